package rpc

// InflatedBytes is how many bytes the server's gzip decompressors have
// produced in this process so far.
func InflatedBytes() int64 { return inflated.Load() }

// RawAll is rawAll, the parse of a request's tensor list.
var RawAll = rawAll
