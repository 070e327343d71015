package host

import (
	"context"
	"fmt"
	"net"
	"net/http"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/moehost/moehost/abi"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/host/checkpoint"
	"github.com/moehost/moehost/host/internal/experts"
	"github.com/moehost/moehost/host/internal/rpc"
	"github.com/moehost/moehost/sdk/wire"
)

// ckptService is the server's CheckpointService backend.
type ckptService struct{ reg *experts.Registry }

// expert returns the expert uid if the request's caller may reach its
// checkpoints: the operator any, a tenant its own.
func (cs ckptService) expert(ctx context.Context, uid string) (*experts.Expert, error) {
	e, err := cs.reg.Running(uid)
	if err != nil {
		return nil, err
	}
	c := rpc.CallerFrom(ctx)
	if !c.Operator && (c.Tenant == "" || e.Owner() != c.Tenant) {
		return nil, fmt.Errorf("expert %q %w: a tenant's token reaches its own experts' checkpoints only", uid, ErrNotYours)
	}
	return e, nil
}

func infoPB(in checkpoint.Info) *moehostv1.CheckpointInfo {
	pb := &moehostv1.CheckpointInfo{Uid: in.UID, Step: in.Step, SizeBytes: in.Bytes}
	if !in.Time.IsZero() {
		pb.CreateTime = timestamppb.New(in.Time)
	}
	return pb
}

func (cs ckptService) Save(ctx context.Context, uid string) (*moehostv1.CheckpointInfo, error) {
	e, err := cs.expert(ctx, uid)
	if err != nil {
		return nil, err
	}
	in, err := cs.reg.SaveCheckpoint(ctx, e)
	if err != nil {
		return nil, err
	}
	return infoPB(in), nil
}

func (cs ckptService) List(ctx context.Context, uid string) ([]*moehostv1.CheckpointInfo, error) {
	if _, err := cs.expert(ctx, uid); err != nil {
		return nil, err
	}
	infos, err := cs.reg.Checkpoints(uid)
	if err != nil {
		return nil, err
	}
	out := make([]*moehostv1.CheckpointInfo, len(infos))
	for i, in := range infos {
		out[i] = infoPB(in)
	}
	return out, nil
}

func (cs ckptService) Restore(ctx context.Context, uid string, step *int64) (*moehostv1.CheckpointInfo, error) {
	e, err := cs.expert(ctx, uid)
	if err != nil {
		return nil, err
	}
	in, err := cs.reg.RestoreCheckpoint(ctx, e, step)
	if err != nil {
		return nil, err
	}
	return infoPB(in), nil
}

func (cs ckptService) Parameters(ctx context.Context, uid string) (int64, []*moehostv1.NamedTensor, error) {
	e, err := cs.expert(ctx, uid)
	if err != nil {
		return 0, nil, err
	}
	snap, err := cs.reg.Snapshot(ctx, e)
	if err != nil {
		return 0, nil, err
	}
	out := make([]*moehostv1.NamedTensor, len(snap.Params))
	for i, p := range snap.Params {
		out[i] = &moehostv1.NamedTensor{Name: p.Name, Tensor: &moehostv1.Tensor{Dtype: moehostv1.DType_DTYPE_FLOAT32, Shape: wire.Dims64(p.Shape), Data: wire.Encode(abi.DTypeFloat32, p.Data)}}
	}
	return snap.Step, out, nil
}

// checkpointHandler mounts the CheckpointService when someone can use
// it: with tenants, each for its own experts; with an admin token, its
// bearer; with neither, loopback callers, as the operator, when the
// listener is on loopback.
func (s *Server) checkpointHandler(ln net.Listener) (http.Handler, bool) {
	addr, ok := ln.Addr().(*net.TCPAddr)
	loopback := s.cfg.adminToken == "" && s.tenants == nil
	if loopback && (!ok || !addr.IP.IsLoopback()) {
		s.log.Info("the checkpoint service is off: the server does not listen on loopback and has no admin token or tenants")
		return nil, false
	}
	var auth rpc.Authenticator
	if !loopback {
		auth = authenticator{s}
	}
	_, h := rpc.NewCheckpointHandler(ckptService{s.experts}, auth, loopback, errorCodes, s.rpcMetrics)
	return h, true
}

var _ rpc.Checkpoints = ckptService{}
