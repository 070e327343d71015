package rpc

import (
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

// descriptorSet is proto/ as `buf build` compiles it (make generate):
// unlike the descriptors in the generated Go code, it keeps the source
// info, so reflection clients (grpcurl describe) show the proto comments.
//
//go:embed descriptors.binpb
var descriptorSet []byte

// sourceFiles parses descriptorSet once.
var sourceFiles = sync.OnceValues(func() (*protoregistry.Files, error) {
	var fds descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(descriptorSet, &fds); err != nil {
		return nil, fmt.Errorf("BUG: embedded descriptor set: %w", err)
	}
	return protodesc.NewFiles(&fds)
})

// healthFiles holds the standard descriptors of the services connect's
// packages serve under copies of their own: grpc/health/v1/health.proto
// (grpc.health.v1) and grpc/reflection/v1/reflection.proto
// (grpc.reflection.v1), plus a v1alpha copy of the latter, whose messages
// are the same. connectrpc.com/grpchealth and grpcreflect register their
// copies under another path and package (connectext.grpc..., to stay
// clear of grpc-go's), so the reflected names grpc.health.v1.Health and
// grpc.reflection.v1.ServerReflection resolved to nothing: grpcurl could
// not describe them, and buf curl --list-methods failed on them. Each
// copy is renamed back once; its wire names are the standard ones.
var healthFiles = sync.OnceValues(func() (*protoregistry.Files, error) {
	files := new(protoregistry.Files)
	for _, f := range []struct{ from, fromPkg, to, toPkg string }{
		{"connectext/grpc/health/v1/health.proto", "connectext.grpc.health.v1", "grpc/health/v1/health.proto", "grpc.health.v1"},
		{"connectext/grpc/reflection/v1/reflection.proto", "connectext.grpc.reflection.v1", "grpc/reflection/v1/reflection.proto", "grpc.reflection.v1"},
		{"connectext/grpc/reflection/v1/reflection.proto", "connectext.grpc.reflection.v1", "grpc/reflection/v1alpha/reflection.proto", "grpc.reflection.v1alpha"},
	} {
		fd, err := renamedFile(f.from, f.fromPkg, f.to, f.toPkg)
		if err != nil {
			return nil, err
		}
		if err := files.RegisterFile(fd); err != nil {
			return nil, fmt.Errorf("registering %s: %w", f.to, err)
		}
	}
	return files, nil
})

// renamedFile copies the globally registered file at path from, of
// package fromPkg, to path to and package toPkg, with every reference to
// its own types renamed. The file must import nothing.
func renamedFile(from, fromPkg, to, toPkg string) (protoreflect.FileDescriptor, error) {
	fd, err := protoregistry.GlobalFiles.FindFileByPath(from)
	if err != nil {
		return nil, fmt.Errorf("descriptor %s: %w", from, err)
	}
	fdp := protodesc.ToFileDescriptorProto(fd)
	fdp.Name = proto.String(to)
	fdp.Package = proto.String(toPkg)
	fdp.Options = nil // its go_package and the like name the copy's internals
	rename := func(s *string) {
		if s != nil && strings.HasPrefix(*s, "."+fromPkg+".") {
			*s = "." + toPkg + strings.TrimPrefix(*s, "."+fromPkg)
		}
	}
	var fields func(ms []*descriptorpb.DescriptorProto)
	fields = func(ms []*descriptorpb.DescriptorProto) {
		for _, m := range ms {
			for _, f := range m.Field {
				rename(f.TypeName)
			}
			fields(m.NestedType)
		}
	}
	fields(fdp.MessageType)
	for _, svc := range fdp.Service {
		for _, m := range svc.Method {
			rename(m.InputType)
			rename(m.OutputType)
		}
	}
	renamed, err := protodesc.NewFile(fdp, nil)
	if err != nil {
		return nil, fmt.Errorf("renamed descriptor %s: %w", to, err)
	}
	return renamed, nil
}

// withSourceInfo resolves descriptors from the embedded set, with source
// info, then gRPC health's and reflection's (renamed, see healthFiles),
// and everything else from the generated code's global registry.
type withSourceInfo struct{ files, health *protoregistry.Files }

func (r withSourceInfo) FindFileByPath(path string) (protoreflect.FileDescriptor, error) {
	if fd, err := r.files.FindFileByPath(path); err == nil {
		return fd, nil
	}
	if fd, err := r.health.FindFileByPath(path); err == nil {
		return fd, nil
	}
	return protoregistry.GlobalFiles.FindFileByPath(path)
}

func (r withSourceInfo) FindDescriptorByName(name protoreflect.FullName) (protoreflect.Descriptor, error) {
	if d, err := r.files.FindDescriptorByName(name); err == nil {
		return d, nil
	}
	if d, err := r.health.FindDescriptorByName(name); err == nil {
		return d, nil
	}
	return protoregistry.GlobalFiles.FindDescriptorByName(name)
}

// reflectionResolver returns the resolver reflection serves descriptors
// from.
func reflectionResolver() (protodesc.Resolver, error) {
	files, err := sourceFiles()
	if err != nil {
		return nil, err
	}
	if files == nil {
		return nil, errors.New("BUG: no embedded descriptors")
	}
	health, err := healthFiles()
	if err != nil {
		return nil, err
	}
	return withSourceInfo{files, health}, nil
}
