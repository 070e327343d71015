package tenant

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// Option configures a Set.
type Option interface {
	apply(*setConfig)
}

type optionFunc func(*setConfig)

func (f optionFunc) apply(c *setConfig) { f(c) }

type setConfig struct {
	operatorUIDs, operatorPrefixes []string
	onReload                       func()
}

// WithOperatorUIDs marks uids as the operator's (the experts given on the
// command line): MayDeploy refuses any tenant a uid or pattern that could
// name one of them, even inside the tenant's own prefixes.
func WithOperatorUIDs(uids ...string) Option {
	return optionFunc(func(c *setConfig) { c.operatorUIDs = append(c.operatorUIDs, uids...) })
}

// WithOperatorPrefixes reserves whole prefixes for the operator, as
// WithOperatorUIDs does single uids.
func WithOperatorPrefixes(prefixes ...string) Option {
	return optionFunc(func(c *setConfig) { c.operatorPrefixes = append(c.operatorPrefixes, prefixes...) })
}

// WithReloadHook calls fn after each successful Reload, once the new
// tenants are in place (for example to update the scheduler's shares).
func WithReloadHook(fn func()) Option {
	return optionFunc(func(c *setConfig) { c.onReload = fn })
}

// Set is the live set of tenants that a server consults: safe for
// concurrent use, reloaded from its file without a restart. Lookups see
// either the old tenants or the new ones, never a mix.
type Set struct {
	path     string
	operator operator
	onReload func()

	mu  sync.Mutex // serialises Reload
	cur atomic.Pointer[snapshot]
}

type snapshot struct {
	file    *File
	entries []entry // every token hash, for Authenticate
}

type entry struct {
	hash tokenHash
	name string
}

func newSnapshot(f *File) *snapshot {
	s := &snapshot{file: f}
	for _, t := range f.tenants {
		for _, h := range t.hashes {
			s.entries = append(s.entries, entry{h, t.Name})
		}
	}
	return s
}

// Open loads the tenants file at path (which must exist) into a Set.
func Open(path string, opts ...Option) (*Set, error) {
	var c setConfig
	for _, o := range opts {
		o.apply(&c)
	}
	op, err := newOperator(c.operatorUIDs, c.operatorPrefixes)
	if err != nil {
		return nil, err
	}
	f, err := Load(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w (create it with: moehost tenant add NAME --prefix PREFIX --tenants %s)", err, path)
	}
	if err != nil {
		return nil, err
	}
	s := &Set{path: path, operator: op, onReload: c.onReload}
	s.cur.Store(newSnapshot(f))
	return s, nil
}

// Path returns the tenants file the Set reloads from.
func (s *Set) Path() string { return s.path }

// Reload reads the file again and, if it is valid, swaps it in at once:
// removed tenants and tokens stop working for every later call. If it is
// not valid, the Set keeps its tenants and Reload returns the error.
func (s *Set) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, err := Load(s.path)
	if err != nil {
		return err
	}
	s.cur.Store(newSnapshot(f))
	if s.onReload != nil {
		s.onReload()
	}
	return nil
}

// Authenticate returns the tenant whose token this is. It hashes token
// once and compares the hash with every stored hash in constant time,
// without stopping at a match, so its timing says nothing about which
// tenant, if any, a wrong token resembles.
func (s *Set) Authenticate(token string) (name string, ok bool) {
	if !wellFormed(token) {
		return "", false
	}
	h := hashToken(token)
	entries := s.cur.Load().entries
	for i := range entries {
		if constantTimeEqual(&h, &entries[i].hash) {
			name, ok = entries[i].name, true
		}
	}
	return name, ok
}

// Tenant returns a copy of the named tenant.
func (s *Set) Tenant(name string) (Tenant, bool) { return s.cur.Load().file.Tenant(name) }

// Tenants returns copies of all tenants, sorted by name.
func (s *Set) Tenants() []Tenant { return s.cur.Load().file.Tenants() }

// Caps returns the caps that apply to the named tenant: its own, with
// zero fields from serverDefaults and then DefaultCaps.
func (s *Set) Caps(name string, serverDefaults Caps) (Caps, bool) {
	t, ok := s.Tenant(name)
	if !ok {
		return Caps{}, false
	}
	return t.Caps.WithDefaults(serverDefaults), true
}

// Owns reports whether the named tenant owns uidOrPattern (see the
// function Owns). It says nothing of the operator's uids: use MayDeploy
// before deploying.
func (s *Set) Owns(name, uidOrPattern string) bool {
	t, ok := s.Tenant(name)
	return ok && t.Owns(uidOrPattern)
}

// MayDeploy returns nil if the named tenant may deploy experts as
// uidOrPattern: it owns every uid the pattern stands for, and none of
// them is the operator's. Otherwise it returns an error wrapping
// ErrUnknownTenant, ErrInvalidPattern, ErrNotOwner or ErrOperatorOwned.
func (s *Set) MayDeploy(name, uidOrPattern string) error {
	t, ok := s.Tenant(name)
	if !ok {
		return fmt.Errorf("tenant %q: %w", name, ErrUnknownTenant)
	}
	pat, err := parsePattern(uidOrPattern)
	if err != nil {
		return err
	}
	if !ownsParsed(t.Prefixes, pat) {
		return &wrapped{fmt.Sprintf("%q is outside tenant %q's prefixes (%s)", uidOrPattern, name, strings.Join(t.Prefixes, ", ")), ErrNotOwner}
	}
	if u := s.operator.clash(pat); u != "" {
		return &wrapped{fmt.Sprintf("%q overlaps %q, which the operator reserved", uidOrPattern, u), ErrOperatorOwned}
	}
	return nil
}

// WatchSIGHUP reloads the Set on every SIGHUP until ctx ends or stop is
// called, logging each outcome; a bad file is logged and the old tenants
// stay. The handler is installed before WatchSIGHUP returns, so a SIGHUP
// sent after it never kills the process. stop waits for the watcher to
// exit and restores SIGHUP's previous handling.
//
// A server wires it in one line:
//
//	defer tenants.WatchSIGHUP(ctx, logger)()
func (s *Set) WatchSIGHUP(ctx context.Context, logger *slog.Logger) (stop func()) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-ch:
				if err := s.Reload(); err != nil {
					logger.Error("tenants file not reloaded; keeping the previous tenants", "path", s.path, "err", err)
					continue
				}
				logger.Info("tenants reloaded", "path", s.path, "tenants", len(s.cur.Load().file.tenants))
			}
		}
	}()
	return func() {
		cancel()
		<-done
		signal.Stop(ch)
	}
}
