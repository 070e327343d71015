package expert

import (
	"errors"
	"testing"

	"github.com/moehost/moehost/abi"
)

// TestStickyErrors checks that an op on a Tensor carrying an error returns
// that error without calling the host, for single- and multi-result ops,
// and that outside a guest the host calls fail.
func TestStickyErrors(t *testing.T) {
	sticky := errors.New("earlier failure")
	bad := Tensor{err: sticky}
	ok := Tensor{h: 1}
	tests := []struct {
		name string
		got  []Tensor
	}{
		{"unary", []Tensor{Relu(bad)}},
		{"binary, first", []Tensor{Add(bad, ok)}},
		{"binary, second", []Tensor{Mul(ok, bad)}},
		{"optional bias", []Tensor{Linear(ok, ok, bad)}},
		{"optional mask", []Tensor{Attention(ok, ok, ok, bad, false, 0)}},
		{"concat", []Tensor{Concat(0, ok, ok, bad)}},
		{"split", Split(bad, 0, 1, 2, 3)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i, r := range tt.got {
				if r.Err() != sticky {
					t.Errorf("result %d: error %v, want the sticky one", i, r.Err())
				}
			}
		})
	}
	if err := Relu(ok).Err(); !errors.Is(err, abi.ErrInternal) {
		t.Errorf("outside a guest: %v, want abi.ErrInternal", err)
	}
	many := make([]Tensor, 65)
	if err := Concat(0, many...).Err(); !errors.Is(err, abi.ErrInvalidArgument) {
		t.Errorf("65 args: %v, want abi.ErrInvalidArgument", err)
	}
	if _, err := (Tensor{err: sticky}).Shape(); err != sticky {
		t.Errorf("Shape: %v, want the sticky error", err)
	}
}
