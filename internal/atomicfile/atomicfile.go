// Package atomicfile writes files so that a crash leaves the old content or
// the new, never a torn mix. Module uploads, checkpoints, the tenants file
// and the DHT's address files all go through it, which is why it is its own
// package rather than a function of one of those rooms.
package atomicfile

import (
	"io"
	"os"
	"path/filepath"
)

// Write writes data to path so that readers see the old file or
// the whole new one, even across a crash: a temp file in the same
// directory, fsync, rename, fsync of the directory.
func Write(path string, data []byte) error {
	return WriteFunc(path, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// WriteFunc is Write for content that write streams into the file, so
// that a large file needs no copy of itself in memory. An error from
// write leaves path as it was.
func WriteFunc(path string, write func(io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err = write(f); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
