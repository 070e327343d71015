package sandbox

import (
	"context"
	_ "embed"
	"math"
	"runtime"
	"testing"

	"github.com/tetratelabs/wazero/api"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
)

// opFuzzWasm is hostile.wasm: FuzzOpSequence uses only its memory and its
// state, and drives the host functions itself.
//
// Rebuild: wat2wasm testdata/hostile.wat -o testdata/hostile.wasm
//
//go:embed testdata/hostile.wasm
var opFuzzWasm []byte

// opFuzzBudget is the fuzzed instance's BytesPerCall.
const opFuzzBudget = 4 << 20

// fuzzer drives the host functions of one instance, a, with handles of its
// own (live and stale), of another instance, b, and made up.
type fuzzer struct {
	t      *testing.T
	a, b   *Instance
	stale  []int32 // a's handles from its previous call
	live   []int32 // a's handles in this call
	theirs []int32 // b's live handles
	// foreign holds every tensor of b, which a must never return.
	foreign map[*gpuhost.Tensor]bool
}

// call runs host function name on a with args, as the guest would.
func (f *fuzzer) call(name string, args ...uint64) int32 {
	for _, hf := range hostFuncs {
		if hf.name == name {
			stack := make([]uint64, max(len(args), 1))
			copy(stack, args)
			wrap(hf).Call(withState(context.Background(), f.a.st), f.a.mod, stack)
			r := api.DecodeI32(stack[0])
			if r == int32(abi.ErrInternal) {
				f.t.Fatalf("%s%v: host bug: %s", name, args, f.a.st.lastErr)
			}
			return r
		}
	}
	panic("BUG: no host function " + name)
}

// handle picks a handle from b: a's live or stale ones, b's, or made up.
func (f *fuzzer) handle(b byte) int32 {
	pick := func(hs []int32) int32 {
		if len(hs) == 0 {
			return int32(b)
		}
		return hs[int(b>>2)%len(hs)]
	}
	switch b & 3 {
	case 0, 1:
		return pick(f.live)
	case 2:
		return pick(f.stale)
	}
	if b&4 != 0 {
		return pick(f.theirs)
	}
	return int32(b) << 24 >> (b & 7) // made up, of any size and sign
}

// check checks the invariants after each step.
func (f *fuzzer) check(r int32) {
	st := f.a.st
	if st.bytes > st.limits.BytesPerCall {
		f.t.Fatalf("charged %d bytes; the budget is %d", st.bytes, st.limits.BytesPerCall)
	}
	if r > 0 {
		if e, err := st.lookup(r); err == nil && f.foreign[e.t] {
			f.t.Fatalf("handle %d resolves to a tensor of another instance", r)
		}
	}
}

// FuzzOpSequence runs random sequences of ops, tensor_new, writes, reads
// and outputs, with random codes, shapes, attrs and handles (live, stale,
// another instance's and made up), against an instance with a 4 MiB call
// budget. The host never fails with a host bug (ErrInternal), never
// charges or allocates past the budget, and never resolves a handle to
// another instance's tensor.
func FuzzOpSequence(f *testing.F) {
	f.Add([]byte{0, 1, 2, 2, 8, 8, 1, 1, 0, 0, 0, 0, 1, 11, 1, 0, 4, 0})
	f.Add([]byte{0, 1, 2, 0x10, 0, 0, 0, 1, 1, 2, 0, 1, 5, 3, 1})
	f.Add([]byte{0, 1, 4, 1, 1, 64, 64, 1, 36, 3, 0, 0, 0, 3, 0})
	f.Add([]byte{1, 1, 2, 1, 0, 4, 4, 5, 4, 6, 4})
	ctx := context.Background()
	rt, err := NewRuntime(ctx, "", Limits{BytesPerCall: opFuzzBudget, OpsPerCall: 64, HostCallsPerCall: 256})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { rt.Close(ctx) })
	m, err := rt.Compile(ctx, opFuzzWasm)
	if err != nil {
		f.Fatal(err)
	}
	dev := gpuhost.NewCPU(1)
	inst := func() *Instance {
		i, err := m.Instantiate(ctx, Binding{Device: dev, Params: NewParamStore(dev, nil, 0)})
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { i.Close(ctx) })
		return i
	}
	a, b := inst(), inst()
	x, err := dev.FromFloat32([]int{1, 2}, []float32{1, 2})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, prog []byte) {
		fz := &fuzzer{t: t, a: a, b: b, foreign: map[*gpuhost.Tensor]bool{}}
		// b's call is open while a runs, as on another device worker.
		b.st.beginCall(phaseForward, []*gpuhost.Tensor{x}, nil, 1, nil)
		defer b.st.endCall()
		for i := range b.st.calls {
			fz.theirs = append(fz.theirs, b.st.callBase+int32(i))
			fz.foreign[b.st.calls[i].t] = true
		}
		// a's first call leaves stale handles; its second is fuzzed.
		a.st.beginCall(phaseForward, []*gpuhost.Tensor{x}, nil, 1, nil)
		fz.stale = append(fz.stale, a.st.callInputs...)
		a.st.endCall()
		a.st.beginCall(phaseForward, []*gpuhost.Tensor{x}, nil, 1, nil)
		defer a.st.endCall()
		fz.live = append(fz.live, a.st.callInputs...)

		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		fz.run(prog)
		runtime.ReadMemStats(&after)
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 2*opFuzzBudget+8<<20 {
			t.Fatalf("a sequence allocated %d bytes; the budget is %d", grew, opFuzzBudget)
		}
	})
}

// Guest memory the fuzzer uses: args at 4096, attrs at 8192, shapes at
// 12288, out handles at 16384, data at 20480.
const (
	fzArgs, fzAttrs, fzShape, fzOuts, fzData = 4096, 8192, 12288, 16384, 20480
)

// run interprets prog: each step is an action byte and its operands.
func (f *fuzzer) run(prog []byte) {
	mem := f.a.mod.Memory()
	next := func() byte {
		if len(prog) == 0 {
			return 0
		}
		c := prog[0]
		prog = prog[1:]
		return c
	}
	for len(prog) > 0 {
		var r int32
		switch next() % 7 {
		case 0: // tensor_new(dtype, shape): dims small, or huge by one bit
			dt, rank := next()%8, next()%5
			for i := range int(rank) {
				d := int64(next())
				if d&0x80 != 0 {
					d = 1 << (d & 63)
				}
				mem.WriteUint64Le(fzShape+8*uint32(i), uint64(d))
			}
			r = f.call(abi.FuncTensorNew, uint64(dt), fzShape, uint64(rank))
		case 1, 2: // op or op_multi(code, args, attrs)
			code, nargs, nattrs := int32(next()%40), next()%5, next()%4
			for i := range uint32(nargs) {
				mem.WriteUint32Le(fzArgs+4*i, uint32(f.handle(next())))
			}
			for i := range uint32(nattrs) {
				v := float64(int8(next()))
				if v == -128 {
					v = math.NaN()
				}
				mem.WriteFloat64Le(fzAttrs+8*i, v)
			}
			if len(prog)%2 == 0 {
				r = f.call(abi.FuncOp, uint64(code), fzArgs, uint64(nargs), fzAttrs, uint64(nattrs))
			} else {
				n := f.call(abi.FuncOpMulti, uint64(code), fzArgs, uint64(nargs), fzAttrs, uint64(nattrs), fzOuts, 8)
				for i := range uint32(max(n, 0)) {
					h, _ := mem.ReadUint32Le(fzOuts + 4*i)
					f.live = append(f.live, int32(h))
					f.check(int32(h))
				}
			}
		case 3: // tensor_write(handle, data, len)
			h, n := f.handle(next()), int32(next())*4
			r = f.call(abi.FuncTensorWrite, uint64(h), fzData, uint64(n))
		case 4: // tensor_read(handle, data, cap)
			r = f.call(abi.FuncTensorRead, uint64(f.handle(next())), fzData, 4096)
		case 5: // tensor_shape and tensor_dtype
			h := f.handle(next())
			f.call(abi.FuncTensorShape, uint64(h), fzShape, 8)
			f.call(abi.FuncTensorDType, uint64(h))
		case 6: // output(0, handle)
			f.call(abi.FuncOutput, 0, uint64(f.handle(next())))
		}
		if r > 0 {
			f.live = append(f.live, r)
		}
		f.check(r)
		if f.a.st.hostCalls >= f.a.st.limits.HostCallsPerCall {
			return // every later call is refused
		}
	}
}
