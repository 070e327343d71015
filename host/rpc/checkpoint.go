package rpc

import (
	"context"
	"crypto/subtle"
	"errors"
	"math"
	"net"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
)

// Checkpoints is the training state of the experts as the
// CheckpointService sees it; package host implements it. Errors wrap this
// package's sentinels.
type Checkpoints interface {
	Save(ctx context.Context, uid string) (*moehostv1.CheckpointInfo, error)
	List(ctx context.Context, uid string) ([]*moehostv1.CheckpointInfo, error)
	// Restore loads the checkpoint at step, or the newest when step is nil.
	Restore(ctx context.Context, uid string, step *int64) (*moehostv1.CheckpointInfo, error)
	Parameters(ctx context.Context, uid string) (step int64, params []*moehostv1.NamedTensor, err error)
}

// NewCheckpointHandler returns the CheckpointService's path and handler.
// With a token, every call must carry "Authorization: Bearer <token>";
// without one, only loopback peers are served (the caller mounts it only
// on a loopback listener then). codes maps c's errors to Connect codes.
func NewCheckpointHandler(c Checkpoints, token string, codes Codes) (string, http.Handler) {
	return moehostv1connect.NewCheckpointServiceHandler(&checkpointService{c: c},
		connect.WithInterceptors(codes.Interceptor(), gate(adminGate{token: token}.admit)),
		connect.WithReadMaxBytes(1<<20), // requests name an expert, no more
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

// adminGate (through admit, as a gate) admits callers with the admin token, or, without a
// token, loopback peers only.
type adminGate struct{ token string }

func (a adminGate) check(peer connect.Peer, h http.Header) error {
	if a.token != "" {
		got, ok := strings.CutPrefix(h.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(a.token)) != 1 {
			return connect.NewError(connect.CodeUnauthenticated, errors.New("the checkpoint service needs the server's admin token (Authorization: Bearer)"))
		}
		return nil
	}
	host, _, err := net.SplitHostPort(peer.Addr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		return connect.NewError(connect.CodePermissionDenied, errors.New("the checkpoint service serves loopback callers only, unless the server has an admin token"))
	}
	return nil
}

// admit is check as a gate.
func (a adminGate) admit(ctx context.Context, peer connect.Peer, h http.Header) (context.Context, error) {
	return ctx, a.check(peer, h)
}
