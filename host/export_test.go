package host

// TrapWasm is a tiny identity expert on x:float32[-1,4] (testdata/trap.wat):
// cheap to instantiate, for tests that start many servers.
func TrapWasm() []byte { return trapWasm }
