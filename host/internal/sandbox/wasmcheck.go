package sandbox

import (
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/moehost/moehost/abi"
)

// ModuleLimits bound what a module may declare, checked on its bytes before
// wazero decodes or compiles it: every one of these turns into host memory
// at compile or instantiation time that the linear-memory cap does not
// count. Zero fields take the defaults, which admit the committed Go and C
// examples several times over (a Go guest: about 1.9 MB, 1,400 functions,
// 1.2 MB of code, one table of 5,500 entries, 8 globals, 23,000 data
// segments).
type ModuleLimits struct {
	// Bytes caps the module's size. Default 16 MiB.
	Bytes int
	// CodeBytes caps the code section's size. Default 8 MiB.
	CodeBytes int
	// Functions caps imported and defined functions. Default 20000.
	Functions int
	// Tables caps the tables, imported or defined. Default 1.
	Tables int
	// TableElements caps each table's initial size. Tables cannot grow:
	// the runtime refuses the reference-types proposal, which brings
	// table.grow (and several tables). Default 65536.
	TableElements uint32
	// Globals caps the globals, imported or defined. Default 1024.
	Globals int
	// DataSegments caps the data segments. Default 100000 (a Go guest
	// has one per 64 bytes of initialised data, about 23,000).
	DataSegments int
	// ElementSegments caps the element segments. Default 4096.
	ElementSegments int
}

func (l ModuleLimits) withDefaults() ModuleLimits {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&l.Bytes, 16<<20)
	def(&l.CodeBytes, 8<<20)
	def(&l.Functions, 20000)
	def(&l.Tables, 1)
	def(&l.Globals, 1024)
	def(&l.DataSegments, 100000)
	def(&l.ElementSegments, 4096)
	if l.TableElements == 0 {
		l.TableElements = 65536
	}
	return l
}

// wasmImport is one import of a module.
type wasmImport struct {
	module, name string
	kind         byte // 0 function, 1 table, 2 memory, 3 global
}

// tableType is a table's declared size.
type tableType struct {
	min, max uint32
	hasMax   bool
}

// moduleShape is what inspect reads from a module's sections.
type moduleShape struct {
	size         int
	imports      []wasmImport
	functions    int // imported and defined
	tables       []tableType
	globals      int
	dataSegs     int
	elemSegs     int
	codeBytes    int
	codeBodies   int
	declaredFunc int // the function section's count
}

// wasmReader reads a module's bytes; its methods fail rather than read
// past the end.
type wasmReader struct {
	b   []byte
	off int
}

func (r *wasmReader) byte() (byte, error) {
	if r.off >= len(r.b) {
		return 0, fmt.Errorf("unexpected end at byte %d", r.off)
	}
	c := r.b[r.off]
	r.off++
	return c, nil
}

// u32 reads an unsigned LEB128 of at most 5 bytes that fits 32 bits.
func (r *wasmReader) u32() (uint32, error) {
	var v uint64
	for i := 0; i < 5; i++ {
		c, err := r.byte()
		if err != nil {
			return 0, err
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c&0x80 == 0 {
			if v > 1<<32-1 {
				return 0, fmt.Errorf("integer at byte %d overflows 32 bits", r.off)
			}
			return uint32(v), nil
		}
	}
	return 0, fmt.Errorf("integer at byte %d is longer than 5 bytes", r.off)
}

// bytes reads n bytes.
func (r *wasmReader) bytes(n uint32) ([]byte, error) {
	if uint64(n) > uint64(len(r.b)-r.off) {
		return nil, fmt.Errorf("%d bytes at byte %d run past the end", n, r.off)
	}
	b := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return b, nil
}

// name reads a length-prefixed UTF-8 name.
func (r *wasmReader) name() (string, error) {
	n, err := r.u32()
	if err != nil {
		return "", err
	}
	b, err := r.bytes(n)
	if err != nil {
		return "", err
	}
	if !utf8.Valid(b) {
		return "", fmt.Errorf("name at byte %d is not UTF-8", r.off)
	}
	return string(b), nil
}

// count reads a vector's length and refuses one that cannot fit the bytes
// left, each element taking at least min bytes. wazero's decoder trusts
// such counts and spends minutes on a few hostile bytes (found by
// FuzzCompile).
func (r *wasmReader) count(min int) (int, error) {
	n, err := r.u32()
	if err != nil {
		return 0, err
	}
	if uint64(n)*uint64(min) > uint64(len(r.b)-r.off) {
		return 0, fmt.Errorf("%d entries cannot fit in %d bytes", n, len(r.b)-r.off)
	}
	return int(n), nil
}

// limits reads a table's or memory's limits.
func (r *wasmReader) limits() (tableType, error) {
	flag, err := r.byte()
	if err != nil {
		return tableType{}, err
	}
	var t tableType
	switch flag {
	case 0x00, 0x01, 0x02, 0x03: // min, min max; 2 and 3 are shared memories
		if t.min, err = r.u32(); err != nil {
			return t, err
		}
		if flag&1 == 1 {
			t.hasMax = true
			if t.max, err = r.u32(); err != nil {
				return t, err
			}
		}
		return t, nil
	}
	return t, fmt.Errorf("limits flag 0x%02x is not served", flag)
}

// inspect reads a module's section headers, imports, tables and the counts
// the limits check. It reads no code; wazero validates what it skips.
func inspect(wasm []byte) (*moduleShape, error) {
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return nil, fmt.Errorf("not a WebAssembly binary")
	}
	s := &moduleShape{size: len(wasm)}
	r := &wasmReader{b: wasm, off: 8}
	for r.off < len(wasm) {
		id, err := r.byte()
		if err != nil {
			return nil, err
		}
		size, err := r.u32()
		if err != nil {
			return nil, fmt.Errorf("section %d: %w", id, err)
		}
		body, err := r.bytes(size)
		if err != nil {
			return nil, fmt.Errorf("section %d: size runs past the end of the module", id)
		}
		if err := s.section(id, &wasmReader{b: body}); err != nil {
			return nil, fmt.Errorf("section %d: %w", id, err)
		}
	}
	return s, nil
}

// section reads one section's body.
func (s *moduleShape) section(id byte, r *wasmReader) error {
	if id == 0 || id == 8 || id == 12 { // custom, start, data count
		return nil
	}
	if id > 12 {
		return fmt.Errorf("unknown section id")
	}
	n, err := r.count(1)
	if err != nil {
		return err
	}
	switch id {
	case 2:
		for range n {
			var im wasmImport
			if im.module, err = r.name(); err != nil {
				return err
			}
			if im.name, err = r.name(); err != nil {
				return err
			}
			if im.kind, err = r.byte(); err != nil {
				return err
			}
			switch im.kind {
			case 0:
				s.functions++
				_, err = r.u32()
			case 1:
				if _, err = r.byte(); err == nil { // reftype
					var t tableType
					t, err = r.limits()
					s.tables = append(s.tables, t)
				}
			case 2:
				_, err = r.limits()
			case 3:
				s.globals++
				_, err = r.bytes(2) // valtype, mutability
			default:
				err = fmt.Errorf("import kind %d is not served", im.kind)
			}
			if err != nil {
				return fmt.Errorf("import %q.%q: %w", im.module, im.name, err)
			}
			s.imports = append(s.imports, im)
		}
	case 3:
		s.functions += n
		s.declaredFunc = n
	case 4:
		for range n {
			if _, err := r.byte(); err != nil { // reftype
				return err
			}
			t, err := r.limits()
			if err != nil {
				return fmt.Errorf("table: %w", err)
			}
			s.tables = append(s.tables, t)
		}
	case 6:
		s.globals += n
	case 9:
		s.elemSegs = n
	case 10:
		s.codeBytes = len(r.b)
		s.codeBodies = n
		for i := range n {
			size, err := r.u32()
			if err != nil {
				return fmt.Errorf("function body %d: %w", i, err)
			}
			if _, err := r.bytes(size); err != nil {
				return fmt.Errorf("function body %d: %w", i, err)
			}
		}
	case 11:
		s.dataSegs = n
	}
	return nil
}

// allowedWASI are the WASI functions a guest may import: exactly those
// that the Go runtime of the committed examples imports (the C example
// imports none). Instances get no files, arguments, environment or
// network, whatever they import (see Module.Instantiate).
var allowedWASI = map[string]bool{
	"args_get": true, "args_sizes_get": true, "environ_get": true, "environ_sizes_get": true,
	"clock_time_get": true, "fd_write": true, "poll_oneoff": true, "proc_exit": true,
	"random_get": true, "sched_yield": true,
}

// checkImports refuses imports of anything but the ABI's functions and
// allowedWASI's.
func (s *moduleShape) checkImports() error {
	for _, im := range s.imports {
		switch im.module {
		case abi.ModuleName:
			if im.kind != 0 || !slices.Contains(hostFuncNames, im.name) {
				return fmt.Errorf("imports unknown host function %s.%s", im.module, im.name)
			}
		case wasiModule:
			if im.kind != 0 || !allowedWASI[im.name] {
				return fmt.Errorf("imports %s.%s, which is not among the WASI functions allowed (those the Go runtime needs)", im.module, im.name)
			}
		default:
			return fmt.Errorf("imports from module %q; only %q and WASI are allowed", im.module, abi.ModuleName)
		}
	}
	return nil
}

// wasiModule is WASI's import module name.
const wasiModule = "wasi_snapshot_preview1"

// check refuses a module past one of l, naming the limit.
func (s *moduleShape) check(l ModuleLimits) error {
	over := func(what string, n, limit int) error {
		if n > limit {
			return fmt.Errorf("%s: %d, the limit is %d", what, n, limit)
		}
		return nil
	}
	if err := over("module bytes", s.size, l.Bytes); err != nil {
		return err
	}
	if err := over("code section bytes", s.codeBytes, l.CodeBytes); err != nil {
		return err
	}
	if err := over("functions", s.functions, l.Functions); err != nil {
		return err
	}
	if err := over("tables", len(s.tables), l.Tables); err != nil {
		return err
	}
	for i, t := range s.tables {
		if t.min > l.TableElements {
			return fmt.Errorf("table %d elements: %d, the limit is %d", i, t.min, l.TableElements)
		}
	}
	if err := over("globals", s.globals, l.Globals); err != nil {
		return err
	}
	if err := over("data segments", s.dataSegs, l.DataSegments); err != nil {
		return err
	}
	return over("element segments", s.elemSegs, l.ElementSegments)
}
