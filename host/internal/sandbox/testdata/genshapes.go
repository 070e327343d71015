//go:build ignore

// genshapes writes the modules whose shapes the text format cannot say
// briefly: a declaration of 2²⁸−1 locals is five bytes of binary and 268
// million words of text. Each is refused by the module reader before it
// compiles (see TestCompileShapesRefused and FuzzInspect).
//
// Rebuild: cd host/internal/sandbox && go run testdata/genshapes.go
package main

import (
	"bytes"
	"os"
)

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

// module is a module of one type () -> () and the given bodies, each
// locals (count, valtype) then instructions.
func module(bodies ...[]byte) []byte {
	m := []byte("\x00asm\x01\x00\x00\x00")
	sec := func(id byte, body []byte) {
		m = append(leb(append(m, id), uint64(len(body))), body...)
	}
	sec(1, []byte{1, 0x60, 0, 0})
	sec(3, append(leb(nil, uint64(len(bodies))), bytes.Repeat([]byte{0}, len(bodies))...))
	code := leb(nil, uint64(len(bodies)))
	for _, b := range bodies {
		code = append(leb(code, uint64(len(b))), b...)
	}
	sec(10, code)
	return m
}

func locals(n uint64, ins ...byte) []byte {
	return append(append(leb([]byte{1}, n), 0x7e), append(ins, 0x0b)...)
}

func main() {
	wide := make([][]byte, 20000)
	for i := range wide {
		wide[i] = locals(50000)
	}
	deep := append(bytes.Repeat([]byte{0x41, 1, 0x04, 0x40}, 10000), bytes.Repeat([]byte{0x05, 0x0b}, 10000)...)
	br := append(leb([]byte{0x02, 0x40, 0x41, 0, 0x0e}, 100000), bytes.Repeat([]byte{0}, 100001)...)
	br = append(br, 0x0b)
	files := map[string][]byte{
		// One function of 2²⁸−1 i64 locals: 29 bytes that made the
		// compiler ask for 2.7 GB.
		"testdata/shape_locals_bomb.wasm": module(locals(1<<28 - 1)),
		// 20,000 functions of 50,000 locals each: 160 KB.
		"testdata/shape_locals_wide.wasm": module(wide...),
		// 10,000 nested ifs: 60 KB that compiled for 14 s.
		"testdata/shape_nested_ifs.wasm": module(append([]byte{0}, append(deep, 0x0b)...)),
		// One br_table of 100,000 targets: 100 KB, 22 s and 280 MB.
		"testdata/shape_br_table.wasm": module(append([]byte{0}, append(br, 0x0b)...)),
	}
	for name, b := range files {
		if err := os.WriteFile(name, b, 0o644); err != nil {
			panic(err)
		}
	}
}
