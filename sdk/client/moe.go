package client

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/sdk/swarm"
)

// MoEConfig configures a MixtureOfExperts, after hivemind's
// RemoteMixtureOfExperts.
type MoEConfig struct {
	// Prefix names the grid: experts are Prefix.i.j… Required.
	Prefix string
	// K is how many experts each sample is sent to. Required.
	K int
	// KMin is how many of them must answer the forward pass for a sample
	// to succeed. Default 1.
	KMin int
	// ForwardTimeout bounds the forward calls of a sample. Default none
	// (the context's deadline).
	ForwardTimeout time.Duration
	// TimeoutAfterKMin is how long to wait for the other experts once KMin
	// have answered. Default 1s, as in hivemind.
	TimeoutAfterKMin time.Duration
	// BackwardKMin is how many of the forward responders must answer the
	// backward pass. Default 1.
	BackwardKMin int
	// BackwardTimeout bounds the backward calls of a sample. Default none.
	BackwardTimeout time.Duration
	// BanBase and BanMax bound how long a failing endpoint is avoided:
	// BanBase after one failure, doubling per failure in a row, up to
	// BanMax. Defaults 1s and 1m.
	BanBase, BanMax time.Duration
	// TrustedPeers, if not empty, pins the servers the mixture calls: the
	// beam search runs over the records signed by these peer IDs (host
	// keys) alone, so that the k best experts that they host are found
	// however many others score higher, and only their endpoints are
	// called (checked again here, since a discovery server may not have
	// filtered). At most swarm.MaxBeamPeers, in canonical form. Default:
	// any server the directory finds.
	TrustedPeers []string
}

// ErrKMinNotMet is returned when fewer than KMin (or BackwardKMin) experts
// of a sample answered.
var ErrKMinNotMet = errors.New("too few experts answered")

// MixtureOfExperts calls, for each sample, the k best existing experts of
// a grid under the caller's gate scores, in parallel, and mixes their
// outputs with a softmax of their scores taken over those that answered.
// Experts take and return one float32 tensor; each sample is sent as a
// batch of one. It is safe for concurrent use.
type MixtureOfExperts struct {
	dir     Directory
	cfg     MoEConfig
	opts    []Option
	trusted map[string]bool // cfg.TrustedPeers; nil: every peer

	mu      sync.Mutex
	clients map[string]*Client // by endpoint URL
	bans    map[string]ban
	seen    map[string]measured // by endpoint URL
}

type ban struct {
	until   time.Time
	backoff time.Duration
}

// measured is what the mixture saw of one endpoint: the moving average
// of its answers' latency and its failures in a row.
type measured struct {
	latency  time.Duration // exponential moving average of answered calls
	answered bool
	failures int // in a row
}

// latencyWeight is the weight of a new sample in the moving average.
const latencyWeight = 0.3

// NewMixtureOfExperts returns a mixture over the grid cfg.Prefix found
// through dir; opts configure the clients of the experts' servers. A
// token (WithToken, or $MOEHOST_TOKEN) goes to every server the mixture
// calls, so set MoEConfig.TrustedPeers to the servers it is meant for.
func NewMixtureOfExperts(dir Directory, cfg MoEConfig, opts ...Option) (*MixtureOfExperts, error) {
	if cfg.KMin == 0 {
		cfg.KMin = 1
	}
	if cfg.BackwardKMin == 0 {
		cfg.BackwardKMin = 1
	}
	if cfg.TimeoutAfterKMin == 0 {
		cfg.TimeoutAfterKMin = time.Second
	}
	if cfg.BanBase == 0 {
		cfg.BanBase = time.Second
	}
	if cfg.BanMax == 0 {
		cfg.BanMax = time.Minute
	}
	switch {
	case dir == nil:
		return nil, errors.New("client: mixture of experts needs a directory")
	case cfg.Prefix == "" || strings.HasSuffix(cfg.Prefix, "."):
		return nil, fmt.Errorf("client: grid prefix %q must be a name without a trailing dot", cfg.Prefix)
	case cfg.K < 1:
		return nil, fmt.Errorf("client: k = %d, want at least 1", cfg.K)
	case cfg.KMin < 1 || cfg.KMin > cfg.K:
		return nil, fmt.Errorf("client: k_min = %d, want 1 to k = %d", cfg.KMin, cfg.K)
	case cfg.BackwardKMin < 1 || cfg.BackwardKMin > cfg.K:
		return nil, fmt.Errorf("client: backward_k_min = %d, want 1 to k = %d", cfg.BackwardKMin, cfg.K)
	case cfg.ForwardTimeout < 0 || cfg.TimeoutAfterKMin < 0 || cfg.BackwardTimeout < 0:
		return nil, errors.New("client: negative timeout")
	}
	if err := swarm.CheckPeers(cfg.TrustedPeers); err != nil {
		return nil, fmt.Errorf("client: trusted peers: %w", err)
	}
	cfg.TrustedPeers = slices.Clone(cfg.TrustedPeers)
	return &MixtureOfExperts{dir: dir, cfg: cfg, opts: opts, trusted: swarm.PeerSet(cfg.TrustedPeers),
		clients: map[string]*Client{}, bans: map[string]ban{}, seen: map[string]measured{}}, nil
}

// Close closes the clients of the experts' servers.
func (m *MixtureOfExperts) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.clients {
		c.Close()
	}
}

// MoEOutput is the result of a forward pass, kept for its backward pass.
type MoEOutput struct {
	// Output is the mixed output, [batch, …].
	Output Tensor
	// Experts lists, per sample, the uids that answered and were mixed.
	Experts [][]string
	// Weights are their softmax weights, per sample.
	Weights [][]float64

	scores  [][][]float64
	samples []sampleState
}

type sampleState struct {
	input   Tensor
	out     []float32 // the mixed output row
	called  []called  // the responders
	outputs [][]float32
}

type called struct {
	uid, url string
	coords   []int
}

// Forward runs a forward pass. x is [batch, …] float32; scores[b][d][i]
// is sample b's gate score of coordinate i in grid dimension d.
func (m *MixtureOfExperts) Forward(ctx context.Context, x Tensor, scores [][][]float64) (*MoEOutput, error) {
	rows, err := splitRows(x)
	if err != nil {
		return nil, err
	}
	if len(scores) != len(rows) {
		return nil, fmt.Errorf("client: %d rows of scores for a batch of %d", len(scores), len(rows))
	}
	out := &MoEOutput{scores: scores, samples: make([]sampleState, len(rows)),
		Experts: make([][]string, len(rows)), Weights: make([][]float64, len(rows))}
	errs := make([]error, len(rows))
	var wg sync.WaitGroup
	for b := range rows {
		wg.Go(func() { errs[b] = m.forwardSample(ctx, rows[b], scores[b], &out.samples[b]) })
	}
	wg.Wait()
	for b, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("sample %d: %w", b, err)
		}
	}
	var mixed []float32
	var outShape []int64
	for b, s := range out.samples {
		mixed = append(mixed, s.out...)
		logits := make([]float64, len(s.called))
		for i, c := range s.called {
			out.Experts[b] = append(out.Experts[b], c.uid)
			logits[i] = scoreOf(scores[b], c.coords)
		}
		out.Weights[b] = softmax(logits)
		if b == 0 {
			outShape = []int64{int64(len(rows)), int64(len(s.out))}
		}
	}
	out.Output = Float32(outShape, mixed)
	return out, nil
}

// forwardSample calls the k best experts of one sample.
func (m *MixtureOfExperts) forwardSample(ctx context.Context, x Tensor, scores [][]float64, st *sampleState) error {
	st.input = x
	// Ask for more than K while servers are banned, so that the next best
	// experts replace theirs, and call the best K that have a server to
	// call (not banned, and trusted).
	k := min(m.cfg.K*(1+m.activeBans()), swarm.MaxBeamK)
	found, err := m.dir.BeamSearch(ctx, m.cfg.Prefix, scores, k, m.cfg.TrustedPeers)
	if err != nil {
		return fmt.Errorf("beam search: %w", err)
	}
	var (
		choices []Choice
		urls    []string
	)
	for _, ch := range found {
		if len(choices) == m.cfg.K {
			break
		}
		if u := m.pick(ch.Endpoints); u != "" {
			choices, urls = append(choices, ch), append(urls, u)
		}
	}
	if m.cfg.ForwardTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.cfg.ForwardTimeout)
		defer cancel()
	}
	ctx, cancelRest := context.WithCancel(ctx)
	defer cancelRest()
	type result struct {
		i    int
		out  []float32
		err  error
		took time.Duration
	}
	results := make(chan result, len(choices))
	for i, ch := range choices {
		go func() {
			begin := time.Now()
			outs, err := m.client(urls[i]).Expert(ch.UID).Forward(ctx, x)
			took := time.Since(begin)
			if err == nil && len(outs) != 1 {
				err = fmt.Errorf("expert %s returned %d outputs, want 1", ch.UID, len(outs))
			}
			var vals []float32
			if err == nil {
				vals, err = outs[0].Float32s()
			}
			results <- result{i: i, out: vals, err: err, took: took}
		}()
	}
	got := map[int][]float32{}
	var failures []error
	var afterKMin <-chan time.Time
	for pending := len(choices); pending > 0; pending-- {
		var r result
		select {
		case r = <-results:
		case <-afterKMin:
			cancelRest()
			r = <-results
		}
		if r.err != nil {
			failures = append(failures, fmt.Errorf("%s at %s: %w", choices[r.i].UID, urls[r.i], r.err))
			if ctx.Err() == nil {
				m.fail(urls[r.i])
			}
			continue
		}
		m.succeed(urls[r.i], r.took)
		got[r.i] = r.out
		if len(got) == m.cfg.KMin && afterKMin == nil {
			afterKMin = time.After(m.cfg.TimeoutAfterKMin)
		}
	}
	if len(got) < m.cfg.KMin {
		err := fmt.Errorf("%w: %d of %d experts answered, k_min is %d", ErrKMinNotMet, len(got), len(choices), m.cfg.KMin)
		if len(choices) < m.cfg.K {
			err = fmt.Errorf("%w (%d of the %d experts found have a server that is not banned or untrusted)", err, len(choices), len(found))
		}
		if len(failures) > 0 {
			err = fmt.Errorf("%w: %w", err, errors.Join(failures...))
		}
		return err
	}
	idx := slices.Sorted(maps.Keys(got))
	logits := make([]float64, len(idx))
	for j, i := range idx {
		coords := coordsOf(choices[i].UID, m.cfg.Prefix)
		st.called = append(st.called, called{uid: choices[i].UID, url: urls[i], coords: coords})
		st.outputs = append(st.outputs, got[i])
		logits[j] = scoreOf(scores, coords)
	}
	w := softmax(logits)
	n := len(st.outputs[0])
	st.out = make([]float32, n)
	for j, o := range st.outputs {
		if len(o) != n {
			return fmt.Errorf("experts %s and %s returned outputs of different sizes", st.called[0].uid, st.called[j].uid)
		}
		for t := range o {
			st.out[t] += float32(w[j]) * o[t]
		}
	}
	return nil
}

// Backward sends the gradient of the output to the experts that answered
// the forward pass (and only them), and returns the gradient of x and of
// the gate scores (shaped like Forward's scores).
func (m *MixtureOfExperts) Backward(ctx context.Context, fwd *MoEOutput, gradOutput Tensor) (Tensor, [][][]float64, error) {
	dys, err := splitRows(gradOutput)
	if err != nil {
		return Tensor{}, nil, err
	}
	if len(dys) != len(fwd.samples) {
		return Tensor{}, nil, fmt.Errorf("client: gradient of %d rows for a batch of %d", len(dys), len(fwd.samples))
	}
	gradScores := make([][][]float64, len(fwd.scores))
	for b := range fwd.scores {
		gradScores[b] = make([][]float64, len(fwd.scores[b]))
		for d := range fwd.scores[b] {
			gradScores[b][d] = make([]float64, len(fwd.scores[b][d]))
		}
	}
	gradRows := make([][]float32, len(dys))
	errs := make([]error, len(dys))
	var wg sync.WaitGroup
	for b := range dys {
		wg.Go(func() {
			gradRows[b], errs[b] = m.backwardSample(ctx, &fwd.samples[b], fwd.Weights[b], dys[b], gradScores[b])
		})
	}
	wg.Wait()
	for b, err := range errs {
		if err != nil {
			return Tensor{}, nil, fmt.Errorf("sample %d: %w", b, err)
		}
	}
	shape := slices.Clone(fwd.samples[0].input.Shape)
	shape[0] = int64(len(dys))
	var flat []float32
	for _, g := range gradRows {
		flat = append(flat, g...)
	}
	return Float32(shape, flat), gradScores, nil
}

func (m *MixtureOfExperts) backwardSample(ctx context.Context, st *sampleState, w []float64, dy Tensor, gradScores [][]float64) ([]float32, error) {
	dyv, err := dy.Float32s()
	if err != nil {
		return nil, err
	}
	if len(dyv) != len(st.out) {
		return nil, fmt.Errorf("client: output gradient has %d values, the output %d", len(dyv), len(st.out))
	}
	// Gate gradients: d/dlogit_e = w_e (dy·y_e − dy·y).
	dyY := dot(dyv, st.out)
	for j, c := range st.called {
		g := w[j] * (dot(dyv, st.outputs[j]) - dyY)
		for d, i := range c.coords {
			gradScores[d][i] += g
		}
	}
	if m.cfg.BackwardTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.cfg.BackwardTimeout)
		defer cancel()
	}
	grads := make([][]float32, len(st.called))
	errs := make([]error, len(st.called))
	var wg sync.WaitGroup
	for j, c := range st.called {
		wg.Go(func() {
			scaled := make([]float32, len(dyv))
			for t := range dyv {
				scaled[t] = float32(w[j]) * dyv[t]
			}
			begin := time.Now()
			outs, err := m.client(c.url).Expert(c.uid).Backward(ctx, []Tensor{st.input}, []Tensor{Float32(dy.Shape, scaled)})
			took := time.Since(begin)
			if err == nil && len(outs) != 1 {
				err = fmt.Errorf("expert %s returned %d gradients, want 1", c.uid, len(outs))
			}
			if err == nil {
				grads[j], err = outs[0].Float32s()
			}
			if err != nil {
				errs[j] = fmt.Errorf("%s at %s: %w", c.uid, c.url, err)
				m.fail(c.url)
				return
			}
			m.succeed(c.url, took)
		})
	}
	wg.Wait()
	var sum []float32
	ok := 0
	for j, g := range grads {
		if errs[j] != nil {
			continue
		}
		if sum == nil {
			sum = make([]float32, len(g))
		}
		if len(g) != len(sum) {
			return nil, fmt.Errorf("experts returned input gradients of different sizes")
		}
		for t := range g {
			sum[t] += g[t]
		}
		ok++
	}
	if ok < m.cfg.BackwardKMin {
		return nil, fmt.Errorf("%w: %d of %d experts answered the backward pass, backward_k_min is %d: %w", ErrKMinNotMet, ok, len(st.called), m.cfg.BackwardKMin, errors.Join(errs...))
	}
	return sum, nil
}

// pick returns the endpoint to call, or "" if every one is banned. What
// the mixture measured decides, not what a record claims (a record may
// announce any load): an endpoint never called is tried first, so that
// one call measures it, and among those the lowest announced queue depth
// breaks the tie; then the endpoint with the fewest failures in a row and
// the lowest moving-average latency wins.
func (m *MixtureOfExperts) pick(eps []Endpoint) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	best := -1
	better := func(i, j int) bool {
		a, b := m.seen[eps[i].URL], m.seen[eps[j].URL]
		untriedA, untriedB := !a.answered && a.failures == 0, !b.answered && b.failures == 0
		switch {
		case untriedA != untriedB:
			return untriedA
		case untriedA:
			return eps[i].QueueDepth < eps[j].QueueDepth
		case a.failures != b.failures:
			return a.failures < b.failures
		default:
			return a.latency < b.latency
		}
	}
	for i, e := range eps {
		if b, ok := m.bans[e.URL]; ok && now.Before(b.until) {
			continue
		}
		if m.trusted != nil && !m.trusted[e.PeerID] {
			continue
		}
		if best < 0 || better(i, best) {
			best = i
		}
	}
	if best < 0 {
		return ""
	}
	return eps[best].URL
}

// activeBans counts the endpoints banned now.
func (m *MixtureOfExperts) activeBans() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, now := 0, time.Now()
	for _, b := range m.bans {
		if now.Before(b.until) {
			n++
		}
	}
	return n
}

// fail bans url for a while, longer after each failure in a row.
func (m *MixtureOfExperts) fail(url string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.bans[url]
	b.backoff = min(max(2*b.backoff, m.cfg.BanBase), m.cfg.BanMax)
	b.until = time.Now().Add(b.backoff)
	m.bans[url] = b
	s := m.seen[url]
	s.failures++
	m.seen[url] = s
}

// succeed lifts url's ban and adds took to its latency average.
func (m *MixtureOfExperts) succeed(url string, took time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.bans, url)
	s := m.seen[url]
	if s.answered {
		s.latency = time.Duration(latencyWeight*float64(took) + (1-latencyWeight)*float64(s.latency))
	} else {
		s.latency, s.answered = took, true
	}
	s.failures = 0
	m.seen[url] = s
}

// Banned reports whether url is being avoided after failures.
func (m *MixtureOfExperts) Banned(url string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.bans[url]
	return ok && time.Now().Before(b.until)
}

func (m *MixtureOfExperts) client(url string) *Client {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.clients[url]
	if !ok {
		c = New(url, m.opts...)
		m.clients[url] = c
	}
	return c
}

// splitRows splits a [batch, …] float32 tensor into batches of one.
func splitRows(x Tensor) ([]Tensor, error) {
	if x.DType != abi.DTypeFloat32 || len(x.Shape) < 1 || x.Shape[0] < 1 {
		return nil, fmt.Errorf("client: want a float32 tensor of shape [batch, …], got %v %v", x.DType, x.Shape)
	}
	vals, err := x.Float32s()
	if err != nil {
		return nil, err
	}
	b := int(x.Shape[0])
	if len(vals)%b != 0 {
		return nil, fmt.Errorf("client: %d values do not split into %d rows", len(vals), b)
	}
	per := len(vals) / b
	shape := slices.Clone(x.Shape)
	shape[0] = 1
	out := make([]Tensor, b)
	for i := range out {
		out[i] = Float32(shape, vals[i*per:(i+1)*per])
	}
	return out, nil
}

// coordsOf returns the grid coordinates of uid under prefix.
func coordsOf(uid, prefix string) []int {
	var out []int
	for _, p := range strings.Split(strings.TrimPrefix(uid, prefix+"."), ".") {
		c, _ := strconv.Atoi(p)
		out = append(out, c)
	}
	return out
}

func scoreOf(scores [][]float64, coords []int) float64 {
	s := 0.0
	for d, c := range coords {
		s += scores[d][c]
	}
	return s
}

func softmax(logits []float64) []float64 {
	mx := math.Inf(-1)
	for _, l := range logits {
		mx = max(mx, l)
	}
	out := make([]float64, len(logits))
	sum := 0.0
	for i, l := range logits {
		out[i] = math.Exp(l - mx)
		sum += out[i]
	}
	for i := range out {
		out[i] /= sum
	}
	return out
}

func dot(a, b []float32) float64 {
	s := 0.0
	for i := range a {
		s += float64(a[i]) * float64(b[i])
	}
	return s
}
