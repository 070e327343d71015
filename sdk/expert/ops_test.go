package expert

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/moehost/moehost/abi"
)

// sdkFuncs names the SDK function of each op of ABI v1.
var sdkFuncs = map[abi.Op]string{
	abi.OpMatMul:       "MatMul",
	abi.OpLinear:       "Linear",
	abi.OpAdd:          "Add",
	abi.OpGeluTanh:     "GeluTanh",
	abi.OpLayerNorm:    "LayerNorm",
	abi.OpSub:          "Sub",
	abi.OpMul:          "Mul",
	abi.OpDiv:          "Div",
	abi.OpScale:        "Scale",
	abi.OpAddScalar:    "AddScalar",
	abi.OpRelu:         "Relu",
	abi.OpGelu:         "Gelu",
	abi.OpTanh:         "Tanh",
	abi.OpSigmoid:      "Sigmoid",
	abi.OpSilu:         "Silu",
	abi.OpExp:          "Exp",
	abi.OpLog:          "Log",
	abi.OpSqrt:         "Sqrt",
	abi.OpNeg:          "Neg",
	abi.OpSoftmax:      "Softmax",
	abi.OpLogSoftmax:   "LogSoftmax",
	abi.OpRMSNorm:      "RMSNorm",
	abi.OpReshape:      "Reshape",
	abi.OpPermute:      "Permute",
	abi.OpTranspose:    "Transpose",
	abi.OpConcat:       "Concat",
	abi.OpSlice:        "Slice",
	abi.OpSplit:        "Split",
	abi.OpSum:          "Sum",
	abi.OpMean:         "Mean",
	abi.OpMax:          "Max",
	abi.OpDropout:      "Dropout",
	abi.OpEmbedding:    "Embedding",
	abi.OpCrossEntropy: "CrossEntropy",
	abi.OpBatchMatMul:  "BatchMatMul",
	abi.OpAttention:    "Attention",

	abi.OpLinearGeluTanh: "LinearGeluTanh",
	abi.OpAddLayerNorm:   "AddLayerNorm",
	abi.OpCast:           "Cast",
}

// TestFusedFallsBackOnOldHost checks that a fused op runs as its parts on
// a host that answers ErrUnknownOp, asking that host once, and as itself
// on a host that serves it.
func TestFusedFallsBackOnOldHost(t *testing.T) {
	defer func(f func(int32, uint32, uint32, uint32, uint32) int32) { callOp = f }(callOp)
	defer func() { clear(hostLacks) }()
	var calls []abi.Op
	serves := func(o abi.Op) bool { return o <= abi.OpAttention }
	callOp = func(code int32, _, _, _, _ uint32) int32 {
		calls = append(calls, abi.Op(code))
		if !serves(abi.Op(code)) {
			return int32(abi.ErrUnknownOp)
		}
		return 7
	}
	x := Tensor{h: 1}
	for _, tc := range []struct {
		name string
		run  func() Tensor
		want []abi.Op
	}{
		{"linear_gelu_tanh old host", func() Tensor { return LinearGeluTanh(x, x, x) }, []abi.Op{abi.OpLinearGeluTanh, abi.OpLinear, abi.OpGeluTanh}},
		{"linear_gelu_tanh remembered", func() Tensor { return LinearGeluTanh(x, x, Tensor{}) }, []abi.Op{abi.OpLinear, abi.OpGeluTanh}},
		{"add_layer_norm old host", func() Tensor { return AddLayerNorm(x, x, x, x, 1e-5) }, []abi.Op{abi.OpAddLayerNorm, abi.OpAdd, abi.OpLayerNorm}},
	} {
		calls = nil
		if y := tc.run(); y.err != nil || y.h != 7 {
			t.Errorf("%s: got %+v", tc.name, y)
		}
		if !slices.Equal(calls, tc.want) {
			t.Errorf("%s: host calls %v, want %v", tc.name, calls, tc.want)
		}
	}
	clear(hostLacks)
	serves = func(abi.Op) bool { return true }
	calls = nil
	if y := LinearGeluTanh(x, x, x); y.err != nil || !slices.Equal(calls, []abi.Op{abi.OpLinearGeluTanh}) {
		t.Errorf("a host with the op: %+v, calls %v", y, calls)
	}
	calls = nil
	// Another error is the op's own: no fallback.
	callOp = func(code int32, _, _, _, _ uint32) int32 {
		calls = append(calls, abi.Op(code))
		return int32(abi.ErrShapeMismatch)
	}
	if y := AddLayerNorm(x, x, x, x, 1e-5); y.err == nil || len(calls) != 1 {
		t.Errorf("a shape error: %+v, calls %v, want the error from one call", y, calls)
	}
}

// TestEveryOpHasAFunction checks that each op of abi.Ops() has an
// exported, documented SDK function that runs that very op: the function
// in sdkFuncs must exist in the package's sources and name the op's
// constant (whose code is read from abi/op.go).
func TestEveryOpHasAFunction(t *testing.T) {
	codes := opConstants(t)
	funcs := packageFuncs(t)
	for _, o := range abi.Ops() {
		t.Run(o.String(), func(t *testing.T) {
			name, ok := sdkFuncs[o]
			if !ok {
				t.Fatalf("op %v (%d) has no SDK function in sdkFuncs", o, o)
			}
			fn, ok := funcs[name]
			if !ok {
				t.Fatalf("SDK function %s of op %v is missing", name, o)
			}
			if fn.Doc == nil || !strings.HasPrefix(fn.Doc.Text(), name+" ") {
				t.Errorf("%s has no doc comment starting with its name", name)
			}
			runs := false
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok {
					if x, ok := sel.X.(*ast.Ident); ok && x.Name == "abi" && codes[sel.Sel.Name] == o {
						runs = true
					}
				}
				return !runs
			})
			if !runs {
				t.Errorf("%s does not refer to the constant of op %v", name, o)
			}
		})
	}
	if len(sdkFuncs) != len(abi.Ops()) {
		t.Errorf("sdkFuncs has %d entries, abi.Ops() %d", len(sdkFuncs), len(abi.Ops()))
	}
}

// opConstants maps the names of abi's Op constants to their codes.
func opConstants(t *testing.T) map[string]abi.Op {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", "..", "abi", "op.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	codes := map[string]abi.Op{}
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || len(vs.Values) != 1 {
			return true
		}
		if typ, ok := vs.Type.(*ast.Ident); !ok || typ.Name != "Op" {
			return true
		}
		if lit, ok := vs.Values[0].(*ast.BasicLit); ok {
			if v, err := strconv.Atoi(lit.Value); err == nil {
				codes[vs.Names[0].Name] = abi.Op(v)
			}
		}
		return true
	})
	if len(codes) != len(abi.Ops()) {
		t.Fatalf("read %d op constants from abi/op.go, want %d", len(codes), len(abi.Ops()))
	}
	return codes
}

// packageFuncs returns the exported top-level functions of the package's
// non-test sources.
func packageFuncs(t *testing.T) map[string]*ast.FuncDecl {
	t.Helper()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	funcs := map[string]*ast.FuncDecl{}
	fset := token.NewFileSet()
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && fn.Name.IsExported() {
				funcs[fn.Name.Name] = fn
			}
		}
	}
	return funcs
}
