//go:build !linux

package pages

import "errors"

func discard[T float32 | byte]([]T) int64 { return 0 }

func residentPages[T float32 | byte]([]T) (int, int, error) {
	return 0, 0, errors.New("pages: residency is known on Linux only")
}
