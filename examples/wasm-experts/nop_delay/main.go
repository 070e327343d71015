// Command nop_delay is hivemind's "nop_delay" expert (DelayedNopExpert) as
// a moehost Wasm module: the identity, y = x, on x [batch, hidden_dim],
// after a sleep of delay_ms milliseconds per batch, forward and backward
// alike (a backward reruns the forward), as hivemind's sleeps in every
// forward. Callers test their timeouts against it, as hivemind's own
// tests do. Config keys: "hidden_dim" (default 1024) and "delay_ms"
// (default 500, hivemind's delay of 0.5 s). It has no parameters; its
// gradient is the output gradient.
//
// The sleep is WASI's poll_oneoff (sleep_wasip1.go): the host waits for
// real only within a call, and never past its call timeout or its callers
// leaving.
//
// Build with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o nop_delay.wasm .
package main

import "github.com/moehost/moehost/sdk/expert"

// nopDelay sleeps delay nanoseconds.
type nopDelay struct{ delay int64 }

// config reads an integer config value, or def when it is not set.
func config(c *expert.InitContext, key string, def int64) int64 {
	if v, err := c.ConfigInt(key); err == nil {
		return v
	}
	return def
}

func (n *nopDelay) Init(c *expert.InitContext) error {
	h := config(c, "hidden_dim", 1024)
	ms := config(c, "delay_ms", 500)
	if h <= 0 {
		return expert.Fail("nop_delay: hidden_dim must be positive")
	}
	if ms < 0 || ms > 3_600_000 {
		return expert.Fail("nop_delay: delay_ms must be in [0, 3600000]")
	}
	n.delay = ms * 1_000_000
	if err := c.Input("x", expert.Float32, expert.Batch, h); err != nil {
		return err
	}
	return c.Output("y", expert.Float32, expert.Batch, h)
}

// Forward sleeps, then sets the output to the input handle itself.
func (n *nopDelay) Forward(c *expert.Call) error {
	sleep(n.delay)
	return c.SetOutput(0, c.Input(0))
}

func init() { expert.Register(&nopDelay{}) }

// main is not run in a c-shared module; the host calls the exports.
func main() {}
