//go:build unix

package tenant

import (
	"os"
	"syscall"
)

// lockFile takes an exclusive flock on path, creating it, and returns its
// release. The kernel drops the lock if the process dies, so a crash
// never leaves the file locked.
func lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
