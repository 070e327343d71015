package host

import (
	"fmt"
	"net/url"
	"strings"
)

// WithCORSOrigins lets browser pages on the given origins call the
// server's procedures (Connect, gRPC-Web and gRPC), e.g.
// "https://dash.example.org" or "http://localhost:5173"; "*" allows any
// origin. Each argument may hold several origins separated by commas.
// Default none: only pages the server itself serves (the /ui/ dashboard)
// may call it from a browser.
func WithCORSOrigins(origins ...string) Option {
	return optionFunc(func(c *config) {
		for _, o := range origins {
			for _, p := range strings.Split(o, ",") {
				if p = strings.TrimSpace(p); p != "" {
					c.corsOrigins = append(c.corsOrigins, p)
				}
			}
		}
	})
}

// validateCORSOrigins checks that each origin is "*" or a scheme and host
// with an optional port and no path, as browsers send them; one "*" may
// stand for a subdomain ("https://*.example.org").
func validateCORSOrigins(origins []string) error {
	for _, o := range origins {
		if o == "*" {
			continue
		}
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
			(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return fmt.Errorf("CORS origin %q is not \"*\" or scheme://host[:port]", o)
		}
		if strings.Count(o, "*") > 1 {
			return fmt.Errorf("CORS origin %q has more than one \"*\"", o)
		}
	}
	return nil
}
