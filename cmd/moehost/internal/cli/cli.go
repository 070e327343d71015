// Package cli holds moehost's cobra commands: flags and wiring only; the
// behaviour lives in package host.
package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/modules"
)

// Main runs the command line and returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	return mainWith(args, os.Stdin, stdout, stderr)
}

// mainWith is Main reading stdin (forward's and backward's JSON) from stdin.
func mainWith(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := &cobra.Command{
		Use:           "moehost",
		Short:         "Host Mixture-of-Experts experts compiled to WebAssembly",
		Version:       Version(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("moehost {{.Version}}\n")
	root.SetFlagErrorFunc(suggestFlag) // the subcommands inherit it
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(serveCmd(stderr), benchCmd(stdout))
	root.AddCommand(checkpointCmd(stdout))
	root.AddCommand(benchMemoryCmd(stdout), benchStartupCmd(stdout))
	root.AddCommand(versionCmd(stdout), compileCmd(stdout))
	root.AddCommand(discoverCmd(stdout, stderr))
	root.AddCommand(tenantCmd(stdout, stderr))
	root.AddCommand(uploadCmd(stdout, stderr), deployCmd(stdout), undeployCmd(stdout), modulesCmd(stdout), expertsCmd(stdout))
	root.AddCommand(forwardCmd(stdout), backwardCmd(stdout))
	root.AddCommand(expertCmd(stdout))
	if err := root.Execute(); err != nil {
		// Package host prefixes its own errors with "moehost:"; print one.
		fmt.Fprintln(stderr, "moehost:", strings.TrimPrefix(err.Error(), "moehost: "))
		if hint := unknownCAHint(err); hint != "" {
			fmt.Fprintln(stderr, "moehost:", hint)
		}
		return 1
	}
	return 0
}

func serveCmd(stderr io.Writer) *cobra.Command {
	var (
		listen, dataDir, compileCache, pattern, module, optimizer, logLevel string
		tenantsFile                                                         string
		maxUploadBytes                                                      int64
		hiddenDim                                                           int64
		lr                                                                  float64
		batching                                                            host.BatchLimits
		guest                                                               host.GuestLimits
		memoryLimit                                                         string
		train                                                               trainFlags
		logFormat                                                           string
		maxRequestBytes                                                     int
		corsOrigins                                                         []string
		dhtCfg                                                              host.DHTConfig
		tlsCfg                                                              host.TLSConfig
		noDHT                                                               bool
		hm                                                                  hivemindFlags
		device                                                              string
		publicBackward                                                      bool
		uploadIdle, uploadTimeout                                           time.Duration
		bodyIdle, bodyTimeout                                               time.Duration
		drainTimeout                                                        time.Duration
		minBodyRate                                                         = byteSize(host.DefaultMinBodyRate)
		maxUploads                                                          int
		moduleLimits                                                        moduleLimitFlags
		prof                                                                profileFlags
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve experts over Connect, gRPC and gRPC-Web",
		Long: `Serve experts over Connect, gRPC and gRPC-Web on one port.

With no flags it hosts hivemind's ffn expert (hidden_dim 1024) as ffn.0 … ffn.3
on 127.0.0.1:7700, keeping its state in ./moehost-data. The default module is
its C build, ffn-c (4 KB, compiled in milliseconds); ffn, the Go build (1.9 MB),
is bitwise equal, and each restores the other's checkpoints.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(stderr, logLevel, logFormat)
			if err != nil {
				return err
			}
			uids, err := host.ExpandPattern(pattern)
			if err != nil {
				return fmt.Errorf("--experts: %w", err)
			}
			src, err := moduleSource(module)
			if err != nil {
				return err
			}
			if err := moduleLimits.check(); err != nil {
				return err
			}
			if err := noDHTAlone(cmd.Flags(), noDHT); err != nil {
				return err
			}
			if maxRequestBytes <= 0 {
				return fmt.Errorf("--max-request-bytes %d: must be positive", maxRequestBytes)
			}
			// Every built-in reads hidden_dim; a module of one's own gets
			// it only when asked for, since the host refuses a config key
			// that the module does not read.
			var config map[string]int64
			if _, builtin := wasmexperts.Builtin(module); builtin || cmd.Flags().Changed("hidden-dim") {
				config = map[string]int64{"hidden_dim": hiddenDim}
			}
			experts := make([]host.ExpertConfig, len(uids))
			for i, uid := range uids {
				experts[i] = host.ExpertConfig{UID: uid, Module: src, Config: config}
			}
			memLimit, err := host.ParseMemoryLimit(memoryLimit)
			if err != nil {
				return fmt.Errorf("--memory-limit: %w", err)
			}
			srv, err := host.New(
				host.WithListen(listen),
				host.WithDataDir(dataDir),
				host.WithCompileCache(compileCache),
				// main runs the compile child (host.CompileChildMain).
				host.WithCompileInChild(),
				host.WithLogger(log),
				deviceEnv(),
				host.WithExperts(experts...),
				host.WithOptimizer(train.optimizer(optimizer, lr)),
				host.WithBatching(batching),
				host.WithGuestLimits(guest),
				host.WithMemoryLimit(memLimit),
				host.WithUpdatePeriod(train.updatePeriod),
				host.WithAdminToken(train.adminToken),
				train.checkpoints(),
				host.WithMaxRequestBytes(maxRequestBytes),
				host.WithCORSOrigins(corsOrigins...),
				host.WithTLS(tlsCfg),
				dhtOption(noDHT, dhtCfg),
				hm.option(),
				host.WithTenants(tenantsFile),
				host.WithMaxUploadBytes(maxUploadBytes),
				host.WithPublicBackward(publicBackward),
				host.WithUploadTimeouts(uploadIdle, uploadTimeout),
				host.WithBodyTimeouts(bodyIdle, bodyTimeout),
				host.WithDrainTimeout(drainTimeout),
				host.WithMinBodyRate(bodyRate(minBodyRate)),
				host.WithMaxUploads(maxUploads),
				host.WithDevice(device),
			)
			if err != nil {
				return err
			}
			stopProf, err := prof.start()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			// The first signal starts the drain; a second one ends the
			// process at once (the signals' default action).
			context.AfterFunc(ctx, stop)
			err = srv.Run(ctx)
			if perr := stopProf(); err == nil {
				err = perr
			}
			if errors.Is(err, context.Canceled) {
				err = nil
			}
			if errors.Is(err, syscall.EADDRINUSE) {
				err = fmt.Errorf("%w (is another server on it? --listen 127.0.0.1:* picks a free port)", err)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", host.DefaultListen, `address to serve on; port "*" picks a free one`)
	f.StringVar(&dataDir, "data-dir", host.DefaultDataDir, "directory for the server's state")
	f.StringVar(&compileCache, "compile-cache", "", "directory for compiled modules, which servers on one machine may share (default $"+host.CompileCacheEnv+", else cache/wazero in the data dir)")
	f.StringVar(&pattern, "experts", "ffn.[0:4]", "expert uids, in hivemind's expert_pattern syntax")
	f.StringVar(&module, "module", "ffn-c", "expert module: a .wasm file, a module in the data dir's store by digest (sha256:<hex>, as moehost pull prints it), or a built-in example ("+strings.Join(wasmexperts.BuiltinNames(), ", ")+")")
	f.Int64Var(&hiddenDim, "hidden-dim", 1024, `the experts' "hidden_dim" config value (a --module file gets it only when this flag is given)`)
	f.StringVar(&optimizer, "optimizer", "adam", "optimizer applied after each backward batch: adam, adamw, sgd or none")
	f.Float64Var(&lr, "lr", 0, "learning rate; 0 means the optimizer's default (adam 1e-3, sgd 1e-2)")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	f.IntVar(&batching.MaxBatchSize, "max-batch-size", 1024, "most rows in one batch; larger requests are split")
	f.IntVar(&batching.MinBatchSize, "min-batch-size", 1, "fewest rows flushed before --max-wait")
	f.DurationVar(&batching.MaxWait, "max-wait", 10*time.Millisecond, "longest a request waits for its batch to fill")
	f.DurationVar(&guest.CallTimeout, "call-timeout", time.Minute, "longest one batch may run in an expert before its instance is stopped and replaced, and the expert quarantined for 9 times as long")
	f.IntVar(&guest.OpsPerCall, "ops-per-call", 100000, "most ops one batch may run in an expert")
	f.IntVar(&batching.QueueSize, "queue-size", 1024, "most pending requests per expert and pool; more get ResourceExhausted")
	f.DurationVar(&guest.InitTimeout, "init-timeout", 30*time.Second, "longest an expert's instance may take to start (_initialize and moe_init); a tenant's instance starts at low priority, and this bounds its CPU time, its wall time at 4 times as much")
	f.Int64Var(&guest.BytesPerCall, "bytes-per-call", 2<<30, "most host memory one batch may make in an expert (tensor bytes plus 512 per tensor)")
	moduleLimits.register(f, &guest.Module)
	f.StringVar(&memoryLimit, "memory-limit", "75%", `memory limit: the Go runtime's soft limit and the ceiling on live tensor bytes, past which new work gets ResourceExhausted; bytes with a unit (2GiB, 1500MB), a percentage of the cgroup's or machine's memory, or "none"`)
	train.register(f)
	f.StringVar(&logFormat, "log-format", "text", "log format: text (logfmt) or json")
	f.IntVar(&maxRequestBytes, "max-request-bytes", 256<<20, "largest request message in bytes; clients must raise their own limits to send this much (grpcio's default is 4 MiB)")
	f.StringVar(&tlsCfg.CertFile, "tls-cert", "", "PEM certificate (chain) to serve TLS with, on the same port: h2 and HTTP/1.1 by ALPN; reread on SIGHUP and when the file changes. Default: plaintext HTTP/1.1 and h2c, for loopback and private networks")
	f.StringVar(&tlsCfg.KeyFile, "tls-key", "", "PEM private key of --tls-cert")
	f.StringVar(&tlsCfg.ClientCAFile, "tls-client-ca", "", "PEM CA certificate(s): with --tls-cert, every client must show a certificate they signed (mutual TLS)")
	f.StringSliceVar(&corsOrigins, "cors-origin", nil, `origin whose browser pages may call the server, e.g. "http://localhost:5173", or "*" for any; repeatable or comma-separated`)
	f.StringSliceVar(&dhtCfg.InitialPeers, "initial-peers", nil, "multiaddrs (with /p2p/) of DHT peers to join, comma-separated; default none (a one-node swarm)")
	f.StringSliceVar(&dhtCfg.Listen, "dht-listen", nil, "libp2p multiaddrs for the DHT node; default a TCP port on the --listen host, the same at every start (kept in <data-dir>/dht-port; a free one, with a warning, if it is taken)")
	f.StringSliceVar(&dhtCfg.Announce, "announce", nil, `public base URL(s) of this server put in its DHT records; default "http://" plus the bound address, "https://" with --tls-cert (required with an unspecified --listen host)`)
	f.Int64Var(&dhtCfg.StoreBytes, "dht-store-bytes", 0, "bound on what the DHT node stores, its records and others' (default 64 MiB); strangers' records are evicted oldest first")
	f.Int64Var(&dhtCfg.PeerBytes, "dht-peer-bytes", 0, "bound on what one other peer may store in this DHT node (default 4 MiB)")
	hm.register(f)
	f.BoolVar(&noDHT, "no-dht", false, "run no DHT node: the server is reachable by address only")
	f.StringVar(&tenantsFile, "tenants", "", "tenants file (moehost tenant add): serve ModuleService so that its tenants upload modules and deploy experts under their prefixes; reread on SIGHUP. Default: none, only the experts given here are served")
	f.Int64Var(&maxUploadBytes, "max-upload-bytes", 64<<20, "largest module upload in bytes (separate from --max-request-bytes)")
	f.BoolVar(&publicBackward, "public-backward", false, "with --tenants, let anyone call Backward (train) on the experts given here; by default only the admin token may, as only a tenant may train its own")
	f.DurationVar(&uploadIdle, "upload-idle-timeout", host.DefaultUploadIdleTimeout, "with --tenants, longest a module upload may send nothing before it is cut")
	f.DurationVar(&uploadTimeout, "upload-timeout", host.DefaultUploadTimeout, "with --tenants, longest one module upload may take in all")
	f.DurationVar(&bodyIdle, "body-idle-timeout", host.DefaultBodyIdleTimeout, "longest a request's body (but a module upload's) may send nothing before the call is cut; the call itself may then run longer")
	f.DurationVar(&bodyTimeout, "body-timeout", host.DefaultBodyTimeout, "longest a request's body (but a module upload's) may take to arrive in all; the call itself may then run longer")
	f.Var(&minBodyRate, "min-body-rate", "least average rate in bytes a second, once 5 s are over, of a request body or a module upload, e.g. 1KiB; slower ones are cut (0: no floor)")
	f.IntVar(&maxUploads, "max-uploads", host.DefaultMaxUploads, "with --tenants, most module uploads in flight at once, all tenants together, counted from each stream's headers")
	f.DurationVar(&drainTimeout, "drain-timeout", host.DefaultDrainTimeout, "at SIGTERM or SIGINT, longest the batches in flight may run before they are cancelled (a second signal exits at once)")
	prof.register(f)
	f.StringVar(&device, "device", "cpu", "devices to run experts on: cpu, cuda (GPU 0), cuda:N, or cuda:N,M,... (experts assigned round-robin, one worker per GPU); CUDA needs a binary from make build-cuda")
	return cmd
}

// bodyRate is --min-body-rate for host.WithMinBodyRate, where 0 means
// the default and a negative rate none.
func bodyRate(b byteSize) int64 {
	if b == 0 {
		return -1
	}
	return int64(b)
}

// newLogger returns the server's logger for --log-level and --log-format.
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// wasmMagic starts every WebAssembly binary.
var wasmMagic = []byte("\x00asm")

// moduleSource resolves --module: a built-in example's name, or a file
// that starts like a WebAssembly binary. Errors name the file, or list the
// built-ins when the name is neither.
func moduleSource(module string) (host.ModuleSource, error) {
	if strings.HasPrefix(module, "sha256:") {
		// A module in the data dir's store, by digest (as moehost pull
		// prints it); the server checks that it is there.
		if _, err := modules.ParseDigest(module); err != nil {
			return host.ModuleSource{}, fmt.Errorf("--module %q: %w", module, err)
		}
		return host.ModuleDigest(module), nil
	}
	if wasm, ok := wasmexperts.Builtin(module); ok {
		src := host.NamedModuleBytes(module, wasm)
		for _, t := range wasmexperts.Twins(module) {
			twin, _ := wasmexperts.Builtin(t)
			src = src.RestoresCheckpointsOf(modules.Digest(twin))
		}
		return src, nil
	}
	f, err := os.Open(module)
	if errors.Is(err, fs.ErrNotExist) {
		return host.ModuleSource{}, fmt.Errorf("--module %q: no such file, and not a built-in module (%s)", module, strings.Join(wasmexperts.BuiltinNames(), ", "))
	}
	if err != nil {
		return host.ModuleSource{}, fmt.Errorf("--module: %w", err)
	}
	defer f.Close()
	head := make([]byte, len(wasmMagic))
	if _, err := io.ReadFull(f, head); err != nil || !bytes.Equal(head, wasmMagic) {
		return host.ModuleSource{}, fmt.Errorf("--module %s: not a WebAssembly module (a .wasm file starts with \\0asm)", module)
	}
	return host.ModuleFile(module), nil
}
