package cli

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host/checkpoint"
	"github.com/moehost/moehost/internal/atomicfile"
)

// checkpointCmd is `moehost checkpoint save|list|restore|export`: the
// CheckpointService from the command line.
func checkpointCmd(stdout io.Writer) *cobra.Command {
	var server, token, tenantToken string
	var ca caFlag
	cmd := &cobra.Command{
		Use:   "checkpoint",
		Short: "Save, list, restore and export experts' checkpoints on a server",
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&server, "server", "http://127.0.0.1:7700", "the server's URL (https:// for TLS)")
	pf.StringVar(&token, "admin-token", "", "the server's admin token (needed unless the server listens on loopback and has no tenants)")
	pf.StringVar(&tenantToken, "token", "", "a tenant's token, for its own experts only (default $"+tokenEnv+")")
	ca.register(pf)
	// hc is the HTTP client of every call, made by PersistentPreRunE
	// from --ca-file.
	var hc *http.Client
	cmd.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		conf, err := ca.config(cmd.Flags())
		hc = httpClient(conf)
		return err
	}
	client := func() moehostv1connect.CheckpointServiceClient {
		if token == "" {
			token = tenantToken
		}
		if token == "" {
			token = os.Getenv(tokenEnv)
		}
		return moehostv1connect.NewCheckpointServiceClient(hc, serverURL(server), connect.WithInterceptors(bearer(token)))
	}
	printInfo := func(in *moehostv1.CheckpointInfo) {
		fmt.Fprintf(stdout, "%s\tstep %d\t%d bytes\t%s\n", in.GetUid(), in.GetStep(), in.GetSizeBytes(), in.GetCreateTime().AsTime().Format(time.RFC3339))
	}
	save := &cobra.Command{
		Use: "save UID", Short: "Save the expert's state now", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := client().Save(cmd.Context(), connect.NewRequest(&moehostv1.CheckpointServiceSaveRequest{Uid: args[0]}))
			if err != nil {
				return err
			}
			printInfo(res.Msg.GetCheckpoint())
			return nil
		},
	}
	list := &cobra.Command{
		Use: "list [UID]", Short: "List the expert's checkpoints, newest first; with no uid, every expert's on the server", Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			uids := args
			if len(uids) == 0 {
				res, err := moehostv1connect.NewExpertServiceClient(hc, serverURL(server), connect.WithInterceptors(bearer(token))).
					ListExperts(cmd.Context(), connect.NewRequest(&moehostv1.ListExpertsRequest{}))
				if err != nil {
					return err
				}
				for _, e := range res.Msg.GetExperts() {
					uids = append(uids, e.GetUid())
				}
				slices.Sort(uids)
			}
			for _, uid := range uids {
				res, err := client().List(cmd.Context(), connect.NewRequest(&moehostv1.CheckpointServiceListRequest{Uid: uid}))
				if len(args) == 0 && connect.CodeOf(err) == connect.CodeNotFound {
					continue // undeployed since ListExperts
				}
				if err != nil {
					return err
				}
				for _, in := range res.Msg.GetCheckpoints() {
					printInfo(in)
				}
			}
			return nil
		},
	}
	var step int64
	restore := &cobra.Command{
		Use: "restore UID", Short: "Load a checkpoint into the running expert (the newest, or --step)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &moehostv1.CheckpointServiceRestoreRequest{Uid: args[0]}
			if cmd.Flags().Changed("step") {
				req.Step = &step
			}
			res, err := client().Restore(cmd.Context(), connect.NewRequest(req))
			if err != nil {
				return err
			}
			printInfo(res.Msg.GetCheckpoint())
			return nil
		},
	}
	restore.Flags().Int64Var(&step, "step", 0, "the step to restore (default: the newest)")
	var out string
	var force bool
	export := &cobra.Command{
		Use: "export UID", Short: "Write the expert's current parameters to a safetensors file (a PyTorch state_dict)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				out = args[0] + ".safetensors"
				// A default name is not a choice to overwrite.
				if _, err := os.Stat(out); err == nil && !force {
					return fmt.Errorf("%s exists: overwrite it with --force, or name another file with -o", out)
				}
			}
			return exportParams(cmd.Context(), client(), args[0], out, stdout)
		},
	}
	export.Flags().StringVarP(&out, "output", "o", "", "the file to write (default <uid>.safetensors, which is not overwritten without --force)")
	export.Flags().BoolVar(&force, "force", false, "overwrite <uid>.safetensors when -o is not given")
	cmd.AddCommand(save, list, restore, export)
	return cmd
}

func exportParams(ctx context.Context, c moehostv1connect.CheckpointServiceClient, uid, out string, stdout io.Writer) error {
	res, err := c.GetParameters(ctx, connect.NewRequest(&moehostv1.CheckpointServiceGetParametersRequest{Uid: uid}))
	if err != nil {
		return err
	}
	var ts []checkpoint.Tensor
	for _, p := range res.Msg.GetParameters() {
		t := p.GetTensor()
		if t.GetDtype() != moehostv1.DType_DTYPE_FLOAT32 || len(t.GetData())%4 != 0 {
			return fmt.Errorf("parameter %q is not float32", p.GetName())
		}
		shape := make([]int, len(t.GetShape()))
		for i, d := range t.GetShape() {
			shape[i] = int(d)
		}
		vals := make([]float32, len(t.GetData())/4)
		for i := range vals {
			vals[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.GetData()[4*i:]))
		}
		ts = append(ts, checkpoint.Tensor{Name: p.GetName(), Shape: shape, Data: vals})
	}
	b, err := checkpoint.Encode(ts, map[string]string{"format": "pt", "uid": uid, "step": fmt.Sprint(res.Msg.GetStep())})
	if err != nil {
		return err
	}
	if err := atomicfile.Write(out, b); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %d parameters of %s at step %d to %s\n", len(ts), uid, res.Msg.GetStep(), out)
	return nil
}

// bearer adds a bearer token (the admin's, or a tenant's) to every
// request, streaming ones included.
type bearer string

func (b bearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if b != "" {
			req.Header().Set("Authorization", "Bearer "+string(b))
		}
		return next(ctx, req)
	}
}

func (b bearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		if b != "" {
			conn.RequestHeader().Set("Authorization", "Bearer "+string(b))
		}
		return conn
	}
}

func (b bearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
