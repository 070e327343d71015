package blob

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moehost/moehost/host/checkpoint"
	"github.com/moehost/moehost/internal/atomicfile"
)

// Puller fetches blobs from holders, checking everything it receives.
// A holder that sends a bad chunk, manifest or module is banned, for a
// backoff that doubles with each offence.
type Puller struct {
	host Host
	// RangeChunks is how many chunks one request asks (default 8).
	RangeChunks int
	// StreamsPerHolder is how many requests run at once per holder
	// (default 2).
	StreamsPerHolder int

	mu   sync.Mutex
	bans map[string]ban

	received atomic.Int64
	byHolder sync.Map // holder → *atomic.Int64 of chunk bytes received
}

type ban struct {
	until   time.Time
	backoff time.Duration
	why     error
}

// NewPuller returns a puller over host.
func NewPuller(h Host) *Puller {
	return &Puller{host: h, RangeChunks: 8, StreamsPerHolder: 2, bans: map[string]ban{}}
}

// Ban bans holder for its next backoff (1 minute, doubling).
func (p *Puller) Ban(holder string, why error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.bans[holder]
	if b.backoff == 0 {
		b.backoff = time.Minute
	} else {
		b.backoff *= 2
	}
	b.until, b.why = time.Now().Add(b.backoff), why
	p.bans[holder] = b
}

// Banned returns why holder is banned now, or nil.
func (p *Puller) Banned(holder string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if b, ok := p.bans[holder]; ok && time.Now().Before(b.until) {
		return b.why
	}
	return nil
}

// Received returns the bytes received so far (answers' payloads).
func (p *Puller) Received() int64 { return p.received.Load() }

// ReceivedFrom returns the chunk bytes received from holder.
func (p *Puller) ReceivedFrom(holder string) int64 {
	if v, ok := p.byHolder.Load(holder); ok {
		return v.(*atomic.Int64).Load()
	}
	return 0
}

func (p *Puller) count(holder string, n int64) {
	p.received.Add(n)
	v, _ := p.byHolder.LoadOrStore(holder, new(atomic.Int64))
	v.(*atomic.Int64).Add(n)
}

// ask opens a stream to holder, sends req and reads the answer's header.
func (p *Puller) ask(ctx context.Context, holder string, req Request, max int64) (Stream, *bufio.Reader, int64, error) {
	st, err := p.host.Open(ctx, holder, Protocol)
	if err != nil {
		return nil, nil, 0, err
	}
	stop := context.AfterFunc(ctx, func() { _ = st.Reset() })
	_ = st.SetDeadline(time.Now().Add(requestTimeout))
	if _, err := st.Write(req.Encode()); err != nil {
		stop()
		_ = st.Reset()
		return nil, nil, 0, err
	}
	br := bufio.NewReaderSize(st, 64<<10)
	n, err := ReadResponse(br, max)
	if err != nil {
		stop()
		_ = st.Reset()
		return nil, nil, 0, err
	}
	return &stopStream{Stream: st, stop: stop}, br, n, nil
}

type stopStream struct {
	Stream
	stop func() bool
}

func (s *stopStream) Close() error { s.stop(); return s.Stream.Close() }

// Manifest fetches the signed manifest with root from the first holder
// that has it and sends bytes that hash to it; a holder that sends
// anything else is banned. errs says what each holder answered.
func (p *Puller) Manifest(ctx context.Context, root string, holders []string) (*checkpoint.SignedManifest, error) {
	sm, err := firstHolder(ctx, p, holders, func(h string) (*checkpoint.SignedManifest, error) { return p.manifestFrom(ctx, h, root) })
	if err != nil {
		return nil, fmt.Errorf("no holder gave the manifest of %s: %w", root, err)
	}
	return sm, nil
}

// firstHolder returns what get gives for the first holder, in order,
// that is not banned and answers well, banning one that sends bad data
// (ErrBadData, checkpoint.ErrBadManifest); the error joins every
// holder's.
func firstHolder[T any](ctx context.Context, p *Puller, holders []string, get func(holder string) (T, error)) (T, error) {
	var errs []error
	for _, h := range holders {
		if err := p.Banned(h); err != nil {
			errs = append(errs, fmt.Errorf("%s: banned: %w", h, err))
			continue
		}
		v, err := get(h)
		if err == nil {
			return v, nil
		}
		if errors.Is(err, ErrBadData) || errors.Is(err, checkpoint.ErrBadManifest) {
			p.Ban(h, err)
		}
		errs = append(errs, fmt.Errorf("%s: %w", h, err))
		if ctx.Err() != nil {
			break
		}
	}
	var zero T
	return zero, errors.Join(errs...)
}

// body asks holder for req and reads its whole answer, at most max
// bytes.
func (p *Puller) body(ctx context.Context, holder string, req Request, max int64) ([]byte, error) {
	st, br, n, err := p.ask(ctx, holder, req, max)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	b := make([]byte, n)
	if _, err := io.ReadFull(br, b); err != nil {
		return nil, err
	}
	p.received.Add(n)
	return b, nil
}

func (p *Puller) manifestFrom(ctx context.Context, holder, root string) (*checkpoint.SignedManifest, error) {
	b, err := p.body(ctx, holder, Request{Kind: KindManifest, Name: root}, checkpoint.MaxManifestBytes+64<<10)
	if err != nil {
		return nil, err
	}
	sm, err := checkpoint.DecodeSigned(b)
	if err != nil {
		return nil, err
	}
	if sm.Root != root {
		return nil, fmt.Errorf("%w: the manifest hashes to %s", ErrBadData, sm.Root)
	}
	return sm, nil
}

// Module fetches the module with digest d ("sha256:<hex>"), at most max
// bytes, from the first holder that sends bytes hashing to it.
func (p *Puller) Module(ctx context.Context, d string, holders []string, max int64) ([]byte, error) {
	wasm, err := firstHolder(ctx, p, holders, func(h string) ([]byte, error) { return p.moduleFrom(ctx, h, d, max) })
	if err != nil {
		return nil, fmt.Errorf("no holder gave module %s: %w", d, err)
	}
	return wasm, nil
}

func (p *Puller) moduleFrom(ctx context.Context, holder, d string, max int64) ([]byte, error) {
	b, err := p.body(ctx, holder, Request{Kind: KindModule, Name: d}, max)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	if got := fmt.Sprintf("sha256:%x", sum); got != d {
		return nil, fmt.Errorf("%w: the module hashes to %s", ErrBadData, got)
	}
	return b, nil
}

// part is one file being pulled: its .part file and bitmap.
type part struct {
	fh     checkpoint.FileHashes
	f      *os.File
	bitmap []byte // a byte per chunk: 1 once written and checked
	bmPath string
	left   int64
}

// rng is a range of chunks of one file.
type rng struct {
	file         int
	first, count int64
}

// Files pulls the files of sm from holders into partPath(name) (a .part
// file, preallocated, with a bitmap beside it, ".bitmap"): each chunk is
// checked against the manifest before it is written at its offset, and
// a pull that stopped resumes with the chunks its bitmap lacks (those it
// has are checked again first). Ranges are striped across the holders,
// each taking the next range as it finishes one, so a slow holder serves
// fewer; a holder that sends a bad chunk is banned and its range goes to
// the others. It returns once every chunk is in place, or with why not.
func (p *Puller) Files(ctx context.Context, sm *checkpoint.SignedManifest, holders []string, partPath func(name string) string) error {
	parts := make([]*part, len(sm.Manifest.Files))
	defer func() {
		for _, pt := range parts {
			if pt != nil {
				pt.f.Close()
			}
		}
	}()
	var queue []rng
	for i, fh := range sm.Manifest.Files {
		pt, err := openPart(partPath(fh.Name), fh)
		if err != nil {
			return err
		}
		parts[i] = pt
		step := int64(p.RangeChunks)
		for c := int64(0); c < int64(len(fh.Chunks)); {
			if pt.bitmap[c] == 1 {
				c++
				continue
			}
			r := rng{file: i, first: c}
			for c < int64(len(fh.Chunks)) && pt.bitmap[c] == 0 && r.count < step {
				c++
				r.count++
			}
			queue = append(queue, r)
		}
	}
	var (
		mu      sync.Mutex
		cond    = sync.NewCond(&mu)
		pending = len(queue)
		active  int
		errs    []error
		wg      sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopCond := context.AfterFunc(ctx, func() { mu.Lock(); cond.Broadcast(); mu.Unlock() })
	defer stopCond()
	take := func() (rng, bool) {
		mu.Lock()
		defer mu.Unlock()
		for len(queue) == 0 && pending > 0 && ctx.Err() == nil {
			cond.Wait()
		}
		if len(queue) == 0 || ctx.Err() != nil {
			return rng{}, false
		}
		r := queue[0]
		queue = queue[1:]
		return r, true
	}
	giveBack := func(r rng) {
		mu.Lock()
		defer mu.Unlock()
		// Only the chunks still missing go back; a range whose chunks
		// all came from another holder meanwhile is done.
		pt := parts[r.file]
		requeued := false
		for c := r.first; c < r.first+r.count; c++ {
			if pt.bitmap[c] == 0 {
				queue = append(queue, rng{file: r.file, first: c, count: r.first + r.count - c})
				requeued = true
				break
			}
		}
		if !requeued {
			pending--
		}
		cond.Broadcast()
	}
	done := func() {
		mu.Lock()
		pending--
		cond.Broadcast()
		mu.Unlock()
	}
	for _, h := range holders {
		if p.Banned(h) != nil {
			continue
		}
		for range max(1, p.StreamsPerHolder) {
			active++
			wg.Add(1)
			go func() {
				defer wg.Done()
				failures := 0
				for {
					if p.Banned(h) != nil {
						break
					}
					r, ok := take()
					if !ok {
						break
					}
					err := p.fetchRange(ctx, h, sm, parts, r, &mu)
					if err == nil {
						done()
						continue
					}
					giveBack(r)
					if errors.Is(err, ErrBadData) {
						p.Ban(h, err)
					}
					mu.Lock()
					errs = append(errs, fmt.Errorf("%s: %w", h, err))
					mu.Unlock()
					if failures++; failures >= 3 || errors.Is(err, ErrPermissionDenied) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrBadData) {
						break
					}
				}
				mu.Lock()
				active--
				cond.Broadcast()
				mu.Unlock()
			}()
		}
	}
	// Once every worker has given up, nobody takes what is queued.
	go func() {
		mu.Lock()
		for active > 0 && pending > 0 && ctx.Err() == nil {
			cond.Wait()
		}
		mu.Unlock()
		cancel()
	}()
	wg.Wait()
	var flushErr error
	for _, pt := range parts {
		flushErr = errors.Join(flushErr, atomicfile.Write(pt.bmPath, pt.bitmap))
	}
	for _, pt := range parts {
		if pt.left > 0 {
			if err := context.Cause(ctx); err != nil && len(errs) == 0 {
				errs = append(errs, err)
			}
			return fmt.Errorf("pulling %s: %d of %d bytes still missing: %w", sm.Root, missing(parts), sm.Manifest.Bytes(), errors.Join(append(errs, flushErr)...))
		}
	}
	if flushErr != nil {
		return flushErr
	}
	for _, pt := range parts {
		os.Remove(pt.bmPath)
	}
	return nil
}

func missing(parts []*part) int64 {
	var n int64
	for _, pt := range parts {
		n += pt.left
	}
	return n
}

// openPart opens (creating and preallocating) the .part file of fh and
// reads its bitmap, checking again each chunk it marks.
func openPart(path string, fh checkpoint.FileHashes) (*part, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	pt := &part{fh: fh, f: f, bmPath: path + ".bitmap", bitmap: make([]byte, len(fh.Chunks)), left: fh.Size}
	fi, err := f.Stat()
	if err == nil && fi.Size() != fh.Size {
		err = f.Truncate(fh.Size)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	if bm, err := os.ReadFile(pt.bmPath); err == nil && len(bm) == len(fh.Chunks) && fi.Size() == fh.Size {
		buf := make([]byte, fh.ChunkSize)
		for c := range bm {
			if bm[c] != 1 {
				continue
			}
			off, n := fh.Chunk(int64(c))
			if _, err := f.ReadAt(buf[:n], off); err == nil && sha256.Sum256(buf[:n]) == fh.Chunks[c] {
				pt.bitmap[c] = 1
				pt.left -= n
			}
		}
	}
	return pt, nil
}

// fetchRange asks holder for r and writes each chunk once checked.
func (p *Puller) fetchRange(ctx context.Context, holder string, sm *checkpoint.SignedManifest, parts []*part, r rng, mu *sync.Mutex) error {
	pt := parts[r.file]
	fh := pt.fh
	start, _ := fh.Chunk(r.first)
	lo, ln := fh.Chunk(r.first + r.count - 1)
	want := lo + ln - start
	st, br, n, err := p.ask(ctx, holder, Request{Kind: KindChunks, Name: sm.Root, File: uint64(r.file), First: uint64(r.first), Count: uint64(r.count)}, want)
	if err != nil {
		return err
	}
	defer st.Close()
	if n != want {
		_ = st.Reset()
		return fmt.Errorf("%w: %d bytes for chunks of %d", ErrBadData, n, want)
	}
	buf := make([]byte, fh.ChunkSize)
	for c := r.first; c < r.first+r.count; c++ {
		off, n := fh.Chunk(c)
		_ = st.SetDeadline(time.Now().Add(writeTimeout))
		got, err := io.ReadFull(br, buf[:n])
		p.count(holder, int64(got))
		if err != nil {
			_ = st.Reset()
			return err
		}
		if sha256.Sum256(buf[:n]) != fh.Chunks[c] {
			_ = st.Reset()
			return fmt.Errorf("%w: chunk %d of %s", ErrBadData, c, fh.Name)
		}
		mu.Lock()
		have := pt.bitmap[c] == 1
		mu.Unlock()
		if have {
			continue
		}
		if _, err := pt.f.WriteAt(buf[:n], off); err != nil {
			_ = st.Reset()
			return err
		}
		mu.Lock()
		if pt.bitmap[c] == 0 {
			pt.bitmap[c] = 1
			pt.left -= n
		}
		mu.Unlock()
	}
	return nil
}

// Equal reports whether two manifests' encodings are the same.
func Equal(a, b *checkpoint.SignedManifest) bool { return bytes.Equal(a.Encoded, b.Encoded) }
