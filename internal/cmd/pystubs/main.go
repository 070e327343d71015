// Command pystubs writes the Python client's protobuf and gRPC stubs
// (package internal/pystubs) from the server's compiled descriptors into
// sdk/python, removing the stubs of files that no longer exist. make
// python-stubs and make generate run it from the repository's root:
//
//	go run ./internal/cmd/pystubs [-descriptors host/internal/rpc/descriptors.binpb] [-out sdk/python]
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/moehost/moehost/internal/pystubs"
)

func main() {
	descriptors := flag.String("descriptors", "host/internal/rpc/descriptors.binpb", "the FileDescriptorSet to read (buf build's output)")
	out := flag.String("out", "sdk/python", "the Python package root to write the stubs under")
	flag.Parse()
	n, err := write(*descriptors, *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pystubs:", err)
		os.Exit(1)
	}
	fmt.Printf("pystubs: %d files in %s\n", n, filepath.Join(*out, strings.TrimSuffix(pystubs.Root, "/")))
}

// write writes the stubs and removes the stale ones: every _pb2 module
// and __init__.py in a package directory the stubs go to that Files did
// not return.
func write(descriptors, out string) (int, error) {
	b, err := os.ReadFile(descriptors)
	if err != nil {
		return 0, err
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(b, &set); err != nil {
		return 0, fmt.Errorf("%s: %w", descriptors, err)
	}
	files, err := pystubs.Files(&set)
	if err != nil {
		return 0, err
	}
	dirs := map[string]bool{}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
		dirs[filepath.Dir(filepath.Join(out, name))] = true
	}
	sort.Strings(names)
	for dir := range dirs {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return 0, err
		}
		old, err := filepath.Glob(filepath.Join(dir, "*.py"))
		if err != nil {
			return 0, err
		}
		for _, p := range old {
			rel, err := filepath.Rel(out, p)
			if err != nil {
				return 0, err
			}
			if _, ok := files[filepath.ToSlash(rel)]; !ok && (strings.HasSuffix(p, "_pb2.py") || strings.HasSuffix(p, "_pb2_grpc.py") || filepath.Base(p) == "__init__.py") {
				if err := os.Remove(p); err != nil {
					return 0, err
				}
			}
		}
	}
	for _, name := range names {
		if err := os.WriteFile(filepath.Join(out, name), files[name], 0o644); err != nil {
			return 0, err
		}
	}
	return len(names), nil
}
