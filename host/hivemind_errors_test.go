package host

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"

	"github.com/moehost/moehost/host/internal/hivemind"
	"github.com/moehost/moehost/host/internal/sandbox"
)

// TestHivemindErrors checks hivemindError against every row of the
// server's table: each sentinel raises the exception its Connect code
// always stood for on hivemind's wire (NotFound, InvalidArgument, and
// busy for ResourceExhausted and Unavailable; nothing for the rest), with
// the error's own message after it, and where beats what as it does for
// codes.
func TestHivemindErrors(t *testing.T) {
	t.Parallel()
	byCode := map[connect.Code]error{
		connect.CodeNotFound:          hivemind.ErrNotFound,
		connect.CodeInvalidArgument:   hivemind.ErrInvalid,
		connect.CodeResourceExhausted: hivemind.ErrBusy,
		connect.CodeUnavailable:       hivemind.ErrBusy,
	}
	for _, w := range wireErrors {
		err := fmt.Errorf("forward %q: %w", "ffn.0", w.err)
		got := hivemindError(err)
		want := byCode[w.code]
		if w.hivemind != want {
			t.Errorf("%v (%v): hivemind form %v, want %v", w.err, w.code, w.hivemind, want)
		}
		switch {
		case want == nil && got != err:
			t.Errorf("%v: %v, want the error as it is", w.err, got)
		case want != nil && (!errors.Is(got, want) || !errors.Is(got, w.err) || got.Error() != want.Error()+": "+err.Error()):
			t.Errorf("%v: %v, want %v: %v", w.err, got, want, err)
		}
	}
	for _, c := range []struct {
		err  error
		want error
	}{
		{fmt.Errorf("%w: replacing the instance: %w", ErrNotRun, sandbox.ErrTrap), hivemind.ErrBusy},
		{fmt.Errorf("%w in moe_forward: %w", sandbox.ErrTrap, context.DeadlineExceeded), nil},
		{errors.New("BUG: a host bug"), nil},
	} {
		got := hivemindError(c.err)
		if c.want == nil && got != c.err || c.want != nil && !errors.Is(got, c.want) {
			t.Errorf("%v: %v, want %v", c.err, got, c.want)
		}
	}
}
