package tenant_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/moehost/moehost/host/tenant"
)

// FuzzParse: the decoder never panics, and what it accepts it writes back
// in a form it reads to the same file.
func FuzzParse(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*.json")
	for _, p := range seeds {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"version":1,"tenants":[{"name":"a","prefixes":["a.b"],"token_hashes":["` + hashA + `"],"caps":{"call_timeout":"1h"}}]}`))
	f.Add([]byte(`{"version":1,"tenants":[{"name":"a","prefixes":["a"],"token_hashes":["` + hashA + `"]},{"name":"b","prefixes":["a.b"],"token_hashes":["` + hashB + `"]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		file, err := tenant.Parse(b)
		if err != nil {
			return
		}
		out := file.Marshal()
		again, err := tenant.Parse(out)
		if err != nil {
			t.Fatalf("Parse(Marshal()) of an accepted file: %v\n%s", err, out)
		}
		if out2 := again.Marshal(); !bytes.Equal(out, out2) {
			t.Fatalf("round trip changed the file:\n%s\n%s", out, out2)
		}
	})
}

// FuzzAuthenticate: only the exact token signs in.
func FuzzAuthenticate(f *testing.F) {
	var file tenant.File
	tok, err := file.Add("alice", []string{"alice"}, tenant.Caps{})
	if err != nil {
		f.Fatal(err)
	}
	path := filepath.Join(f.TempDir(), tenant.FileName)
	if err := file.Save(path); err != nil {
		f.Fatal(err)
	}
	s, err := tenant.Open(path)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(tok)
	f.Add(tok[:len(tok)-1] + "A")
	f.Add("moe_")
	f.Add("")
	f.Fuzz(func(t *testing.T, in string) {
		name, ok := s.Authenticate(in)
		if ok != (in == tok) || ok && name != "alice" || !ok && name != "" {
			t.Fatalf("Authenticate(%q) = %q, %v", in, name, ok)
		}
	})
}
