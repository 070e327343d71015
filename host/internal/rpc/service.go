package rpc

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
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
	inputs, err := rawAll(req.Msg.GetInputs(), "input")
	if err != nil {
		return nil, fmt.Errorf("forward %q: %w", uid, err)
	}
	outputs, err := e.ForwardWire(ctx, inputs, outDType)
	if err != nil {
		return nil, fmt.Errorf("forward %q: %w", uid, err)
	}
	pb := protoAll(outputs)
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
	inputs, err := rawAll(req.Msg.GetInputs(), "input")
	if err != nil {
		return nil, fmt.Errorf("backward %q: %w", uid, err)
	}
	grads, err := rawAll(req.Msg.GetGradOutputs(), "grad_output")
	if err != nil {
		return nil, fmt.Errorf("backward %q: %w", uid, err)
	}
	gradInputs, err := e.BackwardWire(ctx, inputs, grads, gradDType)
	if err != nil {
		return nil, fmt.Errorf("backward %q: %w", uid, err)
	}
	pb := protoAll(gradInputs)
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

// rawAll parses a request's tensors' framing: the expert's ingress
// checks them against its schema and their shapes. It copies nothing.
func rawAll(pbs []*moehostv1.Tensor, what string) ([]wire.Raw, error) {
	out := make([]wire.Raw, len(pbs))
	for i, pb := range pbs {
		if pb == nil {
			return nil, errorf(connect.CodeInvalidArgument, "%s %d: tensor is missing", what, i)
		}
		out[i] = wire.RawOf(pb)
	}
	return out, nil
}

// protoAll turns results into wire messages; it copies nothing.
func protoAll(ts []wire.Raw) []*moehostv1.Tensor {
	out := make([]*moehostv1.Tensor, len(ts))
	for i, t := range ts {
		out[i] = t.Proto()
	}
	return out
}

var _ moehostv1connect.ExpertServiceHandler = (*service)(nil)
