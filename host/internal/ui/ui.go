// Package ui serves moehost's web dashboard: a page that lists the hosted
// experts, charts their load, runs Forward on random input and describes
// the server, its DHT node and the swarm, over Connect from the browser,
// plus read-only JSON paths (API) for what Connect has no call for: the
// load history the charts draw at once, the experts' rates and last
// checkpoints, the swarm view, and the tenants and their modules.
//
// The page is built with Vite from web/ (TypeScript, `make ui`) into
// dist/, which is committed and embedded, so that a server builds and
// serves it with Go alone; `make checkui` fails when dist/ is stale.
package ui

import (
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
)

// dist is the built dashboard. Rebuild it with `make ui`.
//
//go:embed all:dist
var dist embed.FS

// API is what the page reads from the server beside its Connect services:
// read-only JSON under /ui/api/. History and Swarm tell no more than
// ListExperts and the DHT already tell anyone; Experts and Tenants answer
// by the request's bearer token, as the Connect services do, and an error
// they return is the token's fault, answered 401 with its message. A nil
// field's path answers 404.
type API struct {
	// History is the server's recent load, served at /ui/api/history.
	History *History
	// Experts returns the rates and last checkpoints of the experts that
	// the request's caller (its Authorization header, h) may see, as
	// ListExperts would list them to it, served at /ui/api/experts.
	Experts func(h http.Header) (Experts, error)
	// Swarm returns what the server's DHT node knows of the swarm,
	// served at /ui/api/swarm. It must be cheap and bounded: each page
	// asks every few seconds.
	Swarm func() Swarm
	// Tenants returns the tenants and modules that the request's caller
	// may see, served at /ui/api/tenants; nil when the server has no
	// tenants.
	Tenants func(h http.Header) (Tenants, error)
}

// Handler serves the dashboard under /ui/, and api under /ui/api/. Vite
// names the assets it builds by their content hash, so they may be cached
// for good; index.html must be revalidated so that a new build is picked
// up.
func Handler(api API) http.Handler {
	sub, err := fs.Sub(dist, "dist")
	if err != nil {
		panic("BUG: ui: " + err.Error())
	}
	files := http.StripPrefix("/ui/", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if strings.HasPrefix(r.URL.Path, "/ui/assets/") {
			w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
		} else {
			w.Header().Set("Cache-Control", "no-cache")
		}
		w.Header().Set("X-Content-Type-Options", "nosniff")
		switch {
		case r.URL.Path == "/ui/api/history" && api.History != nil:
			serveHistory(w, r, api.History)
		case r.URL.Path == "/ui/api/experts" && api.Experts != nil:
			serveAuthed(w, r, api.Experts)
		case r.URL.Path == "/ui/api/swarm" && api.Swarm != nil:
			serveSwarm(w, api.Swarm)
		case r.URL.Path == "/ui/api/tenants" && api.Tenants != nil:
			serveAuthed(w, r, api.Tenants)
		case strings.HasPrefix(r.URL.Path, "/ui/api/"):
			http.NotFound(w, r)
		default:
			files.ServeHTTP(w, r)
		}
	})
}

// historyJSON is /ui/api/history's body: the samples column by column,
// oldest first, so that a full ring is a few tens of kilobytes.
type historyJSON struct {
	IntervalMs     int64     `json:"interval_ms"`
	Capacity       int       `json:"capacity"`
	UnixMs         []int64   `json:"unix_ms"`
	RowsPerSecond  []float32 `json:"rows_per_second"`
	MeanBatch      []float32 `json:"mean_batch"`
	QueueDepth     []float32 `json:"queue_depth"`
	QueueWaitMaxMs []float32 `json:"queue_wait_max_ms"`
	RunMeanMs      []float32 `json:"run_mean_ms"`
}

// serveHistory answers the samples after ?since= (Unix milliseconds; all
// held ones without it), so that a page loads the whole history once and
// then polls for what is new.
func serveHistory(w http.ResponseWriter, r *http.Request, h *History) {
	var since int64
	if v := r.URL.Query().Get("since"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			http.Error(w, "since: want Unix milliseconds, an integer; got "+strconv.Quote(v), http.StatusBadRequest)
			return
		}
		since = n
	}
	samples := h.Since(since, make([]Sample, 0, h.Cap()))
	out := historyJSON{
		IntervalMs:     h.Interval().Milliseconds(),
		Capacity:       h.Cap(),
		UnixMs:         make([]int64, len(samples)),
		RowsPerSecond:  make([]float32, len(samples)),
		MeanBatch:      make([]float32, len(samples)),
		QueueDepth:     make([]float32, len(samples)),
		QueueWaitMaxMs: make([]float32, len(samples)),
		RunMeanMs:      make([]float32, len(samples)),
	}
	for i, s := range samples {
		out.UnixMs[i], out.RowsPerSecond[i], out.MeanBatch[i] = s.UnixMs, s.RowsPerSecond, s.MeanBatch
		out.QueueDepth[i], out.QueueWaitMaxMs[i], out.RunMeanMs[i] = s.QueueDepth, s.QueueWaitMaxMs, s.RunMeanMs
	}
	writeJSON(w, out)
}

// Experts is /ui/api/experts's body: what the experts table shows beside
// ListExperts.
type Experts struct {
	// RateWindowMs is the span that each expert's RowsPerSecond covers.
	RateWindowMs int64 `json:"rate_window_ms"`
	// Experts are in uid order.
	Experts []Expert `json:"experts"`
}

// Expert is one expert's line of Experts.
type Expert struct {
	UID string `json:"uid"`
	// RowsPerSecond is its mean over the rate window (History.Rates):
	// the page's total throughput is the sum of these.
	RowsPerSecond float32 `json:"rows_per_second"`
	// Checkpoint is the checkpoint of its state that the server last
	// wrote or restored; nil when there is none.
	Checkpoint *Checkpoint `json:"checkpoint"`
}

// Checkpoint names one stored checkpoint of an expert.
type Checkpoint struct {
	Step   int64 `json:"step"`
	UnixMs int64 `json:"unix_ms"` // when it was written
}

// Tenants is /ui/api/tenants's body. It never holds a token or a token's
// hash.
type Tenants struct {
	// Tenants are in name order.
	Tenants []Tenant `json:"tenants"`
	// Modules are by owner, then oldest upload first.
	Modules []Module `json:"modules"`
}

// Tenant is one tenant of the tenants file.
type Tenant struct {
	Name     string   `json:"name"`
	Prefixes []string `json:"prefixes"`
	// Tokens is how many tokens sign in as the tenant.
	Tokens  int      `json:"tokens"`
	Modules int      `json:"modules"`
	Experts []string `json:"experts"`
}

// Module is one module in the server's store, as one owner holds it.
type Module struct {
	// Owner is the tenant that uploaded it; "" for the operator.
	Owner          string   `json:"owner"`
	Digest         string   `json:"digest"`
	Name           string   `json:"name"`
	SizeBytes      int64    `json:"size_bytes"`
	UploadedUnixMs int64    `json:"uploaded_unix_ms"`
	Experts        []string `json:"experts"`
}

// serveAuthed answers get's view for the request's Authorization header,
// or 401 with get's error.
func serveAuthed[T any](w http.ResponseWriter, r *http.Request, get func(http.Header) (T, error)) {
	v, err := get(r.Header)
	if err != nil {
		w.Header().Set("WWW-Authenticate", "Bearer")
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	writeJSON(w, v)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		// The client went away; nothing to tell it.
		return
	}
}
