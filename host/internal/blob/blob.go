// Package blob is the host's room for content-addressed transfer between
// hosts: it serves, on /moehost/blob/1.0.0 of the DHT node's libp2p host,
// a checkpoint's signed manifest by its state root, a module by its
// digest and ranges of a checkpoint's chunks, and it pulls them from
// every holder of a root, checking each chunk against the manifest
// before it writes it.
//
// It knows libp2p only through the small [Host] interface and the
// checkpoints only through [Source]; package host implements both.
//
// The wire: one request per stream,
//
//	request:  uvarint length, then kind (1 byte), name (uvarint length
//	          and bytes: a root or a digest), and for KindChunks the
//	          file index, the first chunk and the chunk count (uvarints)
//	response: status (1 byte); for StatusOK a uvarint length (the
//	          manifest's or the module's bytes, or for KindChunks the
//	          bytes of the chunks asked) and the bytes; otherwise a
//	          uvarint length and a message
package blob

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// Protocol is the libp2p protocol ID of the blob protocol.
const Protocol = "/moehost/blob/1.0.0"

// Request kinds.
const (
	KindManifest byte = 1
	KindModule   byte = 2
	KindChunks   byte = 3
)

// Response statuses.
const (
	StatusOK                byte = 0
	StatusNotFound          byte = 1
	StatusPermissionDenied  byte = 2
	StatusResourceExhausted byte = 3
	StatusInvalidArgument   byte = 4
	StatusInternal          byte = 5
)

// Errors a pull returns for a holder's answer; package host maps them.
var (
	ErrNotFound         = errors.New("not found")
	ErrPermissionDenied = errors.New("permission denied")
	ErrExhausted        = errors.New("holder busy")
	ErrBadFrame         = errors.New("bad blob frame")
	// ErrBadData is a chunk, manifest or module that does not hash to
	// what was asked: its holder is banned.
	ErrBadData = errors.New("data does not match its hash")
)

// Bounds on frames.
const (
	maxRequestBytes = 256
	maxNameBytes    = 7 + 64
	maxMessageBytes = 1024
	// MaxChunksPerRequest bounds one KindChunks request.
	MaxChunksPerRequest = 64
)

// Stream is one libp2p stream.
type Stream interface {
	io.ReadWriteCloser
	Reset() error
	SetDeadline(time.Time) error
}

// Host is the libp2p host the protocol runs on: the DHT node's.
type Host interface {
	// Handle serves protocol: fn gets each stream a peer opens, with the
	// peer's ID.
	Handle(protocol string, fn func(peer string, s Stream))
	// Open opens a stream to peer.
	Open(ctx context.Context, peer, protocol string) (Stream, error)
}

// Request is one decoded request.
type Request struct {
	Kind  byte
	Name  string // a state root or a module digest
	File  uint64
	First uint64
	Count uint64
}

// Encode returns the request's frame, its length first.
func (r Request) Encode() []byte {
	var body []byte
	body = append(body, r.Kind)
	body = binary.AppendUvarint(body, uint64(len(r.Name)))
	body = append(body, r.Name...)
	if r.Kind == KindChunks {
		body = binary.AppendUvarint(body, r.File)
		body = binary.AppendUvarint(body, r.First)
		body = binary.AppendUvarint(body, r.Count)
	}
	return append(binary.AppendUvarint(nil, uint64(len(body))), body...)
}

// ReadRequest reads one request frame from r, at most maxRequestBytes.
func ReadRequest(r *bufio.Reader) (Request, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return Request{}, fmt.Errorf("%w: request length: %v", ErrBadFrame, err)
	}
	if n > maxRequestBytes {
		return Request{}, fmt.Errorf("%w: request of %d bytes, more than %d", ErrBadFrame, n, maxRequestBytes)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return Request{}, fmt.Errorf("%w: request: %v", ErrBadFrame, err)
	}
	return DecodeRequest(b)
}

// DecodeRequest parses a request body (the frame without its length).
func DecodeRequest(b []byte) (Request, error) {
	bad := func(format string, args ...any) (Request, error) {
		return Request{}, fmt.Errorf("%w: %s", ErrBadFrame, fmt.Sprintf(format, args...))
	}
	if len(b) < 1 {
		return bad("empty request")
	}
	r := Request{Kind: b[0]}
	b = b[1:]
	nl, k := uvarint(b)
	if k <= 0 || nl > maxNameBytes || nl > uint64(len(b)-k) {
		return bad("name length")
	}
	r.Name = string(b[k : k+int(nl)])
	b = b[k+int(nl):]
	switch r.Kind {
	case KindManifest, KindModule:
	case KindChunks:
		for _, f := range []*uint64{&r.File, &r.First, &r.Count} {
			v, k := uvarint(b)
			if k <= 0 {
				return bad("chunk range")
			}
			*f, b = v, b[k:]
		}
		if r.Count == 0 || r.Count > MaxChunksPerRequest {
			return bad("%d chunks asked; 1 to %d may be", r.Count, MaxChunksPerRequest)
		}
	default:
		return bad("kind %d", r.Kind)
	}
	if len(b) != 0 {
		return bad("%d bytes after the request", len(b))
	}
	return r, nil
}

// uvarint is binary.Uvarint that refuses a longer encoding than needed,
// so that one request has one frame.
func uvarint(b []byte) (uint64, int) {
	v, k := binary.Uvarint(b)
	if k > 0 && k != len(binary.AppendUvarint(nil, v)) {
		return 0, -1
	}
	return v, k
}

// writeStatus writes an error response.
func writeStatus(w io.Writer, status byte, msg string) error {
	if len(msg) > maxMessageBytes {
		msg = msg[:maxMessageBytes]
	}
	b := append([]byte{status}, binary.AppendUvarint(nil, uint64(len(msg)))...)
	_, err := w.Write(append(b, msg...))
	return err
}

// writeOK writes the header of a successful response of n bytes.
func writeOK(w io.Writer, n int64) error {
	_, err := w.Write(append([]byte{StatusOK}, binary.AppendUvarint(nil, uint64(n))...))
	return err
}

// ReadResponse reads a response's header from r: for StatusOK the
// length of what follows, which must be at most max; otherwise the
// holder's error, as one of this package's.
func ReadResponse(r *bufio.Reader, max int64) (int64, error) {
	st, err := r.ReadByte()
	if err != nil {
		return 0, fmt.Errorf("%w: status: %v", ErrBadFrame, err)
	}
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return 0, fmt.Errorf("%w: length: %v", ErrBadFrame, err)
	}
	if st == StatusOK {
		if n > uint64(max) {
			return 0, fmt.Errorf("%w: %d bytes announced, more than the %d asked", ErrBadFrame, n, max)
		}
		return int64(n), nil
	}
	if n > maxMessageBytes {
		return 0, fmt.Errorf("%w: message of %d bytes", ErrBadFrame, n)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		return 0, fmt.Errorf("%w: message: %v", ErrBadFrame, err)
	}
	var kind error
	switch st {
	case StatusNotFound:
		kind = ErrNotFound
	case StatusPermissionDenied:
		kind = ErrPermissionDenied
	case StatusResourceExhausted:
		kind = ErrExhausted
	default:
		kind = ErrBadFrame
	}
	return 0, fmt.Errorf("%w: %s", kind, msg)
}
