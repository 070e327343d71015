package rpc

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	_ "github.com/moehost/moehost/gen/moehost/v1" // registers the generated descriptors
)

// TestEmbeddedDescriptorsMatchGenerated fails when descriptors.binpb is
// stale: each of its moehost files must equal the generated code's, once
// the source info (which only it has) is dropped.
func TestEmbeddedDescriptorsMatchGenerated(t *testing.T) {
	files, err := sourceFiles()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	files.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		gen, err := protoregistry.GlobalFiles.FindFileByPath(fd.Path())
		if err != nil {
			return true // an import the Go code does not register
		}
		n++
		emb := protodesc.ToFileDescriptorProto(fd)
		if emb.GetSourceCodeInfo() == nil {
			t.Errorf("%s: embedded descriptor has no source info", fd.Path())
		}
		emb.SourceCodeInfo = nil
		want := protodesc.ToFileDescriptorProto(gen)
		want.SourceCodeInfo = nil
		// buf's managed mode sets go_package in both; compare the rest.
		emb.Options, want.Options = nil, nil
		if !proto.Equal(emb, want) {
			t.Errorf("%s: embedded descriptor differs from the generated code: run make generate", fd.Path())
		}
		return true
	})
	if n == 0 {
		t.Fatal("no moehost file in the embedded descriptors")
	}
}
