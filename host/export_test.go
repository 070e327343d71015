package host

// SharedTestDataDir returns the data dir shared by the package's tests, whose
// compilation cache saves each test server from compiling the example
// modules again (slow under -race).
func SharedTestDataDir() string { return testDataDir }
