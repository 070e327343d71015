package sandbox

import (
	"fmt"
	"slices"
	"time"
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
	// ElementEntries caps the entries of all element segments together.
	// Default 65536, the default table size.
	ElementEntries int
	// DataBytes caps the bytes of all data segments together, which
	// the decoder copies. Default 12 MiB (a Go guest: 550 KB).
	DataBytes int

	// The sizes below drive the compiler's memory and time and are not
	// bounded by the module's bytes: each is measured in RATIONALE ("Why
	// bound a compile by the module's shape?").

	// LocalsPerFunction caps the locals one function declares. A
	// declaration of 2³² locals takes five bytes, and the compiler
	// allocates about 30 bytes for each. Default 50000 (Go guests
	// declare at most 17, C ones a few dozen).
	LocalsPerFunction int
	// Locals caps the locals of all functions together (20,000 functions
	// of 50,000 locals fit in 160 KB). Default 1000000 (a Go guest:
	// 5,500).
	Locals int
	// FunctionBodyBytes caps one function's body. The compiler's working
	// set for a function grows with its body, up to 1.6 KB per byte of
	// nested ifs. Default 128 KiB (a Go guest's largest: 12 KB).
	FunctionBodyBytes int
	// NestingDepth caps how deep blocks, loops and ifs nest in one
	// function: the compiler's time grows with the square of the depth
	// (10,000 nested ifs compiled for 14 s). Default 1024 (Go: 296).
	NestingDepth int
	// NestingWork caps the sum, over every block, loop and if, of its
	// nesting depth: what the compiler's time grows with (about 300 ns
	// per unit at worst). Default 8000000 (a Go guest: 1.1 million).
	NestingWork int
	// BrTableTargets caps the targets of one br_table, whose compile
	// time grows with the square of its length (100,000 targets: 22 s
	// and 280 MB). Default 4096 (Go: 534).
	BrTableTargets int
	// BrTableTargetsTotal caps the targets of all br_tables together:
	// each cost the compiler up to 80 µs (65,536 of them in one
	// function: 4-5 s), so a module of nothing but br_tables would
	// compile for minutes. Default 131072 (a Go guest: 44,000).
	BrTableTargetsTotal int
	// CompileBytes caps the memory one compile may take, as the module's
	// shape bounds it (see compileCost): a module that passes every
	// limit above but would cost more is refused, and compiles run one
	// at a time, so that together they never take more than this.
	// Default 1 GiB (a Go guest is charged about 240 MiB).
	CompileBytes int64
	// CompileTimeout bounds a compile in a child process (see
	// WithCompileChild). Default 2 minutes: the worst shapes the limits
	// above admit compile in seconds, and the child runs at nice 19.
	CompileTimeout time.Duration
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
	def(&l.ElementEntries, 65536)
	def(&l.DataBytes, 12<<20)
	def(&l.LocalsPerFunction, 50000)
	def(&l.Locals, 1000000)
	def(&l.FunctionBodyBytes, 128<<10)
	def(&l.NestingDepth, 1024)
	def(&l.NestingWork, 8000000)
	def(&l.BrTableTargets, 4096)
	def(&l.BrTableTargetsTotal, 131072)
	if l.CompileTimeout == 0 {
		l.CompileTimeout = 2 * time.Minute
	}
	if l.CompileBytes == 0 {
		l.CompileBytes = 1 << 30
	}
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
	// exportsStart and exportsInitialize say whether the module exports
	// functions named _start and _initialize.
	exportsStart, exportsInitialize bool
	codeShape
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
	case 7:
		for range n {
			name, err := r.name()
			if err != nil {
				return fmt.Errorf("export: %w", err)
			}
			kind, err := r.byte()
			if err != nil {
				return fmt.Errorf("export %q: %w", name, err)
			}
			if _, err := r.u32(); err != nil {
				return fmt.Errorf("export %q: %w", name, err)
			}
			if kind == 0 {
				s.exportsStart = s.exportsStart || name == "_start"
				s.exportsInitialize = s.exportsInitialize || name == abi.ExportInitialize
			}
		}
	case 9:
		s.elemSegs = n
		for i := range n {
			if err := s.elemSegment(r); err != nil {
				return fmt.Errorf("element segment %d: %w", i, err)
			}
		}
	case 10:
		s.codeBytes = len(r.b)
		s.codeBodies = n
		for i := range n {
			size, err := r.u32()
			if err != nil {
				return fmt.Errorf("function body %d: %w", i, err)
			}
			body, err := r.bytes(size)
			if err != nil {
				return fmt.Errorf("function body %d: %w", i, err)
			}
			if err := s.body(&wasmReader{b: body}); err != nil {
				return fmt.Errorf("function body %d: %w", i, err)
			}
		}
	case 11:
		s.dataSegs = n
		for i := range n {
			if err := s.dataSegment(r); err != nil {
				return fmt.Errorf("data segment %d: %w", i, err)
			}
		}
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

// checkCommand refuses a WASI command (it exports _start and no
// _initialize) from its bytes, before a compile: its exports trap before
// _start, and an expert must be a reactor, which the host initialises
// itself. Compile's validate says the same of a module whose exports it
// reads from the compiled module.
func (s *moduleShape) checkCommand() error {
	if s.exportsStart && !s.exportsInitialize {
		return errWASICommand
	}
	return nil
}

var errWASICommand = fmt.Errorf("the module is a WASI command (it exports _start and no %s): build a Go expert with -buildmode=c-shared, a C one with -mexec-model=reactor", abi.ExportInitialize)

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
	if err := over("element segments", s.elemSegs, l.ElementSegments); err != nil {
		return err
	}
	over64 := func(what string, n uint64, limit int) error {
		if n > uint64(limit) {
			return fmt.Errorf("%s: %d, the limit is %d", what, n, limit)
		}
		return nil
	}
	for _, c := range []struct {
		what  string
		n     uint64
		limit int
	}{
		{"element segment entries", uint64(s.elemEntries), l.ElementEntries},
		{"data segment bytes", uint64(s.dataBytes), l.DataBytes},
		{"locals in one function", s.maxLocals, l.LocalsPerFunction},
		{"locals in all functions", s.locals, l.Locals},
		{"bytes of one function body", uint64(s.maxBody), l.FunctionBodyBytes},
		{"nesting depth of blocks", uint64(s.maxDepth), l.NestingDepth},
		{"nesting work (the sum of every block's depth)", s.depthSum, l.NestingWork},
		{"targets of one br_table", uint64(s.maxBrTable), l.BrTableTargets},
		{"targets of all br_tables", uint64(s.brTables), l.BrTableTargetsTotal},
	} {
		if err := over64(c.what, c.n, c.limit); err != nil {
			return err
		}
	}
	if cost := s.compileCost(); cost > l.CompileBytes {
		return fmt.Errorf("compile memory: up to %d bytes for this shape, the limit is %d", cost, l.CompileBytes)
	}
	return nil
}

// Coefficients of compileCost, each rounded up from the worst shape
// measured with wazero 1.12 (TestCompileCostBound; RATIONALE, "Why bound a
// compile by the module's shape?").
const (
	costBase        = 8 << 20 // the compiler's own start
	costPerBodyByte = 3072    // working set of the largest function (long br_tables: 2.2 KB/byte)
	costPerCodeByte = 160     // kept across functions: machine code, relocations (a value-stack-deep body: 145/byte)
	costPerLocal    = 64      // each local of the function with the most (30 bytes measured)
	costPerFunction = 1024    // each function (empty ones: 263 bytes)
	costPerDataByte = 2       // data segments, copied once
	costPerElement  = 16      // element entries, decoded to indexes
)

// compileCost bounds the memory compiling a module of this shape takes:
// the largest function's working set (the compiler reuses it for the next
// function) plus what it keeps per byte of code, per function and per
// segment byte.
func (s *moduleShape) compileCost() int64 {
	return costBase +
		costPerBodyByte*int64(s.maxBody) +
		costPerCodeByte*int64(s.codeBytes) +
		costPerLocal*int64(min(s.maxLocals, 1<<40)) +
		costPerFunction*int64(s.functions) +
		costPerDataByte*s.dataBytes +
		costPerElement*s.elemEntries
}
