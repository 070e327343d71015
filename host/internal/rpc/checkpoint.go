package rpc

import (
	"context"
	"errors"
	"math"
	"net"
	"net/http"

	"connectrpc.com/connect"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
)

// Checkpoints is the training state of the experts as the
// CheckpointService sees it; package host implements it. Each method
// checks that CallerFrom(ctx) may reach uid: the operator reaches every
// expert, a tenant its own only (an error the Codes table makes
// PermissionDenied otherwise). Errors
// wrap this package's sentinels.
type Checkpoints interface {
	Save(ctx context.Context, uid string) (*moehostv1.CheckpointInfo, error)
	List(ctx context.Context, uid string) ([]*moehostv1.CheckpointInfo, error)
	// Restore loads the checkpoint at step, or the newest when step is nil.
	Restore(ctx context.Context, uid string, step *int64) (*moehostv1.CheckpointInfo, error)
	Parameters(ctx context.Context, uid string) (step int64, params []*moehostv1.NamedTensor, err error)
}

// NewCheckpointHandler returns the CheckpointService's path and handler.
// A caller whose bearer token auth accepts gets that Caller in its
// context (CallerFrom), and the Checkpoints implementation lets a tenant
// reach its own experts only; a bad token is refused. A caller with no
// token is the operator when loopbackOperator is set and it comes from
// loopback (a server without tenants or an admin token), and is refused
// otherwise: with tenants, being local proves nothing (RATIONALE: "Who
// may use the CheckpointService?"). codes maps c's errors to Connect
// codes, and m (nil: none) counts the calls.
func NewCheckpointHandler(c Checkpoints, auth Authenticator, loopbackOperator bool, codes Codes, m *Metrics) (string, http.Handler) {
	return moehostv1connect.NewCheckpointServiceHandler(&checkpointService{c: c},
		m.interceptors(codes.Interceptor(), gate(checkpointGate{auth: auth, loopback: loopbackOperator}.admit)),
		readLimit(smallMessageBytes), // requests name an expert, no more
		connect.WithCompressMinBytes(math.MaxInt),
	)
}

type checkpointService struct{ c Checkpoints }

func uidOf(uid string) error {
	if uid == "" {
		return errorf(connect.CodeInvalidArgument, "uid is empty")
	}
	return nil
}

func (s *checkpointService) Save(ctx context.Context, req *connect.Request[moehostv1.CheckpointServiceSaveRequest]) (*connect.Response[moehostv1.CheckpointServiceSaveResponse], error) {
	if err := uidOf(req.Msg.GetUid()); err != nil {
		return nil, err
	}
	info, err := s.c.Save(ctx, req.Msg.GetUid())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&moehostv1.CheckpointServiceSaveResponse{Checkpoint: info}), nil
}

func (s *checkpointService) List(ctx context.Context, req *connect.Request[moehostv1.CheckpointServiceListRequest]) (*connect.Response[moehostv1.CheckpointServiceListResponse], error) {
	if err := uidOf(req.Msg.GetUid()); err != nil {
		return nil, err
	}
	infos, err := s.c.List(ctx, req.Msg.GetUid())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&moehostv1.CheckpointServiceListResponse{Checkpoints: infos}), nil
}

func (s *checkpointService) Restore(ctx context.Context, req *connect.Request[moehostv1.CheckpointServiceRestoreRequest]) (*connect.Response[moehostv1.CheckpointServiceRestoreResponse], error) {
	if err := uidOf(req.Msg.GetUid()); err != nil {
		return nil, err
	}
	info, err := s.c.Restore(ctx, req.Msg.GetUid(), req.Msg.Step)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&moehostv1.CheckpointServiceRestoreResponse{Checkpoint: info}), nil
}

func (s *checkpointService) GetParameters(ctx context.Context, req *connect.Request[moehostv1.CheckpointServiceGetParametersRequest]) (*connect.Response[moehostv1.CheckpointServiceGetParametersResponse], error) {
	if err := uidOf(req.Msg.GetUid()); err != nil {
		return nil, err
	}
	step, params, err := s.c.Parameters(ctx, req.Msg.GetUid())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&moehostv1.CheckpointServiceGetParametersResponse{Step: step, Parameters: params}), nil
}

// checkpointGate (through admit, as a gate) puts the Caller in the
// context: the bearer of a token auth accepts, or, with loopback and no
// token, a loopback peer as the operator.
type checkpointGate struct {
	auth     Authenticator // nil: no token is valid
	loopback bool
}

func (g checkpointGate) caller(peer connect.Peer, h http.Header) (Caller, error) {
	token, present, err := BearerToken(h)
	if err != nil {
		return Caller{}, err
	}
	if present {
		if g.auth != nil {
			if c, ok := g.auth.Authenticate(token); ok {
				return c, nil
			}
		}
		return Caller{}, connect.NewError(connect.CodeUnauthenticated, errors.New("the bearer token is not valid on this server"))
	}
	if !g.loopback {
		return Caller{}, connect.NewError(connect.CodeUnauthenticated, errors.New("the checkpoint service needs a token (Authorization: Bearer <token>): a tenant's, for its own experts, or the server's admin token"))
	}
	host, _, err := net.SplitHostPort(peer.Addr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		return Caller{}, connect.NewError(connect.CodePermissionDenied, errors.New("the checkpoint service serves loopback callers only, unless the server has an admin token"))
	}
	return Caller{Operator: true}, nil
}

// admit is caller as a gate.
func (g checkpointGate) admit(ctx context.Context, peer connect.Peer, h http.Header) (context.Context, error) {
	c, err := g.caller(peer, h)
	if err != nil {
		return nil, err
	}
	return ContextWithCaller(ctx, c), nil
}
