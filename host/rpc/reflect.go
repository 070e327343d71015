package rpc

import (
	_ "embed"
	"errors"
	"fmt"
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

// withSourceInfo resolves descriptors from the embedded set, with source
// info, and everything else (gRPC health, reflection) from the generated
// code's global registry.
type withSourceInfo struct{ files *protoregistry.Files }

func (r withSourceInfo) FindFileByPath(path string) (protoreflect.FileDescriptor, error) {
	if fd, err := r.files.FindFileByPath(path); err == nil {
		return fd, nil
	}
	return protoregistry.GlobalFiles.FindFileByPath(path)
}

func (r withSourceInfo) FindDescriptorByName(name protoreflect.FullName) (protoreflect.Descriptor, error) {
	if d, err := r.files.FindDescriptorByName(name); err == nil {
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
	return withSourceInfo{files}, nil
}
