// Package batching holds the limits that shape an expert's batches: one
// type for the pools that enforce them (host/internal/batch), the server's
// options (host.BatchLimits) and the wire (wire.BatchLimits), which may not
// import each other.
package batching

import (
	"fmt"
	"time"
)

// Limits configure a pool. Zero fields take the defaults.
type Limits struct {
	// MaxBatchSize is the most rows in one batch. Default 1024.
	MaxBatchSize int
	// MinBatchSize is the fewest rows that are flushed before MaxWait.
	// Default 1: a free device takes whatever is queued, and batches
	// grow while it is busy.
	MinBatchSize int
	// MaxWait is the longest a request waits for the batch to fill
	// before it is flushed with whatever the pool holds. Default 10ms.
	MaxWait time.Duration
	// QueueSize is the most pending pieces (requests, or parts of split
	// requests) the pool holds. Default 1024.
	QueueSize int
}

// WithDefaults returns l with zero fields set to their defaults.
func (l Limits) WithDefaults() Limits {
	if l.MaxBatchSize <= 0 {
		l.MaxBatchSize = 1024
	}
	if l.MinBatchSize <= 0 {
		l.MinBatchSize = 1
	}
	if l.MaxWait <= 0 {
		l.MaxWait = 10 * time.Millisecond
	}
	if l.QueueSize <= 0 {
		l.QueueSize = 1024
	}
	return l
}

// Validate reports limits that contradict each other.
func (l Limits) Validate() error {
	l = l.WithDefaults()
	if l.MinBatchSize > l.MaxBatchSize {
		return fmt.Errorf("min batch size %d is larger than max batch size %d", l.MinBatchSize, l.MaxBatchSize)
	}
	return nil
}

// Or returns l with its zero fields taken from def.
func (l Limits) Or(def Limits) Limits {
	if l.MaxBatchSize <= 0 {
		l.MaxBatchSize = def.MaxBatchSize
	}
	if l.MinBatchSize <= 0 {
		l.MinBatchSize = def.MinBatchSize
	}
	if l.MaxWait <= 0 {
		l.MaxWait = def.MaxWait
	}
	if l.QueueSize <= 0 {
		l.QueueSize = def.QueueSize
	}
	return l
}
