// Package host is moehost's expert server as a Go API: the equivalent of
// hivemind's Server class. A program builds a [Server] with [New] and
// functional options, then runs it in the foreground with [Server.Run] or
// in the background with [Server.Start], and stops it with
// [Server.Shutdown]. `moehost serve` is one such program.
//
// The sub-packages are the rooms of the server: the public
// host/checkpoint and host/tenant, and under host/internal the expert
// lifecycle (experts: the loader, deploys, shared instances, pools,
// deployments and checkpoints, around a Registry of concrete Experts),
// the Connect handlers (rpc), the sandbox (wazero), the batch pools
// (batch), the device workers (sched), the DHT (dht), hivemind's own wire
// and DHT (hivemind) and the dashboard (ui). They do not import each
// other (experts builds on sandbox, batch and sched), and this package
// wires them together through thin adapters. Each room keeps its own
// sentinel errors; wireErrors, the table in errors.go, is the one map
// from them to the wires: to Connect codes (errorCodes, which every
// service of the server uses) and to hivemind's exceptions. A request's
// tensors enter an expert through one ingress (the experts room's), which
// checks them against its schema once, by sdk/wire's Fit, on every path.
package host

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/certs"
	"github.com/moehost/moehost/host/internal/dht"
	"github.com/moehost/moehost/host/internal/experts"
	"github.com/moehost/moehost/host/internal/hivemind"
	"github.com/moehost/moehost/host/internal/rpc"
	"github.com/moehost/moehost/host/internal/sandbox"
	"github.com/moehost/moehost/host/internal/ui"
	"github.com/moehost/moehost/host/tenant"
	"github.com/moehost/moehost/modules"
)

// Defaults of the options.
const (
	DefaultListen  = "127.0.0.1:7700"
	DefaultDataDir = "moehost-data"
)

// ErrServerClosed is returned by Start and Run after Shutdown.
var ErrServerClosed = errors.New("moehost: server closed")

// ErrInvalidModule is returned by Start for a module that does not compile
// or does not follow the ABI.
var ErrInvalidModule = sandbox.ErrInvalidModule

// Server hosts experts and serves them over Connect, gRPC and gRPC-Web on
// one port. It is the composition root: the experts room holds the
// experts, and the server wires it to the wire rooms (rpc, hivemind, dht,
// ui) through thin adapters.
type Server struct {
	cfg config
	log *slog.Logger

	prom *prometheus.Registry // /metrics
	// rpcMetrics count every RPC, whichever listener serves it.
	rpcMetrics *rpc.Metrics
	history    *ui.History // the dashboard's load charts
	experts    *experts.Registry
	// key is the server's libp2p key (the DHT node's, and the signer of
	// its state roots).
	key *hostKey

	mu       sync.Mutex
	front    front            // the port and its HTTP server
	sampler  stopper          // the dashboard's load sampler
	dht      *dht.Service     // nil without WithDHT
	certs    *certs.Reloader  // the port's certificate; nil without WithTLS
	hivemind *hivemind.Server // nil without WithHivemind
	// tenants is the tenants file's set (nil without WithTenants), and
	// stopTenants stops its SIGHUP watch.
	tenants     *tenant.Set
	stopTenants func()
	// inflight counts each owner's uploads and deploys in flight, for
	// the tenants' uploads and deploys caps (tenants.go).
	inflight inflight

	life lifecycle
}

// front is the serving port: its listener, HTTP server and what the
// startup line says is served.
type front struct {
	ln       net.Listener
	addr     string // ln's address, kept after Shutdown
	httpSrv  *http.Server
	serveErr chan error
	served   []any // what the startup log line says is served
	// startTime is when the port began serving, for ServerService.
	startTime time.Time
}

// stopper stops a background loop: stop is closed to stop it, and done
// closes when it has.
type stopper struct{ stop, done chan struct{} }

// lifecycle is the server's Start and Shutdown state.
type lifecycle struct {
	started bool // under Server.mu
	// mu is held by Start while it loads and by Shutdown while it
	// releases, so that a Shutdown during Start waits for Start to stop
	// (it cancels Start's context first) and nothing outlives it.
	mu          sync.Mutex
	cancelStart context.CancelFunc // under Server.mu

	ready, done  chan struct{}
	shutdownOnce sync.Once
	shutdownErr  error
}

// New validates the options and returns a server that is not yet running.
func New(opts ...Option) (*Server, error) {
	cfg := config{
		listen:  DefaultListen,
		dataDir: DefaultDataDir,
		logger:  slog.New(slog.DiscardHandler),

		updatePeriod: DefaultUpdatePeriod,
	}
	for _, o := range opts {
		o.apply(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	prom := prometheus.NewRegistry()
	prom.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfo())
	s := &Server{
		cfg:        cfg,
		log:        cfg.logger,
		prom:       prom,
		rpcMetrics: rpc.NewMetrics(prom),
		history:    ui.NewHistory(historyLen, historyRateLen, historyInterval),
		life:       lifecycle{ready: make(chan struct{}), done: make(chan struct{})},
	}
	s.key = &hostKey{dataDir: cfg.dataDir}
	ckpts := cfg.checkpointConfig()
	if ckpts != nil && cfg.dht != nil {
		ckpts.Signer = s.key
	}
	s.experts = experts.New(experts.Config{
		Log:                cfg.logger,
		DataDir:            cfg.dataDir,
		Optimizer:          cfg.optimizer,
		Batching:           cfg.batching,
		Limits:             cfg.limits,
		OwnerLimits:        s.guestLimits,
		QueueShare:         s.queueShare,
		HasTenant:          s.hasTenant,
		ExclusiveInstances: cfg.exclusiveInstances,
		Checkpoints:        ckpts,
		Metrics:            experts.NewMetrics(prom),
	})
	prom.MustRegister(s.experts.HealthCollector())
	return s, nil
}

// Ready returns a channel that is closed once the server accepts requests.
func (s *Server) Ready() <-chan struct{} { return s.life.ready }

// Addr returns the address the server listens on, with the port it chose
// for "*", or "" before Start.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.front.addr
}

// Start loads the experts, binds the port and serves in the background. It
// returns once the server is ready, or with the error that kept it from
// starting (a taken port, a bad module, ctx done); then nothing is left
// running.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	if s.life.started {
		s.mu.Unlock()
		return errors.New("moehost: server already started")
	}
	s.life.started = true
	s.mu.Unlock()
	s.life.mu.Lock()
	defer s.life.mu.Unlock()
	select {
	case <-s.life.done:
		return ErrServerClosed
	default:
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.mu.Lock()
	s.life.cancelStart = cancel
	s.mu.Unlock()
	if err := s.start(sctx); err != nil {
		s.release(context.WithoutCancel(ctx))
		select {
		case <-s.life.done:
			return fmt.Errorf("%w: %w", ErrServerClosed, err)
		default:
		}
		return err
	}
	s.experts.Serve()
	close(s.life.ready)
	s.mu.Lock()
	served := s.front.served
	s.mu.Unlock()
	s.log.Info("moehost serving", append([]any{"addr", s.Addr()}, served...)...)
	return nil
}

func (s *Server) start(ctx context.Context) error {
	// Bind first, so that a taken port fails at once, before any module
	// is compiled; the port serves once every expert is loaded.
	listen := strings.Replace(s.cfg.listen, ":*", ":0", 1)
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", s.cfg.listen, err)
	}
	s.mu.Lock()
	s.front.ln, s.front.addr = ln, ln.Addr().String()
	s.mu.Unlock()
	if err := s.openCerts(); err != nil {
		return err
	}
	devs, err := s.openExperts(ctx)
	if err != nil {
		return err
	}
	if err := s.openTenants(ctx); err != nil {
		return err
	}
	// The DHT node starts while the experts load: it needs none of them
	// until it announces, after the port serves, and much of its start
	// is waiting for its files to reach the disk. It is up, and its
	// addresses are on disk, before Ready.
	var (
		discovery rpc.Discovery
		dhtErr    error
		dhtDone   = make(chan struct{})
	)
	go func() {
		defer close(dhtDone)
		discovery, dhtErr = s.startDHT(ctx)
	}()
	served, err := s.loadExperts(ctx)
	<-dhtDone
	if err != nil {
		return err
	}
	if dhtErr != nil {
		return dhtErr
	}
	s.mu.Lock()
	s.front.served = append(served, "device", deviceNames(devs), "data_dir", s.cfg.dataDir)
	s.mu.Unlock()

	s.experts.StartWorkers(ctx)
	s.experts.StartSaving(s.cfg.updatePeriod)
	s.startHistory()

	if err := s.startHivemind(ctx); err != nil {
		return err
	}
	s.serveHTTP(ln, discovery)
	if s.dht != nil {
		if err := s.dht.Start(ctx); err != nil {
			return err
		}
	}
	return nil
}

// serveHTTP serves the port: every Connect service (Discovery over the
// DHT node's lookups, when there is one), /metrics, the checkpoint
// service where someone may use it, and the dashboard.
func (s *Server) serveHTTP(ln net.Listener, discovery rpc.Discovery) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.prom, promhttp.HandlerOpts{}))
	mux.Handle("/ui/", ui.Handler(s.dashboardAPI()))
	mux.Handle("GET /{$}", http.RedirectHandler("/ui/", http.StatusFound))
	opts := rpc.Options{
		MaxRequestBytes: s.cfg.maxRequestBytes,
		Server:          describer{s},
		CORSOrigins:     s.cfg.corsOrigins,
		Discovery:       discovery,
		Codes:           errorCodes,
		Bodies:          s.bodyLimits(),
		Metrics:         s.rpcMetrics,
	}
	if s.tenants != nil {
		opts.Auth, opts.Modules, opts.Uploads = authenticator{s}, moduleAPI{s}, s.uploadLimits()
	}
	if h, ok := s.checkpointHandler(ln); ok {
		opts.Checkpoints = h
	}
	mux.Handle("/", rpc.NewHandler(table{s.experts}, opts))
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true) // gRPC without TLS; serveTLS turns it off
	// ReadHeaderTimeout cuts a client that never finishes its headers,
	// IdleTimeout closes a connection (its descriptor) that carries no
	// request. There is no ReadTimeout or WriteTimeout: on HTTP/1 either
	// one cuts a Forward that runs longer, however healthy. Instead each
	// request body has idle and total deadlines that end with the body
	// (rpc.BodyDeadlines, over the whole mux so that the checkpoint
	// service and the rest are bound too), and module uploads, the one
	// streaming request, their own (rpc.UploadLimits).
	srv := &http.Server{
		Handler:           rpc.BodyDeadlines(mux, s.bodyLimits()),
		Protocols:         protocols,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          httpErrorLog(s.log),
	}
	serveErr := make(chan error, 1)
	tls := s.serveTLS(srv)
	s.mu.Lock()
	s.front.ln, s.front.httpSrv, s.front.serveErr, s.front.startTime = ln, srv, serveErr, time.Now()
	if tls {
		s.front.served = append(s.front.served, "tls", true, "client_certs", s.cfg.tls.ClientCAFile != "")
	}
	s.mu.Unlock()
	if tls {
		go func() { serveErr <- srv.ServeTLS(ln, "", "") }()
	} else {
		go func() { serveErr <- srv.Serve(ln) }()
	}
}

// openExperts opens the data dir's compilation cache and module store
// and the devices, and gives them to the experts room.
func (s *Server) openExperts(ctx context.Context) ([]gpuhost.Device, error) {
	if err := os.MkdirAll(s.cfg.dataDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating data dir: %w", err)
	}
	cache, err := sandbox.OpenCache(s.cfg.compileCacheDir(), s.cfg.compileChild...)
	if err != nil {
		return nil, err
	}
	store, err := modules.Open(filepath.Join(s.cfg.dataDir, "modules"))
	if err != nil {
		return nil, errors.Join(err, cache.Close(ctx))
	}
	devs, err := s.newDevices()
	if err != nil {
		return nil, errors.Join(err, cache.Close(ctx))
	}
	if err := s.experts.Open(cache, store, devs); err != nil {
		return nil, errors.Join(err, cache.Close(ctx), closeDevices(devs))
	}
	return devs, nil
}

// loadExperts loads the configured experts and schedules them, then
// restores the deployments file's, and returns what the startup line
// says of them.
func (s *Server) loadExperts(ctx context.Context) ([]any, error) {
	specs := make([]ExpertConfig, len(s.cfg.experts))
	for i, ec := range s.cfg.experts {
		specs[i] = s.operatorBackward(ec)
	}
	loaded, err := s.experts.LoadAll(ctx, specs, kernelThreads())
	if err != nil {
		return nil, err
	}
	var mods, configs []string
	for i, ec := range s.cfg.experts {
		e := loaded[i].Expert
		if loaded[i].Fresh {
			mods = append(mods, fmt.Sprintf("%v %s", ec.Module, e.Digest()))
		}
		s.experts.Schedule(e)
		if c := experts.ConfigString(ec.Config); !slices.Contains(configs, c) {
			configs = append(configs, c)
		}
		s.log.Debug("expert loaded", "uid", ec.UID, "digest", e.Digest(), "params", e.ParamCount())
	}
	if err := s.experts.RestoreDeployments(ctx); err != nil {
		return nil, err
	}
	all := s.experts.All()
	uids := make([]string, len(all))
	for i, e := range all {
		uids[i] = e.UID()
	}
	return []any{
		"experts", uidsString(uids),
		"modules", strings.Join(mods, "; "),
		"config", strings.Join(configs, "; "),
	}, nil
}

// Run starts the server and blocks until ctx is done or Shutdown is
// called, then shuts down.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Start(ctx); err != nil {
		return err
	}
	var err error
	select {
	case <-ctx.Done():
	case <-s.life.done:
	case err = <-s.front.serveErr:
	}
	s.log.Info("moehost shutting down", "drain_timeout", s.drainTimeout())
	// The batches get the drain timeout (release); the rest, closing
	// connections and withdrawing DHT records, up to 20 s more.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.drainTimeout()+20*time.Second)
	defer cancel()
	err = errors.Join(err, s.Shutdown(sctx))
	s.log.Info("moehost stopped", "err", err)
	return err
}

// Shutdown stops accepting requests, fails the queued ones with
// Unavailable, lets the running batch finish (cancelling it if ctx ends
// first), and releases every goroutine, port and file. It is idempotent and
// safe to call from any goroutine; every call returns once the server is
// down.
func (s *Server) Shutdown(ctx context.Context) error {
	s.life.shutdownOnce.Do(func() {
		close(s.life.done)
		s.experts.Refuse()
		s.mu.Lock()
		if s.life.cancelStart != nil {
			s.life.cancelStart()
		}
		s.mu.Unlock()
		s.life.mu.Lock()
		defer s.life.mu.Unlock()
		s.life.shutdownErr = s.release(ctx)
	})
	<-s.life.done
	return s.life.shutdownErr
}

// drainTimeout is how long shutdown lets the batches in flight finish.
func (s *Server) drainTimeout() time.Duration {
	return cmp.Or(s.cfg.drainTimeout, DefaultDrainTimeout)
}

// release frees whatever start made. It runs without s.mu held while it
// waits, because in-flight requests still look experts up.
func (s *Server) release(ctx context.Context) error {
	// Stop announcing first, so that the records expire while the rest
	// shuts down.
	s.stopAnnouncing()
	s.closeTenants()
	s.mu.Lock()
	f := s.front
	s.front.httpSrv, s.front.ln = nil, nil
	s.mu.Unlock()
	// Fail what is queued and refuse what comes, then let the running
	// batch finish, so that every handler can answer before HTTP stops.
	s.stopHistory()
	s.experts.Stop(ctx, s.drainTimeout())
	var errs []error
	if f.httpSrv != nil {
		if err := f.httpSrv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stopping HTTP server: %w", err), f.httpSrv.Close())
		}
		if err := <-f.serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
	} else if f.ln != nil {
		errs = append(errs, f.ln.Close())
	}
	errs = append(errs, s.experts.Close(ctx), s.closeCerts(ctx))
	errs = append(errs, s.closeDHT(ctx), s.closeHivemind(ctx))
	errs = append(errs, s.experts.CloseDevices(closeDevices))
	return errors.Join(errs...)
}

// table is the server's experts as package rpc sees them.
type table struct{ reg *experts.Registry }

func (t table) Expert(uid string) (rpc.Expert, bool) {
	e, ok := t.reg.Get(uid)
	if !ok {
		return nil, false
	}
	return e, true
}

func (t table) All() []rpc.Expert {
	all := t.reg.All()
	out := make([]rpc.Expert, len(all))
	for i, e := range all {
		out[i] = e
	}
	return out
}

var (
	_ rpc.Experts = table{}
	_ rpc.Expert  = (*experts.Expert)(nil)
	_ rpc.Guarded = (*experts.Expert)(nil)
)

// maxLoggedUIDs bounds the uids the startup log line names.
const maxLoggedUIDs = 16

// uidsString lists uids for the startup log line, the first few and a
// count when there are many.
func uidsString(uids []string) string {
	if len(uids) <= maxLoggedUIDs {
		return strings.Join(uids, ",")
	}
	return fmt.Sprintf("%s,… (%d in all)", strings.Join(uids[:maxLoggedUIDs], ","), len(uids))
}
