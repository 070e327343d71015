package sandbox

import "fmt"

// codeShape is what inspect reads from the code, data and element
// sections: the sizes that drive the compiler's memory and time, none of
// which the module's byte count bounds on its own (a local declaration
// is five bytes for 2³² locals) or bounds linearly (nesting costs the
// compiler time in the square of its depth).
type codeShape struct {
	locals    uint64 // declared locals, all functions together
	maxLocals uint64 // the most declared by one function
	maxBody   int    // the largest function body, in bytes
	maxDepth  int    // the deepest nesting of block, loop and if
	// depthSum adds up, over every block, loop and if, its nesting
	// depth: wazero's compiler walks up the enclosing blocks for each
	// (dominators, loop detection), so its time grows with this sum,
	// which is the square of the depth for a single deep nest.
	depthSum     uint64
	maxBrTable   int   // the longest br_table
	brTables     int64 // br_table targets, all together
	dataBytes    int64 // data segment bytes, all together
	elemEntries  int64 // element segment entries, all together
	instructions int64 // instructions, all functions together
}

// body reads one function body: its local declarations, then every
// instruction to the body's final end. It refuses opcodes it does not
// know (wazero would refuse them too) and a body whose end does not
// close its last block exactly at its last byte.
func (s *moduleShape) body(r *wasmReader) error {
	s.maxBody = max(s.maxBody, len(r.b))
	groups, err := r.count(2)
	if err != nil {
		return fmt.Errorf("locals: %w", err)
	}
	var locals uint64
	for range groups {
		n, err := r.u32()
		if err != nil {
			return fmt.Errorf("locals: %w", err)
		}
		if _, err := r.byte(); err != nil { // valtype
			return fmt.Errorf("locals: %w", err)
		}
		locals += uint64(n)
	}
	s.locals += locals
	s.maxLocals = max(s.maxLocals, locals)
	return s.expr(r, true)
}

// expr reads instructions to the end that closes the expression: a
// function body (whole, its end the last byte) or a constant expression.
func (s *moduleShape) expr(r *wasmReader, whole bool) error {
	depth := 0
	for {
		at := r.off
		op, err := r.byte()
		if err != nil {
			return err
		}
		s.instructions++
		switch {
		case op == 0x02 || op == 0x03 || op == 0x04: // block, loop, if
			if err := r.blockType(); err != nil {
				return err
			}
			depth++
			s.maxDepth = max(s.maxDepth, depth)
			s.depthSum += uint64(depth)
		case op == 0x0b: // end
			if depth == 0 {
				if whole && r.off != len(r.b) {
					return fmt.Errorf("the body ends at byte %d of %d", r.off, len(r.b))
				}
				return nil
			}
			depth--
		case op == 0x0e: // br_table
			n, err := r.count(1)
			if err != nil {
				return fmt.Errorf("br_table at byte %d: %w", at, err)
			}
			s.maxBrTable = max(s.maxBrTable, n)
			s.brTables += int64(n)
			for range n + 1 {
				if _, err := r.u32(); err != nil {
					return err
				}
			}
		case op <= 0x01 || op == 0x05 || op == 0x0f || op == 0x1a || op == 0x1b || op == 0xd1 ||
			op >= 0x45 && op <= 0xc4:
			// No immediates: unreachable, nop, else, return, drop,
			// select, ref.is_null and the numeric instructions.
		case op == 0x0c || op == 0x0d || op == 0x10 || op >= 0x20 && op <= 0x26 || op == 0xd2:
			// One index: br, br_if, call, local.*, global.*, table.get
			// and table.set, ref.func.
			if _, err := r.u32(); err != nil {
				return err
			}
		case op == 0x11: // call_indirect: type and table
			if err := r.u32s(2); err != nil {
				return err
			}
		case op == 0x1c: // select with types
			n, err := r.count(1)
			if err != nil {
				return err
			}
			if _, err := r.bytes(uint32(n)); err != nil {
				return err
			}
		case op >= 0x28 && op <= 0x3e: // loads and stores: memarg
			if err := r.u32s(2); err != nil {
				return err
			}
		case op == 0x3f || op == 0x40 || op == 0xd0: // memory.size, memory.grow, ref.null
			if _, err := r.byte(); err != nil {
				return err
			}
		case op == 0x41: // i32.const
			if err := r.sleb(5); err != nil {
				return err
			}
		case op == 0x42: // i64.const
			if err := r.sleb(10); err != nil {
				return err
			}
		case op == 0x43:
			if _, err := r.bytes(4); err != nil {
				return err
			}
		case op == 0x44:
			if _, err := r.bytes(8); err != nil {
				return err
			}
		case op == 0xfc:
			if err := r.miscOp(); err != nil {
				return err
			}
		case op == 0xfd:
			if err := r.vectorOp(); err != nil {
				return err
			}
		default:
			return fmt.Errorf("unknown opcode 0x%02x at byte %d", op, at)
		}
	}
}

// u32s reads n unsigned integers.
func (r *wasmReader) u32s(n int) error {
	for range n {
		if _, err := r.u32(); err != nil {
			return err
		}
	}
	return nil
}

// sleb reads a signed LEB128 of at most max bytes.
func (r *wasmReader) sleb(max int) error {
	for range max {
		c, err := r.byte()
		if err != nil {
			return err
		}
		if c&0x80 == 0 {
			return nil
		}
	}
	return fmt.Errorf("integer at byte %d is longer than %d bytes", r.off, max)
}

// blockType reads a block type: empty (0x40), a value type, or a type
// index as a signed 33-bit integer.
func (r *wasmReader) blockType() error {
	if r.off >= len(r.b) {
		return fmt.Errorf("unexpected end at byte %d", r.off)
	}
	switch r.b[r.off] {
	case 0x40, 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f:
		r.off++
		return nil
	}
	return r.sleb(5)
}

// miscOp reads the rest of a 0xfc instruction: saturating truncations,
// bulk memory and table operations.
func (r *wasmReader) miscOp() error {
	sub, err := r.u32()
	if err != nil {
		return err
	}
	switch {
	case sub <= 7: // trunc_sat
		return nil
	case sub == 8: // memory.init: data index, memory
		if _, err := r.u32(); err != nil {
			return err
		}
		_, err = r.byte()
		return err
	case sub == 9 || sub == 13 || sub >= 15 && sub <= 17: // data.drop, elem.drop, table.grow/size/fill
		_, err = r.u32()
		return err
	case sub == 10: // memory.copy
		_, err = r.bytes(2)
		return err
	case sub == 11: // memory.fill
		_, err = r.byte()
		return err
	case sub == 12 || sub == 14: // table.init, table.copy
		return r.u32s(2)
	}
	return fmt.Errorf("unknown opcode 0xfc %d at byte %d", sub, r.off)
}

// vectorOp reads the rest of a 0xfd (SIMD) instruction.
func (r *wasmReader) vectorOp() error {
	sub, err := r.u32()
	if err != nil {
		return err
	}
	switch {
	case sub <= 11 || sub == 92 || sub == 93: // loads and stores: memarg
		return r.u32s(2)
	case sub == 12 || sub == 13: // v128.const, i8x16.shuffle
		_, err = r.bytes(16)
		return err
	case sub >= 21 && sub <= 34: // extract and replace lane
		_, err = r.byte()
		return err
	case sub >= 84 && sub <= 91: // load and store lane: memarg, lane
		if err := r.u32s(2); err != nil {
			return err
		}
		_, err = r.byte()
		return err
	case sub <= 255:
		return nil
	}
	return fmt.Errorf("unknown opcode 0xfd %d at byte %d", sub, r.off)
}

// dataSegment reads one data segment and adds up its bytes.
func (s *moduleShape) dataSegment(r *wasmReader) error {
	flag, err := r.u32()
	if err != nil {
		return err
	}
	switch flag {
	case 0, 2: // active: (memory index), offset
		if flag == 2 {
			if _, err := r.u32(); err != nil {
				return err
			}
		}
		if err := s.expr(r, false); err != nil {
			return fmt.Errorf("offset: %w", err)
		}
	case 1: // passive
	default:
		return fmt.Errorf("flag %d is not served", flag)
	}
	n, err := r.u32()
	if err != nil {
		return err
	}
	if _, err := r.bytes(n); err != nil {
		return err
	}
	s.dataBytes += int64(n)
	return nil
}

// elemSegment reads one element segment and counts its entries.
func (s *moduleShape) elemSegment(r *wasmReader) error {
	flag, err := r.u32()
	if err != nil {
		return err
	}
	if flag > 7 {
		return fmt.Errorf("flag %d is not served", flag)
	}
	if flag&3 == 2 { // active with a table index
		if _, err := r.u32(); err != nil {
			return err
		}
	}
	if flag&1 == 0 { // active: offset
		if err := s.expr(r, false); err != nil {
			return fmt.Errorf("offset: %w", err)
		}
	}
	if flag&3 != 0 { // element kind or reference type
		if _, err := r.byte(); err != nil {
			return err
		}
	}
	n, err := r.count(1)
	if err != nil {
		return err
	}
	s.elemEntries += int64(n)
	for range n {
		if flag&4 == 0 { // function indexes
			if _, err := r.u32(); err != nil {
				return err
			}
		} else if err := s.expr(r, false); err != nil { // expressions
			return err
		}
	}
	return nil
}
