package gpuhost

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moehost/moehost/gpuhost/internal/cpu"
	"github.com/moehost/moehost/internal/pages"
)

// ErrOutOfMemory reports an allocation (or a [Device.Reserve]) refused
// because it would push the live tensor bytes past the device's
// [Ceiling]. Nothing was allocated. Callers map it to "resource exhausted"
// for the work that asked, and the process carries on.
var ErrOutOfMemory = errors.New("out of memory")

// Ceiling is a limit on live tensor bytes, shared by every device built
// with it, so that one number bounds the whole process. Its zero value
// and a nil *Ceiling have no limit. It is safe for concurrent use.
type Ceiling struct {
	limit int64
	used  atomic.Int64
}

// NewCeiling returns a ceiling of limit bytes; limit <= 0 means none.
func NewCeiling(limit int64) *Ceiling {
	if limit < 0 {
		limit = 0
	}
	return &Ceiling{limit: limit}
}

// Limit returns the ceiling in bytes, 0 for none.
func (c *Ceiling) Limit() int64 {
	if c == nil {
		return 0
	}
	return c.limit
}

// Used returns the bytes charged now: live tensor storage and
// reservations of every device that shares c.
func (c *Ceiling) Used() int64 {
	if c == nil {
		return 0
	}
	return c.used.Load()
}

// charge adds n bytes unless that would pass the limit.
func (c *Ceiling) charge(n int64) bool {
	if c == nil {
		return true
	}
	for {
		u := c.used.Load()
		if c.limit > 0 && u+n > c.limit {
			return false
		}
		if c.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// AdmitFraction is the share of a ceiling up to which [Device.Admit]
// lets new work in; the rest is kept for the activations of the work
// already admitted.
const AdmitFraction = 0.75

// admit reports whether n more bytes of new work fit under
// AdmitFraction of the limit.
func (c *Ceiling) admit(n int64) bool {
	return c == nil || c.limit == 0 || float64(c.used.Load()+n) <= AdmitFraction*float64(c.limit)
}

// refund gives back n bytes that charge took.
func (c *Ceiling) refund(n int64) {
	if c != nil {
		c.used.Add(-n)
	}
}

// MemStats describes a device's tensor memory.
type MemStats struct {
	// LiveBytes is the storage held by tensors that were neither
	// released nor collected, at its allocated (size class) size, plus
	// reservations.
	LiveBytes int64
	// PeakBytes is the recent high-water mark of LiveBytes, which bounds
	// LiveBytes + PoolBytes; it decays to LiveBytes after
	// [PoolDecay]·2 without a higher mark.
	PeakBytes int64
	// PoolBytes is released float32 storage kept for reuse.
	PoolBytes int64
	// DroppedBytes adds up the released storage that the pool let go of
	// instead of keeping (evicted to stay under PeakBytes, or refused at
	// release). On the CPU the whole pages of a dropped buffer of
	// [pages.MinBytes] or more go back to the operating system at once
	// (smaller ones to the garbage collector); on CUDA the memory is
	// freed.
	DroppedBytes int64
	// PoolHits and PoolMisses count float32 allocations served from the
	// pool and from fresh memory.
	PoolHits, PoolMisses int64
	// Refused counts allocations and reservations refused with
	// ErrOutOfMemory, and NotAdmitted the refusals of Admit.
	Refused, NotAdmitted int64
	// GrantedBytes and RequestedBytes add up, over every float32
	// allocation, the storage given (the size class, or a larger pooled
	// buffer) and the storage asked for; GrantedBytes/RequestedBytes - 1
	// is the memory that rounding up wastes.
	GrantedBytes, RequestedBytes int64
	// Limit is the ceiling on live bytes (0: none). It may be shared
	// with other devices, whose bytes count against it too.
	Limit int64
}

// HitRate returns PoolHits / (PoolHits + PoolMisses), 0 before any
// allocation.
func (s MemStats) HitRate() float64 {
	if s.PoolHits+s.PoolMisses == 0 {
		return 0
	}
	return float64(s.PoolHits) / float64(s.PoolHits+s.PoolMisses)
}

// PoolDecay is how often a device's pool forgets its old high-water mark:
// the pool's bound is the highest live byte count seen in the current or
// the previous period, so that an idle device gives its spare storage
// back within two periods.
const PoolDecay = 5 * time.Second

// classSubSteps is the number of size classes per power of two. Eight
// bound the waste of rounding up by 1/8 (Go's allocator and tcmalloc
// use about as many).
const classSubSteps = 8

// sizeClass returns the number of floats a buffer of n floats is rounded
// up to: n itself up to 2·classSubSteps, then the next multiple of
// 2^(⌊log2 n⌋ - 3), eight steps per power of two.
func sizeClass(n int) int {
	if n <= 2*classSubSteps {
		return n
	}
	shift := bits.Len(uint(n)) - 1 - 3 // log2(classSubSteps) = 3
	step := 1 << shift
	return (n + step - 1) &^ (step - 1)
}

// pooled is one released buffer and when it came back, for eviction by
// age.
type pooled struct {
	buf []float32
	seq uint64
}

// memory is a device's tensor memory: live-byte accounting against an
// optional shared ceiling, and a pool of released float32 storage in
// size classes whose total (with the live bytes) stays under the recent
// high-water mark of live bytes. What the pool drops it gives back to the
// operating system (pages.Discard) after unlocking, so that RSS follows
// live + pool bytes instead of waiting for a collection and the
// scavenger.
type memory struct {
	ceiling *Ceiling
	decay   time.Duration // PoolDecay; tests shorten it
	onIdle  func()        // WithOnIdle's, or nil

	mu        sync.Mutex
	free      map[int][]pooled // by capacity in floats; oldest first
	seq       uint64
	live      int64
	poolBytes int64
	peak      int64 // high-water mark of live in the current period
	prevPeak  int64 // and in the previous one
	timer     *time.Timer
	dropped   int64
	hits      int64
	misses    int64
	refused   int64
	notAdmit  int64
	granted   int64
	requested int64
}

// class returns the capacity, in floats, of a buffer for n floats.
func (m *memory) class(n int) int { return sizeClass(n) }

// bound returns the most live + pool bytes may reach: the recent
// high-water mark of live bytes. Call with m.mu held.
func (m *memory) bound() int64 {
	return max(m.peak, m.prevPeak, m.live)
}

// charge accounts n new live bytes, or refuses them with ErrOutOfMemory.
// Call with m.mu held.
func (m *memory) charge(n int64) error {
	if !m.ceiling.charge(n) {
		m.refused++
		return fmt.Errorf("%w: %d more bytes would pass the ceiling of %d bytes (%d in use)", ErrOutOfMemory, n, m.ceiling.Limit(), m.ceiling.Used())
	}
	m.live += n
	m.peak = max(m.peak, m.live)
	return nil
}

// uncharge accounts n live bytes that were released or collected.
func (m *memory) uncharge(n int64) {
	m.ceiling.refund(n)
	m.live -= n
}

// getFloats returns storage of n floats, with stale contents when it
// comes from the pool, charged as live; or ErrOutOfMemory before
// allocating anything. A pooled buffer of n's class is taken first, then,
// with fit, one of the next classes up to twice the size: for a
// short-lived tensor a spare buffer a bit too large serves better than a
// fresh one, and it goes back to its own class. Long-lived storage
// (optimizer state) passes fit false, so that it never keeps a larger
// buffer than its class for the life of the server.
func (m *memory) getFloats(n int, fit bool) ([]float32, error) {
	c := m.class(n)
	most := c
	if fit {
		most = 2 * c
	}
	m.mu.Lock()
	b, hit, drop, err := m.takeLocked(n, c, most)
	m.mu.Unlock()
	discard(drop)
	if err != nil || hit {
		return b, err
	}
	b = make([]float32, n, c)
	cpu.AdviseHuge(b)
	return b, nil
}

// takeLocked is getFloats under m.mu: a pooled buffer of class c to most
// (hit), or, having charged c floats of fresh storage for the caller to
// make, the buffers evicted to make room, for the caller to discard once
// it has unlocked.
func (m *memory) takeLocked(n, c, most int) (b []float32, hit bool, drop [][]float32, err error) {
	for k := c; k <= most && len(m.free) > 0; k = m.class(k + 1) {
		l := m.free[k]
		if len(l) == 0 {
			continue
		}
		if err := m.charge(4 * int64(k)); err != nil {
			return nil, false, nil, err
		}
		b := l[len(l)-1].buf
		l[len(l)-1] = pooled{}
		if len(l) == 1 {
			delete(m.free, k)
		} else {
			m.free[k] = l[:len(l)-1]
		}
		m.poolBytes -= 4 * int64(k)
		m.hits++
		m.granted += 4 * int64(k)
		m.requested += 4 * int64(n)
		return b[:n], true, nil, nil
	}
	if err := m.charge(4 * int64(c)); err != nil {
		return nil, false, nil, err
	}
	m.misses++
	m.granted += 4 * int64(c)
	m.requested += 4 * int64(n)
	// Make room: live + pool stays under the recent high-water mark,
	// so the oldest spare buffers go.
	return nil, false, m.evict(m.bound(), nil), nil
}

// putFloats takes back released storage, whose capacity is a class
// size, and keeps it unless that would pass the bound.
func (m *memory) putFloats(b []float32) {
	b = b[:cap(b)]
	n := 4 * int64(len(b))
	m.mu.Lock()
	m.uncharge(n)
	drop := m.evict(m.bound()-n, nil)
	if m.live+m.poolBytes+n > m.bound() {
		m.dropped += n
		drop = append(drop, b)
	} else {
		if m.free == nil {
			m.free = map[int][]pooled{}
		}
		m.seq++
		m.free[len(b)] = append(m.free[len(b)], pooled{buf: b, seq: m.seq})
		m.poolBytes += n
		m.armTrim()
	}
	m.mu.Unlock()
	discard(drop)
}

// discard gives the pages of buffers that the pool dropped back to the
// operating system; nothing else holds them. Call without m.mu: a
// madvise of many pages takes microseconds that other allocations need
// not wait for.
func discard(drop [][]float32) {
	for _, b := range drop {
		pages.Discard(b)
	}
}

// evict drops the oldest pooled buffers until live + pool <= limit, or
// the pool is empty, and returns drop with them appended, for the
// caller to discard once it has unlocked. Call with m.mu held.
func (m *memory) evict(limit int64, drop [][]float32) [][]float32 {
	for m.poolBytes > 0 && m.live+m.poolBytes > limit {
		oldest, at := -1, uint64(0)
		for c, l := range m.free {
			if len(l) > 0 && (oldest < 0 || l[0].seq < at) {
				oldest, at = c, l[0].seq
			}
		}
		l := m.free[oldest]
		m.poolBytes -= 4 * int64(cap(l[0].buf))
		m.dropped += 4 * int64(cap(l[0].buf))
		drop = append(drop, l[0].buf)
		l[0] = pooled{}
		if len(l) == 1 {
			delete(m.free, oldest)
		} else {
			m.free[oldest] = l[1:]
		}
	}
	return drop
}

// armTrim starts the decay timer unless it runs. Call with m.mu held.
func (m *memory) armTrim() {
	if m.timer != nil {
		return
	}
	d := m.decay
	if d <= 0 {
		d = PoolDecay
	}
	m.timer = time.AfterFunc(d, m.trim)
}

// trim ends a decay period: the previous period's mark is forgotten, and
// the pool shrinks to the new bound, its dropped buffers given back to
// the operating system. It re-arms while the pool holds anything, and
// calls onIdle when this tick emptied it. The timer calls it; a test may
// call it for a tick of its own (its timer, which it stops, then starts
// the next period).
func (m *memory) trim() {
	m.mu.Lock()
	if m.timer != nil {
		m.timer.Stop()
		m.timer = nil
	}
	m.prevPeak, m.peak = m.peak, m.live
	drop := m.evict(m.bound(), nil)
	if m.poolBytes > 0 {
		m.armTrim()
	}
	idle := m.poolBytes == 0 && len(drop) > 0
	m.mu.Unlock()
	discard(drop)
	if idle && m.onIdle != nil {
		m.onIdle()
	}
}

// admit is Device.Admit for a device named who: nil when the ceiling
// admits n more bytes of new work, else ErrOutOfMemory with the figures.
func (m *memory) admit(n int64, who string) error {
	if m.ceiling.admit(n) {
		return nil
	}
	m.mu.Lock()
	m.notAdmit++
	m.mu.Unlock()
	c := m.ceiling
	return fmt.Errorf("%w: %s: admitting %d bytes of new work: %d of the ceiling's %d bytes are in use, and new work may take %.0f%%", ErrOutOfMemory, who, n, c.Used(), c.Limit(), 100*AdmitFraction)
}

// chargeOther accounts storage that is not pooled (other dtypes,
// reservations).
func (m *memory) chargeOther(n int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.charge(n)
}

// unchargeOther gives back what chargeOther took.
func (m *memory) unchargeOther(n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.uncharge(n)
}

// collected is the cleanup of a tensor that the garbage collector took
// without a Release: its storage goes with it, and its bytes stop
// counting.
func (m *memory) collected(n int64) { m.unchargeOther(n) }

// stats returns the device's MemStats.
func (m *memory) stats() MemStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return MemStats{
		LiveBytes:      m.live,
		PeakBytes:      max(m.peak, m.prevPeak, m.live),
		PoolBytes:      m.poolBytes,
		DroppedBytes:   m.dropped,
		PoolHits:       m.hits,
		PoolMisses:     m.misses,
		Refused:        m.refused,
		NotAdmitted:    m.notAdmit,
		Limit:          m.ceiling.Limit(),
		GrantedBytes:   m.granted,
		RequestedBytes: m.requested,
	}
}
