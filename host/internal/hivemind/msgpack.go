package hivemind

import (
	"bytes"
	"errors"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/moehost/moehost/abi"
)

// posInf is hivemind's maxsize of an unbounded dictionary value.
var posInf = math.Inf(1)

// hivemind's msgpack serializer (MSGPackSerializer) adds extension types
// to plain msgpack: a tuple is ext 0x40 holding the packed list, a
// dictionary DHT value ext 0x50, a batch tensor descriptor ext 0x51.
const (
	extTuple      int8 = 0x40
	extDictionary int8 = 0x50
	extDescriptor int8 = 0x51
)

// packer builds hivemind msgpack with the library's encoder; ext values
// are packed into their own buffer first, since their length leads.
type packer struct {
	buf bytes.Buffer
	enc *msgpack.Encoder
	err error
}

func newPacker() *packer {
	p := &packer{}
	p.enc = msgpack.NewEncoder(&p.buf)
	p.enc.UseCompactInts(true)
	return p
}

func (p *packer) do(f func(*msgpack.Encoder) error) *packer {
	if p.err == nil {
		p.err = f(p.enc)
	}
	return p
}

func (p *packer) str(s string) *packer {
	return p.do(func(e *msgpack.Encoder) error { return e.EncodeString(s) })
}
func (p *packer) int(i int64) *packer {
	return p.do(func(e *msgpack.Encoder) error { return e.EncodeInt(i) })
}
func (p *packer) bool(b bool) *packer {
	return p.do(func(e *msgpack.Encoder) error { return e.EncodeBool(b) })
}
func (p *packer) nil() *packer { return p.do(func(e *msgpack.Encoder) error { return e.EncodeNil() }) }
func (p *packer) float(f float64) *packer {
	return p.do(func(e *msgpack.Encoder) error { return e.EncodeFloat64(f) })
}
func (p *packer) bin(b []byte) *packer {
	return p.do(func(e *msgpack.Encoder) error { return e.EncodeBytes(b) })
}
func (p *packer) mapLen(n int) *packer {
	return p.do(func(e *msgpack.Encoder) error { return e.EncodeMapLen(n) })
}
func (p *packer) arrayLen(n int) *packer {
	return p.do(func(e *msgpack.Encoder) error { return e.EncodeArrayLen(n) })
}

// raw appends already-packed msgpack.
func (p *packer) raw(b []byte) *packer {
	if p.err == nil {
		p.buf.Write(b)
	}
	return p
}

// ext appends an extension value whose body inner packs.
func (p *packer) ext(code int8, inner *packer) *packer {
	if p.err == nil && inner.err != nil {
		p.err = inner.err
	}
	body := inner.buf.Bytes()
	return p.do(func(e *msgpack.Encoder) error { return e.EncodeExtHeader(code, len(body)) }).raw(body)
}

func (p *packer) bytes() ([]byte, error) { return p.buf.Bytes(), p.err }

// Spec describes one input or output of an expert, without the batch
// dimension.
type Spec struct {
	DType abi.DType
	Shape []int
}

// Schema is what an expert takes and returns, as hivemind describes it.
type Schema struct {
	Inputs, Outputs []Spec
}

// descriptor packs a BatchTensorDescriptor (ext 0x51): a map with exactly
// the keys hivemind's unpacker passes to its constructor.
func descriptor(s Spec, requiresGrad bool, comp int64) *packer {
	size := newPacker().arrayLen(1 + len(s.Shape)).nil()
	for _, d := range s.Shape {
		size.int(int64(d))
	}
	m := newPacker().mapLen(8).
		str("size").ext(extTuple, size).
		str("dtype").str(torchName(s.DType)).
		str("layout").str("torch.strided").
		str("requires_grad").bool(requiresGrad).
		str("pin_memory").bool(false).
		str("compression").int(comp).
		str("device_type").str("cpu").
		str("device_index").nil()
	return newPacker().ext(extDescriptor, m)
}

// tuple packs a tuple of the given packed items.
func tuple(items ...*packer) *packer {
	l := newPacker().arrayLen(len(items))
	for _, it := range items {
		b, err := it.bytes()
		if err != nil {
			l.err = err
		}
		l.raw(b)
	}
	return newPacker().ext(extTuple, l)
}

// InfoBytes packs rpc_info's answer for an expert: forward_schema
// ((inputs…), {}), outputs_schema (a descriptor, or a tuple of them for
// several outputs) and keyword_names (), all as hivemind's
// ModuleBackend.get_info gives them. comp is the compression the client
// should send inputs with and will get outputs in.
func InfoBytes(s Schema, comp int64) ([]byte, error) {
	if len(s.Inputs) == 0 || len(s.Outputs) == 0 {
		return nil, errors.New("an expert needs at least one input and one output")
	}
	args := make([]*packer, len(s.Inputs))
	for i, in := range s.Inputs {
		args[i] = descriptor(in, false, comp)
	}
	var outputs *packer
	if len(s.Outputs) == 1 {
		outputs = descriptor(s.Outputs[0], true, comp)
	} else {
		outs := make([]*packer, len(s.Outputs))
		for i, o := range s.Outputs {
			outs[i] = descriptor(o, true, comp)
		}
		outputs = tuple(outs...)
	}
	forward := tuple(tuple(args...), newPacker().mapLen(0))
	p := newPacker().mapLen(3).
		str("forward_schema").raw(mustBytes(forward)).
		str("outputs_schema").raw(mustBytes(outputs)).
		str("keyword_names").raw(mustBytes(tuple()))
	if forward.err != nil || outputs.err != nil {
		return nil, errors.Join(forward.err, outputs.err)
	}
	return p.bytes()
}

func mustBytes(p *packer) []byte { b, _ := p.bytes(); return b }

// packString is hivemind's msgpack of a string (a DHT key or value).
func packString(s string) []byte {
	b, _ := newPacker().str(s).bytes()
	return b
}

// packInt is hivemind's msgpack of an int (a DHT subkey).
func packInt(i int64) []byte {
	b, _ := newPacker().int(i).bytes()
	return b
}

// packUIDPeer is the value of a grid prefix's subkey: the tuple (uid,
// peer ID in base58).
func packUIDPeer(uid, peer string) []byte {
	b, _ := tuple(newPacker().str(uid), newPacker().str(peer)).bytes()
	return b
}

// maxDictionaryItems bounds the entries of a dictionary value a peer may
// send; a grid prefix has one per expert under it.
const maxDictionaryItems = 1 << 16

// dictItem is one entry of a dictionary DHT value: a packed subkey, a
// packed value and its expiration.
type dictItem struct {
	subkey, value []byte
	expiration    float64
}

// packDictionary packs a dictionary DHT value (ext 0x50):
// [maxsize, latest_expiration, [[subkey, value bytes, expiration]…]].
func packDictionary(items []dictItem) []byte {
	latest := 0.0
	for _, it := range items {
		latest = max(latest, it.expiration)
	}
	body := newPacker().arrayLen(3).float(posInf).float(latest).arrayLen(len(items))
	for _, it := range items {
		body.arrayLen(3).raw(it.subkey).bin(it.value).float(it.expiration)
	}
	b, _ := newPacker().ext(extDictionary, body).bytes()
	return b
}

// unpackDictionary reads a dictionary DHT value a peer sent.
func unpackDictionary(b []byte) ([]dictItem, error) {
	d := msgpack.NewDecoder(bytes.NewReader(b))
	code, n, err := d.DecodeExtHeader()
	if err != nil {
		return nil, fmt.Errorf("dictionary value: %w", err)
	}
	if code != extDictionary || n != len(b)-headerLen(b) {
		return nil, fmt.Errorf("dictionary value: ext type %#x of %d bytes", code, n)
	}
	if l, err := d.DecodeArrayLen(); err != nil || l != 3 {
		return nil, fmt.Errorf("dictionary value: want [maxsize, latest, items], got %d items (%v)", l, err)
	}
	if err := d.Skip(); err != nil {
		return nil, fmt.Errorf("dictionary value: maxsize: %w", err)
	}
	if err := d.Skip(); err != nil {
		return nil, fmt.Errorf("dictionary value: latest expiration: %w", err)
	}
	l, err := d.DecodeArrayLen()
	if err != nil || l < 0 || l > maxDictionaryItems {
		return nil, fmt.Errorf("dictionary value: %d items (at most %d): %v", l, maxDictionaryItems, err)
	}
	items := make([]dictItem, 0, min(l, 1024))
	for range l {
		if k, err := d.DecodeArrayLen(); err != nil || k != 3 {
			return nil, fmt.Errorf("dictionary item: want [subkey, value, expiration]: %v", err)
		}
		sub, err := d.DecodeRaw()
		if err != nil {
			return nil, fmt.Errorf("dictionary subkey: %w", err)
		}
		val, err := d.DecodeBytes()
		if err != nil {
			return nil, fmt.Errorf("dictionary value bytes: %w", err)
		}
		exp, err := d.DecodeFloat64()
		if err != nil {
			return nil, fmt.Errorf("dictionary expiration: %w", err)
		}
		items = append(items, dictItem{subkey: sub, value: val, expiration: exp})
	}
	return items, nil
}

// headerLen is the length of the ext header that starts b.
func headerLen(b []byte) int {
	if len(b) == 0 {
		return 0
	}
	switch b[0] {
	case msgpcode.FixExt1, msgpcode.FixExt2, msgpcode.FixExt4, msgpcode.FixExt8, msgpcode.FixExt16:
		return 2
	case msgpcode.Ext8:
		return 3
	case msgpcode.Ext16:
		return 4
	case msgpcode.Ext32:
		return 6
	}
	return 0
}
