package sandbox

// CallHandleEnd is the end of the call handles' range.
const CallHandleEnd = callHandleEnd

// SetNextCallHandle moves an instance's call handle counter, so that a test
// reaches its end without 2³⁰ host calls (about 18 minutes).
func SetNextCallHandle(inst *Instance, h int32) { inst.st.nextCall = h }
