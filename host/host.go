// Package host is moehost's expert server as a Go API: the equivalent of
// hivemind's Server class. A program builds a [Server] with [New] and
// functional options, then runs it in the foreground with [Server.Run] or
// in the background with [Server.Start], and stops it with
// [Server.Shutdown]. `moehost serve` is one such program.
//
// The sub-packages are the rooms of the server: the public
// host/checkpoint and host/tenant, and under host/internal the Connect
// handlers (rpc), the sandbox (wazero), the batch pools (batch), the
// device workers (sched), the DHT (dht), hivemind's own wire and DHT
// (hivemind) and the dashboard (ui). They do not import each other, and
// this package wires them together. Each room keeps its own sentinel
// errors; wireErrors, the table in errors.go, is the one map from them to
// the wires: to Connect codes (errorCodes, which every service of the
// server uses) and to hivemind's exceptions. A request's tensors are
// checked against the expert's schema once, by sdk/wire's Fit, on every
// path.
package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/moehost/moehost/host/internal/dht"
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

var errShuttingDown = errors.New("server is shutting down")

// Server hosts experts and serves them over Connect, gRPC and gRPC-Web on
// one port.
type Server struct {
	cfg config
	log *slog.Logger

	metrics *metrics
	history *ui.History // the dashboard's load charts

	mu       sync.Mutex
	started  bool
	lanes    []*lane // one per device: the one place the server keeps its devices and their workers
	experts  map[string]*expert
	sorted   []rpc.Expert
	ln       net.Listener
	addr     string // ln's address, kept after Shutdown
	httpSrv  *http.Server
	serveErr chan error
	ckpt     *checkpointer // nil without WithCheckpoints
	stopSave chan struct{} // closed to stop the periodic saver
	saveDone chan struct{} // closed when it has stopped
	stopHist chan struct{} // closed to stop the load sampler
	histDone chan struct{} // closed when it has stopped
	served   []any         // what the startup log line says is served
	// startTime is when the port began serving, for ServerService.
	startTime time.Time
	dht       *dht.Service     // nil without WithDHT
	hivemind  *hivemind.Server // nil without WithHivemind
	loader    *loader          // makes and takes apart experts, at Start and live
	// tenants is the tenants file's set (nil without WithTenants), and
	// stopTenants stops its SIGHUP watch.
	tenants     *tenant.Set
	stopTenants func()
	// inflight counts each owner's uploads and deploys in flight, for
	// the tenants' uploads and deploys caps (tenants.go).
	inflight inflight
	// devicesClosed is set once release has closed the devices (they
	// stay listed, so that MemoryStats reads after Shutdown).
	devicesClosed bool

	// lifeMu is held by Start while it loads and by Shutdown while it
	// releases, so that a Shutdown during Start waits for Start to stop
	// (it cancels Start's context first) and nothing outlives it.
	lifeMu      sync.Mutex
	cancelStart context.CancelFunc

	ready        chan struct{}
	done         chan struct{}
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
	return &Server{
		cfg:     cfg,
		log:     cfg.logger,
		metrics: newMetrics(),
		history: ui.NewHistory(historyLen, historyInterval),
		ready:   make(chan struct{}),
		done:    make(chan struct{}),
	}, nil
}

// Ready returns a channel that is closed once the server accepts requests.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Addr returns the address the server listens on, with the port it chose
// for "*", or "" before Start.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Start loads the experts, binds the port and serves in the background. It
// returns once the server is ready, or with the error that kept it from
// starting (a taken port, a bad module, ctx done); then nothing is left
// running.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return errors.New("moehost: server already started")
	}
	s.started = true
	s.mu.Unlock()
	s.lifeMu.Lock()
	defer s.lifeMu.Unlock()
	select {
	case <-s.done:
		return ErrServerClosed
	default:
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.mu.Lock()
	s.cancelStart = cancel
	s.mu.Unlock()
	if err := s.start(sctx); err != nil {
		s.release(context.WithoutCancel(ctx))
		select {
		case <-s.done:
			return fmt.Errorf("%w: %w", ErrServerClosed, err)
		default:
		}
		return err
	}
	close(s.ready)
	s.mu.Lock()
	served := s.served
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
	s.ln, s.addr = ln, ln.Addr().String()
	s.mu.Unlock()
	if err := os.MkdirAll(s.cfg.dataDir, 0o755); err != nil {
		return fmt.Errorf("creating data dir: %w", err)
	}
	cache, err := sandbox.OpenCache(s.cfg.compileCacheDir())
	if err != nil {
		return err
	}
	l := newLoader(cache, s.guestLimits)
	s.mu.Lock()
	s.loader = l
	s.mu.Unlock()
	store, err := modules.Open(filepath.Join(s.cfg.dataDir, "modules"))
	if err != nil {
		return err
	}
	if _, err := s.openCheckpoints(); err != nil {
		return err
	}
	if err := s.newDevices(); err != nil {
		return err
	}
	l.store = store
	var mods, configs []string // for the startup log line
	if err := s.openTenants(ctx); err != nil {
		return err
	}
	experts := map[string]*expert{}
	s.mu.Lock()
	s.experts = experts // filled as they are made, so that a failed Start releases them
	s.mu.Unlock()
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
	loaded, err := s.loadAll(ctx, l)
	<-dhtDone
	if err != nil {
		return err
	}
	if dhtErr != nil {
		return dhtErr
	}
	for i, ec := range s.cfg.experts {
		e := loaded[i].e
		if loaded[i].fresh {
			mods = append(mods, fmt.Sprintf("%v %s", ec.Module, e.guest.digest()))
		}
		s.schedule(e)
		if c := configString(ec.Config); !slices.Contains(configs, c) {
			configs = append(configs, c)
		}
		s.log.Debug("expert loaded", "uid", ec.UID, "digest", e.guest.digest(), "params", e.guest.binding.Params.Count())
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := s.restoreDeployments(ctx, l); err != nil {
		return err
	}
	s.mu.Lock()
	s.sorted = sortedExperts(experts)
	s.served = []any{
		"experts", uidsString(slices.Sorted(maps.Keys(experts))),
		"modules", strings.Join(mods, "; "),
		"config", strings.Join(configs, "; "),
		"device", deviceNames(s.devicesLocked()),
		"data_dir", s.cfg.dataDir,
	}
	s.mu.Unlock()

	s.startWorkers(ctx)
	s.startSaving()
	s.startHistory()

	if err := s.startHivemind(ctx); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	if path, h, ok := s.checkpointHandler(ln); ok {
		mux.Handle(path, h)
	}
	view := new(swarmView)
	mux.Handle("/ui/", ui.Handler(ui.API{History: s.history, Swarm: func() ui.Swarm { return view.get(s) }}))
	mux.Handle("GET /{$}", http.RedirectHandler("/ui/", http.StatusFound))
	opts := rpc.Options{
		MaxRequestBytes: s.cfg.maxRequestBytes,
		Server:          (*describer)(s),
		CORSOrigins:     s.cfg.corsOrigins,
		Discovery:       discovery,
		Codes:           errorCodes,
		Bodies:          s.bodyLimits(),
	}
	if s.tenants != nil {
		opts.Auth, opts.Modules, opts.Uploads = (*authenticator)(s), (*moduleAPI)(s), s.uploadLimits()
	}
	mux.Handle("/", rpc.NewHandler((*table)(s), opts))
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true) // gRPC without TLS
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
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	serveErr := make(chan error, 1)
	s.mu.Lock()
	s.ln, s.httpSrv, s.serveErr, s.startTime = ln, srv, serveErr, time.Now()
	s.mu.Unlock()
	go func() { serveErr <- srv.Serve(ln) }()
	if s.dht != nil {
		if err := s.dht.Start(ctx); err != nil {
			return err
		}
	}
	return nil
}

// loaded is one configured expert that loadAll made.
type loaded struct {
	e     *expert
	fresh bool // its module was compiled for it
}

// loadAll loads the configured experts side by side, as many at a time as
// the kernels have threads (the cores; one at a time on several devices,
// so that they go round-robin in order): experts of one module and config
// wait for the first to compile the module and start the instance they
// share, then restore or draw their parameters in parallel. Each is in
// s.experts once made, so that a failed Start releases it. The error is
// that of the first expert in the configured order that failed for a
// reason of its own (not the cancellation that a failure of another
// caused).
func (s *Server) loadAll(ctx context.Context, l *loader) ([]loaded, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := make([]loaded, len(s.cfg.experts))
	errs := make([]error, len(s.cfg.experts))
	n := max(1, min(kernelThreads(), len(s.cfg.experts)))
	s.mu.Lock()
	if len(s.lanes) > 1 {
		// Each load picks the device with the fewest experts made so
		// far (pickLane), which loads side by side would all see alike.
		n = 1
	}
	s.mu.Unlock()
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for i, ec := range s.cfg.experts {
		sem <- struct{}{} // loads start in the configured order
		wg.Go(func() {
			defer func() { <-sem }()
			if err := ctx.Err(); err != nil {
				errs[i] = fmt.Errorf("starting: %w", err)
				return
			}
			l.mu.Lock()
			e, fresh, err := s.load(ctx, l, s.operatorBackward(ec))
			l.mu.Unlock()
			if err != nil {
				errs[i] = err
				cancel()
				return
			}
			out[i] = loaded{e: e, fresh: fresh}
			s.mu.Lock()
			s.experts[ec.UID] = e
			s.mu.Unlock()
		})
	}
	wg.Wait()
	var first error
	for _, err := range errs {
		if err == nil {
			continue
		}
		if first == nil || (errors.Is(first, context.Canceled) && !errors.Is(err, context.Canceled)) {
			first = err
		}
	}
	return out, first
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
	case <-s.done:
	case err = <-s.serveErr:
	}
	s.log.Info("moehost shutting down")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
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
	s.shutdownOnce.Do(func() {
		close(s.done)
		s.mu.Lock()
		if s.cancelStart != nil {
			s.cancelStart()
		}
		s.mu.Unlock()
		s.lifeMu.Lock()
		defer s.lifeMu.Unlock()
		s.shutdownErr = s.release(ctx)
	})
	<-s.done
	return s.shutdownErr
}

// release frees whatever start made. It runs without s.mu held while it
// waits, because in-flight requests still look experts up.
func (s *Server) release(ctx context.Context) error {
	// Stop announcing first, so that the records expire while the rest
	// shuts down.
	s.stopAnnouncing()
	s.closeTenants()
	s.mu.Lock()
	httpSrv, serveErr, ln, l := s.httpSrv, s.serveErr, s.ln, s.loader
	experts := slices.Collect(maps.Values(s.experts))
	s.httpSrv, s.ln = nil, nil
	s.mu.Unlock()
	// Fail what is queued and refuse what comes, then let the running
	// batch finish, so that every handler can answer before HTTP stops.
	for _, e := range experts {
		e.pools.close(errShuttingDown)
	}
	s.stopSaving()
	s.stopHistory()
	s.closeWorkers(ctx)
	s.saveOnShutdown(ctx, experts)
	var errs []error
	if httpSrv != nil {
		if err := httpSrv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stopping HTTP server: %w", err), httpSrv.Close())
		}
		if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
	} else if ln != nil {
		errs = append(errs, ln.Close())
	}
	for _, e := range experts {
		errs = append(errs, e.close(ctx))
	}
	if l != nil {
		errs = append(errs, l.close(ctx))
	}
	errs = append(errs, s.closeDHT(ctx), s.closeHivemind(ctx))
	s.mu.Lock()
	devs, closed := s.devicesLocked(), s.devicesClosed
	s.devicesClosed = true
	s.mu.Unlock()
	if !closed {
		errs = append(errs, closeDevices(devs))
	}
	return errors.Join(errs...)
}

// table is the server's experts as package rpc sees them.
type table Server

func (t *table) Expert(uid string) (rpc.Expert, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.experts[uid]
	if !ok {
		return nil, false
	}
	return e, true
}

func (t *table) All() []rpc.Expert {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.sorted)
}

var _ rpc.Experts = (*table)(nil)

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

// configString renders an expert config as sorted key=value pairs.
func configString(c map[string]int64) string {
	parts := make([]string, 0, len(c))
	for _, k := range slices.Sorted(maps.Keys(c)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, c[k]))
	}
	if len(parts) == 0 {
		return "(none)"
	}
	return strings.Join(parts, ",")
}
