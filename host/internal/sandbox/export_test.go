package sandbox

import "runtime"

// CallHandleEnd is the end of the call handles' range.
const CallHandleEnd = callHandleEnd

// SetNextCallHandle moves an instance's call handle counter, so that a test
// reaches its end without 2³⁰ host calls (about 18 minutes).
func SetNextCallHandle(inst *Instance, h int32) { inst.st.nextCall = h }

// AllocatedDuring returns the bytes the process allocated while f ran. It
// is an upper bound on what f allocated; the suite runs its cases one at a
// time so that little else runs.
func AllocatedDuring(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
