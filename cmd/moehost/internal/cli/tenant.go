package cli

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/host/tenant"
)

// tenantCmd is `moehost tenant add|list|remove|rotate|caps`: editing the
// tenants file that `moehost serve --tenants` reads. A running server
// picks up changes on SIGHUP.
func tenantCmd(stdout, stderr io.Writer) *cobra.Command {
	var file, dataDir string
	cmd := &cobra.Command{
		Use:   "tenant",
		Short: "Add, list, remove tenants and rotate their tokens in the tenants file",
		Long: `Edit the tenants file: who may upload and deploy experts, under which uid
prefixes, with which caps. Tokens are stored hashed and printed only once.
A running server rereads the file on SIGHUP (kill -HUP <pid>).`,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&file, "tenants", "", "the tenants file (default <data-dir>/"+tenant.FileName+")")
	pf.StringVar(&dataDir, "data-dir", host.DefaultDataDir, "the server's data directory, where the tenants file is by default")
	path := func() string {
		if file != "" {
			return file
		}
		return filepath.Join(dataDir, tenant.FileName)
	}
	// printToken prints the token alone on stdout, so that
	// TOKEN=$(moehost tenant add ...) works, and what it is on stderr.
	printToken := func(what, token string) {
		fmt.Fprintf(stderr, "%s in %s.\nIts token, shown only this once (store it now; a running server accepts it after SIGHUP):\n", what, path())
		fmt.Fprintln(stdout, token)
	}

	var prefixes []string
	var caps capFlags
	add := &cobra.Command{
		Use:   "add NAME --prefix P [--prefix P2] [--cap-...]",
		Short: "Add a tenant owning uid prefixes, and print its new token",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(prefixes) == 0 {
				return errors.New("--prefix: give at least one uid prefix the tenant owns (e.g. --prefix " + args[0] + ")")
			}
			var token string
			err := tenant.Edit(path(), func(f *tenant.File) (err error) {
				token, err = f.Add(args[0], prefixes, caps.caps)
				return err
			})
			if err != nil {
				return err
			}
			printToken(fmt.Sprintf("Added tenant %q (prefixes %s; caps %s)", args[0], strings.Join(prefixes, ", "), caps.caps), token)
			return nil
		},
	}
	add.Flags().StringArrayVar(&prefixes, "prefix", nil, `a uid prefix the tenant owns, at dot boundaries ("alice" owns alice.* but not alicex.*); repeatable`)
	caps.register(add.Flags())

	list := &cobra.Command{
		Use:   "list",
		Short: "List the tenants: names, prefixes, token counts and caps (never tokens or their hashes)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			f, err := tenant.LoadOrEmpty(path())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tPREFIXES\tTOKENS\tCAPS")
			for _, t := range f.Tenants() {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", t.Name, strings.Join(t.Prefixes, ","), t.Tokens(), t.Caps)
			}
			return tw.Flush()
		},
	}

	remove := &cobra.Command{
		Use:   "remove NAME",
		Short: "Remove a tenant; when the server reloads (SIGHUP) its tokens stop working and its experts are undeployed",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if err := tenant.Edit(path(), func(f *tenant.File) error { return f.Remove(args[0]) }); err != nil {
				return err
			}
			fmt.Fprintf(stderr, "Removed tenant %q from %s; send the server SIGHUP: its tokens stop working, and its experts are undeployed once their running batches finish (its modules and checkpoints stay on disk).\n", args[0], path())
			return nil
		},
	}

	var keepOld bool
	rotate := &cobra.Command{
		Use:   "rotate NAME",
		Short: "Give a tenant a new token (print it), revoking the old ones unless --keep-old",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			var token string
			err := tenant.Edit(path(), func(f *tenant.File) (err error) {
				token, err = f.Rotate(args[0], keepOld)
				return err
			})
			if err != nil {
				return err
			}
			what := fmt.Sprintf("New token for tenant %q; the old ones are revoked", args[0])
			if keepOld {
				what = fmt.Sprintf("New token for tenant %q; the old ones still work until a rotate without --keep-old", args[0])
			}
			printToken(what, token)
			return nil
		},
	}
	rotate.Flags().BoolVar(&keepOld, "keep-old", false, "keep the old tokens working too, while clients move to the new one")

	var newCaps capFlags
	setCaps := &cobra.Command{
		Use:   "caps NAME --cap-...",
		Short: "Change a tenant's caps: only the caps given change; 0 means the server's default",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var now tenant.Caps
			err := tenant.Edit(path(), func(f *tenant.File) error {
				t, ok := f.Tenant(args[0])
				if !ok {
					return fmt.Errorf("tenant %q: %w", args[0], tenant.ErrUnknownTenant)
				}
				now = newCaps.merge(cmd.Flags(), t.Caps)
				return f.SetCaps(args[0], now)
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(stderr, "Tenant %q now has caps %s; send the server SIGHUP to apply them.\n", args[0], now)
			return nil
		},
	}
	newCaps.register(setCaps.Flags())

	cmd.AddCommand(add, list, remove, rotate, setCaps)
	return cmd
}

// capFlags are the --cap-... flags, one per tenant.Caps field.
type capFlags struct {
	caps tenant.Caps
}

func (c *capFlags) register(f *pflag.FlagSet) {
	f.Int64Var(&c.caps.Modules, "cap-modules", 0, "most modules the tenant may upload (0: the server's default)")
	f.Var((*byteSize)(&c.caps.ModuleBytes), "cap-module-bytes", "most bytes of uploaded modules, e.g. 64MiB (0: the server's default)")
	f.Int64Var(&c.caps.Experts, "cap-experts", 0, "most experts the tenant may deploy (0: the server's default)")
	f.Int64Var(&c.caps.MemoryPages, "cap-memory-pages", 0, "most guest memory per instance, in 64 KiB pages, at most 65536 (0: the server's default)")
	f.DurationVar(&c.caps.CallTimeout, "cap-call-timeout", 0, "longest one call into the tenant's experts may run, e.g. 30s (0: the server's default)")
	f.Var((*byteSize)(&c.caps.BytesPerCall), "cap-bytes-per-call", "most host tensor memory one call may make, e.g. 512MiB (0: the server's default)")
	f.Var((*byteSize)(&c.caps.ParamBytes), "cap-param-bytes", "most parameter bytes of all the tenant's experts together, e.g. 2GiB (0: the server's default)")
	f.Int64Var(&c.caps.QueueShare, "cap-queue-share", 0, "the tenant's weight in the fair scheduler (0: the server's default, 1)")
	f.DurationVar(&c.caps.InitTimeout, "cap-init-timeout", 0, "most CPU time one of the tenant's instances may take to start (_initialize and moe_init), e.g. 5s (0: the server's --init-timeout)")
	f.Int64Var(&c.caps.Uploads, "cap-uploads", 0, "most module uploads the tenant may have in flight at once (0: the default, 2)")
	f.Int64Var(&c.caps.Deploys, "cap-deploys", 0, "most deploy requests the tenant may have in flight at once (0: the default, 2)")
}

// merge returns old with the caps whose flags were set replaced.
func (c *capFlags) merge(f *pflag.FlagSet, old tenant.Caps) tenant.Caps {
	set := func(name string, dst *int64, v int64) {
		if f.Changed(name) {
			*dst = v
		}
	}
	set("cap-modules", &old.Modules, c.caps.Modules)
	set("cap-module-bytes", &old.ModuleBytes, c.caps.ModuleBytes)
	set("cap-experts", &old.Experts, c.caps.Experts)
	set("cap-memory-pages", &old.MemoryPages, c.caps.MemoryPages)
	if f.Changed("cap-call-timeout") {
		old.CallTimeout = c.caps.CallTimeout
	}
	set("cap-bytes-per-call", &old.BytesPerCall, c.caps.BytesPerCall)
	set("cap-param-bytes", &old.ParamBytes, c.caps.ParamBytes)
	set("cap-queue-share", &old.QueueShare, c.caps.QueueShare)
	if f.Changed("cap-init-timeout") {
		old.InitTimeout = c.caps.InitTimeout
	}
	set("cap-uploads", &old.Uploads, c.caps.Uploads)
	set("cap-deploys", &old.Deploys, c.caps.Deploys)
	return old
}

// byteSize is a flag of bytes: a count, or a number with a unit (B, KB,
// MB, GB, TB, KiB, MiB, GiB, TiB).
type byteSize int64

func (b *byteSize) String() string { return strconv.FormatInt(int64(*b), 10) }
func (b *byteSize) Type() string   { return "bytes" }

func (b *byteSize) Set(s string) error {
	units := []struct {
		suffix string
		mult   int64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
	}
	num, mult := s, int64(1)
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	v, err := strconv.ParseInt(num, 10, 64)
	if err != nil || v < 0 || v > (1<<63-1)/mult {
		return fmt.Errorf("%q is not a byte count such as 1048576 or 64MiB", s)
	}
	*b = byteSize(v * mult)
	return nil
}
