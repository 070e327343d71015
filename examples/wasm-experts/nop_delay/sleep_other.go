//go:build !wasip1

package main

import "time"

// sleep waits ns nanoseconds. Only the wasip1 build is an expert; this one
// lets the package build and vet on the host.
func sleep(ns int64) { time.Sleep(time.Duration(ns)) }
