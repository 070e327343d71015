package modules

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// indexVersion is the index file's format version.
const indexVersion = 1

type tenantModule struct {
	tenant string
	Module
}

type indexJSON struct {
	Version int         `json:"version"`
	Modules []indexItem `json:"modules"`
}

type indexItem struct {
	Tenant   string    `json:"tenant"`
	Digest   string    `json:"digest"`
	Name     string    `json:"name,omitempty"`
	Size     int64     `json:"size"`
	Uploaded time.Time `json:"uploaded"`
}

func encodeIndex(mods []tenantModule) ([]byte, error) {
	ix := indexJSON{Version: indexVersion, Modules: make([]indexItem, 0, len(mods))}
	for _, m := range mods {
		ix.Modules = append(ix.Modules, indexItem{m.tenant, m.Digest, m.Name, m.Size, m.Uploaded})
	}
	b, err := json.MarshalIndent(ix, "", "\t")
	if err != nil {
		return nil, fmt.Errorf("encoding module index: %w", err)
	}
	return append(b, '\n'), nil
}

// decodeIndex parses an index file, refusing anything it would not write:
// another version, unknown fields, a malformed digest, a negative size or
// a tenant listed twice for one digest.
func decodeIndex(b []byte) ([]tenantModule, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var ix indexJSON
	if err := dec.Decode(&ix); err != nil {
		return nil, fmt.Errorf("decoding: %w", err)
	}
	if dec.More() {
		return nil, errors.New("decoding: trailing data")
	}
	if ix.Version != indexVersion {
		return nil, fmt.Errorf("version %d, want %d", ix.Version, indexVersion)
	}
	seen := make(map[refKey]bool, len(ix.Modules))
	out := make([]tenantModule, 0, len(ix.Modules))
	for i, it := range ix.Modules {
		if _, err := ParseDigest(it.Digest); err != nil {
			return nil, fmt.Errorf("module %d: %w", i, err)
		}
		if it.Size < 0 {
			return nil, fmt.Errorf("module %d: negative size %d", i, it.Size)
		}
		k := refKey{it.Tenant, it.Digest}
		if seen[k] {
			return nil, fmt.Errorf("module %d: tenant %q holds %s twice", i, it.Tenant, it.Digest)
		}
		seen[k] = true
		out = append(out, tenantModule{it.Tenant, Module{it.Digest, it.Name, it.Size, it.Uploaded}})
	}
	return out, nil
}
