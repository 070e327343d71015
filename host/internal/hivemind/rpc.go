package hivemind

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	hivemindv1 "github.com/moehost/moehost/gen/hivemind/v1"
)

// callTimeout bounds one call on a stream, reading included, so that a
// peer that stops sending does not hold a handler forever.
const callTimeout = 10 * time.Minute

// pyRepr formats err as hivemind's handlers report exceptions
// (repr(exception)), so that the client's P2PHandlerError reads as it
// would against hivemind's own server.
func pyRepr(err error) string {
	kind := "RuntimeError"
	switch {
	case errors.Is(err, ErrNotFound):
		kind = "KeyError"
	case errors.Is(err, ErrInvalid), errors.Is(err, ErrBadTensor), errors.Is(err, ErrFrameTooLarge):
		kind = "ValueError"
	}
	msg := strings.ReplaceAll(strings.ReplaceAll(err.Error(), `\`, `\\`), `'`, `\'`)
	return kind + "('" + msg + "')"
}

// unaryHandler serves one unary protocol in the p2p daemon's framing:
// read one delimited frame with a call, answer one with the response or
// the error's text, close. A caller that half-closes cancels the call,
// as the daemon does.
func (s *Server) unaryHandler(name string, h func(context.Context, peer.ID, []byte) ([]byte, error)) network.StreamHandler {
	return func(st network.Stream) {
		defer st.Close()
		_ = st.SetDeadline(time.Now().Add(callTimeout))
		br := bufio.NewReader(st)
		b, err := readDelimited(br, MaxUnaryBytes)
		if err != nil {
			s.log.Debug("hivemind: bad unary frame", "protocol", name, "peer", st.Conn().RemotePeer().String(), "err", err)
			_ = st.Reset()
			return
		}
		var req hivemindv1.UnaryFrame
		if err := proto.Unmarshal(b, &req); err != nil || req.GetCallUnary() == nil || len(req.GetCallId()) != 16 {
			s.log.Debug("hivemind: bad unary call", "protocol", name, "peer", st.Conn().RemotePeer().String(), "err", err)
			_ = st.Reset()
			return
		}
		ctx, cancel := context.WithCancel(s.ctx)
		defer cancel()
		go func() {
			var one [1]byte
			if _, err := br.Read(one[:]); err != nil {
				cancel()
			}
		}()
		out, err := h(ctx, st.Conn().RemotePeer(), req.GetCallUnary().GetData())
		if err == nil && len(out) > MaxUnaryBytes-64 {
			err = fmt.Errorf("%w: the response is %d bytes, over the unary limit of %d; send the request through the streaming handler", ErrInvalid, len(out), MaxUnaryBytes)
		}
		res := &hivemindv1.UnaryResult{}
		if err != nil {
			if !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrBadTensor) {
				s.log.Debug("hivemind: call failed", "protocol", name, "err", err)
			}
			res.Result = &hivemindv1.UnaryResult_Error{Error: []byte(pyRepr(err))}
		} else {
			res.Result = &hivemindv1.UnaryResult_Response{Response: out}
		}
		frame, _ := proto.Marshal(&hivemindv1.UnaryFrame{CallId: req.GetCallId(), Message: &hivemindv1.UnaryFrame_UnaryResponse{UnaryResponse: res}})
		_ = writeDelimited(st, frame)
	}
}

// rpcInfo answers ConnectionHandler.rpc_info with the msgpack schema.
func (s *Server) rpcInfo(_ context.Context, _ peer.ID, data []byte) ([]byte, error) {
	var req hivemindv1.ExpertUID
	if err := proto.Unmarshal(data, &req); err != nil {
		return nil, fmt.Errorf("%w: ExpertUID: %w", ErrInvalid, err)
	}
	schema, err := s.experts.HivemindSchema(req.GetUid())
	if err != nil {
		return nil, err
	}
	info, err := InfoBytes(schema, int64(hivemindv1.CompressionType_COMPRESSION_TYPE_NONE))
	if err != nil {
		return nil, fmt.Errorf("expert %q: %w", req.GetUid(), err)
	}
	return proto.Marshal(&hivemindv1.ExpertInfo{SerializedInfo: info})
}

func (s *Server) rpcForward(ctx context.Context, _ peer.ID, data []byte) ([]byte, error) {
	return s.unaryCall(ctx, data, false)
}

func (s *Server) rpcBackward(ctx context.Context, _ peer.ID, data []byte) ([]byte, error) {
	return s.unaryCall(ctx, data, true)
}

// unaryCall decodes a unary ExpertRequest, runs it and encodes the
// response.
func (s *Server) unaryCall(ctx context.Context, data []byte, backward bool) ([]byte, error) {
	var req hivemindv1.ExpertRequest
	if err := proto.Unmarshal(data, &req); err != nil {
		return nil, fmt.Errorf("%w: ExpertRequest: %w", ErrInvalid, err)
	}
	outs, err := s.call(ctx, req.GetUid(), req.GetTensors(), backward)
	if err != nil {
		return nil, err
	}
	return proto.Marshal(&hivemindv1.ExpertResponse{Tensors: outs})
}

// call decodes the tensors of one request, runs it through the expert and
// encodes the results as the schema says.
func (s *Server) call(ctx context.Context, uid string, pbs []*hivemindv1.Tensor, backward bool) ([]*hivemindv1.Tensor, error) {
	schema, err := s.experts.HivemindSchema(uid)
	if err != nil {
		return nil, err
	}
	want := len(schema.Inputs)
	if backward {
		want += len(schema.Outputs)
	}
	if len(pbs) != want {
		what := "inputs"
		if backward {
			what = "inputs and output gradients"
		}
		return nil, fmt.Errorf("%w: expert %q takes %d %s, got %d tensors", ErrInvalid, uid, want, what, len(pbs))
	}
	ts := make([]Tensor, len(pbs))
	budget := s.cfg.MaxRequestBytes
	for i, pb := range pbs {
		t, err := DecodeTensor(pb, budget)
		if err != nil {
			return nil, fmt.Errorf("expert %q: tensor %d: %w", uid, i, err)
		}
		budget -= len(t.Data)
		ts[i] = t
	}
	var outs []Tensor
	if backward {
		outs, err = s.experts.HivemindBackward(ctx, uid, ts[:len(schema.Inputs)], ts[len(schema.Inputs):])
	} else {
		outs, err = s.experts.HivemindForward(ctx, uid, ts)
	}
	if err != nil {
		return nil, err
	}
	res := make([]*hivemindv1.Tensor, len(outs))
	for i, t := range outs {
		if res[i], err = EncodeTensor(t, hivemindv1.CompressionType_COMPRESSION_TYPE_NONE); err != nil {
			return nil, fmt.Errorf("expert %q: output %d: %w", uid, i, err)
		}
	}
	return res, nil
}

// streamHandler serves rpc_forward_stream or rpc_backward_stream in
// hivemind's stream framing: it reads the request's parts until the
// caller's end-of-stream frame, charging each frame against the request
// budget before reading it, runs the call, and writes the results in
// parts of partBytes, or one error frame, then closes.
func (s *Server) streamHandler(backward bool) network.StreamHandler {
	return func(st network.Stream) {
		defer st.Close()
		_ = st.SetDeadline(time.Now().Add(callTimeout))
		ctx, cancel := context.WithCancel(s.ctx)
		defer cancel()
		s.log.Debug("hivemind: stream call", "protocol", string(st.Protocol()), "peer", st.Conn().RemotePeer().String())
		outs, err := s.streamCall(ctx, bufio.NewReader(st), backward)
		if err != nil {
			msg := pyRepr(err)
			b, _ := proto.Marshal(&hivemindv1.RPCError{Message: &msg})
			_ = writeFrame(st, markerError, b)
			return
		}
		for _, t := range outs {
			for _, part := range splitTensor(t, partBytes) {
				b, _ := proto.Marshal(&hivemindv1.ExpertResponse{Tensors: []*hivemindv1.Tensor{part}})
				if err := writeFrame(st, markerMessage, b); err != nil {
					_ = st.Reset()
					return
				}
			}
		}
	}
}

// streamCall gathers a streamed request and runs it.
func (s *Server) streamCall(ctx context.Context, r io.Reader, backward bool) ([]*hivemindv1.Tensor, error) {
	var (
		uid     string
		tensors []*hivemindv1.Tensor
		budget  = s.cfg.MaxRequestBytes
	)
	for {
		marker, b, err := readFrame(r, min(maxFrameBytes, budget+64<<10))
		if err != nil {
			if errors.Is(err, io.EOF) {
				break // a caller that closes instead of sending END_OF_STREAM
			}
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		if marker == markerError {
			var e hivemindv1.RPCError
			if err := proto.Unmarshal(b, &e); err != nil {
				return nil, fmt.Errorf("%w: error frame: %w", ErrInvalid, err)
			}
			if e.Message != nil {
				return nil, fmt.Errorf("%w: the caller sent an error: %s", ErrInvalid, e.GetMessage())
			}
			break // END_OF_STREAM
		}
		var req hivemindv1.ExpertRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			return nil, fmt.Errorf("%w: ExpertRequest: %w", ErrInvalid, err)
		}
		if uid == "" {
			uid = req.GetUid()
		} else if req.GetUid() != uid {
			return nil, fmt.Errorf("%w: expert uids differ in one request (%q, %q)", ErrInvalid, uid, req.GetUid())
		}
		for _, part := range req.GetTensors() {
			budget -= len(part.GetBuffer())
			if budget < 0 {
				return nil, fmt.Errorf("%w: the request's tensors exceed %d bytes", ErrInvalid, s.cfg.MaxRequestBytes)
			}
			if part.GetDtype() != "" || len(tensors) == 0 {
				tensors = append(tensors, part)
				continue
			}
			last := tensors[len(tensors)-1]
			last.Buffer = append(last.Buffer, part.GetBuffer()...)
		}
	}
	return s.call(ctx, uid, tensors, backward)
}

// splitTensor cuts a serialized tensor into parts of at most size bytes
// of buffer: the first carries the description and the part count, the
// rest only buffer.
func splitTensor(t *hivemindv1.Tensor, size int) []*hivemindv1.Tensor {
	buf := t.GetBuffer()
	n := max(1, (len(buf)+size-1)/size)
	first := &hivemindv1.Tensor{
		Size: t.GetSize(), RequiresGrad: t.GetRequiresGrad(), Dtype: t.GetDtype(), Compression: t.GetCompression(),
		Chunks: int32(n), Buffer: buf[:min(size, len(buf))],
	}
	parts := []*hivemindv1.Tensor{first}
	for off := size; off < len(buf); off += size {
		parts = append(parts, &hivemindv1.Tensor{Buffer: buf[off:min(off+size, len(buf))]})
	}
	return parts
}
