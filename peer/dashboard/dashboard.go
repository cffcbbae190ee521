// Package dashboard is the web page any node serves on its API address: the
// fleet (who lends what, how each peer is connected, who attests), the
// coordinator and its term, running jobs with live loss and throughput
// curves, bytes on the wire per codec, and the contributor leaderboard.
//
// Everything the page needs is embedded in the binary and served by the
// node itself: the page makes no request to any other host (its
// Content-Security-Policy forbids it). Charts are drawn on the server as
// SVG with gonum.org/v1/plot; the page updates itself from server-sent
// events, falling back to polling, without reloading.
package dashboard

import (
	"embed"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/holopeer/holopeer/peer/api"
)

// Source is what the dashboard shows: the node's own view, read afresh at
// every update. Implementations must be safe for concurrent use and quick
// (they are called about once a second while anyone watches).
type Source interface {
	Status() api.Status
	Jobs() []api.JobStatus
	Leaderboard() []api.LedgerEntry
}

// Paths the dashboard serves (mount the handler at "/" and "/dashboard/").
const (
	PathIndex      = "/dashboard/"
	PathState      = "/dashboard/state.json"
	PathEvents     = "/dashboard/events"
	PathLoss       = "/dashboard/loss.svg"       // ?job=ID
	PathThroughput = "/dashboard/throughput.svg" // ?job=ID
	PathBytes      = "/dashboard/bytes.svg"
	PathStatic     = "/dashboard/static/"
)

//go:embed assets
var assets embed.FS

// Option configures a Dashboard.
type Option func(*Dashboard)

// WithInterval sets how often live updates are pushed (default 1 s).
func WithInterval(d time.Duration) Option { return func(x *Dashboard) { x.interval = d } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(x *Dashboard) { x.log = l } }

// WithClock sets the clock (default time.Now), for tests.
func WithClock(now func() time.Time) Option { return func(x *Dashboard) { x.now = now } }

// WithMaxStreams bounds concurrent live-update streams (default 32);
// beyond it the page polls.
func WithMaxStreams(n int) Option { return func(x *Dashboard) { x.maxStreams = n } }

// Dashboard is the handler. It samples its source in the background; Close
// stops that and ends open event streams, so call it before the HTTP
// server shuts down.
type Dashboard struct {
	src        Source
	interval   time.Duration
	log        *slog.Logger
	now        func() time.Time
	maxStreams int
	static     http.Handler
	mux        *http.ServeMux

	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
	streams   chan struct{} // a token per open stream

	mu         sync.Mutex // guards the fields below
	cached     *State
	cachedJSON []byte
	cachedAt   time.Time
	history    *throughputHistory
	charts     map[chartKey]drawnChart
}

// New builds the dashboard over src.
func New(src Source, opts ...Option) (*Dashboard, error) {
	if src == nil {
		return nil, errors.New("dashboard: nil source")
	}
	d := &Dashboard{
		src:        src,
		interval:   time.Second,
		log:        slog.Default(),
		now:        time.Now,
		maxStreams: 32,
		done:       make(chan struct{}),
		history:    newThroughputHistory(maxJobsTracked, maxThroughputSamples),
		charts:     map[chartKey]drawnChart{},
	}
	for _, o := range opts {
		o(d)
	}
	if d.interval <= 0 || d.maxStreams <= 0 {
		return nil, errors.New("dashboard: interval and max streams must be positive")
	}
	d.streams = make(chan struct{}, d.maxStreams)
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, err
	}
	d.static = http.StripPrefix(PathStatic, http.FileServerFS(sub))
	d.mux = http.NewServeMux()
	d.mux.HandleFunc("GET /{$}", d.serveIndex)
	d.mux.HandleFunc("GET /dashboard/{$}", d.serveIndex)
	d.mux.Handle("GET /dashboard", http.RedirectHandler(PathIndex, http.StatusMovedPermanently))
	d.mux.HandleFunc("GET "+PathState, d.serveState)
	d.mux.HandleFunc("GET "+PathEvents, d.serveEvents)
	d.mux.HandleFunc("GET "+PathLoss, d.serveLoss)
	d.mux.HandleFunc("GET "+PathThroughput, d.serveThroughput)
	d.mux.HandleFunc("GET "+PathBytes, d.serveBytes)
	d.mux.HandleFunc("GET "+PathStatic, d.serveStatic)
	d.wg.Add(1)
	go d.sample()
	return d, nil
}

// sample reads the source every interval even while no one watches, so the
// throughput curve covers the node's whole run, not just the time a page
// was open.
func (d *Dashboard) sample() {
	defer d.wg.Done()
	t := time.NewTicker(d.interval)
	defer t.Stop()
	for {
		select {
		case <-d.done:
			return
		case <-t.C:
			d.state()
		}
	}
}

// ServeHTTP implements http.Handler.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Nothing the dashboard serves may be framed or sniffed.
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	d.mux.ServeHTTP(w, r)
}

// Close stops sampling and ends open event streams. The handler keeps
// answering plain requests.
func (d *Dashboard) Close() error {
	d.closeOnce.Do(func() { close(d.done) })
	d.wg.Wait()
	return nil
}

// pageCSP allows the page to load only from the node itself.
const pageCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"manifest-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

func (d *Dashboard) serveIndex(w http.ResponseWriter, r *http.Request) {
	b, err := assets.ReadFile("assets/index.html")
	if err != nil {
		http.Error(w, "dashboard: index missing", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Security-Policy", pageCSP)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.Write(b)
}

func (d *Dashboard) serveStatic(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Security-Policy", pageCSP)
	w.Header().Set("Cache-Control", "no-cache") // revalidated by Last-Modified; assets change with the binary
	d.static.ServeHTTP(w, r)
}
