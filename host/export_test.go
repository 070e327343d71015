package host

// SharedTestDataDir returns the data dir shared by the package's tests, whose
// compilation cache saves each test server from compiling the example
// modules again (slow under -race).
func SharedTestDataDir() string { return testDataDir }

// TrapWasm is a tiny identity expert on x:float32[-1,4] (testdata/trap.wat):
// cheap to instantiate, for tests that start many servers.
func TrapWasm() []byte { return trapWasm }
