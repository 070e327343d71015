package pystubs_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/moehost/moehost/internal/pystubs"
)

// The committed descriptors and the Python package root the stubs are
// committed under, from this package's directory.
const (
	descriptors = "../../host/internal/rpc/descriptors.binpb"
	pythonRoot  = "../../sdk/python"
)

// TestCommittedStubsAreFresh fails when sdk/python/moehost/v1 is not what
// the committed descriptors give: a proto changed (make generate) without
// its stubs, a stub was edited by hand, or a stale one was left behind.
func TestCommittedStubsAreFresh(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(descriptors)
	if err != nil {
		t.Fatal(err)
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(b, &set); err != nil {
		t.Fatal(err)
	}
	files, err := pystubs.Files(&set)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"moehost/v1/__init__.py", "moehost/v1/module_pb2.py", "moehost/v1/module_pb2_grpc.py", "moehost/v1/server_pb2_grpc.py", "moehost/v1/tensor_pb2.py"} {
		if _, ok := files[want]; !ok {
			t.Errorf("Files wrote no %s", want)
		}
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(pythonRoot, name))
		if err != nil {
			t.Errorf("%v: run make python-stubs and commit it", err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("sdk/python/%s is stale: run make python-stubs and commit it", name)
		}
	}
	committed, err := filepath.Glob(filepath.Join(pythonRoot, "moehost", "v1", "*.py"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range committed {
		rel, _ := filepath.Rel(pythonRoot, p)
		if _, ok := files[filepath.ToSlash(rel)]; !ok {
			t.Errorf("sdk/python/%s is no stub of the descriptors: make python-stubs removes it", rel)
		}
	}
}

// TestPb2HoldsTheDescriptorAlone checks what a _pb2 module registers: the
// file's descriptor with proto3 optional intact, and neither its source
// info nor buf's own fields.
func TestPb2HoldsTheDescriptorAlone(t *testing.T) {
	t.Parallel()
	fd := &descriptorpb.FileDescriptorProto{
		Name:    proto.String("moehost/v1/x.proto"),
		Package: proto.String("moehost.v1"),
		Syntax:  proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{
			Name: proto.String("M"),
			Field: []*descriptorpb.FieldDescriptorProto{{
				Name: proto.String("n"), Number: proto.Int32(1), Proto3Optional: proto.Bool(true),
				Type: descriptorpb.FieldDescriptorProto_TYPE_INT64.Enum(), OneofIndex: proto.Int32(0),
			}},
			OneofDecl: []*descriptorpb.OneofDescriptorProto{{Name: proto.String("_n")}},
		}},
		SourceCodeInfo: &descriptorpb.SourceCodeInfo{Location: []*descriptorpb.SourceCodeInfo_Location{{Path: []int32{4, 0}, LeadingComments: proto.String(" secret\n")}}},
	}
	withBuf := proto.Clone(fd).(*descriptorpb.FileDescriptorProto)
	withBuf.ProtoReflect().SetUnknown([]byte{0xd2, 0xf6, 0x03, 0x02, 0x08, 0x00}) // buf's image extension, field 8042
	files, err := pystubs.Files(&descriptorpb.FileDescriptorSet{File: []*descriptorpb.FileDescriptorProto{withBuf}})
	if err != nil {
		t.Fatal(err)
	}
	src := string(files["moehost/v1/x_pb2.py"])
	want := proto.Clone(fd).(*descriptorpb.FileDescriptorProto)
	want.SourceCodeInfo = nil
	wantBytes, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	lit := "    " + strings.Join(pystubs.BytesLiteral(wantBytes, 96), "\n    ") + "\n)"
	if !strings.Contains(src, "AddSerializedFile(\n"+lit) {
		t.Errorf("x_pb2.py does not register the descriptor alone; want\n%s\nin\n%s", lit, src)
	}
	if strings.Contains(src, "secret") {
		t.Errorf("x_pb2.py carries the source info:\n%s", src)
	}
	if _, ok := files["moehost/v1/x_pb2_grpc.py"]; ok {
		t.Error("a _pb2_grpc module for a file without services")
	}
}

// TestFilesRefuses checks the refusals: an import with no Python module,
// a service naming a message nowhere in the set, a set with no moehost
// file.
func TestFilesRefuses(t *testing.T) {
	t.Parallel()
	svc := func(input string) *descriptorpb.ServiceDescriptorProto {
		return &descriptorpb.ServiceDescriptorProto{Name: proto.String("S"), Method: []*descriptorpb.MethodDescriptorProto{{
			Name: proto.String("Call"), InputType: proto.String(input), OutputType: proto.String(".moehost.v1.M"),
		}}}
	}
	file := func(deps []string, services ...*descriptorpb.ServiceDescriptorProto) *descriptorpb.FileDescriptorProto {
		return &descriptorpb.FileDescriptorProto{
			Name: proto.String("moehost/v1/x.proto"), Package: proto.String("moehost.v1"), Dependency: deps,
			MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String("M")}}, Service: services,
		}
	}
	other := &descriptorpb.FileDescriptorProto{Name: proto.String("other/y.proto"), Package: proto.String("other")}
	tests := []struct {
		name  string
		files []*descriptorpb.FileDescriptorProto
		want  string // in the error; "" for none
	}{
		{"well-formed", []*descriptorpb.FileDescriptorProto{file([]string{"google/protobuf/timestamp.proto"}, svc(".moehost.v1.M"))}, ""},
		{"import without a module", []*descriptorpb.FileDescriptorProto{other, file([]string{"other/y.proto"})}, "other/y.proto has no Python module"},
		{"unknown message", []*descriptorpb.FileDescriptorProto{file(nil, svc(".moehost.v1.Gone"))}, "S.Call names .moehost.v1.Gone"},
		{"service on a message of a file without a module", []*descriptorpb.FileDescriptorProto{
			{Name: proto.String("other/y.proto"), Package: proto.String("other"), MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String("Y")}}},
			file(nil, svc(".other.Y")),
		}, "other/y.proto has no Python module"},
		{"no moehost file", []*descriptorpb.FileDescriptorProto{other}, "no file under moehost/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := pystubs.Files(&descriptorpb.FileDescriptorSet{File: tt.files})
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Files: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Files: %v, want an error with %q", err, tt.want)
			}
		})
	}
}

// TestBytesLiteral checks the escapes and the line breaks, which never
// split an escape.
func TestBytesLiteral(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		in    string
		width int
		want  []string
	}{
		{"empty", "", 80, []string{`b''`}},
		{"printable", `ab "c"`, 80, []string{`b'ab "c"'`}},
		{"quote and backslash", `'\`, 80, []string{`b'\'\\'`}},
		{"control", "\n\r\t\x00\x1f", 80, []string{`b'\n\r\t\x00\x1f'`}},
		{"high and DEL", "\x7f\x80\xff", 80, []string{`b'\x7f\x80\xff'`}},
		{"hex-looking text after an escape", "\x01ab", 80, []string{`b'\x01ab'`}},
		{"split", "abcdef", 6, []string{`b'abc'`, `b'def'`}},
		{"no split inside an escape", "a\xff\xffb", 10, []string{`b'a\xff'`, `b'\xffb'`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := pystubs.BytesLiteral([]byte(tt.in), tt.width)
			if strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Errorf("BytesLiteral(%q, %d) = %q, want %q", tt.in, tt.width, got, tt.want)
			}
			for _, l := range got {
				if len(l) > tt.width && len(l) > len(`b'\x00'`) {
					t.Errorf("line %q is longer than %d", l, tt.width)
				}
			}
		})
	}
}
