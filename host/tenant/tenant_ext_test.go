package tenant_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moehost/moehost/host/tenant"
)

const hashA = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
const hashB = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

// TestParse checks the tenants file's rules, and that each error names
// the tenant and the field.
func TestParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		file string
		want []string // substrings of the error; none: valid
	}{
		{"empty tenants", `{"version":1,"tenants":[]}`, nil},
		{"two tenants, caps", `{"version":1,"tenants":[
			{"name":"alice","prefixes":["alice","shared.alice"],"token_hashes":["` + hashA + `"],"caps":{"modules":3,"call_timeout":"30s","queue_share":2}},
			{"name":"alicex","prefixes":["alicex"],"token_hashes":["` + hashB + `"]}]}`, nil},
		{"no version", `{"tenants":[]}`, []string{"version is missing"}},
		{"wrong version", `{"version":2}`, []string{"version 2 is not supported"}},
		{"not json", `version: 1`, []string{"not valid JSON at line 1, column 1"}},
		// A hand-edited file's syntax error is named by line and column.
		{"syntax error's line and column", "{\n  \"version\": 1,\n  \"tenants\": [}\n}", []string{"not valid JSON at line 3, column 15", "invalid character '}'"}},
		{"trailing comma", "{\"version\":1,\n\"tenants\":[],\n}", []string{"not valid JSON at line 3, column 1"}},
		{"empty input", ``, []string{"empty input"}},
		{"trailing data", `{"version":1} {}`, []string{"data after the JSON object"}},
		{"unknown top-level field", `{"version":1,"tenant":[]}`, []string{`unknown field "tenant"`}},
		{"misspelt cap names tenant and field", `{"version":1,"tenants":[{"name":"bob","prefixes":["bob"],"token_hashes":["` + hashA + `"],"caps":{"module":1}}]}`,
			[]string{`tenant "bob"`, `unknown field "module"`}},
		{"wrong type names tenant and field", `{"version":1,"tenants":[{"name":"bob","prefixes":["bob"],"token_hashes":["` + hashA + `"],"caps":{"experts":"many"}}]}`,
			[]string{`tenant "bob"`, "caps.experts: want an integer, got a JSON string"}},
		{"negative cap", `{"version":1,"tenants":[{"name":"bob","prefixes":["bob"],"token_hashes":["` + hashA + `"],"caps":{"param_bytes":-1}}]}`,
			[]string{`tenant "bob"`, "caps.param_bytes -1: must not be negative"}},
		{"negative timeout", `{"version":1,"tenants":[{"name":"bob","prefixes":["bob"],"token_hashes":["` + hashA + `"],"caps":{"call_timeout":"-1s"}}]}`,
			[]string{`tenant "bob"`, "caps.call_timeout -1s: must not be negative"}},
		{"bad init timeout", `{"version":1,"tenants":[{"name":"bob","prefixes":["bob"],"token_hashes":["` + hashA + `"],"caps":{"init_timeout":"soon"}}]}`,
			[]string{`tenant "bob"`, `caps.init_timeout "soon"`}},
		{"negative uploads", `{"version":1,"tenants":[{"name":"bob","prefixes":["bob"],"token_hashes":["` + hashA + `"],"caps":{"uploads":-1}}]}`,
			[]string{`tenant "bob"`, "caps.uploads -1: must not be negative"}},
		{"bad timeout", `{"version":1,"tenants":[{"name":"bob","prefixes":["bob"],"token_hashes":["` + hashA + `"],"caps":{"call_timeout":"soon"}}]}`,
			[]string{`tenant "bob"`, `caps.call_timeout "soon"`}},
		{"too many pages", `{"version":1,"tenants":[{"name":"bob","prefixes":["bob"],"token_hashes":["` + hashA + `"],"caps":{"memory_pages":65537}}]}`,
			[]string{`tenant "bob"`, "caps.memory_pages 65537"}},
		{"bad name by index", `{"version":1,"tenants":[{"name":"Bob","prefixes":["bob"],"token_hashes":["` + hashA + `"]}]}`,
			[]string{"tenants[0]", `name "Bob"`, "lower-case letter"}},
		{"empty name", `{"version":1,"tenants":[{"prefixes":["bob"],"token_hashes":["` + hashA + `"]}]}`,
			[]string{"tenants[0]", "name", "empty"}},
		{"name with dot", `{"version":1,"tenants":[{"name":"b.b","prefixes":["bob"],"token_hashes":["` + hashA + `"]}]}`,
			[]string{`name "b.b"`, `contains '.'`}},
		{"duplicate name", `{"version":1,"tenants":[{"name":"bob","prefixes":["bob"],"token_hashes":["` + hashA + `"]},{"name":"bob","prefixes":["bob2"],"token_hashes":["` + hashB + `"]}]}`,
			[]string{`tenant "bob": name is used by two tenants`}},
		{"no prefixes", `{"version":1,"tenants":[{"name":"bob","prefixes":[],"token_hashes":["` + hashA + `"]}]}`,
			[]string{`tenant "bob": prefixes: none`}},
		{"prefix with trailing dot", `{"version":1,"tenants":[{"name":"bob","prefixes":["bob."],"token_hashes":["` + hashA + `"]}]}`,
			[]string{`tenant "bob": prefixes[0]`, "empty part"}},
		{"prefix with pattern", `{"version":1,"tenants":[{"name":"bob","prefixes":["bob.[0:4]"],"token_hashes":["` + hashA + `"]}]}`,
			[]string{`tenant "bob": prefixes[0]`, `contains '['`}},
		{"same prefix twice", `{"version":1,"tenants":[{"name":"alice","prefixes":["x"],"token_hashes":["` + hashA + `"]},{"name":"bob","prefixes":["x"],"token_hashes":["` + hashB + `"]}]}`,
			[]string{`tenant "bob": prefixes[0] "x" is also owned by tenant "alice"`}},
		{"overlapping prefixes", `{"version":1,"tenants":[{"name":"alice","prefixes":["alice"],"token_hashes":["` + hashA + `"]},{"name":"bob","prefixes":["alice.x"],"token_hashes":["` + hashB + `"]}]}`,
			[]string{`tenant "bob": prefix "alice.x" overlaps prefix "alice" of tenant "alice"`}},
		{"overlap deep", `{"version":1,"tenants":[{"name":"alice","prefixes":["a.b"],"token_hashes":["` + hashA + `"]},{"name":"bob","prefixes":["a.b.c.d"],"token_hashes":["` + hashB + `"]}]}`,
			[]string{`prefix "a.b.c.d" overlaps prefix "a.b"`}},
		{"overlap within one tenant", `{"version":1,"tenants":[{"name":"alice","prefixes":["alice","alice.x"],"token_hashes":["` + hashA + `"]}]}`,
			[]string{`tenant "alice": prefix "alice.x" overlaps prefix "alice" of tenant "alice"`}},
		{"no tokens", `{"version":1,"tenants":[{"name":"bob","prefixes":["bob"],"token_hashes":[]}]}`,
			[]string{`tenant "bob": token_hashes: none`}},
		{"bad hash", `{"version":1,"tenants":[{"name":"bob","prefixes":["bob"],"token_hashes":["sha256:AAAA"]}]}`,
			[]string{`tenant "bob": token_hashes[0]: not sha256:<64 lower-case hex digits>`}},
		{"upper-case hash", `{"version":1,"tenants":[{"name":"bob","prefixes":["bob"],"token_hashes":["` + strings.ToUpper(hashA[7:]) + `"]}]}`,
			[]string{`tenant "bob": token_hashes[0]`}},
		{"shared hash", `{"version":1,"tenants":[{"name":"alice","prefixes":["alice"],"token_hashes":["` + hashA + `"]},{"name":"bob","prefixes":["bob"],"token_hashes":["` + hashA + `"]}]}`,
			[]string{`tenant "bob": token_hashes[0] is also a token hash of tenant "alice"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f, err := tenant.Parse([]byte(tt.file))
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if _, err := tenant.Parse(f.Marshal()); err != nil {
					t.Fatalf("Parse(Marshal()): %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse succeeded, want an error containing %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestParseCaps checks that every cap in the file reaches Caps.
func TestParseCaps(t *testing.T) {
	t.Parallel()
	f, err := tenant.Parse([]byte(`{"version":1,"tenants":[{"name":"bob","prefixes":["bob"],"token_hashes":["` + hashA + `"],
		"caps":{"modules":1,"module_bytes":2,"experts":3,"memory_pages":4,"call_timeout":"5s","bytes_per_call":6,"param_bytes":7,"queue_share":8,
		"init_timeout":"9s","uploads":10,"deploys":11}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	bob, ok := f.Tenant("bob")
	if !ok {
		t.Fatal("no tenant bob")
	}
	want := tenant.Caps{Modules: 1, ModuleBytes: 2, Experts: 3, MemoryPages: 4, CallTimeout: 5 * time.Second, BytesPerCall: 6, ParamBytes: 7, QueueShare: 8,
		InitTimeout: 9 * time.Second, Uploads: 10, Deploys: 11}
	if bob.Caps != want {
		t.Errorf("caps %+v, want %+v", bob.Caps, want)
	}
	if got := bob.Caps.String(); got != "modules=1 module_bytes=2 experts=3 memory_pages=4 call_timeout=5s bytes_per_call=6 param_bytes=7 queue_share=8 init_timeout=9s uploads=10 deploys=11" {
		t.Errorf("String() = %q", got)
	}
	g, err := tenant.Parse(f.Marshal())
	if err != nil {
		t.Fatal(err)
	}
	if b2, _ := g.Tenant("bob"); b2.Caps != want || b2.Tokens() != 1 {
		t.Errorf("after a round trip: caps %+v, %d tokens", b2.Caps, b2.Tokens())
	}
}

func TestParseTooLarge(t *testing.T) {
	t.Parallel()
	b := make([]byte, tenant.MaxFileBytes+1)
	if _, err := tenant.Parse(b); err == nil || !strings.Contains(err.Error(), "more than the") {
		t.Fatalf("Parse of %d bytes: %v", len(b), err)
	}
}

// TestFileEdits covers Add, Rotate, SetCaps and Remove, and that a change
// that breaks a rule changes nothing.
func TestFileEdits(t *testing.T) {
	t.Parallel()
	var f tenant.File
	tokA, err := f.Add("alice", []string{"alice"}, tenant.Caps{Experts: 4})
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^moe_[A-Za-z0-9_-]{43}$`).MatchString(tokA) {
		t.Errorf("token %q does not look like moe_ and 43 base64url characters", tokA)
	}
	if strings.Contains(string(f.Marshal()), tokA) || strings.Contains(string(f.Marshal()), tokA[4:]) {
		t.Error("the file holds the token itself")
	}
	before := string(f.Marshal())
	for _, tc := range []struct {
		name     string
		prefixes []string
		caps     tenant.Caps
		want     string
	}{
		{"alice", []string{"other"}, tenant.Caps{}, "already exists"},
		{"bob", []string{"alice.bob"}, tenant.Caps{}, "overlaps"},
		{"bob", nil, tenant.Caps{}, "prefixes: none"},
		{"bob", []string{"bob"}, tenant.Caps{Modules: -1}, "caps.modules -1"},
		{"Bob", []string{"bob"}, tenant.Caps{}, "lower-case"},
	} {
		if _, err := f.Add(tc.name, tc.prefixes, tc.caps); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Add(%q, %q, %+v) = %v, want an error containing %q", tc.name, tc.prefixes, tc.caps, err, tc.want)
		}
	}
	if after := string(f.Marshal()); after != before {
		t.Errorf("failed Adds changed the file:\n%s\nwant\n%s", after, before)
	}
	tokB, err := f.Add("bob", []string{"bob", "shared.bob"}, tenant.Caps{})
	if err != nil {
		t.Fatal(err)
	}
	if tokA == tokB {
		t.Fatal("two tenants got the same token")
	}
	names := []string{}
	for _, tn := range f.Tenants() {
		names = append(names, tn.Name)
	}
	if strings.Join(names, ",") != "alice,bob" {
		t.Errorf("tenants %v, want alice,bob", names)
	}
	if _, err := f.Rotate("bob", true); err != nil {
		t.Fatal(err)
	}
	if b, _ := f.Tenant("bob"); b.Tokens() != 2 {
		t.Errorf("after Rotate(keepOld): %d tokens, want 2", b.Tokens())
	}
	if _, err := f.Rotate("bob", false); err != nil {
		t.Fatal(err)
	}
	if b, _ := f.Tenant("bob"); b.Tokens() != 1 {
		t.Errorf("after Rotate: %d tokens, want 1", b.Tokens())
	}
	if err := f.SetCaps("bob", tenant.Caps{QueueShare: -2}); err == nil {
		t.Error("SetCaps accepted a negative share")
	}
	if err := f.SetCaps("bob", tenant.Caps{QueueShare: 3}); err != nil {
		t.Fatal(err)
	}
	if b, _ := f.Tenant("bob"); b.Caps.QueueShare != 3 {
		t.Errorf("queue share %d after SetCaps, want 3", b.Caps.QueueShare)
	}
	if err := f.Remove("carol"); !errors.Is(err, tenant.ErrUnknownTenant) {
		t.Errorf("Remove(carol) = %v, want ErrUnknownTenant", err)
	}
	if err := f.Remove("alice"); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.Tenant("alice"); ok {
		t.Error("alice is still there after Remove")
	}
	// A copy from Tenant does not alias the file.
	b, _ := f.Tenant("bob")
	b.Prefixes[0] = "alice"
	if b2, _ := f.Tenant("bob"); b2.Prefixes[0] != "bob" {
		t.Error("changing a Tenant's prefixes changed the file")
	}
}

func TestSaveLoad(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "new-dir", "tenants.json")
	if _, err := tenant.Load(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Load of a missing file: %v, want fs.ErrNotExist", err)
	}
	f, err := tenant.LoadOrEmpty(path)
	if err != nil || len(f.Tenants()) != 0 {
		t.Fatalf("LoadOrEmpty of a missing file: %v, %d tenants", err, len(f.Tenants()))
	}
	if _, err := f.Add("alice", []string{"alice"}, tenant.Caps{CallTimeout: 90 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if err := f.Save(path); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("tenants file mode %v, want 0600", st.Mode().Perm())
	}
	g, err := tenant.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(g.Marshal()) != string(f.Marshal()) {
		t.Errorf("loaded\n%s\nsaved\n%s", g.Marshal(), f.Marshal())
	}
	if err := os.WriteFile(path, []byte(`{"version":1,"tenants":[{"name":"x"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := tenant.Load(path); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), `tenant "x"`) {
		t.Errorf("Load of a bad file: %v, want the path and the tenant named", err)
	}
}

// TestOwns checks ownership at dot boundaries, for uids and patterns.
func TestOwns(t *testing.T) {
	t.Parallel()
	tests := []struct {
		prefixes []string
		uid      string
		want     bool
	}{
		{[]string{"alice"}, "alice", true},
		{[]string{"alice"}, "alice.0", true},
		{[]string{"alice"}, "alice.x.y", true},
		{[]string{"alice"}, "alicex", false},
		{[]string{"alice"}, "alicex.0", false},
		{[]string{"alice"}, "alic", false},
		{[]string{"alice"}, "bob.alice", false},
		{[]string{"alice"}, "alice.[0:4]", true},
		{[]string{"alice"}, "alice.[0:4].[2:3]", true},
		{[]string{"alice"}, "[0:4]", false},
		{[]string{"alice.x"}, "alice", false},
		{[]string{"alice.x"}, "alice.x.1", true},
		{[]string{"alice.x"}, "alice.y.1", false},
		{[]string{"alice.0"}, "alice.[0:1]", true},
		{[]string{"alice.0"}, "alice.[0:1].[3:9]", true},
		{[]string{"alice.0"}, "alice.[0:2]", false},
		{[]string{"alice.1"}, "alice.[0:1]", false},
		{[]string{"ffn.3"}, "ffn.[3:4]", true},
		{[]string{"bob", "alice"}, "alice.1", true},
		{[]string{"alice"}, "alice..1", false},
		{[]string{"alice"}, "alice.", false},
		{[]string{"alice"}, "alice.[4:0]", false},
		{[]string{"alice"}, "alice.[a:b]", false},
		{[]string{"alice"}, "", false},
		{nil, "alice", false},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.prefixes, ",")+"/"+tt.uid, func(t *testing.T) {
			t.Parallel()
			if got := tenant.Owns(tt.prefixes, tt.uid); got != tt.want {
				t.Errorf("Owns(%q, %q) = %v, want %v", tt.prefixes, tt.uid, got, tt.want)
			}
		})
	}
}

func TestCaps(t *testing.T) {
	t.Parallel()
	server := tenant.Caps{Modules: 10, CallTimeout: 20 * time.Second}
	c := tenant.Caps{Modules: 2, Experts: 5}.WithDefaults(server)
	want := tenant.DefaultCaps
	want.Modules, want.Experts, want.CallTimeout = 2, 5, 20*time.Second
	if c != want {
		t.Errorf("WithDefaults: %+v, want %+v", c, want)
	}
	if err := c.Admit(tenant.Usage{Modules: 1}, tenant.Usage{Modules: 1}); err != nil {
		t.Errorf("Admit within the cap: %v", err)
	}
	tests := []struct {
		name      string
		used, add tenant.Usage
		cap       string
	}{
		{"modules", tenant.Usage{Modules: 2}, tenant.Usage{Modules: 1}, "modules"},
		{"experts", tenant.Usage{Experts: 3}, tenant.Usage{Experts: 3}, "experts"},
		{"module bytes", tenant.Usage{ModuleBytes: 1 << 30}, tenant.Usage{ModuleBytes: 1}, "module_bytes"},
		{"param bytes overflow", tenant.Usage{ParamBytes: 1}, tenant.Usage{ParamBytes: 1<<63 - 1}, "param_bytes"},
	}
	for _, tt := range tests {
		err := c.Admit(tt.used, tt.add)
		var ce *tenant.CapError
		if !errors.As(err, &ce) || ce.Cap != tt.cap || !errors.Is(err, tenant.ErrCapExceeded) {
			t.Errorf("%s: Admit = %v, want a CapError for %s", tt.name, err, tt.cap)
			continue
		}
		if !strings.Contains(err.Error(), tt.cap+" cap is") {
			t.Errorf("%s: %q does not name the cap", tt.name, err)
		}
	}
	// Over a cap lowered by a reload, adding nothing still passes.
	if err := c.Admit(tenant.Usage{Experts: 100}, tenant.Usage{Modules: 1}); err != nil {
		t.Errorf("Admit of nothing more experts: %v", err)
	}

	if q := c.ModuleQuota(); q.Modules != 2 || q.Bytes != 1<<30 {
		t.Errorf("ModuleQuota: %+v, want 2 modules and 1 GiB", q)
	}
	got := c.Clamp(tenant.Limits{MemoryPages: 1 << 20, CallTimeout: time.Second, BytesPerCall: 0, ParamBytes: 1})
	wantL := tenant.Limits{MemoryPages: 4096, CallTimeout: time.Second, BytesPerCall: 2 << 30, ParamBytes: 1}
	if got != wantL {
		t.Errorf("Clamp: %+v, want %+v", got, wantL)
	}
	if err := c.CheckLimits(tenant.Limits{CallTimeout: time.Minute}); err == nil || !strings.Contains(err.Error(), "call_timeout cap is 20s and this needs 1m0s") {
		t.Errorf("CheckLimits over the timeout: %v", err)
	}
	if err := c.CheckLimits(wantL); err != nil {
		t.Errorf("CheckLimits within caps: %v", err)
	}
}

// TestExampleFile: the example in testdata (also a fuzz seed) is valid.
func TestExampleFile(t *testing.T) {
	t.Parallel()
	f, err := tenant.Load(filepath.Join("testdata", "example.json"))
	if err != nil {
		t.Fatal(err)
	}
	if a, ok := f.Tenant("alice"); !ok || a.Caps.CallTimeout != 30*time.Second || len(a.Prefixes) != 2 {
		t.Errorf("alice: %+v", a)
	}
}

// TestEditConcurrent: edits at once from many goroutines all land (the
// lock serialises their read-modify-write).
func TestEditConcurrent(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "dir", tenant.FileName)
	const n = 8
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			name := fmt.Sprintf("t%d", i)
			if err := tenant.Edit(path, func(f *tenant.File) error {
				_, err := f.Add(name, []string{name}, tenant.Caps{})
				return err
			}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	f, err := tenant.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(f.Tenants()); got != n {
		t.Errorf("%d tenants after %d concurrent adds", got, n)
	}
	// A failing edit saves nothing.
	before, _ := os.ReadFile(path)
	if err := tenant.Edit(path, func(f *tenant.File) error { f.Remove("t0"); return errors.New("no") }); err == nil {
		t.Error("Edit hid fn's error")
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Error("a failed Edit changed the file")
	}
}
