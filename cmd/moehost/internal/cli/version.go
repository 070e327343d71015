package cli

import (
	"fmt"
	"io"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/moehost/moehost/host"
)

// Version says which moehost this is: the version ([host.Version]), the
// commit ([host.Commit], with "+dirty" for uncommitted changes) when the
// build recorded it, and the Go version.
func Version() string {
	v := host.Version()
	if c := host.Commit(); c != "" {
		v += " " + c
	}
	return v + " " + runtime.Version()
}

func versionCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print moehost's version, commit and Go version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintln(stdout, "moehost", Version())
			return err
		},
	}
}
