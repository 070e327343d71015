// Command testca writes a certificate authority made on the spot, a
// server certificate for 127.0.0.1, ::1 and localhost, and a client
// certificate (package internal/testing/testca) into a directory, for the
// Python, TypeScript and browser tests of TLS, which make test-python,
// test-ts and test-web build it for:
//
//	testca DIR
//
// It writes ca.pem, server.pem, server-key.pem, client.pem,
// client-key.pem and server.spki (the base64 SHA-256 of the server
// certificate's public key, for Chromium's
// --ignore-certificate-errors-spki-list). Nothing it makes is fit for
// production.
package main

import (
	"fmt"
	"os"

	"github.com/moehost/moehost/internal/testing/testca"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: testca DIR")
		os.Exit(2)
	}
	if _, err := testca.WriteAll(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "testca:", err)
		os.Exit(1)
	}
}
