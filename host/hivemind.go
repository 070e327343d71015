package host

import (
	"context"
	"errors"
	"fmt"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/host/internal/experts"
	"github.com/moehost/moehost/host/internal/hivemind"
	"github.com/moehost/moehost/host/internal/rpc"
	"github.com/moehost/moehost/sdk/wire"
)

// HivemindConfig configures the server's face to hivemind 1.x clients.
// The zero value listens on a free TCP port of the listen host and joins
// no one.
type HivemindConfig struct {
	// Listen are libp2p multiaddrs to listen on. Default: a free TCP port
	// on the host of the server's listen address.
	Listen []string
	// InitialPeers are multiaddrs (with /p2p/) of hivemind DHT peers to
	// join, e.g. a hivemind Server's. Default none.
	InitialPeers []string
}

// WithHivemind serves the experts to unmodified hivemind 1.x clients too:
// hivemind's expert RPC and DHT on a libp2p host of their own, behind the
// same batching, admission and optimizer as Connect. The host's multiaddrs
// (what a client passes as initial_peers) are logged and written to
// <data-dir>/hivemind-addrs before Ready. Every uid must follow hivemind's
// grammar ("ffn.3", "ffn.0.12"). Only experts open to anonymous callers
// are served to hivemind clients, which present no token.
func WithHivemind(c HivemindConfig) Option {
	return optionFunc(func(cfg *config) { cfg.hivemind = &c })
}

// HivemindAddrs returns the multiaddrs of the server's hivemind node, or
// nil when it runs none.
func (s *Server) HivemindAddrs() []string {
	s.mu.Lock()
	h := s.hivemind
	s.mu.Unlock()
	if h == nil {
		return nil
	}
	return h.Addrs()
}

// validateHivemind checks the uids of the experts given at New.
func (c *config) validateHivemind() error {
	if c.hivemind == nil {
		return nil
	}
	for _, e := range c.experts {
		if err := hivemind.CheckGridUID(e.UID); err != nil {
			return fmt.Errorf("moehost: --hivemind: %w", err)
		}
	}
	return nil
}

// startHivemind starts the hivemind node once the experts are loaded; its
// addresses are on disk when it returns.
func (s *Server) startHivemind(ctx context.Context) error {
	if s.cfg.hivemind == nil {
		return nil
	}
	if err := s.cfg.validateHivemind(); err != nil {
		return err
	}
	c := *s.cfg.hivemind
	if len(c.Listen) == 0 {
		c.Listen = dhtListen(s.cfg.listen)
	}
	h, err := hivemind.New(ctx, hivemind.Config{
		DataDir: s.cfg.dataDir, Listen: c.Listen, InitialPeers: c.InitialPeers,
		UpdatePeriod: s.cfg.updatePeriod, MaxRequestBytes: s.cfg.maxRequestBytes, Logger: s.log,
	}, hivemindExperts{s.experts})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.hivemind = h
	s.mu.Unlock()
	s.log.Info("hivemind node up: pass these as initial_peers", "addrs", h.Addrs())
	return h.Start(ctx)
}

// closeHivemind closes the node, if any.
func (s *Server) closeHivemind(ctx context.Context) error {
	s.mu.Lock()
	h := s.hivemind
	s.hivemind = nil
	s.mu.Unlock()
	if h == nil {
		return nil
	}
	return h.Close(ctx)
}

// hivemindExperts is the server as the hivemind room sees it.
type hivemindExperts struct{ reg *experts.Registry }

// public finds an expert open to anonymous callers.
func (h hivemindExperts) public(uid string) (*experts.Expert, error) {
	e, err := h.reg.Running(uid)
	if err != nil {
		return nil, fmt.Errorf("%w: no expert %q on this server", hivemind.ErrNotFound, uid)
	}
	owner, fwd, bwd := e.Access()
	if (rpc.Caller{}).Check(fwd, owner, "") != nil || (rpc.Caller{}).Check(bwd, owner, "") != nil {
		return nil, fmt.Errorf("%w: no expert %q on this server", hivemind.ErrNotFound, uid)
	}
	return e, nil
}

func (h hivemindExperts) HivemindUIDs() []string {
	var out []string
	for _, e := range h.reg.All() {
		uid := e.UID()
		if _, err := h.public(uid); err == nil && hivemind.CheckGridUID(uid) == nil {
			out = append(out, uid)
		}
	}
	return out
}

func (h hivemindExperts) HivemindSchema(uid string) (hivemind.Schema, error) {
	e, err := h.public(uid)
	if err != nil {
		return hivemind.Schema{}, err
	}
	in, out := e.Schema()
	var s hivemind.Schema
	for _, t := range in {
		s.Inputs = append(s.Inputs, hivemindSpec(t.GetDtype(), t.GetShape()))
	}
	for _, t := range out {
		s.Outputs = append(s.Outputs, hivemindSpec(t.GetDtype(), t.GetShape()))
	}
	return s, nil
}

// hivemindSpec drops the leading batch dimension of a declared shape.
func hivemindSpec[D ~int32](dt D, shape []int64) hivemind.Spec {
	sp := hivemind.Spec{DType: abi.DType(dt)}
	for i, d := range shape {
		if i == 0 && d == -1 {
			continue
		}
		sp.Shape = append(sp.Shape, int(d))
	}
	return sp
}

func (h hivemindExperts) HivemindForward(ctx context.Context, uid string, inputs []hivemind.Tensor) ([]hivemind.Tensor, error) {
	return h.call(ctx, uid, inputs, nil, false)
}

func (h hivemindExperts) HivemindBackward(ctx context.Context, uid string, inputs, gradOutputs []hivemind.Tensor) ([]hivemind.Tensor, error) {
	return h.call(ctx, uid, inputs, gradOutputs, true)
}

// call hands a hivemind request to the expert's one ingress (the schema
// check, admission, conversion), whose pools take the tensors, and its
// results back to hivemind's wire as float32, as hivemind's server sends
// them.
func (h hivemindExperts) call(ctx context.Context, uid string, inputs, gradOutputs []hivemind.Tensor, backward bool) ([]hivemind.Tensor, error) {
	e, err := h.public(uid)
	if err != nil {
		return nil, err
	}
	var out []wire.Raw
	if backward {
		out, err = e.BackwardWire(ctx, hivemindRaws(inputs), hivemindRaws(gradOutputs), abi.DTypeFloat32)
	} else {
		out, err = e.ForwardWire(ctx, hivemindRaws(inputs), abi.DTypeFloat32)
	}
	if errors.Is(err, ErrBadTensors) {
		err = fmt.Errorf("expert %q: %w", uid, err)
	}
	if err != nil {
		return nil, hivemindError(err)
	}
	res := make([]hivemind.Tensor, len(out))
	for i, r := range out {
		shape := make([]int, len(r.Shape))
		for j, d := range r.Shape {
			shape[j] = int(d)
		}
		res[i] = hivemind.Tensor{DType: r.DType, Shape: shape, Data: r.Data}
	}
	return res, nil
}

// hivemindRaws is hivemind's tensors as wire tensors; it copies no data.
func hivemindRaws(ts []hivemind.Tensor) []wire.Raw {
	out := make([]wire.Raw, len(ts))
	for i, t := range ts {
		out[i] = wire.Raw{DType: t.DType, Shape: wire.Dims64(t.Shape), Data: t.Data}
	}
	return out
}

var _ hivemind.Experts = hivemindExperts{}

// WithoutHivemind undoes WithHivemind: hivemind clients are not served.
func WithoutHivemind() Option {
	return optionFunc(func(cfg *config) { cfg.hivemind = nil })
}
