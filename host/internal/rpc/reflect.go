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

// healthFiles holds grpc/health/v1/health.proto, package grpc.health.v1.
// connectrpc.com/grpchealth registers its copy of that file under another
// path and package (connectext.grpc.health.v1, to stay clear of grpc-go's),
// so the reflected service name grpc.health.v1.Health resolved to nothing:
// grpcurl could not describe it, and buf curl --list-methods failed on it.
// The copy is renamed back once; its wire names are the standard ones.
var healthFiles = sync.OnceValues(func() (*protoregistry.Files, error) {
	const from, to = "connectext.grpc.health.v1", "grpc.health.v1"
	fd, err := protoregistry.GlobalFiles.FindFileByPath("connectext/grpc/health/v1/health.proto")
	if err != nil {
		return nil, fmt.Errorf("grpchealth's descriptor: %w", err)
	}
	fdp := protodesc.ToFileDescriptorProto(fd)
	fdp.Name = proto.String("grpc/health/v1/health.proto")
	fdp.Package = proto.String(to)
	fdp.Options = nil // its go_package and the like name grpchealth's internals
	rename := func(s *string) {
		if s != nil && strings.HasPrefix(*s, "."+from+".") {
			*s = "." + to + strings.TrimPrefix(*s, "."+from)
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
	health, err := protodesc.NewFile(fdp, nil)
	if err != nil {
		return nil, fmt.Errorf("renamed health descriptor: %w", err)
	}
	files := new(protoregistry.Files)
	if err := files.RegisterFile(health); err != nil {
		return nil, err
	}
	return files, nil
})

// withSourceInfo resolves descriptors from the embedded set, with source
// info, then gRPC health's (renamed, see healthFiles), and everything else
// (reflection) from the generated code's global registry.
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
