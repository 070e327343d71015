package sandbox_test

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/moehost/moehost/host/internal/sandbox"
)

// hostileModules each declare something that costs host memory outside
// the linear-memory cap.
//
// Rebuild: for f in testdata/hostile_table_grow testdata/hostile_big_table testdata/hostile_wasi; do wat2wasm $f.wat -o $f.wasm; done
//
//go:embed testdata/hostile_table_grow.wasm testdata/hostile_big_table.wasm testdata/hostile_wasi.wasm
var hostileModules embed.FS

// uleb appends v as an unsigned LEB128.
func uleb(b []byte, v uint64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			b = append(b, c|0x80)
			continue
		}
		return append(b, c)
	}
}

// module builds a module from sections: id and body each. It adds a type
// () -> () and a memory when its sections do not.
func module(sections ...[]byte) []byte {
	m := []byte("\x00asm\x01\x00\x00\x00")
	for _, s := range sections {
		m = append(m, s[0])
		m = uleb(m, uint64(len(s)-1))
		m = append(m, s[1:]...)
	}
	return m
}

// section returns a section of n copies of entry, with its count.
func section(id byte, n int, entry []byte) []byte {
	b := uleb([]byte{id}, uint64(n))
	return append(b, bytes.Repeat(entry, n)...)
}

var (
	typeSection   = section(1, 1, []byte{0x60, 0, 0}) // () -> ()
	memorySection = section(5, 1, []byte{0, 1})       // one page
)

// TestModuleLimits checks that a module past any limit of ModuleLimits is
// refused before it compiles, with ErrInvalidModule naming the limit.
func TestModuleLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	file := func(name string) []byte {
		b, err := hostileModules.ReadFile("testdata/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name   string
		limits sandbox.ModuleLimits
		wasm   []byte
		msg    string
	}{
		{"200k functions", sandbox.ModuleLimits{},
			module(typeSection, section(3, 200000, []byte{0}), section(10, 200000, []byte{2, 0, 0x0b})), "functions: 200000, the limit is 20000"},
		{"code bytes", sandbox.ModuleLimits{CodeBytes: 1000},
			module(typeSection, section(3, 1000, []byte{0}), section(10, 1000, []byte{2, 0, 0x0b})), "code section bytes: 3002, the limit is 1000"},
		{"module bytes", sandbox.ModuleLimits{Bytes: 100},
			module(typeSection, section(3, 100, []byte{0}), section(10, 100, []byte{2, 0, 0x0b})), "module bytes: 421, the limit is 100"},
		{"globals", sandbox.ModuleLimits{},
			module(section(6, 2000, []byte{0x7f, 0, 0x41, 0, 0x0b})), "globals: 2000, the limit is 1024"},
		{"data segments", sandbox.ModuleLimits{DataSegments: 10},
			module(memorySection, section(11, 11, []byte{0, 0x41, 0, 0x0b, 0})), "data segments: 11, the limit is 10"},
		{"element segments", sandbox.ModuleLimits{},
			module(section(4, 1, []byte{0x70, 0, 1}), section(9, 5000, []byte{0, 0x41, 0, 0x0b, 0})), "element segments: 5000, the limit is 4096"},
		{"two tables", sandbox.ModuleLimits{},
			module(section(4, 2, []byte{0x70, 0, 1})), "tables: 2, the limit is 1"},
		{"10M-element table", sandbox.ModuleLimits{}, file("hostile_big_table.wasm"), "table 0 elements: 10000000, the limit is 65536"},
		{"table.grow", sandbox.ModuleLimits{}, file("hostile_table_grow.wasm"), "reference-types"},
		{"WASI beyond the Go runtime's", sandbox.ModuleLimits{}, file("hostile_wasi.wasm"), "wasi_snapshot_preview1.path_open"},
		{"a count past its section", sandbox.ModuleLimits{}, module([]byte{3, 0xff, 0xff, 0xff, 0xff, 0x0f}), "cannot fit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rt, err := sandbox.NewRuntime(ctx, "", sandbox.Limits{Module: tt.limits})
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Close(ctx)
			start := time.Now()
			_, err = rt.Compile(ctx, tt.wasm)
			if !errors.Is(err, sandbox.ErrInvalidModule) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("got %v; want ErrInvalidModule with %q", err, tt.msg)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("refusing took %v", d)
			}
		})
	}
}
