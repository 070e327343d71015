package tenant

import (
	"fmt"
	"os"
	"path/filepath"
)

// Edit changes the tenants file at path in one step: it takes an
// exclusive lock (on path+".lock", so that two `moehost tenant` commands
// at once do not lose one's change), reads the file (a missing one is
// empty), calls fn, and saves the result atomically if fn returns nil.
// A running server sees the change on its next Reload.
func Edit(path string, fn func(*File) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("editing tenants file: %w", err)
	}
	unlock, err := lockFile(path + ".lock")
	if err != nil {
		return fmt.Errorf("locking tenants file %s: %w", path, err)
	}
	defer unlock()
	f, err := LoadOrEmpty(path)
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		return err
	}
	return f.Save(path)
}
