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

// TestReflectionResolvesHealth fails when the health service that
// reflection lists cannot be resolved by its standard name, as grpcurl
// describe and buf curl --list-methods ask for it.
func TestReflectionResolvesHealth(t *testing.T) {
	r, err := reflectionResolver()
	if err != nil {
		t.Fatal(err)
	}
	d, err := r.FindDescriptorByName("grpc.health.v1.Health")
	if err != nil {
		t.Fatalf("grpc.health.v1.Health: %v", err)
	}
	svc, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		t.Fatalf("grpc.health.v1.Health is a %T, not a service", d)
	}
	for _, tt := range []struct{ method, in, out string }{
		{"Check", "grpc.health.v1.HealthCheckRequest", "grpc.health.v1.HealthCheckResponse"},
		{"Watch", "grpc.health.v1.HealthCheckRequest", "grpc.health.v1.HealthCheckResponse"},
	} {
		m := svc.Methods().ByName(protoreflect.Name(tt.method))
		if m == nil {
			t.Errorf("no method %s", tt.method)
			continue
		}
		if string(m.Input().FullName()) != tt.in || string(m.Output().FullName()) != tt.out {
			t.Errorf("%s: %s -> %s, want %s -> %s", tt.method, m.Input().FullName(), m.Output().FullName(), tt.in, tt.out)
		}
	}
	status, err := r.FindDescriptorByName("grpc.health.v1.HealthCheckResponse.ServingStatus")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := status.(protoreflect.EnumDescriptor); !ok {
		t.Errorf("ServingStatus is a %T, not an enum", status)
	}
	if fd, err := r.FindFileByPath("grpc/health/v1/health.proto"); err != nil || fd.Package() != "grpc.health.v1" {
		t.Errorf("grpc/health/v1/health.proto: %v, %v", fd, err)
	}
}
