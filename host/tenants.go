package host

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/moehost/moehost/host/internal/rpc"
	"github.com/moehost/moehost/host/internal/sandbox"
	"github.com/moehost/moehost/host/tenant"
	"github.com/moehost/moehost/modules"
)

// WithTenants serves ModuleService to the tenants of the tenants file at
// path (see package tenant and `moehost tenant`): each uploads modules
// and deploys experts under its own uid prefixes, within its caps, and
// sees only its own. The server rereads the file on SIGHUP. The admin
// token (WithAdminToken), when set, acts as the operator. Without
// WithTenants no ModuleService is served: the host runs the configured
// experts only.
func WithTenants(path string) Option {
	return optionFunc(func(c *config) { c.tenantsFile = path })
}

// WithMaxUploadBytes caps one module upload. Default
// rpc.DefaultMaxUploadBytes (64 MiB).
func WithMaxUploadBytes(n int64) Option {
	return optionFunc(func(c *config) { c.maxUploadBytes = n })
}

// WithPublicBackward lets anyone call Backward on the experts given with
// WithExperts when the server has tenants (WithTenants). By default they
// are then owner-only for training, as a tenant's experts are: Backward
// changes their parameters, and only the admin token is their owner;
// Start warns when there is none (WithAdminToken), since then nobody can
// train them. Without tenants the configured experts stay public, as in
// hivemind.
func WithPublicBackward(public bool) Option {
	return optionFunc(func(c *config) { c.publicBackward = public })
}

// operatorBackward returns ec with its Backward access resolved for a
// configured expert: owner-only under tenants unless WithPublicBackward.
func (s *Server) operatorBackward(ec ExpertConfig) ExpertConfig {
	if ec.BackwardAccess == 0 && s.cfg.tenantsFile != "" && !s.cfg.publicBackward {
		ec.BackwardAccess = AccessOwner
	}
	return ec
}

// The defaults of WithUploadTimeouts.
const (
	DefaultUploadIdleTimeout = rpc.DefaultUploadIdleTimeout
	DefaultUploadTimeout     = rpc.DefaultUploadTimeout
)

// WithUploadTimeouts bounds each module upload: it is cut (with
// DeadlineExceeded) when it sends nothing for idle, or is not complete
// after total, so that a client trickling bytes cannot hold a stream
// and its file descriptor. Zero takes the defaults,
// DefaultUploadIdleTimeout and DefaultUploadTimeout.
func WithUploadTimeouts(idle, total time.Duration) Option {
	return optionFunc(func(c *config) { c.uploadIdle, c.uploadTimeout = idle, total })
}

// uploadLimits are WithMaxUploadBytes and WithUploadTimeouts, for
// rpc, which applies the defaults.
func (s *Server) uploadLimits() rpc.UploadLimits {
	return rpc.UploadLimits{MaxBytes: s.maxUploadBytes(), IdleTimeout: s.cfg.uploadIdle, Timeout: s.cfg.uploadTimeout, MinRate: s.cfg.minBodyRate}
}

// bodyLimits are WithBodyTimeouts, for rpc, which applies the defaults.
func (s *Server) bodyLimits() rpc.BodyLimits {
	return rpc.BodyLimits{IdleTimeout: s.cfg.bodyIdle, Timeout: s.cfg.bodyTimeout, MinRate: s.cfg.minBodyRate, Metrics: s.rpcMetrics}
}

// openTenants opens the tenants file, with the configured experts' uids
// reserved for the operator, and starts watching SIGHUP.
func (s *Server) openTenants(ctx context.Context) error {
	if s.cfg.tenantsFile == "" {
		return nil
	}
	uids := make([]string, len(s.cfg.experts))
	for i, ec := range s.cfg.experts {
		uids[i] = ec.UID
	}
	set, err := tenant.Open(s.cfg.tenantsFile, tenant.WithOperatorUIDs(uids...),
		tenant.WithReloadHook(func() { go s.undeployRemoved(context.WithoutCancel(ctx)) }))
	if err != nil {
		return err
	}
	stop := set.WatchSIGHUP(context.WithoutCancel(ctx), s.log)
	s.mu.Lock()
	s.tenants, s.stopTenants = set, stop
	s.mu.Unlock()
	s.warnUntrainable()
	return nil
}

// warnUntrainable warns, under tenants, when some configured experts are
// owner-only for Backward (the default without WithPublicBackward) and
// no admin token is set: then nobody can train them.
func (s *Server) warnUntrainable() {
	if s.cfg.adminToken != "" {
		return
	}
	n := 0
	for _, ec := range s.cfg.experts {
		if s.operatorBackward(ec).BackwardAccess == AccessOwner {
			n++
		}
	}
	if n > 0 {
		s.log.Warn("nobody can train the operator's experts: with --tenants their Backward takes the admin token, and none is set",
			"fix", "--admin-token, or --public-backward to let anyone train them", "experts", n)
	}
}

// undeployRemoved undeploys the experts of tenants that a reload
// removed, each after its running batch: nobody else's token could
// undeploy them, and nobody would answer for them. Their modules and
// checkpoints stay on disk, should the tenant come back.
func (s *Server) undeployRemoved(ctx context.Context) {
	s.mu.Lock()
	set := s.tenants
	s.mu.Unlock()
	if set == nil {
		return
	}
	for _, e := range s.experts.All() {
		if e.Owner() == "" || e.Owner() == modules.Operator {
			continue
		}
		if _, ok := set.Tenant(e.Owner()); ok {
			continue
		}
		err := s.Undeploy(ctx, e.UID())
		if errors.Is(err, ErrUnknownExpert) {
			continue // undeployed meanwhile
		}
		if err != nil {
			s.log.Error("undeploying a removed tenant's expert", "uid", e.UID(), "owner", e.Owner(), "err", err)
			continue
		}
		s.log.Info("undeployed the expert of a removed tenant", "uid", e.UID(), "owner", e.Owner())
	}
}

// hasTenant reports whether the tenants file has name; every owner may
// restore its deployments on a server without tenants.
func (s *Server) hasTenant(name string) bool {
	s.mu.Lock()
	set := s.tenants
	s.mu.Unlock()
	if set == nil {
		return true
	}
	_, ok := set.Tenant(name)
	return ok
}

// closeTenants stops watching SIGHUP.
func (s *Server) closeTenants() {
	s.mu.Lock()
	stop := s.stopTenants
	s.stopTenants = nil
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// serverCaps are the caps a tenant gets where the tenants file leaves
// them zero: the server's own guest limits.
func (s *Server) serverCaps() tenant.Caps {
	l := s.cfg.limits.WithDefaults()
	return tenant.Caps{
		MemoryPages: int64(l.MemoryPages), CallTimeout: l.CallTimeout,
		BytesPerCall: l.BytesPerCall, ParamBytes: l.ParamBytes, InitTimeout: l.InitTimeout,
	}
}

// caps returns the caps that apply to tenant name.
func (s *Server) caps(name string) (tenant.Caps, error) {
	if s.tenants == nil {
		return tenant.Caps{}, fmt.Errorf("%w: tenant %q", ErrNoTenants, name)
	}
	c, ok := s.tenants.Caps(name, s.serverCaps())
	if !ok {
		// Removed from the file since the token was checked.
		return tenant.Caps{}, fmt.Errorf("%w: %q is gone", tenant.ErrUnknownTenant, name)
	}
	return c, nil
}

// guestLimits returns the limits of owner's runtimes: the server's for
// the operator, and a tenant's caps (never above the server's) for a
// tenant.
func (s *Server) guestLimits(owner string) sandbox.Limits {
	l := s.cfg.limits.WithDefaults()
	if owner == modules.Operator || s.tenants == nil {
		return l
	}
	// A tenant's init runs at nice 19, its timeout counting CPU time
	// (sandbox.Limits.LowPriorityInit).
	l.LowPriorityInit = true
	c, ok := s.tenants.Caps(owner, s.serverCaps())
	if !ok {
		return l
	}
	if c.MemoryPages > 0 && c.MemoryPages < int64(l.MemoryPages) {
		l.MemoryPages = uint32(c.MemoryPages)
	}
	if c.CallTimeout > 0 && c.CallTimeout < l.CallTimeout {
		l.CallTimeout = c.CallTimeout
	}
	if c.InitTimeout > 0 && c.InitTimeout < l.InitTimeout {
		l.InitTimeout = c.InitTimeout
	}
	if c.BytesPerCall > 0 && c.BytesPerCall < l.BytesPerCall {
		l.BytesPerCall = c.BytesPerCall
	}
	if c.ParamBytes > 0 && c.ParamBytes < l.ParamBytes {
		l.ParamBytes = c.ParamBytes
	}
	return l
}

// queueShare is owner's weight on the device worker: its caps' queue
// share.
func (s *Server) queueShare(owner string) float64 {
	if s.tenants == nil {
		return 1
	}
	if c, ok := s.tenants.Caps(owner, s.serverCaps()); ok && c.QueueShare > 0 {
		return float64(c.QueueShare)
	}
	return 1
}

// authenticator is the server as rpc.Authenticator: the admin token is
// the operator, a tenant's token is that tenant.
type authenticator struct{ *Server }

func (a authenticator) Authenticate(token string) (rpc.Caller, bool) {
	if admin := a.cfg.adminToken; admin != "" && subtle.ConstantTimeCompare([]byte(token), []byte(admin)) == 1 {
		return rpc.Caller{Operator: true}, true
	}
	if a.tenants == nil {
		return rpc.Caller{}, false
	}
	name, ok := a.tenants.Authenticate(token)
	return rpc.Caller{Tenant: name}, ok
}

// moduleAPI is the server as rpc.Modules.
type moduleAPI struct{ *Server }

// owner is the module store's and the experts' name for c.
func owner(c rpc.Caller) string {
	if c.Operator {
		return modules.Operator
	}
	return c.Tenant
}

// inflight counts what each tenant has in flight, for the caps that
// bound concurrency (uploads, deploys).
type inflight struct {
	mu     sync.Mutex
	counts map[string]int64 // by kind and tenant
}

// enter takes one of tenant's limit slots of kind ("uploads",
// "deploys"), or returns an error wrapping a *tenant.CapError when all
// are taken; leave gives it back.
func (f *inflight) enter(kind, tenantName string, limit int64) (leave func(), err error) {
	return f.take(kind+"\x00"+tenantName, limit, func(n int64) error {
		return fmt.Errorf("%w in flight; wait for one to finish", &tenant.CapError{Cap: kind, Limit: limit, Want: n + 1})
	})
}

// enterServer takes one of the server's slots of kind, whoever asks, or
// returns a ResourceExhausted that names flag, the limit's.
func (f *inflight) enterServer(kind, flag string, limit int64) (leave func(), err error) {
	return f.take(kind, limit, func(int64) error {
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("the server has %d %s in flight, the most it takes (%s); wait for one to finish", limit, kind, flag))
	})
}

// take counts one more under key, or returns full's error at limit.
func (f *inflight) take(key string, limit int64, full func(n int64) error) (leave func(), err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.counts == nil {
		f.counts = map[string]int64{}
	}
	if n := f.counts[key]; n >= limit {
		return nil, full(n)
	}
	f.counts[key]++
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.counts[key]--; f.counts[key] <= 0 {
			delete(f.counts, key)
		}
	}, nil
}

// BeginUpload counts an upload stream from its headers: against the
// tenant's cap on uploads in flight and the server's (the operator's
// count there too), so that streams that trickle their first message
// hold no more than the caps allow.
func (m moduleAPI) BeginUpload(ctx context.Context, c rpc.Caller) (func(), error) {
	s := m.Server
	all, err := s.inflight.enterServer("module uploads", "--max-uploads", s.maxUploadsInFlight())
	if err != nil {
		return nil, err
	}
	if c.Operator {
		return all, nil
	}
	caps, err := s.caps(c.Tenant)
	if err != nil {
		all()
		return nil, err
	}
	mine, err := s.inflight.enter("uploads", c.Tenant, caps.Uploads)
	if err != nil {
		all()
		return nil, err
	}
	return func() { mine(); all() }, nil
}

func (m moduleAPI) Upload(ctx context.Context, c rpc.Caller, u rpc.ModuleUpload) (rpc.ModuleInfo, error) {
	s := m.Server
	store, err := s.experts.LiveStore()
	if err != nil {
		return rpc.ModuleInfo{}, err
	}
	var q modules.Quota
	if !c.Operator {
		caps, err := s.caps(c.Tenant)
		if err != nil {
			return rpc.ModuleInfo{}, err
		}
		q = caps.ModuleQuota()
	}
	st, err := store.Stage(owner(c), u.Name, u.Body, s.maxUploadBytes(), q)
	if err != nil {
		// The store's sentinels and the body's own *connect.Errors keep
		// their codes; a full disk is ResourceExhausted, other I/O
		// errors Internal.
		return rpc.ModuleInfo{}, fmt.Errorf("uploading: %w", err)
	}
	defer func() {
		// After Commit it does nothing; a temp file it fails to remove
		// goes when the store next opens.
		if err := st.Abort(); err != nil {
			s.log.Warn("dropping a staged upload", "owner", owner(c), "err", err)
		}
	}()
	if !st.Had() {
		// A new module is validated (and compiled, warming the cache)
		// while staged: nobody sees it, nor may deploy it, before the
		// sandbox accepts it, and a refused one leaves nothing.
		wasm, err := st.Bytes()
		if err != nil {
			return rpc.ModuleInfo{}, fmt.Errorf("uploading: %w", err)
		}
		if err := s.experts.ValidateModule(ctx, owner(c), wasm, st.Digest()); err != nil {
			return rpc.ModuleInfo{}, err
		}
	}
	mod, err := st.Commit()
	if err != nil {
		return rpc.ModuleInfo{}, fmt.Errorf("uploading: %w", err)
	}
	return m.info(owner(c), mod), nil
}

// info describes one of owner's modules, with the experts that run it.
func (m moduleAPI) info(owner string, mod modules.Module) rpc.ModuleInfo {
	var uids []string
	for _, e := range m.experts.OwnedBy(owner) {
		if e.Digest() == mod.Digest {
			uids = append(uids, e.UID())
		}
	}
	return rpc.ModuleInfo{Digest: mod.Digest, Size: mod.Size, Name: mod.Name, Created: mod.Uploaded, Experts: uids}
}

func (m moduleAPI) List(ctx context.Context, c rpc.Caller) ([]rpc.ModuleInfo, error) {
	store, err := m.experts.LiveStore()
	if err != nil {
		return nil, err
	}
	var out []rpc.ModuleInfo
	for _, mod := range store.List(owner(c)) {
		out = append(out, m.info(owner(c), mod))
	}
	slices.SortFunc(out, func(a, b rpc.ModuleInfo) int { return strings.Compare(a.Digest, b.Digest) })
	return out, nil
}

func (m moduleAPI) Delete(ctx context.Context, c rpc.Caller, digest string) error {
	store, err := m.experts.LiveStore()
	if err != nil {
		return err
	}
	if !store.Has(owner(c), digest) {
		return m.notYours("module " + digest)
	}
	err = store.Delete(owner(c), digest)
	if errors.Is(err, modules.ErrInUse) {
		return fmt.Errorf("%w; undeploy its experts first", err)
	}
	return err
}

// notYours is the error for a module c does not have: NotFound, with
// the same words whether another tenant has uploaded it or nobody has,
// so that no tenant learns which modules exist.
func (m moduleAPI) notYours(what string) error {
	return fmt.Errorf("%w: %s: you have no such module; upload it first", modules.ErrNotFound, what)
}

func (m moduleAPI) Deploy(ctx context.Context, c rpc.Caller, d rpc.Deployment) ([]string, error) {
	s := m.Server
	store, err := s.experts.LiveStore()
	if err != nil {
		return nil, err
	}
	uids, err := ExpandPattern(d.Experts)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	own := owner(c)
	var limits *ExpertLimits
	var caps tenant.Caps
	if !c.Operator {
		if err := s.tenants.MayDeploy(c.Tenant, d.Experts); err != nil {
			return nil, err
		}
		if caps, err = s.caps(c.Tenant); err != nil {
			return nil, err
		}
		leave, err := s.inflight.enter("deploys", c.Tenant, caps.Deploys)
		if err != nil {
			return nil, err
		}
		defer leave()
		if err := caps.CheckLimits(d.Limits); err != nil {
			return nil, err
		}
		if err := caps.Admit(tenant.Usage{Experts: int64(s.expertsOf(c.Tenant))}, tenant.Usage{Experts: int64(len(uids))}); err != nil {
			return nil, err
		}
	}
	if !d.Limits.IsZero() {
		limits = &d.Limits
	}
	if !store.Has(own, d.Module) {
		return nil, m.notYours("module " + d.Module)
	}
	for _, uid := range uids {
		if e, ok := s.experts.Get(uid); ok && e.Owner() != own && !c.Operator {
			return nil, fmt.Errorf("%q: %w", uid, ErrNotYours)
		}
	}
	var batching *BatchLimits
	if d.Batching != (rpc.BatchLimits{}) {
		b := d.Batching.Or(s.cfg.batching)
		batching = &b
	}
	var opt *OptimizerConfig
	if d.Optimizer != nil {
		o := d.Optimizer
		opt = &OptimizerConfig{
			Name: o.GetName(), LR: o.GetLr(), Momentum: o.GetMomentum(), WeightDecay: o.GetWeightDecay(),
			ClipGradNorm: o.GetClipGradNorm(), Scheduler: o.GetScheduler(),
			NumWarmupSteps: o.GetNumWarmupSteps(), NumTrainingSteps: o.GetNumTrainingSteps(),
		}
	}
	var done []string
	// undo takes back what this call deployed: a deploy is all or nothing.
	undo := func(err error) ([]string, error) {
		for _, u := range done {
			err = errors.Join(err, s.Undeploy(context.WithoutCancel(ctx), u))
		}
		return nil, err
	}
	for _, uid := range uids {
		lim := limits
		if !c.Operator {
			// The tenant's param_bytes cap covers all its experts: each
			// new one may declare what the others left.
			left := caps.ParamBytes - s.paramBytesOf(c.Tenant)
			if left <= 0 {
				return undo(&tenant.CapError{Cap: "param_bytes", Limit: caps.ParamBytes, Want: caps.ParamBytes - left + 1})
			}
			capped := ExpertLimits{}
			if lim != nil {
				capped = *lim
			}
			if capped.ParamBytes <= 0 || capped.ParamBytes > left {
				capped.ParamBytes = left
			}
			lim = &capped
		}
		err := s.Deploy(ctx, ExpertConfig{
			UID: uid, Owner: own, Module: ModuleDigest(d.Module), Config: d.Config,
			Batching: batching, Optimizer: opt, Limits: lim,
			ForwardAccess: d.Forward, BackwardAccess: d.Backward,
		})
		if err != nil {
			return undo(err)
		}
		done = append(done, uid)
	}
	slices.Sort(done)
	return done, nil
}

// paramBytesOf sums the parameter bytes of tenant's experts, overhead
// included.
func (s *Server) paramBytesOf(tenant string) int64 {
	var n int64
	for _, e := range s.experts.OwnedBy(tenant) {
		n += e.ParamBytes()
	}
	return n
}

// expertsOf counts the experts tenant owns.
func (s *Server) expertsOf(tenant string) int {
	return len(s.experts.OwnedBy(tenant))
}

func (m moduleAPI) Undeploy(ctx context.Context, c rpc.Caller, pattern string) ([]string, error) {
	s := m.Server
	uids, err := ExpandPattern(pattern)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	var mine []string
	for _, uid := range uids {
		e, ok := s.experts.Get(uid)
		if !ok {
			continue
		}
		if e.Owner() != owner(c) && !c.Operator {
			return nil, fmt.Errorf("%q: %w", uid, ErrNotYours)
		}
		mine = append(mine, uid)
	}
	if len(mine) == 0 {
		return nil, fmt.Errorf("%w: %q names none served", ErrUnknownExpert, pattern)
	}
	var errs []error
	for _, uid := range mine {
		errs = append(errs, s.Undeploy(ctx, uid))
	}
	return mine, errors.Join(errs...)
}

// maxUploadBytes resolves WithMaxUploadBytes.
// DefaultMaxUploads is how many module uploads the server takes in
// flight at once, all owners together.
const DefaultMaxUploads = 16

// WithMaxUploads bounds the module uploads in flight at once, all owners
// together, counted from each stream's headers (a tenant's own cap,
// tenant.Caps.Uploads, bounds hers). Default DefaultMaxUploads.
func WithMaxUploads(n int) Option {
	return optionFunc(func(c *config) { c.maxUploads = n })
}

func (s *Server) maxUploadsInFlight() int64 {
	if s.cfg.maxUploads > 0 {
		return int64(s.cfg.maxUploads)
	}
	return DefaultMaxUploads
}

func (s *Server) maxUploadBytes() int64 {
	if s.cfg.maxUploadBytes > 0 {
		return s.cfg.maxUploadBytes
	}
	return rpc.DefaultMaxUploadBytes
}

var (
	_ rpc.Authenticator = authenticator{}
	_ rpc.Modules       = moduleAPI{}
)
