// Package ui serves moehost's web dashboard: a page that lists the hosted
// experts, charts their load, runs Forward on random input and describes
// the server and its DHT node, all over Connect from the browser.
//
// The page is built with Vite from web/ (TypeScript, `make ui`) into
// dist/, which is committed and embedded, so that a server builds and
// serves it with Go alone; `make checkui` fails when dist/ is stale.
package ui

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

// dist is the built dashboard. Rebuild it with `make ui`.
//
//go:embed all:dist
var dist embed.FS

// Handler serves the dashboard under /ui/. Vite names the assets it
// builds by their content hash, so they may be cached for good; index.html
// must be revalidated so that a new build is picked up.
func Handler() http.Handler {
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
		files.ServeHTTP(w, r)
	})
}
