// Package npy reads and writes NumPy .npy files that hold one float32
// array: little-endian ('<f4'), C order, format version 1.0 or 2.0 (3.0,
// which differs only in allowing UTF-8 in the header, is read too).
//
// Read decodes untrusted bytes: it bounds the header to MaxHeaderBytes, as
// NumPy does, and the data to the caller's limit before it allocates.
package npy

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// MaxHeaderBytes is the longest header Read accepts: NumPy's own default
// limit (max_header_size).
const MaxHeaderBytes = 10000

// magic opens every .npy file.
const magic = "\x93NUMPY"

// Array is a float32 array in C (row-major) order.
type Array struct {
	Shape []int64
	Data  []float32
}

// Read decodes a .npy file of float32 values from r. It refuses any other
// dtype, Fortran order, a header over MaxHeaderBytes, and data over
// maxBytes bytes (0 means no limit) before it allocates them.
func Read(r io.Reader, maxBytes int64) (Array, error) {
	var pre [8]byte
	if _, err := io.ReadFull(r, pre[:]); err != nil {
		return Array{}, fmt.Errorf("npy: reading the preamble: %w", err)
	}
	if string(pre[:6]) != magic {
		return Array{}, errors.New(`npy: not a .npy file (no "\x93NUMPY" magic)`)
	}
	var hlen int
	switch major := pre[6]; major {
	case 1:
		var b [2]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return Array{}, fmt.Errorf("npy: reading the header length: %w", err)
		}
		hlen = int(binary.LittleEndian.Uint16(b[:]))
	case 2, 3:
		var b [4]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return Array{}, fmt.Errorf("npy: reading the header length: %w", err)
		}
		n := binary.LittleEndian.Uint32(b[:])
		if n > MaxHeaderBytes {
			return Array{}, fmt.Errorf("npy: a header of %d bytes is over the limit of %d", n, MaxHeaderBytes)
		}
		hlen = int(n)
	default:
		return Array{}, fmt.Errorf("npy: format version %d.%d, want 1.0, 2.0 or 3.0", major, pre[7])
	}
	if hlen > MaxHeaderBytes {
		return Array{}, fmt.Errorf("npy: a header of %d bytes is over the limit of %d", hlen, MaxHeaderBytes)
	}
	h := make([]byte, hlen)
	if _, err := io.ReadFull(r, h); err != nil {
		return Array{}, fmt.Errorf("npy: reading the header: %w", err)
	}
	shape, err := parseHeader(string(h))
	if err != nil {
		return Array{}, fmt.Errorf("npy: header %q: %w", strings.TrimSpace(string(h)), err)
	}
	n := int64(1)
	for _, d := range shape {
		if d != 0 && n > math.MaxInt64/4/d {
			return Array{}, fmt.Errorf("npy: shape %v is too large", shape)
		}
		n *= d
	}
	if maxBytes > 0 && n*4 > maxBytes {
		return Array{}, fmt.Errorf("npy: shape %v holds %d bytes, over the limit of %d", shape, n*4, maxBytes)
	}
	if n*4 > math.MaxInt {
		return Array{}, fmt.Errorf("npy: shape %v is too large", shape)
	}
	raw := make([]byte, n*4)
	if _, err := io.ReadFull(r, raw); err != nil {
		return Array{}, fmt.Errorf("npy: shape %v wants %d bytes of data: %w", shape, n*4, err)
	}
	var extra [1]byte
	if m, _ := r.Read(extra[:]); m != 0 {
		return Array{}, fmt.Errorf("npy: bytes after the %d of shape %v", n*4, shape)
	}
	data := make([]float32, n)
	for i := range data {
		data[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return Array{Shape: shape, Data: data}, nil
}

// parseHeader reads the header's Python dict literal, which must hold
// exactly 'descr', 'fortran_order' and 'shape', and returns the shape.
func parseHeader(h string) ([]int64, error) {
	p := &parser{s: strings.TrimRight(h, " \n")}
	if !p.eat('{') {
		return nil, errors.New("want a dict")
	}
	var (
		shape               []int64
		seenDescr, seenOrd  bool
		seenShape, finished bool
	)
	for !finished {
		if p.eat('}') {
			break
		}
		key, err := p.str()
		if err != nil {
			return nil, err
		}
		if !p.eat(':') {
			return nil, fmt.Errorf("want ':' after %q", key)
		}
		switch key {
		case "descr":
			if seenDescr {
				return nil, errors.New("'descr' twice")
			}
			seenDescr = true
			d, err := p.str()
			if err != nil {
				return nil, err
			}
			if d != "<f4" {
				return nil, fmt.Errorf("dtype %q, want '<f4' (little-endian float32)", d)
			}
		case "fortran_order":
			if seenOrd {
				return nil, errors.New("'fortran_order' twice")
			}
			seenOrd = true
			switch {
			case p.word("False"):
			case p.word("True"):
				return nil, errors.New("fortran_order is True; want C order (numpy.ascontiguousarray)")
			default:
				return nil, errors.New("fortran_order: want False")
			}
		case "shape":
			if seenShape {
				return nil, errors.New("'shape' twice")
			}
			seenShape = true
			if shape, err = p.tuple(); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("unknown key %q", key)
		}
		if !p.eat(',') {
			if !p.eat('}') {
				return nil, errors.New("want ',' or '}'")
			}
			finished = true
		}
	}
	if p.skip(); p.i != len(p.s) {
		return nil, errors.New("text after the dict")
	}
	if !seenDescr || !seenOrd || !seenShape {
		return nil, errors.New("want 'descr', 'fortran_order' and 'shape'")
	}
	return shape, nil
}

type parser struct {
	s string
	i int
}

func (p *parser) skip() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t' || p.s[p.i] == '\n') {
		p.i++
	}
}

func (p *parser) eat(c byte) bool {
	p.skip()
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *parser) word(w string) bool {
	p.skip()
	if strings.HasPrefix(p.s[p.i:], w) {
		p.i += len(w)
		return true
	}
	return false
}

// str reads a quoted string without escapes.
func (p *parser) str() (string, error) {
	p.skip()
	if p.i >= len(p.s) || (p.s[p.i] != '\'' && p.s[p.i] != '"') {
		return "", errors.New("want a quoted string")
	}
	q := p.s[p.i]
	end := strings.IndexByte(p.s[p.i+1:], q)
	if end < 0 {
		return "", errors.New("an unterminated string")
	}
	v := p.s[p.i+1 : p.i+1+end]
	p.i += end + 2
	return v, nil
}

// maxDims bounds a shape's rank.
const maxDims = 32

// tuple reads a tuple of non-negative ints: (), (3,), (2, 3).
func (p *parser) tuple() ([]int64, error) {
	if !p.eat('(') {
		return nil, errors.New("shape: want a tuple")
	}
	shape := []int64{}
	for {
		if p.eat(')') {
			return shape, nil
		}
		p.skip()
		j := p.i
		for j < len(p.s) && p.s[j] >= '0' && p.s[j] <= '9' {
			j++
		}
		d, err := strconv.ParseInt(p.s[p.i:j], 10, 64)
		if err != nil {
			return nil, errors.New("shape: want non-negative integers")
		}
		p.i = j
		if shape = append(shape, d); len(shape) > maxDims {
			return nil, fmt.Errorf("shape: more than %d dimensions", maxDims)
		}
		if !p.eat(',') {
			if !p.eat(')') {
				return nil, errors.New("shape: want ',' or ')'")
			}
			if len(shape) == 1 {
				return nil, errors.New("shape: a 1-tuple needs its comma, as in (3,)")
			}
			return shape, nil
		}
	}
}

// Write encodes a as a .npy file, version 1.0 (2.0 if the header needs
// it), with the header padded so that the data start on a 64-byte
// boundary, as NumPy writes it. It returns an error when len(a.Data) does
// not match a.Shape.
func Write(w io.Writer, a Array) error {
	n := int64(1)
	for _, d := range a.Shape {
		if d < 0 {
			return fmt.Errorf("npy: negative dimension in shape %v", a.Shape)
		}
		n *= d
	}
	if n != int64(len(a.Data)) {
		return fmt.Errorf("npy: %d values for shape %v", len(a.Data), a.Shape)
	}
	dims := make([]string, len(a.Shape))
	for i, d := range a.Shape {
		dims[i] = strconv.FormatInt(d, 10)
	}
	tuple := "(" + strings.Join(dims, ", ")
	if len(dims) == 1 {
		tuple += ","
	}
	tuple += ")"
	dict := "{'descr': '<f4', 'fortran_order': False, 'shape': " + tuple + ", }"
	version, lenBytes := byte(1), 2
	if len(dict)+1+10 > math.MaxUint16 {
		version, lenBytes = 2, 4
	}
	pre := len(magic) + 2 + lenBytes
	pad := (64 - (pre+len(dict)+1)%64) % 64
	header := dict + strings.Repeat(" ", pad) + "\n"
	var buf bytes.Buffer
	buf.WriteString(magic)
	buf.WriteByte(version)
	buf.WriteByte(0)
	if version == 1 {
		buf.Write(binary.LittleEndian.AppendUint16(nil, uint16(len(header))))
	} else {
		buf.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(header))))
	}
	buf.WriteString(header)
	bw := bufio.NewWriter(w)
	if _, err := bw.Write(buf.Bytes()); err != nil {
		return err
	}
	var b [4]byte
	for _, v := range a.Data {
		binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
		if _, err := bw.Write(b[:]); err != nil {
			return err
		}
	}
	return bw.Flush()
}
