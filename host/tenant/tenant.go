// Package tenant keeps the tenants of a multi-tenant host: who may sign in
// (tokens, stored hashed), which expert uids each one owns (prefixes at
// dot boundaries), and what each may use (caps). It reads and writes the
// tenants file, a small JSON document the operator edits with
// `moehost tenant`, and holds the live set that the server consults and
// reloads on SIGHUP. It knows nothing of modules, experts or RPC; package
// host wires it to them.
//
// The file looks like this (caps are optional; zero or absent means the
// server's default):
//
//	{
//	  "version": 1,
//	  "tenants": [
//	    {
//	      "name": "alice",
//	      "prefixes": ["alice", "shared.alice"],
//	      "token_hashes": ["sha256:<64 hex digits>"],
//	      "caps": {"modules": 8, "module_bytes": 67108864, "call_timeout": "30s", "queue_share": 2}
//	    }
//	  ]
//	}
package tenant

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/moehost/moehost/internal/atomicfile"
)

// FileVersion is the version of the tenants file this package reads and
// writes.
const FileVersion = 1

// MaxFileBytes bounds the tenants file read: far more than thousands of
// tenants need, and small enough that a wrong path (a model, a log) fails
// fast instead of being read whole.
const MaxFileBytes = 8 << 20

// FileName is the tenants file's name in the server's data directory when
// no other path is given.
const FileName = "tenants.json"

// Limits of names and prefixes.
const (
	maxNameLen     = 64
	maxPrefixLen   = 256
	maxPrefixes    = 1024 // per tenant
	maxTokenHashes = 16   // per tenant: the current token and a few being rotated out
	maxMemoryPages = 65536
	maxQueueShare  = 1_000_000
)

// Tenant is one tenant as the file describes it. Its token hashes are
// deliberately unexported: nothing outside this package shows them.
type Tenant struct {
	// Name identifies the tenant: 1–64 of a-z, 0-9, '-' and '_', starting
	// with a letter.
	Name string
	// Prefixes are the uid prefixes the tenant owns, at dot boundaries
	// (see Owns).
	Prefixes []string
	// Caps are the tenant's caps; zero fields take the server's defaults.
	Caps Caps

	hashes []tokenHash
}

// Tokens returns how many tokens can sign in as the tenant.
func (t Tenant) Tokens() int { return len(t.hashes) }

// clone returns a deep copy of t.
func (t Tenant) clone() Tenant {
	t.Prefixes = slices.Clone(t.Prefixes)
	t.hashes = slices.Clone(t.hashes)
	return t
}

// File is the content of a tenants file. Its methods keep it valid: a
// change that would break a rule returns an error and changes nothing.
// The zero File has no tenants. It is not safe for concurrent use; the
// server uses a Set.
type File struct {
	tenants []Tenant // sorted by name
}

// Tenants returns copies of the tenants, sorted by name.
func (f *File) Tenants() []Tenant {
	out := make([]Tenant, len(f.tenants))
	for i, t := range f.tenants {
		out[i] = t.clone()
	}
	return out
}

// Tenant returns a copy of the named tenant.
func (f *File) Tenant(name string) (Tenant, bool) {
	i, ok := f.index(name)
	if !ok {
		return Tenant{}, false
	}
	return f.tenants[i].clone(), true
}

func (f *File) index(name string) (int, bool) {
	return slices.BinarySearchFunc(f.tenants, name, func(t Tenant, n string) int { return strings.Compare(t.Name, n) })
}

// Add adds a tenant owning prefixes, with caps, and returns its token,
// which exists only in the return value: the file keeps its hash.
func (f *File) Add(name string, prefixes []string, caps Caps) (token string, err error) {
	if _, ok := f.index(name); ok {
		return "", fmt.Errorf("tenant %q already exists", name)
	}
	token, h, err := newToken()
	if err != nil {
		return "", err
	}
	next := append(f.Tenants(), Tenant{Name: name, Prefixes: slices.Clone(prefixes), Caps: caps, hashes: []tokenHash{h}})
	if err := f.replace(next); err != nil {
		return "", err
	}
	return token, nil
}

// Remove removes the named tenant; its tokens stop working once the
// server reloads the file.
func (f *File) Remove(name string) error {
	i, ok := f.index(name)
	if !ok {
		return fmt.Errorf("tenant %q: %w", name, ErrUnknownTenant)
	}
	// A new slice, never an edit in place: a File copied by value, or a
	// Set's snapshot, may share the old one.
	f.tenants = slices.Delete(slices.Clone(f.tenants), i, i+1)
	return nil
}

// Rotate gives the named tenant a new token and returns it. With keepOld
// the old tokens keep working too (until the next Rotate without it), so
// that clients can move over; at most a few tokens are kept.
func (f *File) Rotate(name string, keepOld bool) (token string, err error) {
	i, ok := f.index(name)
	if !ok {
		return "", fmt.Errorf("tenant %q: %w", name, ErrUnknownTenant)
	}
	token, h, err := newToken()
	if err != nil {
		return "", err
	}
	next := f.Tenants()
	if keepOld {
		next[i].hashes = append(next[i].hashes, h)
	} else {
		next[i].hashes = []tokenHash{h}
	}
	if err := f.replace(next); err != nil {
		return "", err
	}
	return token, nil
}

// SetCaps replaces the named tenant's caps.
func (f *File) SetCaps(name string, caps Caps) error {
	i, ok := f.index(name)
	if !ok {
		return fmt.Errorf("tenant %q: %w", name, ErrUnknownTenant)
	}
	next := f.Tenants()
	next[i].Caps = caps
	return f.replace(next)
}

// replace validates tenants and, if they pass, makes them f's.
func (f *File) replace(tenants []Tenant) error {
	slices.SortFunc(tenants, func(a, b Tenant) int { return strings.Compare(a.Name, b.Name) })
	if err := validate(tenants); err != nil {
		return err
	}
	f.tenants = tenants
	return nil
}

// The file's JSON form. It is separate from the exported types so that
// the API (time.Duration, unexported hashes) and the format can each stay
// what suits them.
type fileJSON struct {
	Version int          `json:"version"`
	Tenants []tenantJSON `json:"tenants"`
}

type tenantJSON struct {
	Name        string   `json:"name"`
	Prefixes    []string `json:"prefixes"`
	TokenHashes []string `json:"token_hashes"`
	Caps        capsJSON `json:"caps,omitzero"`
}

type capsJSON struct {
	Modules      int64  `json:"modules,omitempty"`
	ModuleBytes  int64  `json:"module_bytes,omitempty"`
	Experts      int64  `json:"experts,omitempty"`
	MemoryPages  int64  `json:"memory_pages,omitempty"`
	CallTimeout  string `json:"call_timeout,omitempty"`
	BytesPerCall int64  `json:"bytes_per_call,omitempty"`
	ParamBytes   int64  `json:"param_bytes,omitempty"`
	QueueShare   int64  `json:"queue_share,omitempty"`
	InitTimeout  string `json:"init_timeout,omitempty"`
	Uploads      int64  `json:"uploads,omitempty"`
	Deploys      int64  `json:"deploys,omitempty"`
}

// Parse decodes and validates a tenants file. Unknown fields are errors
// (a misspelt cap must not silently mean "the default"), and every error
// names the tenant and the field.
func Parse(b []byte) (*File, error) {
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("tenants file is %d bytes, more than the %d allowed", len(b), MaxFileBytes)
	}
	var raw struct {
		Version *int              `json:"version"`
		Tenants []json.RawMessage `json:"tenants"`
	}
	if err := decodeStrict(b, &raw); err != nil {
		return nil, fmt.Errorf("tenants file: %w", err)
	}
	if raw.Version == nil {
		return nil, fmt.Errorf("tenants file: version is missing (want %d)", FileVersion)
	}
	if *raw.Version != FileVersion {
		return nil, fmt.Errorf("tenants file: version %d is not supported (want %d)", *raw.Version, FileVersion)
	}
	tenants := make([]Tenant, 0, len(raw.Tenants))
	for i, rt := range raw.Tenants {
		var tj tenantJSON
		if err := decodeStrict(rt, &tj); err != nil {
			return nil, fmt.Errorf("%s: %w", tenantLabel(i, peekName(rt)), err)
		}
		t, err := tj.tenant()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", tenantLabel(i, tj.Name), err)
		}
		tenants = append(tenants, t)
	}
	f := &File{}
	if err := f.replace(tenants); err != nil {
		return nil, err
	}
	return f, nil
}

// decodeStrict decodes one JSON value into v, refusing unknown fields and
// trailing data, and rewords type errors without Go's type names.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fmt.Errorf("%s: want %s, got a JSON %s", te.Field, jsonKind(te.Type.Kind().String()), te.Value)
		}
		if errors.Is(err, io.EOF) {
			return errors.New("empty input, want a JSON object")
		}
		var se *json.SyntaxError
		if errors.As(err, &se) {
			// An offset is no help in a hand-edited file; an editor
			// jumps to a line and column.
			line, col := lineCol(b, se.Offset)
			return fmt.Errorf("not valid JSON at line %d, column %d: %w", line, col, err)
		}
		return fmt.Errorf("not valid JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("data after the JSON object")
	}
	return nil
}

// lineCol turns a json.SyntaxError's Offset (the bytes read up to and
// including the bad one) into the 1-based line and column of that byte
// in b; columns count bytes.
func lineCol(b []byte, offset int64) (line, col int) {
	i := int(min(max(offset-1, 0), int64(len(b))))
	before := b[:i]
	return 1 + bytes.Count(before, []byte("\n")), i - bytes.LastIndexByte(before, '\n')
}

func jsonKind(goKind string) string {
	switch goKind {
	case "int", "int64", "uint32":
		return "an integer"
	case "string":
		return "a string"
	case "slice":
		return "an array"
	case "struct", "map":
		return "an object"
	}
	return goKind
}

// peekName returns the "name" of a tenant object that failed to decode,
// so that the error can name it; "" if it has none.
func peekName(b []byte) string {
	var n struct {
		Name string `json:"name"`
	}
	_ = json.Unmarshal(b, &n)
	return n.Name
}

func tenantLabel(i int, name string) string {
	if validName(name) == nil {
		return fmt.Sprintf("tenant %q", name)
	}
	return fmt.Sprintf("tenants[%d]", i)
}

func (tj tenantJSON) tenant() (Tenant, error) {
	t := Tenant{Name: tj.Name, Prefixes: tj.Prefixes}
	if len(tj.TokenHashes) > maxTokenHashes {
		return Tenant{}, fmt.Errorf("token_hashes: %d hashes, more than the %d allowed", len(tj.TokenHashes), maxTokenHashes)
	}
	for i, s := range tj.TokenHashes {
		h, err := parseTokenHash(s)
		if err != nil {
			return Tenant{}, fmt.Errorf("token_hashes[%d]: %w", i, err)
		}
		t.hashes = append(t.hashes, h)
	}
	c, err := tj.Caps.caps()
	if err != nil {
		return Tenant{}, err
	}
	t.Caps = c
	return t, nil
}

func (cj capsJSON) caps() (Caps, error) {
	c := Caps{
		Modules: cj.Modules, ModuleBytes: cj.ModuleBytes, Experts: cj.Experts, MemoryPages: cj.MemoryPages,
		BytesPerCall: cj.BytesPerCall, ParamBytes: cj.ParamBytes, QueueShare: cj.QueueShare,
		Uploads: cj.Uploads, Deploys: cj.Deploys,
	}
	for _, f := range []struct {
		name, v string
		dst     *time.Duration
	}{{"call_timeout", cj.CallTimeout, &c.CallTimeout}, {"init_timeout", cj.InitTimeout, &c.InitTimeout}} {
		if f.v == "" {
			continue
		}
		d, err := time.ParseDuration(f.v)
		if err != nil {
			return Caps{}, fmt.Errorf("caps.%s %q: not a duration such as 30s or 2m", f.name, f.v)
		}
		*f.dst = d
	}
	return c, nil
}

func (c Caps) json() capsJSON {
	cj := capsJSON{
		Modules: c.Modules, ModuleBytes: c.ModuleBytes, Experts: c.Experts, MemoryPages: c.MemoryPages,
		BytesPerCall: c.BytesPerCall, ParamBytes: c.ParamBytes, QueueShare: c.QueueShare,
		Uploads: c.Uploads, Deploys: c.Deploys,
	}
	if c.CallTimeout != 0 {
		cj.CallTimeout = c.CallTimeout.String()
	}
	if c.InitTimeout != 0 {
		cj.InitTimeout = c.InitTimeout.String()
	}
	return cj
}

// Marshal encodes f as an indented tenants file that Parse reads back to
// an equal File.
func (f *File) Marshal() []byte {
	fj := fileJSON{Version: FileVersion, Tenants: make([]tenantJSON, len(f.tenants))}
	for i, t := range f.tenants {
		tj := tenantJSON{Name: t.Name, Prefixes: t.Prefixes, TokenHashes: make([]string, len(t.hashes)), Caps: t.Caps.json()}
		if tj.Prefixes == nil {
			tj.Prefixes = []string{}
		}
		for j, h := range t.hashes {
			tj.TokenHashes[j] = h.String()
		}
		fj.Tenants[i] = tj
	}
	b, err := json.MarshalIndent(fj, "", "  ")
	if err != nil {
		panic("BUG: encoding a tenants file: " + err.Error())
	}
	return append(b, '\n')
}

// Load reads and validates the tenants file at path. A missing file is an
// error that matches fs.ErrNotExist.
func Load(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading tenants file: %w", err)
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading tenants file %s: %w", path, err)
	}
	f, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Save writes f to path atomically, readable by its owner only (mode
// 0600), creating the directory (0700) if needed.
func (f *File) Save(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("writing tenants file: %w", err)
	}
	if err := atomicfile.Write(path, f.Marshal()); err != nil {
		return fmt.Errorf("writing tenants file %s: %w", path, err)
	}
	return nil
}

// LoadOrEmpty is Load, except that a missing file gives an empty File:
// what `moehost tenant add` starts from.
func LoadOrEmpty(path string) (*File, error) {
	f, err := Load(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &File{}, nil
	}
	return f, err
}

// validate checks every rule of the file on tenants sorted by name.
func validate(tenants []Tenant) error {
	owner := map[string]string{}     // prefix → tenant
	hashOwner := map[string]string{} // token hash → tenant
	for i, t := range tenants {
		if err := validName(t.Name); err != nil {
			return fmt.Errorf("%s: name %q: %w", tenantLabel(i, t.Name), t.Name, err)
		}
		if i > 0 && tenants[i-1].Name == t.Name {
			return fmt.Errorf("tenant %q: name is used by two tenants", t.Name)
		}
		label := fmt.Sprintf("tenant %q", t.Name)
		if len(t.Prefixes) == 0 {
			return fmt.Errorf("%s: prefixes: none (a tenant must own at least one uid prefix)", label)
		}
		if len(t.Prefixes) > maxPrefixes {
			return fmt.Errorf("%s: prefixes: %d, more than the %d allowed", label, len(t.Prefixes), maxPrefixes)
		}
		for j, p := range t.Prefixes {
			if err := ValidPrefix(p); err != nil {
				return fmt.Errorf("%s: prefixes[%d]: %w", label, j, err)
			}
			if o, ok := owner[p]; ok {
				return fmt.Errorf("%s: prefixes[%d] %q is also owned by tenant %q", label, j, p, o)
			}
			owner[p] = t.Name
		}
		if len(t.hashes) == 0 {
			return fmt.Errorf("%s: token_hashes: none (the tenant could never sign in; remove it instead)", label)
		}
		for j, h := range t.hashes {
			if o, ok := hashOwner[string(h[:])]; ok {
				return fmt.Errorf("%s: token_hashes[%d] is also a token hash of tenant %q", label, j, o)
			}
			hashOwner[string(h[:])] = t.Name
		}
		if err := t.Caps.validate(); err != nil {
			return fmt.Errorf("%s: %w", label, err)
		}
	}
	// A prefix overlaps another when one is an ancestor of the other at a
	// dot boundary ("alice" and "alice.x"); exact duplicates were caught
	// above.
	for p, o := range owner {
		for i := len(p) - 1; i > 0; i-- {
			if p[i] != '.' {
				continue
			}
			if o2, ok := owner[p[:i]]; ok {
				return fmt.Errorf("tenant %q: prefix %q overlaps prefix %q of tenant %q", o, p, p[:i], o2)
			}
		}
	}
	return nil
}

func validName(name string) error {
	if name == "" {
		return errors.New("empty")
	}
	if len(name) > maxNameLen {
		return fmt.Errorf("longer than %d bytes", maxNameLen)
	}
	if name[0] < 'a' || name[0] > 'z' {
		return errors.New("must start with a lower-case letter")
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("contains %q; use a-z, 0-9, '-' and '_'", c)
		}
	}
	return nil
}

// ValidPrefix checks that p can be owned: dot-separated parts, each
// non-empty and made of A-Z, a-z, 0-9, '-' and '_' (no pattern syntax).
func ValidPrefix(p string) error {
	if p == "" {
		return errors.New("prefix is empty")
	}
	if len(p) > maxPrefixLen {
		return fmt.Errorf("prefix is longer than %d bytes", maxPrefixLen)
	}
	for part := range strings.SplitSeq(p, ".") {
		if part == "" {
			return fmt.Errorf("prefix %q has an empty part (a leading, trailing or doubled dot)", p)
		}
		for _, c := range []byte(part) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("prefix %q contains %q; use A-Z, a-z, 0-9, '-', '_' and '.' between parts", p, c)
			}
		}
	}
	return nil
}
