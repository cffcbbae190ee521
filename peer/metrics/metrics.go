// Package metrics is a node's Prometheus metrics, served on /metrics in the
// text format operators' tools scrape. Each node has its own registry (not
// the global one), so many nodes can share a process in tests.
//
// Two ways in, used together:
//   - push: the packages that see an event call a method (ObserveStep,
//     AddBytes, Refused, HolePunch, SetCoordinator …);
//   - pull: gauges that describe the node's present state (peers by
//     connection type, the coordinator and its term, per-job tokens/s, step
//     and loss) are read at scrape time from the functions given with
//     WithStatus and WithJobs, so they are never stale.
//
// Label values that come from the network (job ids) are capped: past
// MaxJobs distinct jobs, further ones are counted under job="other".
package metrics

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/holopeer/holopeer/peer/api"
)

// Namespace prefixes every metric of ours.
const Namespace = "holopeer"

// Caps on label values, against a flood of job ids or odd reasons.
const (
	MaxJobs       = 64
	maxReasons    = 256
	maxLabelBytes = 64
	otherLabel    = "other"
)

// Option configures Metrics.
type Option func(*Metrics)

// WithStatus reads the node's status at scrape time for the peer, node and
// coordinator gauges (instead of SetPeers and SetCoordinator's values).
func WithStatus(f func() api.Status) Option { return func(m *Metrics) { m.status = f } }

// WithJobs reads the jobs at scrape time for the per-job gauges (instead
// of SetTokensPerS's values).
func WithJobs(f func() []api.JobStatus) Option { return func(m *Metrics) { m.jobs = f } }

// WithoutRuntime leaves out the Go runtime and process collectors (tests
// that count families).
func WithoutRuntime() Option { return func(m *Metrics) { m.noRuntime = true } }

// Metrics is one node's collectors and registry. Its methods are safe for
// concurrent use and cheap enough for per-step calls.
type Metrics struct {
	reg       *prometheus.Registry
	status    func() api.Status
	jobs      func() []api.JobStatus
	noRuntime bool

	holePunch    *prometheus.CounterVec
	coordChanges prometheus.Counter
	stepSeconds  *prometheus.HistogramVec
	bytesSent    *prometheus.CounterVec
	tokens       *prometheus.CounterVec
	rejections   *prometheus.CounterVec
	receipts     *prometheus.CounterVec

	jobLabels    *limiter
	reasonLabels *limiter

	mu          sync.Mutex // guards the pushed state below
	peers       map[string]int
	coordPeer   string
	coordTerm   uint64
	coordTEE    string
	coordInsec  bool
	haveCoord   bool
	tokensPerS  map[string]float64
	seenCoord   string // last (peer, term) counted as a change
	seenTerm    uint64
	seenAnyTerm bool
}

// New builds a node's metrics on a fresh registry.
func New(opts ...Option) *Metrics {
	m := &Metrics{
		reg:          prometheus.NewRegistry(),
		peers:        map[string]int{},
		tokensPerS:   map[string]float64{},
		jobLabels:    newLimiter(MaxJobs),
		reasonLabels: newLimiter(maxReasons),
	}
	for _, o := range opts {
		o(m)
	}
	m.holePunch = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "hole_punch_total",
		Help: "Hole-punch attempts to upgrade a relayed connection to a direct one, by result (success, failure).",
	}, []string{"result"})
	m.coordChanges = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Name: "coordinator_changes_total",
		Help: "Times the followed coordinator or its term changed.",
	})
	m.stepSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "stage_step_seconds",
		Help:    "Time this node's stage took for one training step (all microbatches, forward and backward), by job and stage.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14), // 1 ms to ~150 s
	}, []string{"job", "stage"})
	m.bytesSent = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "bytes_sent_total",
		Help: "Bytes this node sent across stage boundaries (activations and gradients, framing included), by codec.",
	}, []string{"codec"})
	m.tokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "tokens_processed_total",
		Help: "Tokens this node's stage processed, by job.",
	}, []string{"job"})
	m.rejections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "refused_total",
		Help: "Requests and messages this node refused, by protocol (a libp2p protocol or gossip topic, control-api, ledger) and reason.",
	}, []string{"protocol", "reason"})
	m.receipts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "ledger_receipts_total",
		Help: "Contribution receipts heard, by result (kept, duplicate, held until their term is recorded, rejected).",
	}, []string{"result"})
	m.holePunch.WithLabelValues("success")
	m.holePunch.WithLabelValues("failure")
	m.reg.MustRegister(m.holePunch, m.coordChanges, m.stepSeconds, m.bytesSent, m.tokens, m.rejections, m.receipts, (*stateCollector)(m))
	if !m.noRuntime {
		m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{Namespace: Namespace}))
	}
	return m
}

// Registry is the node's registry, for collectors of other libraries (for
// example libp2p.PrometheusRegisterer(m.Registry())).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus text format (mount it at
// "GET /metrics").
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
	})
}

// HolePunch counts one hole-punch outcome.
func (m *Metrics) HolePunch(success bool) {
	res := "failure"
	if success {
		res = "success"
	}
	m.holePunch.WithLabelValues(res).Inc()
}

// ObserveStep records how long this node's stage took for one step.
func (m *Metrics) ObserveStep(job string, stage int, d time.Duration) {
	m.stepSeconds.WithLabelValues(m.jobLabels.get(job), strconv.Itoa(stage)).Observe(d.Seconds())
}

// AddBytes counts bytes sent across a stage boundary with codec.
func (m *Metrics) AddBytes(codec string, n int64) {
	if n <= 0 {
		return
	}
	m.bytesSent.WithLabelValues(clipLabel(codec)).Add(float64(n))
}

// AddTokens counts tokens this node's stage processed for job.
func (m *Metrics) AddTokens(job string, n int64) {
	if n <= 0 {
		return
	}
	m.tokens.WithLabelValues(m.jobLabels.get(job)).Add(float64(n))
}

// Refused counts one request or message this node refused: protocol is
// where it came in (a libp2p protocol id or gossip topic, "control-api",
// "ledger"), reason a short fixed word, not an error text. Past a few
// hundred distinct pairs, further ones count under "other". A nil
// Metrics counts nothing, so callers need not check.
func (m *Metrics) Refused(protocol, reason string) {
	if m == nil {
		return
	}
	key := m.reasonLabels.get(clipLabel(protocol) + "\x00" + clipLabel(reason))
	p, r := otherLabel, otherLabel
	if key != otherLabel {
		p, r = clipLabel(protocol), clipLabel(reason)
	}
	m.rejections.WithLabelValues(p, r).Inc()
}

// Reject is Refused under its older name (topic is the protocol).
func (m *Metrics) Reject(topic, reason string) { m.Refused(topic, reason) }

// Receipt counts a ledger receipt heard: "kept", "duplicate" or "rejected".
func (m *Metrics) Receipt(result string) { m.receipts.WithLabelValues(clipLabel(result)).Inc() }

// SetPeers sets the connected peers by connection type (direct, relayed);
// ignored when WithStatus is given.
func (m *Metrics) SetPeers(byConn map[string]int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.peers)
	for k, v := range byConn {
		m.peers[clipLabel(k)] = v
	}
}

// SetTerm sets the election term followed, keeping the coordinator.
func (m *Metrics) SetTerm(term uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.coordTerm, m.haveCoord = term, true
	m.noteCoordinator(m.coordPeer, term)
}

// SetCoordinator sets the coordinator followed and its term (from the
// election's status changes) and counts a change of either.
func (m *Metrics) SetCoordinator(peerID string, term uint64, tee string, insecure bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.coordPeer, m.coordTerm, m.coordTEE, m.coordInsec, m.haveCoord = peerID, term, tee, insecure, true
	m.noteCoordinator(peerID, term)
}

// noteCoordinator counts a change of (coordinator, term). It is called by
// pushes and by scrapes in pull mode; both see the same (peer, term), so a
// change counts once. Callers hold m.mu.
func (m *Metrics) noteCoordinator(peerID string, term uint64) {
	if m.seenAnyTerm && peerID == m.seenCoord && term == m.seenTerm {
		return
	}
	if m.seenAnyTerm || term != 0 {
		m.coordChanges.Inc()
	}
	m.seenCoord, m.seenTerm, m.seenAnyTerm = peerID, term, true
}

// SetTokensPerS sets a job's throughput; ignored when WithJobs is given.
func (m *Metrics) SetTokensPerS(job string, v float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tokensPerS[m.jobLabels.get(job)] = v
}

// ForgetJob drops a finished job's series, freeing its label slot.
func (m *Metrics) ForgetJob(job string) {
	job = clipLabel(job)
	m.mu.Lock()
	delete(m.tokensPerS, job)
	m.mu.Unlock()
	m.stepSeconds.DeletePartialMatch(prometheus.Labels{"job": job})
	m.tokens.DeleteLabelValues(job)
	m.jobLabels.forget(job)
}

// clipLabel makes a label value safe: valid UTF-8, at most maxLabelBytes,
// never empty.
func clipLabel(s string) string {
	if s == "" {
		return "none"
	}
	s = strings.ToValidUTF8(s, "?")
	if len(s) > maxLabelBytes {
		cut := maxLabelBytes
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return s
}

// limiter hands out at most n distinct label values, then otherLabel.
type limiter struct {
	mu   sync.Mutex
	n    int
	seen map[string]struct{}
}

func newLimiter(n int) *limiter { return &limiter{n: n, seen: map[string]struct{}{}} }

func (l *limiter) get(v string) string {
	v = clipLabel(v)
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[v]; ok {
		return v
	}
	if len(l.seen) >= l.n {
		return otherLabel
	}
	l.seen[v] = struct{}{}
	return v
}

func (l *limiter) forget(v string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.seen, clipLabel(v))
}
