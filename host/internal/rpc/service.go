package rpc

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/abi/half"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/sdk/wire"
)

type service struct {
	experts Experts
}

func (s *service) lookup(uid string) (Expert, error) {
	if uid == "" {
		return nil, errorf(connect.CodeInvalidArgument, "uid is empty")
	}
	e, ok := s.experts.Expert(uid)
	if !ok {
		return nil, errorf(connect.CodeNotFound, "no expert %q on this server; %s", uid, s.served())
	}
	return e, nil
}

// maxListedUIDs bounds the uids a NotFound message names.
const maxListedUIDs = 5

// served says which uids the server has, for NotFound messages: the first
// few, and ListExperts for the rest.
func (s *service) served() string {
	all := s.experts.All()
	if len(all) == 0 {
		return "it serves no experts"
	}
	n := min(len(all), maxListedUIDs)
	uids := make([]string, n)
	for i, e := range all[:n] {
		uids[i] = strconv.Quote(e.Info().GetUid())
	}
	list := strings.Join(uids, ", ")
	if len(all) > n {
		list += fmt.Sprintf(", … (%d in all)", len(all))
	}
	return "it serves " + list + "; ListExperts describes them all"
}

// Guarded is an Expert with an owner and access rules, which Forward and
// Backward check against CallerFrom before they decode anything. Experts
// that do not implement it are public.
type Guarded interface {
	// Access returns the expert's owner tenant ("" for the operator) and
	// who may call Forward and Backward.
	Access() (owner string, forward, backward Access)
}

// checkAccess applies e's access rule for one procedure, if it has one;
// its messages name the procedure as verb "uid" (nothing when verb is
// empty), formatted only when the rule is not public.
func checkAccess(ctx context.Context, e Expert, backward bool, verb, uid string) error {
	g, ok := e.(Guarded)
	if !ok {
		return nil
	}
	owner, fwd, bwd := g.Access()
	a := fwd
	if backward {
		a = bwd
	}
	if a == AccessPublic {
		return nil
	}
	what := ""
	if verb != "" {
		what = fmt.Sprintf("%s %q", verb, uid)
	}
	return CallerFrom(ctx).Check(a, owner, what)
}

func (s *service) Forward(ctx context.Context, req *connect.Request[moehostv1.ForwardRequest]) (*connect.Response[moehostv1.ForwardResponse], error) {
	uid := req.Msg.GetUid()
	e, err := s.lookup(uid)
	if err != nil {
		return nil, err
	}
	if err := checkAccess(ctx, e, false, "forward", uid); err != nil {
		return nil, err
	}
	outDType, err := CheckWireDType(req.Msg.GetOutputDtype())
	if err != nil {
		return nil, errorf(connect.CodeInvalidArgument, "forward %q: output_dtype: %w", uid, err)
	}
	inSchema, _ := e.Schema()
	inputs, _, err := decodeAll(e.Device(), req.Msg.GetInputs(), inSchema, "input", -1)
	if err != nil {
		return nil, fmt.Errorf("forward %q: %w", uid, err)
	}
	// Forward takes the inputs; the outputs are ours, and the response
	// holds copies.
	outputs, err := e.Forward(ctx, inputs)
	if err != nil {
		return nil, fmt.Errorf("forward %q: %w", uid, err)
	}
	defer e.Device().Release(outputs...)
	pb, err := encodeAll(e.Device(), outputs, outDType)
	if err != nil {
		return nil, fmt.Errorf("forward %q: %w", uid, err)
	}
	return connect.NewResponse(&moehostv1.ForwardResponse{Outputs: pb}), nil
}

func (s *service) Backward(ctx context.Context, req *connect.Request[moehostv1.BackwardRequest]) (*connect.Response[moehostv1.BackwardResponse], error) {
	uid := req.Msg.GetUid()
	e, err := s.lookup(uid)
	if err != nil {
		return nil, err
	}
	if err := checkAccess(ctx, e, true, "backward", uid); err != nil {
		return nil, err
	}
	gradDType, err := CheckWireDType(req.Msg.GetGradInputDtype())
	if err != nil {
		return nil, errorf(connect.CodeInvalidArgument, "backward %q: grad_input_dtype: %w", uid, err)
	}
	inSchema, outSchema := e.Schema()
	inputs, batch, err := decodeAll(e.Device(), req.Msg.GetInputs(), inSchema, "input", -1)
	if err != nil {
		return nil, fmt.Errorf("backward %q: %w", uid, err)
	}
	grads, _, err := decodeAll(e.Device(), req.Msg.GetGradOutputs(), outSchema, "grad_output", batch)
	if err != nil {
		e.Device().Release(inputs...)
		return nil, fmt.Errorf("backward %q: %w", uid, err)
	}
	// Backward takes inputs and grads; the gradients are ours.
	gradInputs, err := e.Backward(ctx, inputs, grads)
	if err != nil {
		return nil, fmt.Errorf("backward %q: %w", uid, err)
	}
	defer e.Device().Release(gradInputs...)
	pb, err := encodeAll(e.Device(), gradInputs, gradDType)
	if err != nil {
		return nil, fmt.Errorf("backward %q: %w", uid, err)
	}
	return connect.NewResponse(&moehostv1.BackwardResponse{GradInputs: pb}), nil
}

// Info and ListExperts describe an expert only to callers who may call its
// Forward: a private expert's config, schema and traffic are its owner's
// business. Info answers the others as Forward would; ListExperts leaves
// the expert out.
func (s *service) Info(ctx context.Context, req *connect.Request[moehostv1.InfoRequest]) (*connect.Response[moehostv1.ExpertInfo], error) {
	uid := req.Msg.GetUid()
	e, err := s.lookup(uid)
	if err != nil {
		return nil, err
	}
	if err := checkAccess(ctx, e, false, "info", uid); err != nil {
		return nil, err
	}
	return connect.NewResponse(e.Info()), nil
}

func (s *service) ListExperts(ctx context.Context, _ *connect.Request[moehostv1.ListExpertsRequest]) (*connect.Response[moehostv1.ListExpertsResponse], error) {
	all := s.experts.All()
	res := &moehostv1.ListExpertsResponse{Experts: make([]*moehostv1.ExpertInfo, 0, len(all))}
	for _, e := range all {
		if checkAccess(ctx, e, false, "", "") == nil {
			res.Experts = append(res.Experts, e.Info())
		}
	}
	return connect.NewResponse(res), nil
}

// decodeAll checks tensors against a schema with wire.Fit, the one
// schema check of a request, requiring one batch size (batch, when >= 0)
// across them, and moves them to dev.
func decodeAll(dev gpuhost.Device, pbs []*moehostv1.Tensor, schema []*moehostv1.TensorSchema, what string, batch int) ([]*gpuhost.Tensor, int, error) {
	var inline [4]wire.Meta // most experts take a tensor or two
	metas := inline[:0]
	for i, pb := range pbs {
		if pb == nil {
			return nil, 0, errorf(connect.CodeInvalidArgument, "%s %d: tensor is missing", what, i)
		}
		metas = append(metas, metaOf(pb))
	}
	batch, err := wire.Fit(schema, what, metas, batch)
	if err != nil {
		return nil, 0, errorf(connect.CodeInvalidArgument, "%w", err)
	}
	// Admission: a request whose tensors would leave too little of the
	// memory limit for the work already running is refused whole,
	// before anything is decoded.
	// A float16 or bfloat16 tensor takes twice its wire bytes on the
	// device, once widened to float32.
	var total int64
	for _, pb := range pbs {
		n := int64(len(pb.GetData()))
		if half.Is(abi.DType(pb.GetDtype())) {
			n *= 2
		}
		total += n
	}
	if err := dev.Admit(total); err != nil {
		return nil, 0, errorf(connect.CodeResourceExhausted, "%ss: %w", what, err)
	}
	ts := make([]*gpuhost.Tensor, len(pbs))
	for i, pb := range pbs {
		w, err := decodeFitted(pb, schema[i])
		if err == nil {
			ts[i], err = fromWire(dev, w)
		}
		if err != nil {
			dev.Release(ts[:i]...)
			if errors.Is(err, gpuhost.ErrOutOfMemory) {
				return nil, 0, errorf(connect.CodeResourceExhausted, "%s %d: %w", what, i, err)
			}
			return nil, 0, errorf(connect.CodeInvalidArgument, "%s %d: %w", what, i, err)
		}
	}
	return ts, batch, nil
}

// fromWire moves a decoded wire tensor to dev, widening a float16 or
// bfloat16 one to float32. DecodeTensor has checked its data against its
// shape, so the float32 copy is exactly twice the wire bytes, which the
// request size limit bounds.
func fromWire(dev gpuhost.Device, w WireTensor) (*gpuhost.Tensor, error) {
	if !half.Is(w.DType) {
		return dev.FromBytes(w.DType, w.Shape, w.Data)
	}
	f, err := wire.Decode(w.DType, w.Data)
	if err != nil {
		return nil, err
	}
	return dev.FromFloat32(w.Shape, f)
}

// encodeAll copies tensors into wire tensors, narrowing float32 ones to
// dt (float16 or bfloat16) unless it is float32.
func encodeAll(dev gpuhost.Device, ts []*gpuhost.Tensor, dt abi.DType) ([]*moehostv1.Tensor, error) {
	out := make([]*moehostv1.Tensor, len(ts))
	for i, t := range ts {
		shape := make([]int64, len(t.Shape()))
		for j, d := range t.Shape() {
			shape[j] = int64(d)
		}
		if t.DType() == abi.DTypeFloat32 && half.Is(dt) {
			f, err := dev.Float32s(t)
			if err != nil {
				return nil, errorf(connect.CodeInternal, "reading output %d: %w", i, err)
			}
			out[i] = wire.Tensor(shape, f, dt)
			continue
		}
		data := make([]byte, t.ByteSize())
		if err := dev.ReadBytes(t, data); err != nil {
			return nil, errorf(connect.CodeInternal, "reading output %d: %w", i, err)
		}
		out[i] = &moehostv1.Tensor{Dtype: moehostv1.DType(t.DType()), Shape: shape, Data: data}
	}
	return out, nil
}

var _ moehostv1connect.ExpertServiceHandler = (*service)(nil)
