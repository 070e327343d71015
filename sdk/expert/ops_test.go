package expert

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
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
