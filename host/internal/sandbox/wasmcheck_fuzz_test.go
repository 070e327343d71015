package sandbox

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzInspect feeds arbitrary bytes to the module decoder that runs before
// wazero sees a module: it never panics, never reads past its input, and
// what it counts fits the bytes it read.
func FuzzInspect(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*.wasm")
	seeds = append(seeds, "../../examples/wasm-experts/ffn-c/ffn-c.wasm")
	for _, p := range seeds {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, wasm []byte) {
		s, err := inspect(wasm)
		if err != nil {
			return
		}
		if s.size != len(wasm) || s.functions > len(wasm) || s.globals > len(wasm) || len(s.tables) > len(wasm) ||
			s.dataSegs > len(wasm) || s.elemSegs > len(wasm) || s.codeBytes > len(wasm) || len(s.imports) > len(wasm) ||
			s.maxBody > len(wasm) || s.maxDepth > len(wasm) || s.maxBrTable > len(wasm) || s.dataBytes > int64(len(wasm)) ||
			s.elemEntries > int64(len(wasm)) || s.instructions > int64(len(wasm)) || s.brTables > int64(len(wasm)) {
			t.Fatalf("counts past the module's %d bytes: %+v", len(wasm), s)
		}
		_ = s.check(ModuleLimits{}.withDefaults())
		_ = s.compileCost()
		_ = s.checkImports()
	})
}
