package abi_test

import (
	"strings"
	"testing"

	"github.com/moehost/moehost/abi"
)

func TestOps(t *testing.T) {
	ops := abi.Ops()
	if len(ops) != 39 {
		t.Errorf("len(Ops()) = %d, want 39", len(ops))
	}
	names := map[string]bool{}
	for i, o := range ops {
		if o != abi.Op(i+1) || !o.Valid() {
			t.Errorf("Ops()[%d] = %d (valid %t), want code %d", i, o, o.Valid(), i+1)
		}
		n := o.String()
		if n == "" || strings.HasPrefix(n, "op(") || names[n] {
			t.Errorf("op %d has name %q (empty, unknown or repeated)", o, n)
		}
		names[n] = true
	}
	for _, o := range []abi.Op{0, -1, abi.Op(len(ops) + 1)} {
		if o.Valid() {
			t.Errorf("Op(%d).Valid() = true", o)
		}
		if !strings.HasPrefix(o.String(), "op(") {
			t.Errorf("Op(%d).String() = %q", o, o.String())
		}
	}
	if abi.OpSplit.String() != "split" || abi.OpAttention.String() != "attention" || abi.OpGeluTanh.String() != "gelu_tanh" {
		t.Errorf("names: %s %s %s", abi.OpSplit, abi.OpAttention, abi.OpGeluTanh)
	}
	ops[0] = 99 // Ops returns a fresh slice
	if abi.Ops()[0] != abi.OpMatMul {
		t.Errorf("Ops() shares its slice")
	}
}
