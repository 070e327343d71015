package sandbox

import (
	"bytes"
	"context"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// leb appends v as an unsigned LEB128.
func leb(b []byte, v uint64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v == 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// shapeModule builds a module of one type () -> (), one memory page and
// the given function bodies (locals and instructions, without the size).
func shapeModule(bodies ...[]byte) []byte {
	m := []byte("\x00asm\x01\x00\x00\x00")
	sec := func(id byte, body []byte) {
		m = append(m, id)
		m = leb(m, uint64(len(body)))
		m = append(m, body...)
	}
	sec(1, []byte{1, 0x60, 0, 0})
	fs := leb(nil, uint64(len(bodies)))
	fs = append(fs, bytes.Repeat([]byte{0}, len(bodies))...)
	sec(3, fs)
	sec(5, []byte{1, 0, 1})
	code := leb(nil, uint64(len(bodies)))
	for _, b := range bodies {
		code = leb(code, uint64(len(b)))
		code = append(code, b...)
	}
	sec(10, code)
	return m
}

// shapeBody is a body with locals i64 locals and the instructions ins.
func shapeBody(locals int, ins []byte) []byte {
	b := []byte{0}
	if locals > 0 {
		b = leb([]byte{1}, uint64(locals))
		b = append(b, 0x7e)
	}
	return append(append(b, ins...), 0x0b)
}

// nest wraps n copies of open (a block, loop or if, with its block type)
// around mid, each closed by closer.
func nest(n int, open, mid, closer []byte) []byte {
	return append(append(bytes.Repeat(open, n), mid...), bytes.Repeat(closer, n)...)
}

// adversarialShapes are the worst shapes for the compiler's memory that
// the measurements of RATIONALE found, each at or near the default limits
// (scaled where a full-size one would make the test slow).
func adversarialShapes() map[string][]byte {
	lim := ModuleLimits{}.withDefaults()
	d := lim.NestingDepth
	// Nested ifs at full depth, as many as keep the test quick.
	ifs := nest(d, []byte{0x41, 1, 0x04, 0x40}, nil, []byte{0x05, 0x0b})
	loops := nest(d, []byte{0x03, 0x40}, nil, []byte{0x0b})
	var brs []byte
	for range 8 {
		brs = append(brs, 0x02, 0x40, 0x41, 0, 0x0e)
		brs = leb(brs, uint64(lim.BrTableTargets))
		brs = append(brs, bytes.Repeat([]byte{0}, lim.BrTableTargets+1)...)
		brs = append(brs, 0x0b)
	}
	// A value stack as deep as the body allows, then added up.
	k := lim.FunctionBodyBytes/3 - 8
	stack := append(bytes.Repeat([]byte{0x41, 1}, k), bytes.Repeat([]byte{0x6a}, k-1)...)
	stack = append(stack, 0x1a)
	flat := bytes.Repeat([]byte{0x41, 1, 0x41, 1, 0x6a, 0x1a}, lim.FunctionBodyBytes/6-2)
	var uses []byte
	for i := range 20000 {
		uses = append(leb(append(uses, 0x20), uint64(i)), 0x1a)
	}
	many := make([][]byte, 1000)
	for i := range many {
		many[i] = shapeBody(lim.Locals/len(many), nil)
	}
	flats := make([][]byte, 16)
	for i := range flats {
		flats[i] = shapeBody(0, flat)
	}
	return map[string][]byte{
		"nested ifs":                       shapeModule(shapeBody(0, ifs)),
		"nested loops":                     shapeModule(shapeBody(0, loops)),
		"long br_tables":                   shapeModule(shapeBody(0, brs)),
		"deep value stack":                 shapeModule(shapeBody(0, stack)),
		"flat code":                        shapeModule(shapeBody(0, flat)),
		"most locals in one function":      shapeModule(shapeBody(lim.LocalsPerFunction, uses)),
		"most locals in 1000 functions":    shapeModule(many...),
		"16 functions of flat code":        shapeModule(flats...),
		"nested ifs and most locals":       shapeModule(shapeBody(lim.LocalsPerFunction, ifs)),
		"1000 functions, one deep nest":    shapeModule(append([][]byte{shapeBody(0, loops)}, many[:999]...)...),
		"long br_tables, deep value stack": shapeModule(shapeBody(0, brs), shapeBody(0, stack)),
	}
}

// TestCompileCostBound compiles the adversarial shapes with wazero and
// checks that the heap the compile takes at its peak stays under
// compileCost: the bound charged before compiling holds for them.
func TestCompileCostBound(t *testing.T) {
	skipUnderRace(t)
	lim := ModuleLimits{}.withDefaults()
	ctx := context.Background()
	cfg := wazero.NewRuntimeConfig().WithCoreFeatures(api.CoreFeaturesV2 &^ api.CoreFeatureReferenceTypes)
	for name, wasm := range adversarialShapes() {
		t.Run(name, func(t *testing.T) {
			s, err := inspect(wasm)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.check(lim); err != nil {
				t.Fatalf("the shape should pass the default limits: %v", err)
			}
			r := wazero.NewRuntimeWithConfig(ctx, cfg)
			defer r.Close(ctx)
			peak, took, err := peakHeap(func() error {
				_, err := r.CompileModule(ctx, wasm)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			cost := s.compileCost()
			t.Logf("%d bytes: heap peak %.1f MiB in %v, charged %.1f MiB", len(wasm), float64(peak)/(1<<20), took.Round(time.Millisecond), float64(cost)/(1<<20))
			if peak > cost {
				t.Errorf("the compile took %d bytes of heap, more than the %d charged", peak, cost)
			}
		})
	}
}

// peakHeap runs f and returns the most heap (objects, live or not yet
// swept) it added, sampled every 100 µs, and how long it ran.
func peakHeap(f func() error) (int64, time.Duration, error) {
	runtime.GC()
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() int64 {
		metrics.Read(sample)
		return int64(sample[0].Value.Uint64())
	}
	base := read()
	done := make(chan struct{})
	peakc := make(chan int64)
	go func() {
		peak := int64(0)
		tick := time.NewTicker(100 * time.Microsecond)
		defer tick.Stop()
		for {
			peak = max(peak, read()-base)
			select {
			case <-done:
				peakc <- max(peak, read()-base)
				return
			case <-tick.C:
			}
		}
	}()
	start := time.Now()
	err := f()
	took := time.Since(start)
	close(done)
	return <-peakc, took, err
}

// TestCompileShapesRefused checks the reader's refusals of the locals
// bomb and its friends, each naming the limit, before any compile.
func TestCompileShapesRefused(t *testing.T) {
	lim := ModuleLimits{}.withDefaults()
	bomb := make([][]byte, 20000)
	for i := range bomb {
		bomb[i] = shapeBody(50000, nil)
	}
	brs := append([]byte{0x02, 0x40, 0x41, 0, 0x0e}, leb(nil, uint64(lim.BrTableTargets+1))...)
	brs = append(append(brs, bytes.Repeat([]byte{0}, lim.BrTableTargets+2)...), 0x0b)
	var brBody []byte
	for range 17 {
		brBody = append(append(brBody, 0x02, 0x40, 0x41, 0, 0x0e), leb(nil, 4096)...)
		brBody = append(append(brBody, bytes.Repeat([]byte{0}, 4097)...), 0x0b)
	}
	tests := []struct {
		name, want string
		wasm       []byte
	}{
		{"many long br_tables", "targets of all br_tables: 139264, the limit is 131072", shapeModule(shapeBody(0, brBody), shapeBody(0, brBody))},
		{"one function with 2^28-1 i64 locals", "locals in one function: 268435455, the limit is 50000", shapeModule(shapeBody(1<<28-1, nil))},
		{"20000 functions of 50000 locals", "locals in all functions: 1000000000, the limit is 1000000", shapeModule(bomb...)},
		{"nesting too deep", "nesting depth of blocks: 1025, the limit is 1024", shapeModule(shapeBody(0, nest(1025, []byte{0x02, 0x40}, nil, []byte{0x0b})))},
		{"too much nesting", "nesting work", shapeModule(shapeBody(0, bytes.Repeat(nest(1000, []byte{0x02, 0x40}, nil, []byte{0x0b}), 17)))},
		{"long br_table", "targets of one br_table: 4097, the limit is 4096", shapeModule(shapeBody(0, brs))},
		{"big body", "bytes of one function body", shapeModule(shapeBody(0, bytes.Repeat([]byte{0x01}, lim.FunctionBodyBytes)))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := inspect(tt.wasm)
			if err == nil {
				err = s.check(lim)
			}
			if err == nil || !bytes.Contains([]byte(err.Error()), []byte(tt.want)) {
				t.Fatalf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
}
