package cli

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"

	"github.com/spf13/cobra"
)

// sdkModule is the module path of this repository, whose sdk/expert an
// expert builds against.
const sdkModule = "github.com/moehost/moehost"

func expertCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "expert",
		Short: "Write an expert: scaffold a Go expert module and build it",
	}
	cmd.AddCommand(expertNewCmd(stdout), expertBuildCmd(stdout))
	return cmd
}

func expertNewCmd(stdout io.Writer) *cobra.Command {
	var sdk string
	cmd := &cobra.Command{
		Use:   "new NAME",
		Short: "Scaffold a buildable Go expert in ./NAME",
		Long: `Scaffold a buildable Go expert in the directory NAME (a path; its last
element names the Go module and the .wasm): go.mod, main.go (a linear layer
whose size is the config key hidden_dim) and a Makefile whose build target
makes NAME.wasm.

The moehost module is not published yet, so go.mod builds the SDK from a
local checkout with a replace directive: --sdk, by default the checkout
that holds the current directory or this binary.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := args[0]
			name := filepath.Base(filepath.Clean(dir))
			if !expertName.MatchString(name) {
				return fmt.Errorf("expert name %q: want a letter, then letters, digits, '-' or '_'", name)
			}
			if _, err := os.Lstat(dir); err == nil {
				return fmt.Errorf("%s already exists; pick a new directory", dir)
			} else if !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			if sdk == "" {
				var err error
				if sdk, err = findCheckout(); err != nil {
					return err
				}
			}
			goVersion, err := checkoutGoVersion(sdk)
			if err != nil {
				return fmt.Errorf("--sdk %s: %w", sdk, err)
			}
			abs, err := filepath.Abs(sdk)
			if err != nil {
				return err
			}
			if err := scaffold(dir, scaffoldData{Name: name, SDK: abs, Go: goVersion, Module: sdkModule}); err != nil {
				return fmt.Errorf("scaffolding %s: %w", dir, err)
			}
			fmt.Fprintf(stdout, "wrote %s (go.mod, main.go, Makefile); build it with:\n  moehost expert build %s\n", dir, dir)
			return nil
		},
	}
	cmd.Flags().StringVar(&sdk, "sdk", "", "path to a checkout of "+sdkModule+" (default: the checkout holding the current directory or this binary)")
	return cmd
}

func expertBuildCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "build [DIR]",
		Short: "Build the Go expert in DIR (default .) into DIR/NAME.wasm",
		Long: `Build the Go expert in DIR (default .) into DIR/NAME.wasm, NAME being the
last element of its module path, as its Makefile does:

  GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o NAME.wasm .

It prints the module's path as the last line.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := "."
			if len(args) == 1 {
				dir = args[0]
			}
			mod, err := moduleName(filepath.Join(dir, "go.mod"))
			if err != nil {
				return err
			}
			out := mod[strings.LastIndex(mod, "/")+1:] + ".wasm"
			build := exec.CommandContext(cmd.Context(), "go", "build", "-buildmode=c-shared", "-o", out, ".")
			build.Dir = dir
			build.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
			build.Stdout, build.Stderr = cmd.ErrOrStderr(), cmd.ErrOrStderr()
			if err := build.Run(); err != nil {
				return fmt.Errorf("building %s: %w", dir, err)
			}
			fmt.Fprintln(stdout, filepath.Join(dir, out))
			return nil
		},
	}
}

var expertName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]*$`)

// findCheckout returns the moehost checkout that holds the working
// directory or, failing that, the running binary.
func findCheckout() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if exe, err := os.Executable(); err == nil {
		if exe, err := filepath.EvalSymlinks(exe); err == nil {
			starts = append(starts, filepath.Dir(exe))
		}
	}
	for _, dir := range starts {
		for {
			if m, err := moduleName(filepath.Join(dir, "go.mod")); err == nil && m == sdkModule {
				return dir, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", fmt.Errorf("no checkout of %s holds the current directory or this binary; pass --sdk PATH to one (the module is not published yet)", sdkModule)
}

// moduleName reads the module path from a go.mod file.
func moduleName(gomod string) (string, error) {
	v, err := goModDirective(gomod, "module")
	if err != nil {
		return "", err
	}
	return strings.Trim(v, `"`), nil
}

// checkoutGoVersion checks that dir is a checkout of sdkModule and returns
// the go version its go.mod needs.
func checkoutGoVersion(dir string) (string, error) {
	gomod := filepath.Join(dir, "go.mod")
	m, err := moduleName(gomod)
	if err != nil {
		return "", err
	}
	if m != sdkModule {
		return "", fmt.Errorf("%s is module %s, not %s", gomod, m, sdkModule)
	}
	return goModDirective(gomod, "go")
}

// goModDirective returns the argument of the first line of gomod that
// starts with directive.
func goModDirective(gomod, directive string) (string, error) {
	b, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == directive {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("%s has no %s line", gomod, directive)
}

type scaffoldData struct {
	Name, SDK, Go, Module string
}

// scaffold writes the expert's files into a new directory dir.
func scaffold(dir string, d scaffoldData) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range []struct{ name, text string }{
		{"go.mod", goModTemplate},
		{"main.go", mainTemplate},
		{"Makefile", makefileTemplate},
		{".gitignore", "*.wasm\n"},
	} {
		var buf bytes.Buffer
		if err := template.Must(template.New(f.name).Parse(f.text)).Execute(&buf, d); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, f.name), buf.Bytes(), 0o644); err != nil {
			return err
		}
	}
	return nil
}

const goModTemplate = `module {{.Name}}

go {{.Go}}

require {{.Module}} v0.0.0-00010101000000-000000000000

// {{.Module}} is not published yet, so the SDK (sdk/expert) is built
// from a local checkout. Point this at yours, or remove it once the module
// is published.
replace {{.Module}} => {{.SDK}}
`

const mainTemplate = `// Command {{.Name}} is a moehost expert: y = x·Wᵀ + b, one linear layer of
// size hidden_dim (the expert's config key, required).
//
// Build it with "make build" or "moehost expert build", which run
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o {{.Name}}.wasm .
//
// Without -buildmode=c-shared Go builds a WASI command, which the host
// refuses. "go doc {{.Module}}/sdk/expert" lists the ops and layers.
package main

import "{{.Module}}/sdk/expert"

type model struct {
	linear expert.LinearLayer
}

// Init declares the inputs, outputs and parameters; the host calls it once
// per instance.
func (e *model) Init(c *expert.InitContext) error {
	// The host refuses config keys that Init does not read; a key it
	// reads but the deployment lacks is an error here, not a default.
	h, err := c.ConfigInt("hidden_dim")
	if err != nil {
		return expert.Fail("hidden_dim is not set: deploy with --config hidden_dim=N")
	}
	if h <= 0 {
		return expert.Fail("hidden_dim must be positive")
	}
	if err := c.Input("x", expert.Float32, expert.Batch, h); err != nil {
		return err
	}
	if err := c.Output("y", expert.Float32, expert.Batch, h); err != nil {
		return err
	}
	e.linear = expert.NewLinear(c, "linear", h, h)
	return e.linear.Err()
}

// Forward computes one batch. The host records these ops and
// differentiates them for Backward.
func (e *model) Forward(c *expert.Call) error {
	return c.SetOutput(0, e.linear.Forward(c.Input(0)))
}

func init() { expert.Register(&model{}) }

// main is not run in a c-shared module; the host calls the exports.
func main() {}
`

const makefileTemplate = `# Build {{.Name}}.wasm, the module to upload to a moehost server.
.PHONY: build
build:
	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o {{.Name}}.wasm .
`
