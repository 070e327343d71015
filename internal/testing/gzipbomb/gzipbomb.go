// Package gzipbomb makes the gzip bombs that tests send the services: a
// small body that inflates far past a server's request cap.
package gzipbomb

import (
	"bytes"
	"compress/gzip"
)

// Zeros returns n MiB of zero bytes as n gzip members of 1 MiB each
// (gzip readers read concatenated members as one stream): about n KiB.
func Zeros(n int) []byte {
	var member bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&member, gzip.BestCompression)
	zw.Write(make([]byte, 1<<20))
	zw.Close()
	return bytes.Repeat(member.Bytes(), n)
}
