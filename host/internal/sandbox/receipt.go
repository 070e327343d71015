package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"

	"golang.org/x/sys/cpu"

	"github.com/moehost/moehost/internal/atomicfile"
)

// A compile receipt is an empty file in a compilation cache that says a
// module compiled, into that cache, under the same wazero and runtime
// configuration on the same CPU: its name is a hash of all of them. A
// compile that finds its receipt skips the compile child, whose work
// would be a cache hit, and compiles in the process, which then reads the
// machine code back from the cache as it does after a child
// (RATIONALE: "Why does a compile with a receipt skip the child?").
const receiptDir = "moehost-compiled"

// receiptVersion names what the receipt's hash covers; change it when
// runtimeConfig changes what wazero compiles.
const receiptVersion = "moehost compile receipt v1: wazevo, close on context done, core features v2 without reference types"

// wazeroVersion is the wazero version that names wazero's own cache
// directory: the module's version in the build info, else "dev" (a test
// binary's build info lists no modules), found as wazero finds it. A
// receipt is then exactly as good as the cache entry it vouches for.
var wazeroVersion = sync.OnceValue(func() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, d := range info.Deps {
			if d.Path == "github.com/tetratelabs/wazero" && d.Version != "" && d.Version != "(devel)" {
				return d.Version
			}
		}
	}
	return "dev"
})

// receiptPath returns the path of the receipt of the module with digest in
// the cache directory dir, or "" when there is no directory.
func receiptPath(dir, digest string) string {
	if dir == "" {
		return ""
	}
	h := sha256.New()
	// wazero keys its cache by the module's bytes, the close-on-context-
	// done flag and the CPU's features; the receipt by as much and more.
	fmt.Fprintf(h, "%s\x00%s\x00%s/%s\x00%+v\x00%+v\x00%s", receiptVersion, wazeroVersion(), runtime.GOOS, runtime.GOARCH, cpu.X86, cpu.ARM64, digest)
	return filepath.Join(dir, receiptDir, hex.EncodeToString(h.Sum(nil)))
}

// hasReceipt reports whether the module with digest compiled into the
// cache in dir before.
func hasReceipt(dir, digest string) bool {
	p := receiptPath(dir, digest)
	if p == "" {
		return false
	}
	_, err := os.Stat(p)
	return err == nil
}

// writeReceipt records that the module with digest compiled into the
// cache in dir. A failure only costs later compiles of it their child.
func writeReceipt(dir, digest string) error {
	p := receiptPath(dir, digest)
	if p == "" {
		return nil
	}
	if _, err := os.Stat(p); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return atomicfile.Write(p, nil)
}
