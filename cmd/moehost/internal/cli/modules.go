package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/sdk/wire"
)

// tokenEnv is the environment variable --token defaults to.
const tokenEnv = "MOEHOST_TOKEN"

// uploadChunkBytes is the size of each UploadModule message's chunk: the
// most the server accepts.
const uploadChunkBytes = 1 << 20

// remote holds the flags of the commands that call a running server:
// --server, --token and --ca-file.
type remote struct {
	server, token string
	needToken     bool
	ca            caFlag
	tls           *tls.Config // resolve's, from --ca-file
}

func (r *remote) register(cmd *cobra.Command, needToken bool) {
	r.needToken = needToken
	f := cmd.Flags()
	f.StringVar(&r.server, "server", "http://127.0.0.1:7700", "the server's URL (https:// for TLS)")
	f.StringVar(&r.token, "token", "", "a tenant's bearer token (default $"+tokenEnv+")")
	r.ca.register(f)
}

// resolve fills the token from the environment and checks it is there
// when needed, and reads the CA file.
func (r *remote) resolve(cmd *cobra.Command) error {
	if !cmd.Flags().Changed("token") {
		r.token = os.Getenv(tokenEnv)
	}
	if r.needToken && r.token == "" {
		return fmt.Errorf("%s needs a tenant's token: --token or $%s", cmd.Name(), tokenEnv)
	}
	var err error
	r.tls, err = r.ca.config(cmd.Flags())
	return err
}

// url returns --server with a scheme.
func (r *remote) url() string { return serverURL(r.server) }

func (r *remote) modules() moehostv1connect.ModuleServiceClient {
	return moehostv1connect.NewModuleServiceClient(httpClient(r.tls), r.url(), connect.WithInterceptors(bearer(r.token)))
}

func (r *remote) experts() moehostv1connect.ExpertServiceClient {
	return moehostv1connect.NewExpertServiceClient(httpClient(r.tls), r.url(), connect.WithInterceptors(bearer(r.token)))
}

// uploadCmd is `moehost upload FILE.wasm`.
func uploadCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		r    remote
		name string
	)
	cmd := &cobra.Command{
		Use:   "upload FILE.wasm",
		Short: "Upload a module to a server, and print its digest",
		Long: `Upload a WebAssembly expert module to a server's ModuleService. The server
validates it and keeps it for the tenant whose token is given. The digest
("sha256:<hex>") is the last line of stdout, for deploy --module.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := r.resolve(cmd); err != nil {
				return err
			}
			if name == "" {
				name = filepath.Base(args[0])
			}
			info, err := uploadFile(cmd.Context(), r.modules(), args[0], name)
			if err != nil {
				return err
			}
			fmt.Fprintf(stderr, "uploaded %s: %d bytes\n", info.GetName(), info.GetSizeBytes())
			fmt.Fprintln(stdout, info.GetDigest())
			return nil
		},
	}
	r.register(cmd, true)
	cmd.Flags().StringVar(&name, "name", "", "the module's name in listings (default the file's base name)")
	return cmd
}

// uploadFile streams the file in chunks, declaring its size first.
func uploadFile(ctx context.Context, c moehostv1connect.ModuleServiceClient, path, name string) (*moehostv1.ModuleInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := st.Size()
	stream := c.UploadModule(ctx)
	msg := &moehostv1.UploadModuleRequest{Name: name, SizeBytes: &size}
	buf := make([]byte, uploadChunkBytes)
	for {
		n, rerr := io.ReadFull(f, buf)
		if rerr != nil && !errors.Is(rerr, io.EOF) && !errors.Is(rerr, io.ErrUnexpectedEOF) {
			_, _ = stream.CloseAndReceive() // the read error says more
			return nil, fmt.Errorf("reading %s: %w", path, rerr)
		}
		msg.Chunk = buf[:n]
		if n > 0 || msg.SizeBytes != nil {
			if err := stream.Send(msg); err != nil {
				break // the server has answered: CloseAndReceive says how
			}
		}
		msg = &moehostv1.UploadModuleRequest{}
		if rerr != nil {
			break
		}
	}
	res, err := stream.CloseAndReceive()
	if err != nil {
		return nil, fmt.Errorf("upload %s: %w", path, err)
	}
	return res.Msg.GetModule(), nil
}

// deployCmd is `moehost deploy`.
func deployCmd(stdout io.Writer) *cobra.Command {
	var (
		r                 remote
		experts, module   string
		config            map[string]int64
		opt               moehostv1.OptimizerConfig
		batching          wire.BatchLimits
		limits            wire.ExpertLimits
		forward, backward string
	)
	cmd := &cobra.Command{
		Use:   "deploy --module DIGEST --experts UID_OR_PATTERN",
		Short: "Deploy an uploaded module as experts on a server",
		Long: `Deploy one of the tenant's uploaded modules as experts on a running server,
and print their uids. The uids must lie under the tenant's prefixes. Flags
left out take the server's settings, within the tenant's caps.`,
		Example: `  moehost deploy --token "$TOKEN" --module sha256:… --experts 'alice.ffn.[0:4]' --config hidden_dim=1024`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := r.resolve(cmd); err != nil {
				return err
			}
			req := &moehostv1.DeployExpertRequest{Experts: experts, ModuleDigest: module, Config: config}
			fl := cmd.Flags()
			for _, n := range []string{"optimizer", "lr", "momentum", "weight-decay", "clip-grad-norm", "scheduler", "num-warmup-steps", "num-training-steps"} {
				if fl.Changed(n) {
					req.Optimizer = &opt
				}
			}
			for n, v := range map[string]int{"--max-batch-size": batching.MaxBatchSize, "--min-batch-size": batching.MinBatchSize, "--queue-size": batching.QueueSize} {
				if v < 0 || v > math.MaxInt32 {
					return fmt.Errorf("%s %d: want 0 to %d", n, v, math.MaxInt32)
				}
			}
			if batching != (wire.BatchLimits{}) {
				req.Batching = &moehostv1.BatchLimits{
					MaxBatchSize: int32(batching.MaxBatchSize), MinBatchSize: int32(batching.MinBatchSize),
					QueueSize: int32(batching.QueueSize), MaxWait: optDuration(batching.MaxWait),
				}
			}
			if limits != (wire.ExpertLimits{}) {
				req.Limits = &moehostv1.ExpertLimits{
					CallTimeout: optDuration(limits.CallTimeout), BytesPerCall: limits.BytesPerCall,
					ParamBytes: limits.ParamBytes, MemoryPages: limits.MemoryPages,
				}
			}
			for _, a := range []struct {
				flag, v string
				dst     *moehostv1.Access
			}{{"--forward-access", forward, &req.ForwardAccess}, {"--backward-access", backward, &req.BackwardAccess}} {
				if a.v == "" {
					continue
				}
				acc, err := wire.ParseAccess(a.v)
				if err != nil {
					return fmt.Errorf("%s: %w", a.flag, err)
				}
				*a.dst = acc.Proto()
			}
			// The server checks all of it; these are the mistakes
			// worth a flag's name. They read as the server's answer
			// would: invalid_argument.
			if _, err := wire.DeploymentFromProto(req); err != nil {
				return fmt.Errorf("deploy: %w", connect.NewError(connect.CodeInvalidArgument, err))
			}
			res, err := r.modules().DeployExpert(cmd.Context(), connect.NewRequest(req))
			if err != nil {
				return err
			}
			for _, uid := range res.Msg.GetUids() {
				fmt.Fprintln(stdout, uid)
			}
			return nil
		},
	}
	r.register(cmd, true)
	f := cmd.Flags()
	f.StringVar(&module, "module", "", `the module's digest ("sha256:<hex>", as upload prints it)`)
	f.StringVar(&experts, "experts", "", `the experts' uid, or a uid pattern in hivemind's syntax ("alice.ffn.[0:4]")`)
	f.StringToInt64Var(&config, "config", nil, "the module's settings, key=value (e.g. hidden_dim=1024); repeatable or comma-separated")
	f.StringVar(&opt.Name, "optimizer", "", "optimizer applied after each backward batch: adam, adamw, sgd or none (default the server's)")
	f.Float64Var(&opt.Lr, "lr", 0, "learning rate; 0 means the optimizer's default")
	f.Float64Var(&opt.Momentum, "momentum", 0, "SGD momentum")
	f.Float64Var(&opt.WeightDecay, "weight-decay", 0, "weight decay (adamw: 0 means 1e-2)")
	f.Float64Var(&opt.ClipGradNorm, "clip-grad-norm", 0, "if positive, clip each step's gradients to this global L2 norm")
	f.StringVar(&opt.Scheduler, "scheduler", "", "learning-rate schedule: linear or none")
	f.Int64Var(&opt.NumWarmupSteps, "num-warmup-steps", 0, "warmup steps of the linear schedule")
	f.Int64Var(&opt.NumTrainingSteps, "num-training-steps", 0, "total steps of the linear schedule")
	f.IntVar(&batching.MaxBatchSize, "max-batch-size", 0, "most rows in one batch (default the server's)")
	f.IntVar(&batching.MinBatchSize, "min-batch-size", 0, "fewest rows flushed before --max-wait (default the server's)")
	f.DurationVar(&batching.MaxWait, "max-wait", 0, "longest a request waits for its batch to fill (default the server's)")
	f.IntVar(&batching.QueueSize, "queue-size", 0, "most pending requests per pool (default the server's)")
	f.DurationVar(&limits.CallTimeout, "call-timeout", 0, "longest one batch may run (default the tenant's cap)")
	f.Int64Var(&limits.BytesPerCall, "bytes-per-call", 0, "most host memory one batch may make (default the tenant's cap)")
	f.Int64Var(&limits.ParamBytes, "param-bytes", 0, "most parameter bytes per expert (default the tenant's cap)")
	f.Uint32Var(&limits.MemoryPages, "memory-pages", 0, "most guest memory, in 64 KiB pages (default the tenant's cap)")
	f.StringVar(&forward, "forward-access", "", "who may call Forward: public, owner or tenants (default public)")
	f.StringVar(&backward, "backward-access", "", "who may call Backward, which trains the expert: public, owner or tenants (default owner)")
	_ = cmd.MarkFlagRequired("module")
	_ = cmd.MarkFlagRequired("experts")
	return cmd
}

// optDuration is d on the wire, or nil for 0.
func optDuration(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

// undeployCmd is `moehost undeploy UID_OR_PATTERN`.
func undeployCmd(stdout io.Writer) *cobra.Command {
	var r remote
	cmd := &cobra.Command{
		Use:   "undeploy UID_OR_PATTERN",
		Short: "Stop serving some of the tenant's experts, and print their uids",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := r.resolve(cmd); err != nil {
				return err
			}
			res, err := r.modules().UndeployExpert(cmd.Context(), connect.NewRequest(&moehostv1.UndeployExpertRequest{Experts: args[0]}))
			if err != nil {
				return err
			}
			for _, uid := range res.Msg.GetUids() {
				fmt.Fprintln(stdout, uid)
			}
			return nil
		},
	}
	r.register(cmd, true)
	return cmd
}

// modulesCmd is `moehost modules`: the tenant's modules, one a line.
func modulesCmd(stdout io.Writer) *cobra.Command {
	var r remote
	var noHeaders bool
	cmd := &cobra.Command{
		Use:   "modules",
		Short: "List the tenant's modules on a server",
		Long: `List the tenant's uploaded modules, one a line after a header row:
DIGEST<TAB>BYTES<TAB>NAME<TAB>EXPERTS (comma-separated uids that run it).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := r.resolve(cmd); err != nil {
				return err
			}
			res, err := r.modules().ListModules(cmd.Context(), connect.NewRequest(&moehostv1.ListModulesRequest{}))
			if err != nil {
				return err
			}
			if !noHeaders {
				fmt.Fprintln(stdout, "DIGEST\tBYTES\tNAME\tEXPERTS")
			}
			for _, m := range res.Msg.GetModules() {
				fmt.Fprintf(stdout, "%s\t%d\t%s\t%s\n", m.GetDigest(), m.GetSizeBytes(), m.GetName(), strings.Join(m.GetExperts(), ","))
			}
			return nil
		},
	}
	r.register(cmd, true)
	cmd.Flags().BoolVar(&noHeaders, "no-headers", false, "print no header row")
	var dr remote
	del := &cobra.Command{
		Use:   "delete DIGEST",
		Short: "Delete one of the tenant's modules (refused while an expert runs it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := dr.resolve(cmd); err != nil {
				return err
			}
			_, err := dr.modules().DeleteModule(cmd.Context(), connect.NewRequest(&moehostv1.DeleteModuleRequest{Digest: args[0]}))
			return err
		},
	}
	dr.register(del, true)
	cmd.AddCommand(del)
	return cmd
}

// expertsCmd is `moehost experts`: what ExpertService.ListExperts says.
func expertsCmd(stdout io.Writer) *cobra.Command {
	var r remote
	var noHeaders bool
	cmd := &cobra.Command{
		Use:   "experts",
		Short: "List the experts a server hosts",
		Long: `List the experts a running server hosts, one a line after a header row:
UID<TAB>OWNER<TAB>MODULE<TAB>PARAMETERS<TAB>HEALTH (healthy|unhealthy), where
OWNER is the tenant that deployed it, or "-" for the operator's. No token
is needed; a given one must be valid.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := r.resolve(cmd); err != nil {
				return err
			}
			res, err := r.experts().ListExperts(cmd.Context(), connect.NewRequest(&moehostv1.ListExpertsRequest{}))
			if err != nil {
				return err
			}
			if !noHeaders {
				fmt.Fprintln(stdout, "UID\tOWNER\tMODULE\tPARAMETERS\tHEALTH")
			}
			for _, e := range res.Msg.GetExperts() {
				health := "healthy"
				if !e.GetHealthy() {
					health = "unhealthy"
				}
				owner := e.GetOwner()
				if owner == "" {
					owner = "-"
				}
				fmt.Fprintf(stdout, "%s\t%s\t%s\t%d\t%s\n", e.GetUid(), owner, e.GetModuleDigest(), e.GetParameterCount(), health)
			}
			return nil
		},
	}
	r.register(cmd, false)
	cmd.Flags().BoolVar(&noHeaders, "no-headers", false, "print no header row")
	return cmd
}
