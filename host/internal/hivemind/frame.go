package hivemind

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The two framings hivemind's peers use on a libp2p stream.
//
// Unary calls (p2pd's "persistent" protocol): each side writes one
// uvarint-length-delimited protobuf message.
//
// Stream calls (hivemind's own): frames of a one-byte marker, an 8-byte
// big-endian length and that many bytes of protobuf; marker 0 is a
// message, marker 1 an RPCError (an empty one ends the caller's side).

// ErrFrameTooLarge is returned when a peer announces a frame longer than
// the reader allows; nothing of it has been allocated.
var ErrFrameTooLarge = errors.New("frame too large")

// Frame markers of the stream framing.
const (
	markerMessage byte = 0
	markerError   byte = 1
)

// readDelimited reads one uvarint-length-delimited message of at most max
// bytes. The length is checked before the buffer is allocated.
func readDelimited(r *bufio.Reader, max int) ([]byte, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		return nil, fmt.Errorf("reading frame length: %w", err)
	}
	if n > uint64(max) {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, n, max)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, fmt.Errorf("reading %d-byte frame: %w", n, io.ErrUnexpectedEOF)
	}
	return buf, nil
}

// writeDelimited writes msg with its uvarint length in front.
func writeDelimited(w io.Writer, msg []byte) error {
	buf := make([]byte, 0, binary.MaxVarintLen64+len(msg))
	buf = binary.AppendUvarint(buf, uint64(len(msg)))
	buf = append(buf, msg...)
	_, err := w.Write(buf)
	return err
}

// readFrame reads one stream frame of at most max bytes of payload; the
// length is checked before the payload is allocated. It returns io.EOF
// when the stream ends cleanly between frames.
func readFrame(r io.Reader, max int) (marker byte, payload []byte, err error) {
	var head [9]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return 0, nil, io.EOF
		}
		return 0, nil, fmt.Errorf("reading frame header: %w", io.ErrUnexpectedEOF)
	}
	marker = head[0]
	if marker != markerMessage && marker != markerError {
		return 0, nil, fmt.Errorf("bad frame marker %#x", marker)
	}
	n := binary.BigEndian.Uint64(head[1:])
	if n > uint64(max) {
		return 0, nil, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, n, max)
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, fmt.Errorf("reading %d-byte frame: %w", n, io.ErrUnexpectedEOF)
	}
	return marker, payload, nil
}

// writeFrame writes one stream frame.
func writeFrame(w io.Writer, marker byte, payload []byte) error {
	buf := make([]byte, 9+len(payload))
	buf[0] = marker
	binary.BigEndian.PutUint64(buf[1:9], uint64(len(payload)))
	copy(buf[9:], payload)
	_, err := w.Write(buf)
	return err
}
