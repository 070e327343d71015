// Package hivemind is the host's room for hivemind 1.x's own clients: a
// libp2p host of its own that speaks hivemind's expert RPC (the
// ConnectionHandler.* protocols, with the p2p daemon's unary framing and
// hivemind's stream framing, msgpack info and hivemind's tensor codecs)
// and hivemind's DHT (DHTProtocol.*: a full node that stores, finds and
// announces the experts as hivemind's server does).
//
// It knows the experts only through the small [Experts] interface, which
// package host implements over the same pools as Connect.
package hivemind

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p"
	kad "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/moehost/moehost/internal/atomicfile"
)

// Names of the files the room keeps in the data dir.
const (
	KeyFile   = "hivemind-key"
	AddrsFile = "hivemind-addrs"
)

// Sizes of hivemind's wire.
const (
	// MaxUnaryBytes is the largest unary message the p2p daemon reads
	// (its persistentConnMsgMaxSize); hivemind clients send at most 2 MiB
	// of tensors unary and stream the rest.
	MaxUnaryBytes = 4 << 20
	// partBytes is the size of the parts a streamed tensor is cut into
	// (hivemind's DEFAULT_MAX_MSG_SIZE).
	partBytes = 4 << 20
	// maxFrameBytes bounds one stream frame: a part plus its message.
	maxFrameBytes = partBytes + 64<<10
)

// DefaultUpdatePeriod is how often experts are announced by default, as
// hivemind's server does.
const DefaultUpdatePeriod = 30 * time.Second

// Errors an [Experts] implementation wraps its errors with, so that the
// client gets the exception hivemind's server would raise.
var (
	// ErrNotFound: no such expert (hivemind: KeyError).
	ErrNotFound = errors.New("not found")
	// ErrInvalid: the request does not fit the expert (ValueError).
	ErrInvalid = errors.New("invalid request")
	// ErrBusy: the host refused the work for now (RuntimeError).
	ErrBusy = errors.New("busy")
)

// Experts are the hosted experts as hivemind clients see them.
type Experts interface {
	// HivemindUIDs lists the uids to announce, sorted.
	HivemindUIDs() []string
	// HivemindSchema describes an expert; it wraps ErrNotFound for an
	// unknown or private one.
	HivemindSchema(uid string) (Schema, error)
	// HivemindForward runs a forward batch through the expert's pool.
	HivemindForward(ctx context.Context, uid string, inputs []Tensor) ([]Tensor, error)
	// HivemindBackward runs a backward batch (one optimizer step) and
	// returns the input gradients.
	HivemindBackward(ctx context.Context, uid string, inputs, gradOutputs []Tensor) ([]Tensor, error)
}

// Config configures the room.
type Config struct {
	// DataDir holds the identity key (KeyFile) and the multiaddrs
	// (AddrsFile). Required.
	DataDir string
	// Listen are libp2p multiaddrs to listen on. Required.
	Listen []string
	// InitialPeers are multiaddrs (with /p2p/) of hivemind DHT peers to
	// join through.
	InitialPeers []string
	// UpdatePeriod is how often experts are announced. Default
	// DefaultUpdatePeriod.
	UpdatePeriod time.Duration
	// MaxRequestBytes bounds the tensors of one streamed request. Default
	// 256 MiB.
	MaxRequestBytes int
	// Logger logs; nil discards.
	Logger *slog.Logger
}

// Server is the room's libp2p host with its handlers and DHT node.
type Server struct {
	cfg     Config
	log     *slog.Logger
	experts Experts
	host    host.Host
	kad     *kad.IpfsDHT // peer routing for the clients' p2p daemons
	dht     *node

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New starts the libp2p host with the handlers, joins the initial peers,
// and writes the multiaddrs to the data dir. Announcing starts with Start.
func New(ctx context.Context, cfg Config, experts Experts) (*Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("hivemind: no data dir")
	}
	if cfg.UpdatePeriod <= 0 {
		cfg.UpdatePeriod = DefaultUpdatePeriod
	}
	if cfg.MaxRequestBytes <= 0 {
		cfg.MaxRequestBytes = 256 << 20
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	initial, err := parsePeers(cfg.InitialPeers)
	if err != nil {
		return nil, err
	}
	priv, err := loadKey(filepath.Join(cfg.DataDir, KeyFile))
	if err != nil {
		return nil, err
	}
	h, err := libp2p.New(
		libp2p.Identity(priv),
		libp2p.ListenAddrStrings(cfg.Listen...),
		libp2p.NoTransports,
		libp2p.Transport(tcp.NewTCPTransport),
		// p2pd offers both; hivemind's default is TLS, then Noise.
		libp2p.Security(libp2ptls.ID, libp2ptls.New),
		libp2p.Security(noise.ID, noise.New),
		libp2p.Muxer(yamux.ID, yamux.DefaultTransport),
		libp2p.DisableRelay(),
		libp2p.DisableMetrics(),
	)
	if err != nil {
		return nil, fmt.Errorf("hivemind: libp2p host: %w", err)
	}
	// The clients' p2p daemons find a server's addresses from its peer ID
	// (all that hivemind's records hold) through kad-dht on its default
	// /ipfs prefix; serve it, seeded from the initial peers only.
	k, err := kad.New(h, kad.Mode(kad.ModeServer), kad.BootstrapPeers(initial...))
	if err != nil {
		return nil, errors.Join(fmt.Errorf("hivemind: peer routing: %w", err), h.Close())
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s := &Server{cfg: cfg, log: log, experts: experts, host: h, kad: k, ctx: sctx, cancel: cancel}
	s.dht = newNode(s)
	s.register()
	addrs := s.Addrs()
	if len(addrs) == 0 {
		return nil, errors.Join(errors.New("hivemind: the host listens on no address"), s.Close(ctx))
	}
	if err := atomicfile.Write(filepath.Join(cfg.DataDir, AddrsFile), []byte(strings.Join(addrs, "\n")+"\n")); err != nil {
		return nil, errors.Join(fmt.Errorf("hivemind: writing %s: %w", AddrsFile, err), s.Close(ctx))
	}
	s.dht.bootstrap(ctx, initial)
	log.Debug("hivemind node up", "peer", h.ID().String(), "addrs", strings.Join(addrs, ","))
	return s, nil
}

// register installs the handlers of the expert RPC and the DHT.
func (s *Server) register() {
	unary := map[string]func(context.Context, peer.ID, []byte) ([]byte, error){
		"ConnectionHandler.rpc_info":     s.rpcInfo,
		"ConnectionHandler.rpc_forward":  s.rpcForward,
		"ConnectionHandler.rpc_backward": s.rpcBackward,
		"DHTProtocol.rpc_ping":           s.dht.rpcPing,
		"DHTProtocol.rpc_store":          s.dht.rpcStore,
		"DHTProtocol.rpc_find":           s.dht.rpcFind,
	}
	for name, h := range unary {
		s.host.SetStreamHandler(protocol.ID(name), s.unaryHandler(name, h))
	}
	s.host.SetStreamHandler("ConnectionHandler.rpc_forward_stream", s.streamHandler(false))
	s.host.SetStreamHandler("ConnectionHandler.rpc_backward_stream", s.streamHandler(true))
}

// PeerID returns the host's peer ID in base58.
func (s *Server) PeerID() string { return s.host.ID().String() }

// Addrs returns the host's multiaddrs with its /p2p/ part: what a hivemind
// client passes as initial_peers.
func (s *Server) Addrs() []string {
	var out []string
	for _, a := range s.host.Addrs() {
		out = append(out, a.String()+"/p2p/"+s.host.ID().String())
	}
	return out
}

// Start announces the experts now and then every update period, until
// Close.
func (s *Server) Start(context.Context) error {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.dht.announceLoop(s.ctx)
	}()
	return nil
}

// Close stops announcing, ends the handlers' calls and closes the host.
func (s *Server) Close(context.Context) error {
	s.cancel()
	err := errors.Join(s.kad.Close(), s.host.Close())
	s.wg.Wait()
	return err
}

// parsePeers parses initial peers, each with its /p2p/ part.
func parsePeers(addrs []string) ([]peer.AddrInfo, error) {
	var out []peer.AddrInfo
	for _, a := range addrs {
		m, err := ma.NewMultiaddr(a)
		if err != nil {
			return nil, fmt.Errorf("hivemind: initial peer %q: %w", a, err)
		}
		info, err := peer.AddrInfoFromP2pAddr(m)
		if err != nil {
			return nil, fmt.Errorf("hivemind: initial peer %q needs a /p2p/ part: %w", a, err)
		}
		out = append(out, *info)
	}
	return out, nil
}

// loadKey reads the host key at path, or makes one and writes it there.
func loadKey(path string) (crypto.PrivKey, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		k, err := crypto.UnmarshalPrivateKey(b)
		if err != nil {
			return nil, fmt.Errorf("hivemind: %s: %w", path, err)
		}
		return k, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("hivemind: reading key: %w", err)
	}
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("hivemind: %w", err)
	}
	if b, err = crypto.MarshalPrivateKey(k); err != nil {
		return nil, fmt.Errorf("hivemind: encoding key: %w", err)
	}
	if err := atomicfile.Write(path, b); err != nil {
		return nil, fmt.Errorf("hivemind: writing key: %w", err)
	}
	return k, nil
}
