package rpc

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	"connectrpc.com/connect"
)

// readLimit caps each request message of a handler at max bytes, before
// and after decompression. connect's own gzip decompressor stops at the
// cap but then inflates the rest of the message only to report its size,
// so that 1 MiB of gzip (1 GiB of zeros) costs a second of CPU before it
// is refused; the decompressor here fails as soon as it has produced one
// byte more than max, and the message is refused with ResourceExhausted
// after no more inflating than the cap allows.
func readLimit(max int) connect.HandlerOption {
	return connect.WithHandlerOptions(
		strictJSONCodecs(),
		connect.WithReadMaxBytes(max),
		connect.WithCompression("gzip",
			func() connect.Decompressor { return &cappedGzip{max: int64(max) + 1} },
			func() connect.Compressor { return gzip.NewWriter(io.Discard) },
		),
	)
}

// errInflateCap is what a cappedGzip returns past its cap.
var errInflateCap = errors.New("the message inflates past the server's size limit")

// inflated counts the bytes every cappedGzip has produced, so that a test
// can check how far a bomb was inflated by bytes rather than by CPU time,
// which a loaded machine and the race detector stretch tenfold.
var inflated atomic.Int64

// cappedGzip is a gzip reader that yields at most max bytes per message
// and then fails with errInflateCap.
type cappedGzip struct {
	zr        gzip.Reader
	max, left int64
}

func (c *cappedGzip) Reset(r io.Reader) error {
	c.left = c.max
	if err := c.zr.Reset(r); err != nil {
		return fmt.Errorf("gzip: %w", err)
	}
	return nil
}

func (c *cappedGzip) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, errInflateCap
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.zr.Read(p)
	c.left -= int64(n)
	inflated.Add(int64(n))
	return n, err
}

func (c *cappedGzip) Close() error { return c.zr.Close() }
