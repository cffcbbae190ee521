package serve

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// serveMetrics are the API's Prometheus collectors, labelled with the
// serving job (Config.Job) so that two jobs on one node stay apart.
type serveMetrics struct {
	requests   *prometheus.CounterVec // by endpoint and HTTP status
	errors     *prometheus.CounterVec // by OpenAI error code
	ttft       prometheus.Histogram
	interToken prometheus.Histogram
	tokensPerS prometheus.Histogram
	duration   prometheus.Histogram
	tokens     *prometheus.CounterVec // by kind: prompt, completion
}

// latencyBuckets span 1 ms to ~100 s.
var latencyBuckets = prometheus.ExponentialBuckets(0.001, 2.5, 13)

func newServeMetrics(reg prometheus.Registerer, job string) (*serveMetrics, error) {
	labels := prometheus.Labels{"job": job}
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "holopeer", Subsystem: "serve", Name: name, Help: help, ConstLabels: labels}
	}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		o := opts(name, help)
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: o.Namespace, Subsystem: o.Subsystem, Name: o.Name, Help: o.Help,
			ConstLabels: o.ConstLabels, Buckets: buckets})
	}
	m := &serveMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts(opts("requests_total",
			"Requests to the OpenAI-compatible API, by endpoint and HTTP status.")), []string{"endpoint", "status"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts(opts("errors_total",
			"Error answers of the API (streams' last events included), by OpenAI error code.")), []string{"code"}),
		ttft: hist("time_to_first_token_seconds",
			"From a request's admission to each of its choices' first token (queueing and the prompt's prefill included).", latencyBuckets),
		interToken: hist("inter_token_latency_seconds",
			"Time between two consecutive tokens of one sequence.", latencyBuckets),
		tokensPerS: hist("tokens_per_second",
			"Tokens per second of each generated sequence, from its start to its last token.", prometheus.ExponentialBuckets(0.5, 2, 14)),
		duration: hist("request_duration_seconds",
			"Time to answer a request, from its headers to its last byte.", latencyBuckets),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts(opts("tokens_total",
			"Tokens of answered requests, by kind (prompt, completion).")), []string{"kind"}),
	}
	if reg == nil {
		// Nobody scrapes these; a registry of their own keeps the code
		// paths the same.
		reg = prometheus.NewRegistry()
	}
	for _, c := range []prometheus.Collector{m.requests, m.errors, m.ttft, m.interToken, m.tokensPerS, m.duration, m.tokens} {
		if err := reg.Register(c); err != nil {
			var dup prometheus.AlreadyRegisteredError
			if errors.As(err, &dup) {
				return nil, fmt.Errorf("serve: the metrics of job %q are registered already: %w", job, err)
			}
			return nil, fmt.Errorf("serve: metrics: %w", err)
		}
	}
	return m, nil
}

// observeChoice records a finished sequence's speed.
func (m *serveMetrics) observeChoice(c *choice) {
	if c.produced == 0 {
		return
	}
	if d := c.last.Sub(c.begun).Seconds(); d > 0 {
		m.tokensPerS.Observe(float64(c.produced) / d)
	}
}

// endpoints are the paths counted by name; any other is "other", so that
// a scan of random paths cannot grow the label set.
var endpoints = map[string]bool{"/v1/completions": true, "/v1/chat/completions": true, "/v1/models": true, "/health": true}

// statusWriter records the status a handler wrote; it passes Flush on for
// streams.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// count wraps h to count every request and time it.
func (m *serveMetrics) count(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		ep := r.URL.Path
		if !endpoints[ep] {
			ep = "other"
			if len(r.URL.Path) > len("/v1/models/") && r.URL.Path[:len("/v1/models/")] == "/v1/models/" {
				ep = "/v1/models/{id}"
			}
		}
		if sw.status == 0 {
			sw.status = http.StatusOK
		}
		m.requests.WithLabelValues(ep, fmt.Sprint(sw.status)).Inc()
		m.duration.Observe(time.Since(start).Seconds())
	})
}
