package hivemind

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"google.golang.org/protobuf/proto"

	"github.com/moehost/moehost/abi"
	hivemindv1 "github.com/moehost/moehost/gen/hivemind/v1"
)

// fakeExperts host "lin.0" and "lin.1": y = 2x + 1 over [batch, 4]
// float32; backward returns 2·g and counts the steps.
type fakeExperts struct{ steps *atomic.Int64 }

func (fakeExperts) HivemindUIDs() []string { return []string{"lin.0", "lin.1"} }

func (fakeExperts) HivemindSchema(uid string) (Schema, error) {
	if uid != "lin.0" && uid != "lin.1" {
		return Schema{}, fmt.Errorf("%w: no expert %q", ErrNotFound, uid)
	}
	sp := Spec{DType: abi.DTypeFloat32, Shape: []int{4}}
	return Schema{Inputs: []Spec{sp}, Outputs: []Spec{sp}}, nil
}

func check(ts []Tensor) error {
	for _, t := range ts {
		if t.DType != abi.DTypeFloat32 || len(t.Shape) != 2 || t.Shape[1] != 4 {
			return fmt.Errorf("%w: want float32 [batch, 4], got %v %v", ErrInvalid, t.DType, t.Shape)
		}
	}
	return nil
}

func (fakeExperts) HivemindForward(_ context.Context, _ string, in []Tensor) ([]Tensor, error) {
	if err := check(in); err != nil {
		return nil, err
	}
	x := float32s(in[0].Data)
	for i := range x {
		x[i] = 2*x[i] + 1
	}
	return []Tensor{{DType: abi.DTypeFloat32, Shape: in[0].Shape, Data: float32Bytes(x)}}, nil
}

func (f fakeExperts) HivemindBackward(_ context.Context, _ string, in, g []Tensor) ([]Tensor, error) {
	if err := check(append(in, g...)); err != nil {
		return nil, err
	}
	if f.steps != nil {
		f.steps.Add(1)
	}
	x := float32s(g[0].Data)
	for i := range x {
		x[i] *= 2
	}
	return []Tensor{{DType: abi.DTypeFloat32, Shape: g[0].Shape, Data: float32Bytes(x)}}, nil
}

func newTestServer(t *testing.T, experts Experts, peers []string) *Server {
	t.Helper()
	s, err := New(context.Background(), Config{DataDir: t.TempDir(), Listen: []string{"/ip4/127.0.0.1/tcp/0"}, InitialPeers: peers, UpdatePeriod: time.Second}, experts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

func tensorPB(rows int, v float32) *hivemindv1.Tensor {
	x := make([]float32, rows*4)
	for i := range x {
		x[i] = v + float32(i)
	}
	return &hivemindv1.Tensor{Dtype: "float32", Size: []uint32{uint32(rows), 4}, Buffer: float32Bytes(x)}
}

// TestUnaryRPC calls the expert RPC over a real libp2p connection in the
// p2p daemon's framing.
func TestUnaryRPC(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, fakeExperts{}, nil)
	cli := newTestServer(t, fakeExperts{}, srv.Addrs())
	ctx := context.Background()
	target := srv.host.ID()

	b, err := cli.dht.callUnary(ctx, target, "ConnectionHandler.rpc_forward", &hivemindv1.ExpertRequest{Uid: "lin.1", Tensors: []*hivemindv1.Tensor{tensorPB(3, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	var res hivemindv1.ExpertResponse
	if err := proto.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	got := float32s(res.GetTensors()[0].GetBuffer())
	for i, g := range got {
		if want := 2*(1+float32(i)) + 1; g != want {
			t.Fatalf("output %d = %v, want %v", i, g, want)
		}
	}
	if len(got) != 12 || res.GetTensors()[0].GetDtype() != "float32" {
		t.Fatalf("got %d values of %q", len(got), res.GetTensors()[0].GetDtype())
	}

	for _, tt := range []struct {
		name, proto, want string
		req               proto.Message
	}{
		{"unknown uid", "ConnectionHandler.rpc_forward", "KeyError(", &hivemindv1.ExpertRequest{Uid: "lin.9", Tensors: []*hivemindv1.Tensor{tensorPB(1, 0)}}},
		{"wrong shape", "ConnectionHandler.rpc_forward", "ValueError(", &hivemindv1.ExpertRequest{Uid: "lin.0", Tensors: []*hivemindv1.Tensor{{Dtype: "float32", Size: []uint32{1, 3}, Buffer: make([]byte, 12)}}}},
		{"short buffer", "ConnectionHandler.rpc_forward", "ValueError(", &hivemindv1.ExpertRequest{Uid: "lin.0", Tensors: []*hivemindv1.Tensor{{Dtype: "float32", Size: []uint32{1, 4}, Buffer: make([]byte, 12)}}}},
		{"backward without grads", "ConnectionHandler.rpc_backward", "ValueError(", &hivemindv1.ExpertRequest{Uid: "lin.0", Tensors: []*hivemindv1.Tensor{tensorPB(1, 0)}}},
		{"info unknown", "ConnectionHandler.rpc_info", "KeyError(", &hivemindv1.ExpertUID{Uid: "nope.1"}},
	} {
		_, err := cli.dht.callUnary(ctx, target, tt.proto, tt.req)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want %s…", tt.name, err, tt.want)
		}
	}

	// Garbage frames: the handler resets the stream and the host stays up.
	st, err := cli.host.NewStream(ctx, target, "ConnectionHandler.rpc_forward")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = st.Write([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})
	if _, err := bufio.NewReader(st).ReadByte(); err == nil {
		t.Error("a garbage frame got an answer")
	}
	_ = st.Close()
	if _, err := cli.dht.callUnary(ctx, target, "ConnectionHandler.rpc_info", &hivemindv1.ExpertUID{Uid: "lin.0"}); err != nil {
		t.Fatalf("after garbage: %v", err)
	}
}

// streamCall calls a stream handler as hivemind's client does: one
// request per part, END_OF_STREAM, then read frames to EOF.
func streamCall(ctx context.Context, cli *Server, target peer.ID, name string, uid string, ts []*hivemindv1.Tensor, part int) ([]*hivemindv1.Tensor, error) {
	st, err := cli.host.NewStream(ctx, target, protocol.ID("ConnectionHandler."+name))
	if err != nil {
		return nil, err
	}
	defer st.Close()
	for _, t := range ts {
		for _, p := range splitTensor(t, part) {
			b, _ := proto.Marshal(&hivemindv1.ExpertRequest{Uid: uid, Tensors: []*hivemindv1.Tensor{p}})
			if err := writeFrame(st, markerMessage, b); err != nil {
				return nil, err
			}
		}
	}
	if err := writeFrame(st, markerError, nil); err != nil {
		return nil, err
	}
	var parts []*hivemindv1.Tensor
	r := bufio.NewReader(st)
	for {
		m, b, err := readFrame(r, maxFrameBytes)
		if err != nil {
			break
		}
		if m == markerError {
			var e hivemindv1.RPCError
			_ = proto.Unmarshal(b, &e)
			return nil, errors.New(e.GetMessage())
		}
		var res hivemindv1.ExpertResponse
		if err := proto.Unmarshal(b, &res); err != nil {
			return nil, err
		}
		parts = append(parts, res.GetTensors()...)
	}
	var out []*hivemindv1.Tensor
	for _, p := range parts {
		if p.GetDtype() != "" || len(out) == 0 {
			out = append(out, p)
		} else {
			out[len(out)-1].Buffer = append(out[len(out)-1].Buffer, p.GetBuffer()...)
		}
	}
	return out, nil
}

// TestStreamRPC sends a request over the unary limit through the stream
// handlers, in parts, forward and backward.
func TestStreamRPC(t *testing.T) {
	t.Parallel()
	var steps atomic.Int64
	srv := newTestServer(t, fakeExperts{steps: &steps}, nil)
	cli := newTestServer(t, fakeExperts{}, srv.Addrs())
	ctx := context.Background()
	rows := (MaxUnaryBytes + 4096) / 16 // over the unary limit
	in := tensorPB(rows, 0)
	out, err := streamCall(ctx, cli, srv.host.ID(), "rpc_forward_stream", "lin.0", []*hivemindv1.Tensor{in}, partBytes)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || len(out[0].GetBuffer()) != 16*rows {
		t.Fatalf("got %d tensors", len(out))
	}
	got := float32s(out[0].GetBuffer())
	for i := 0; i < len(got); i += 997 {
		if want := 2*float32(i) + 1; got[i] != want {
			t.Fatalf("output %d = %v, want %v", i, got[i], want)
		}
	}
	grads, err := streamCall(ctx, cli, srv.host.ID(), "rpc_backward_stream", "lin.0", []*hivemindv1.Tensor{tensorPB(2, 0), tensorPB(2, 3)}, 5)
	if err != nil {
		t.Fatal(err)
	}
	if g := float32s(grads[0].GetBuffer()); len(g) != 8 || g[0] != 6 || g[7] != 20 || steps.Load() != 1 {
		t.Fatalf("grads %v, steps %d", g, steps.Load())
	}
	// Errors come back as an error frame.
	if _, err := streamCall(ctx, cli, srv.host.ID(), "rpc_forward_stream", "lin.7", []*hivemindv1.Tensor{tensorPB(1, 0)}, partBytes); err == nil || !strings.HasPrefix(err.Error(), "KeyError(") {
		t.Fatalf("unknown uid: %v", err)
	}
	// A frame announced over the limit is refused before it is read.
	st, err := cli.host.NewStream(ctx, srv.host.ID(), "ConnectionHandler.rpc_forward_stream")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = st.Write(append([]byte{0}, binary.BigEndian.AppendUint64(nil, 1<<50)...))
	m, b, err := readFrame(bufio.NewReader(st), maxFrameBytes)
	if err != nil || m != markerError || !strings.Contains(string(b), "frame too large") {
		t.Fatalf("huge frame: %v %q %v", m, b, err)
	}
	_ = st.Close()
}

// TestDHT announces from one node and finds the records from another, as
// a hivemind client's get would: regular uid keys and grid dictionaries.
func TestDHT(t *testing.T) {
	t.Parallel()
	a := newTestServer(t, fakeExperts{}, nil)
	b := newTestServer(t, fakeExperts{}, a.Addrs())
	if len(b.dht.nearest(dhtID{}, 5, nil)) != 1 || len(a.dht.nearest(dhtID{}, 5, nil)) != 1 {
		t.Fatalf("routing tables: a %d, b %d peers", len(a.dht.peers), len(b.dht.peers))
	}
	ctx := context.Background()
	b.dht.announce(ctx) // stores on a too
	keys := [][]byte{}
	for _, k := range []string{"lin.0", "lin.0.", "nothing"} {
		id := keyID(packString(k))
		keys = append(keys, id[:])
	}
	raw, err := b.dht.callUnary(ctx, a.host.ID(), "DHTProtocol.rpc_find", &hivemindv1.FindRequest{Keys: keys, Peer: b.dht.info()})
	if err != nil {
		t.Fatal(err)
	}
	var res hivemindv1.FindResponse
	if err := proto.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}
	r := res.GetResults()
	if len(r) != 3 {
		t.Fatalf("%d results", len(r))
	}
	if r[0].GetType() != hivemindv1.ResultType_RESULT_TYPE_FOUND_REGULAR || string(r[0].GetValue()) != string(packString(b.PeerID())) {
		t.Errorf("uid: %v %q", r[0].GetType(), r[0].GetValue())
	}
	items, err := unpackDictionary(r[1].GetValue())
	if r[1].GetType() != hivemindv1.ResultType_RESULT_TYPE_FOUND_DICTIONARY || err != nil || len(items) != 1 ||
		string(items[0].subkey) != string(packInt(-1)) || string(items[0].value) != string(packUIDPeer("lin.0", b.PeerID())) {
		t.Errorf("prefix: %v %+v %v", r[1].GetType(), items, err)
	}
	if r[2].GetType() != hivemindv1.ResultType_RESULT_TYPE_NOT_FOUND {
		t.Errorf("missing key: %v", r[2].GetType())
	}
	if exp := r[0].GetExpirationTime() - dhtNow(); exp < 2 || exp > 3.5 {
		t.Errorf("expires in %.1f s, want max(2×1 s, 3 s)", exp)
	}
	// The find reply names b, the only other peer a knows, as nearest.
	if got := r[2].GetNearestPeerIds(); len(got) != 0 {
		// b asked, so b is left out.
		t.Errorf("nearest peers for the asker itself: %d", len(got))
	}
}
