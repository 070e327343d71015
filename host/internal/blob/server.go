package blob

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/moehost/moehost/host/checkpoint"
)

// File is an open, immutable checkpoint file: it stays readable while
// it is served even if it is pruned meanwhile.
type File interface {
	io.ReaderAt
	io.Closer
}

// Source is what the server serves. Its methods must not wait for
// training: checkpoint files are immutable once written.
type Source interface {
	// State returns the signed manifest (file bytes) of the checkpoint
	// with state root root, and the manifest; checkpoint.ErrNotFound if
	// none is held.
	State(root string) (signed []byte, m *checkpoint.Manifest, err error)
	// OpenFile opens file i of the checkpoint with state root root.
	OpenFile(root string, i int) (File, error)
	// Module returns the module with digest d and the uids that use it
	// here; checkpoint.ErrNotFound if none is held.
	Module(d string) (wasm []byte, uids []string, err error)
}

// Config configures a Server.
type Config struct {
	// Source is what is served. Required.
	Source Source
	// Allow says whether peer may pull uid's state and module. Nil
	// allows no one.
	Allow func(peer, uid string) bool
	// MaxTransfers bounds the transfers served at once, and MaxPerPeer
	// one peer's; a request past either gets ResourceExhausted at once.
	// Defaults DefaultMaxTransfers and DefaultMaxPerPeer.
	MaxTransfers, MaxPerPeer int
	// Logger logs; nil discards.
	Logger *slog.Logger
}

// Defaults of Config.
const (
	DefaultMaxTransfers = 64
	DefaultMaxPerPeer   = 8
	// BufferBytes is what one transfer holds in memory: one chunk of
	// the largest size. MaxTransfers × BufferBytes bounds the bytes in
	// flight.
	BufferBytes = checkpoint.BigChunkSize
	// requestTimeout bounds the wait for a request, and writeTimeout
	// each chunk's write, so that a peer that stops reading frees its
	// slot.
	requestTimeout = 10 * time.Second
	writeTimeout   = 30 * time.Second
)

// Server answers the blob protocol.
type Server struct {
	cfg  Config
	log  *slog.Logger
	bufs sync.Pool

	mu     sync.Mutex
	total  int
	byPeer map[string]int
}

// NewServer returns a server of cfg; register its Serve with Host.Handle.
func NewServer(cfg Config) *Server {
	if cfg.MaxTransfers <= 0 {
		cfg.MaxTransfers = DefaultMaxTransfers
	}
	if cfg.MaxPerPeer <= 0 {
		cfg.MaxPerPeer = DefaultMaxPerPeer
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: log, byPeer: map[string]int{}}
	s.bufs.New = func() any { b := make([]byte, BufferBytes); return &b }
	return s
}

// acquire takes a transfer slot for peer, or reports that none is free.
func (s *Server) acquire(peer string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.total >= s.cfg.MaxTransfers || s.byPeer[peer] >= s.cfg.MaxPerPeer {
		return false
	}
	s.total++
	s.byPeer[peer]++
	return true
}

func (s *Server) release(peer string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total--
	if s.byPeer[peer]--; s.byPeer[peer] == 0 {
		delete(s.byPeer, peer)
	}
}

func (s *Server) allowed(peer, uid string) bool {
	return s.cfg.Allow != nil && s.cfg.Allow(peer, uid)
}

// Serve answers one stream. Nothing a peer sends makes it panic or
// allocate beyond its bounds.
func (s *Server) Serve(peer string, st Stream) {
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(requestTimeout))
	br := bufio.NewReaderSize(st, 512)
	req, err := ReadRequest(br)
	if err != nil {
		_ = writeStatus(st, StatusInvalidArgument, err.Error())
		return
	}
	if !s.acquire(peer) {
		_ = writeStatus(st, StatusResourceExhausted, "too many transfers; try another holder or later")
		return
	}
	defer s.release(peer)
	if err := s.serve(peer, st, req); err != nil {
		s.log.Debug("blob transfer ended", "peer", peer, "kind", req.Kind, "name", req.Name, "err", err)
		_ = st.Reset()
	}
}

func (s *Server) serve(peer string, st Stream, req Request) error {
	switch req.Kind {
	case KindManifest:
		signed, m, err := s.cfg.Source.State(req.Name)
		if err != nil {
			return s.fail(st, err)
		}
		if !s.allowed(peer, m.UID) {
			return writeStatus(st, StatusPermissionDenied, "this host does not share "+m.UID+"'s state with you")
		}
		if err := writeOK(st, int64(len(signed))); err != nil {
			return err
		}
		_, err = st.Write(signed)
		return err
	case KindModule:
		wasm, uids, err := s.cfg.Source.Module(req.Name)
		if err != nil {
			return s.fail(st, err)
		}
		ok := false
		for _, u := range uids {
			ok = ok || s.allowed(peer, u)
		}
		if !ok {
			return writeStatus(st, StatusPermissionDenied, "this host does not share module "+req.Name+" with you")
		}
		if err := writeOK(st, int64(len(wasm))); err != nil {
			return err
		}
		for len(wasm) > 0 {
			_ = st.SetDeadline(time.Now().Add(writeTimeout))
			n := min(len(wasm), 1<<20)
			if _, err := st.Write(wasm[:n]); err != nil {
				return err
			}
			wasm = wasm[n:]
		}
		return nil
	case KindChunks:
		return s.serveChunks(peer, st, req)
	}
	return fmt.Errorf("BUG: request kind %d passed the decoder", req.Kind)
}

// fail answers a Source error.
func (s *Server) fail(st Stream, err error) error {
	if errors.Is(err, checkpoint.ErrNotFound) {
		return writeStatus(st, StatusNotFound, "this host holds no such blob")
	}
	s.log.Warn("serving a blob", "err", err)
	return writeStatus(st, StatusInternal, "this host could not read the blob")
}

func (s *Server) serveChunks(peer string, st Stream, req Request) error {
	_, m, err := s.cfg.Source.State(req.Name)
	if err != nil {
		return s.fail(st, err)
	}
	if !s.allowed(peer, m.UID) {
		return writeStatus(st, StatusPermissionDenied, "this host does not share "+m.UID+"'s state with you")
	}
	if req.File >= uint64(len(m.Files)) {
		return writeStatus(st, StatusInvalidArgument, "no such file in the manifest")
	}
	fh := m.Files[req.File]
	nc := uint64(len(fh.Chunks))
	if req.First >= nc || req.Count > nc-req.First {
		return writeStatus(st, StatusInvalidArgument, fmt.Sprintf("chunks [%d, %d+%d) of a file of %d", req.First, req.First, req.Count, nc))
	}
	f, err := s.cfg.Source.OpenFile(req.Name, int(req.File))
	if err != nil {
		return s.fail(st, err)
	}
	defer f.Close()
	start, _ := fh.Chunk(int64(req.First))
	lastOff, lastN := fh.Chunk(int64(req.First + req.Count - 1))
	if err := writeOK(st, lastOff+lastN-start); err != nil {
		return err
	}
	bp := s.bufs.Get().(*[]byte)
	defer s.bufs.Put(bp)
	for i := req.First; i < req.First+req.Count; i++ {
		off, n := fh.Chunk(int64(i))
		buf := (*bp)[:n]
		if _, err := f.ReadAt(buf, off); err != nil {
			return fmt.Errorf("reading chunk %d: %w", i, err)
		}
		_ = st.SetDeadline(time.Now().Add(writeTimeout))
		if _, err := st.Write(buf); err != nil {
			return err
		}
	}
	return nil
}
