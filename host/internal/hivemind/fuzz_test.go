package hivemind

import (
	"bufio"
	"bytes"
	"context"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	hivemindv1 "github.com/moehost/moehost/gen/hivemind/v1"
)

// The decoders of a peer's bytes: none may panic, and none may allocate
// past its limit (the limits are small here, so an unchecked allocation
// from a forged length would show as an out-of-memory crash).

func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 3, 'a', 'b', 'c'})
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		for {
			_, p, err := readFrame(r, 1<<10)
			if err != nil {
				return
			}
			if len(p) > 1<<10 {
				t.Fatalf("frame of %d bytes over the limit", len(p))
			}
		}
	})
}

func FuzzReadDelimited(f *testing.F) {
	f.Add([]byte{3, 'a', 'b', 'c'})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := readDelimited(bufio.NewReader(bytes.NewReader(b)), 1<<10)
		if err == nil && len(p) > 1<<10 {
			t.Fatalf("message of %d bytes over the limit", len(p))
		}
	})
}

func FuzzDecodeTensor(f *testing.F) {
	seed, _ := proto.Marshal(&hivemindv1.Tensor{Dtype: "float32", Size: []uint32{2, 2}, Buffer: make([]byte, 16)})
	f.Add(seed)
	seed, _ = proto.Marshal(&hivemindv1.Tensor{Dtype: "float32", Size: []uint32{2, 2}, Buffer: make([]byte, 24), Compression: hivemindv1.CompressionType_COMPRESSION_TYPE_MEANSTD_16BIT})
	f.Add(seed)
	seed, _ = proto.Marshal(&hivemindv1.Tensor{Dtype: "float16", Size: []uint32{4}, Buffer: append(make([]byte, 8), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), Compression: hivemindv1.CompressionType_COMPRESSION_TYPE_UNIFORM_8BIT})
	f.Add(seed)
	f.Fuzz(func(t *testing.T, b []byte) {
		var pb hivemindv1.Tensor
		if proto.Unmarshal(b, &pb) != nil {
			return
		}
		got, err := DecodeTensor(&pb, 1<<12)
		if err != nil {
			return
		}
		n := got.DType.Size()
		for _, d := range got.Shape {
			n *= d
		}
		if n != len(got.Data) || len(got.Data) > 1<<12 {
			t.Fatalf("decoded %d bytes for shape %v of %v (limit %d)", len(got.Data), got.Shape, got.DType, 1<<12)
		}
	})
}

func FuzzUnpackDictionary(f *testing.F) {
	f.Add(packDictionary([]dictItem{{subkey: packInt(1), value: []byte("v"), expiration: 1}}))
	f.Add([]byte{0xc7, 0x05, 0x50, 0x93, 0xcb, 0x7f, 0xf0})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = unpackDictionary(b)
	})
}

// FuzzHandlers feeds arbitrary payloads to the unary DHT and RPC handlers.
func FuzzHandlers(f *testing.F) {
	seed, _ := proto.Marshal(&hivemindv1.StoreRequest{Keys: [][]byte{make([]byte, 20)}, Subkeys: [][]byte{{}}, Values: [][]byte{{0xc7, 0x01, 0x50, 0x90}}, ExpirationTime: []float64{1e12}, InCache: []bool{false}})
	f.Add(seed)
	seed, _ = proto.Marshal(&hivemindv1.ExpertRequest{Uid: "ffn.0", Tensors: []*hivemindv1.Tensor{{Dtype: "float32", Size: []uint32{1, 4}, Buffer: make([]byte, 16)}}})
	f.Add(seed)
	s := &Server{cfg: Config{MaxRequestBytes: 1 << 12}, experts: fakeExperts{}}
	s.dht = &node{s: s, store: map[dhtID]*entry{}, peers: map[peer.ID]dhtID{}}
	f.Fuzz(func(t *testing.T, b []byte) {
		ctx := context.Background()
		_, _ = s.dht.rpcStore(ctx, "", b)
		_, _ = s.dht.rpcFind(ctx, "", b)
		_, _ = s.rpcForward(ctx, "", b)
		_, _ = s.rpcBackward(ctx, "", b)
		_, _ = s.rpcInfo(ctx, "", b)
		_, _ = s.streamCall(ctx, bytes.NewReader(b), false)
	})
}
