//go:build wasip1

package main

import "unsafe"

//go:wasmimport wasi_snapshot_preview1 poll_oneoff
func pollOneoff(in, out, nsubscriptions, nevents uint32) uint32

// sleep waits ns nanoseconds: one WASI poll_oneoff on a relative clock
// subscription. Go's time.Sleep would do as well, but package time brings
// in package syscall, whose WASI imports (fd_prestat_get and others) the
// host refuses.
//
//	subscription (48 bytes): userdata u64 @0, tag u8 @8 (0 = clock),
//	  clock id u32 @16 (1 = monotonic), timeout u64 @24 (ns),
//	  precision u64 @32, flags u16 @40 (0 = relative)
//	event (32 bytes), written by the host; nevents u32
func sleep(ns int64) {
	sub := make([]byte, 48)
	evt := make([]byte, 32)
	nevents := make([]uint32, 1)
	put := func(off int, v uint64, n int) {
		for i := range n {
			sub[off+i] = byte(v >> (8 * i))
		}
	}
	put(16, 1, 4)
	put(24, uint64(ns), 8)
	put(32, 1000, 8)
	pollOneoff(addr(sub), addr(evt), 1, uint32(uintptr(unsafe.Pointer(&nevents[0]))))
}

func addr(b []byte) uint32 { return uint32(uintptr(unsafe.Pointer(&b[0]))) }
