package sandbox

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var updateShapes = flag.Bool("update-shapes", false, "rewrite testdata/shape_*.wasm")

// refusedShapes are the modules whose shapes the text format cannot say
// briefly (a declaration of 2²⁸−1 locals is five bytes of binary and 268
// million words of text). The module reader refuses each before it
// compiles; they seed FuzzInspect and the end-to-end front-door test.
func refusedShapes() map[string][]byte {
	wide := make([][]byte, 20000)
	for i := range wide {
		wide[i] = shapeBody(50000, nil)
	}
	deep := nest(10000, []byte{0x41, 1, 0x04, 0x40}, nil, []byte{0x05, 0x0b})
	br := leb([]byte{0x02, 0x40, 0x41, 0, 0x0e}, 100000)
	br = append(append(br, bytes.Repeat([]byte{0}, 100001)...), 0x0b)
	return map[string][]byte{
		// One function of 2²⁸−1 i64 locals (34 bytes with its memory; the
		// audit's was 29 without) that made the
		// compiler ask for 2.7 GB.
		"shape_locals_bomb.wasm": shapeModule(shapeBody(1<<28-1, nil)),
		// 20,000 functions of 50,000 locals each: 160 KB.
		"shape_locals_wide.wasm": shapeModule(wide...),
		// 10,000 nested ifs: 60 KB that compiled for 14 s.
		"shape_nested_ifs.wasm": shapeModule(shapeBody(0, deep)),
		// One br_table of 100,000 targets: 100 KB, 22 s and 280 MB.
		"shape_br_table.wasm": shapeModule(shapeBody(0, br)),
	}
}

// TestShapeFiles keeps testdata/shape_*.wasm equal to refusedShapes;
// -update-shapes rewrites them.
func TestShapeFiles(t *testing.T) {
	for name, want := range refusedShapes() {
		path := filepath.Join("testdata", name)
		if *updateShapes {
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: go test -run TestShapeFiles -update-shapes ./host/internal/sandbox/", path)
		}
	}
}
