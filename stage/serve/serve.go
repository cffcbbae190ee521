// Package serve is the OpenAI-compatible HTTP API in front of a model:
// POST /v1/completions, POST /v1/chat/completions (a single JSON body, or
// server-sent events with "stream": true) and GET /v1/models, with a
// bounded request queue, sampling (temperature, top-p, seed) and stop
// strings. It runs on the researcher's node in front of the swarm
// (pipeline.Server) or, as the single-process reference, in front of one
// whole model (Local); both are an Engine.
//
// # Requests
//
// Every parameter OpenAI documents for the two endpoints is accepted by
// name; a name it does not document is refused with 400
// unknown_parameter, as is malformed JSON, so that a typo never silently
// changes what is generated. Honoured:
//
//   - model, prompt (a string, a one-string array, or token ids) or
//     messages; max_tokens (completions: default 16; chat: as many as the
//     limits allow) and max_completion_tokens;
//   - temperature (default 1; 0 is greedy), top_p, seed, stop (a string
//     or up to 4);
//   - presence_penalty and frequency_penalty (−2..2, over the tokens
//     generated so far) and logit_bias (token id → −100..100);
//   - logprobs (completions: 0..5 alternatives; chat: true, with
//     top_logprobs 0..20): the log-softmax of the logits after bias and
//     penalties, at temperature 1;
//   - n choices (up to the batch), best_of (completions: the n of best_of
//     with the highest total logprob), echo (completions);
//   - stream and stream_options.include_usage; response_format of type
//     text; modalities ["text"].
//
// Accepted because they change nothing generated: user, metadata,
// service_tier, prediction, parallel_tool_calls, prompt_cache_key,
// safety_identifier, store false, tool_choice "none" and empty tools.
// Refused with 400 code "unsupported", param naming the field: tools,
// tool_choice, functions, function_call, response_format json_object and
// json_schema, audio, non-text modalities and content parts,
// reasoning_effort, verbosity, web_search_options, moderation, store
// true, suffix, echo with logprobs.
//
// # Security
//
// The API answers only Host names it knows (Config.AllowedHosts and
// loopback), against DNS rebinding; refuses POST bodies that are not
// application/json and requests whose Origin is not one of
// Config.CORSOrigins (whose preflights it answers), against cross-site
// requests from web pages; and with Config.APIKey requires
// "Authorization: Bearer KEY".
//
// # Metrics
//
// With Config.Metrics, holopeer_serve_* counts requests (by endpoint and
// status), errors (by code) and tokens, and keeps histograms of time to
// first token, inter-token latency, tokens/s per sequence and request
// duration, labelled with Config.Job.
//
// # Chat template
//
// holopeer's own models have no chat training, so chat uses a plain,
// documented template: one line per message, "role: content", then
// "assistant:" for the model to continue; roles are system, user and
// assistant ("developer" counts as system). Generation also stops at
// "\nuser:" and "\nsystem:", where the model would start the next turn.
//
// # Errors
//
// Every error is {"error": {"message", "type", "param", "code"}} as
// OpenAI's API sends it: 400 invalid_request_error for bad input
// (code context_length_exceeded when a prompt or max_tokens is over the
// limits; code unsupported for what this server cannot do), 401 for a
// missing or wrong key, 403 for a Host or Origin not allowed, 415 for a
// body that is not JSON, 404 for an unknown model or path, 429 rate_limit_error
// (code queue_full, with Retry-After) when the queue is full, and 500 or
// 503 when generation fails. An error after a stream has started comes
// as a last event holding the error object.
package serve

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/holopeer/holopeer/stage/tokenizer"
)

// Engine generates tokens: the swarm (pipeline.Server) or one process
// (Local). prompt holds token ids; pick chooses each next token from the
// logits, emit receives it and returns true to stop. Both are called on
// the engine's goroutine and must not block. Generate returns when the
// sequence ends (after maxNew tokens, a stop, or the context's end; then
// emit is not called again).
type Engine interface {
	Generate(ctx context.Context, prompt []int32, maxNew int, pick func(logits []float32) int32, emit func(token int32) (stop bool)) error
}

// Config describes the model behind the API and its limits.
type Config struct {
	// Model is the id /v1/models lists and responses name. Requests may
	// name it or leave model out. Required.
	Model string
	// Engine generates. Required.
	Engine Engine
	// Tokenizer turns prompts into ids and ids into text. Required.
	Tokenizer tokenizer.Tokenizer
	// Vocab is the model's vocabulary size (token-id prompts must be
	// below it). Required.
	Vocab int
	// EOS are the ids that end a sequence (the tokenizer's EOS is added).
	EOS []int
	// ContextTokens bounds prompt plus output per request (the serving
	// job's MaxTokens). Required.
	ContextTokens int
	// MaxPromptTokens and MaxOutputTokens bound each part (default: the
	// context).
	MaxPromptTokens, MaxOutputTokens int
	// MaxBatch sequences generate at once (default 8; a request of n
	// choices is n sequences, and n may not exceed it); MaxQueue more wait
	// (default 64); beyond that requests get 429.
	MaxBatch, MaxQueue int
	// MaxBodyBytes bounds a request body (default 1 MiB).
	MaxBodyBytes int64
	// StreamKeepAlive is how long a stream may stay silent (waiting in
	// the queue, or while the swarm replaces a lost stage) before it
	// carries an SSE comment line, so that proxies and clients keep it
	// open (default 15 s).
	StreamKeepAlive time.Duration
	Logger          *slog.Logger
	// Now is the clock for "created" fields (default time.Now).
	Now func() time.Time

	// AllowedHosts are the names a request's Host header may carry
	// besides the loopback ones (localhost, 127.0.0.0/8, ::1): the host
	// the API listens on, and any name a proxy in front of it uses. An
	// unspecified address (0.0.0.0 or ::) in it admits every IP literal.
	// Any other Host is refused, so that a web page whose name an
	// attacker re-points at this machine (DNS rebinding) cannot read it.
	AllowedHosts []string
	// APIKey, if set, is required as "Authorization: Bearer KEY" on
	// every request but GET /health, as OpenAI's API does.
	APIKey string
	// CORSOrigins are the web origins (scheme://host[:port], or "*")
	// whose pages may call the API; requests that carry any other Origin
	// are refused. Default none: no browser page may.
	CORSOrigins []string

	// Metrics, if set, receives the API's Prometheus collectors
	// (holopeer_serve_*), labelled job=Job.
	Metrics prometheus.Registerer
	Job     string
}

// Server is the HTTP API.
type Server struct {
	cfg     Config
	log     *slog.Logger
	eos     []int
	bos     int
	slots   chan struct{} // one per generation running
	turn    chan struct{} // held by the request taking its slots
	pending atomic.Int64  // sequences waiting or running
	handler http.Handler
	metrics *serveMetrics
	hosts   map[string]bool
	anyIP   bool
	origins map[string]bool

	mu   sync.Mutex
	http *http.Server
}

// New checks cfg and returns the API.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Model == "" || cfg.Engine == nil || cfg.Tokenizer == nil:
		return nil, errors.New("serve: a model id, an engine and a tokenizer are required")
	case cfg.Vocab <= 0 || cfg.ContextTokens < 2:
		return nil, fmt.Errorf("serve: vocabulary %d, context %d", cfg.Vocab, cfg.ContextTokens)
	case cfg.Tokenizer.VocabSize() > cfg.Vocab:
		return nil, fmt.Errorf("serve: tokenizer %s has %d ids, the model %d", cfg.Tokenizer.Name(), cfg.Tokenizer.VocabSize(), cfg.Vocab)
	}
	if cfg.MaxPromptTokens <= 0 || cfg.MaxPromptTokens >= cfg.ContextTokens {
		cfg.MaxPromptTokens = cfg.ContextTokens - 1
	}
	if cfg.MaxOutputTokens <= 0 || cfg.MaxOutputTokens > cfg.ContextTokens-1 {
		cfg.MaxOutputTokens = cfg.ContextTokens - 1
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 8
	}
	if cfg.MaxQueue <= 0 {
		cfg.MaxQueue = 64
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.StreamKeepAlive <= 0 {
		cfg.StreamKeepAlive = 15 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Server{
		cfg: cfg, log: cfg.Logger.With("component", "serve"),
		eos: append([]int(nil), cfg.EOS...), bos: tokenizer.BOS(cfg.Tokenizer),
		slots: make(chan struct{}, cfg.MaxBatch), turn: make(chan struct{}, 1),
		hosts: map[string]bool{}, origins: map[string]bool{},
	}
	for _, h := range cfg.AllowedHosts {
		h = normalHost(h)
		if ip := net.ParseIP(h); ip != nil && ip.IsUnspecified() || h == "" {
			s.anyIP = true
			continue
		}
		s.hosts[h] = true
	}
	for _, o := range cfg.CORSOrigins {
		s.origins[strings.TrimSuffix(o, "/")] = true
	}
	var err error
	if s.metrics, err = newServeMetrics(cfg.Metrics, cfg.Job); err != nil {
		return nil, err
	}
	if e := cfg.Tokenizer.EOS(); e >= 0 && !contains(s.eos, e) {
		s.eos = append(s.eos, e)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/completions", s.only(http.MethodPost, s.completions))
	mux.HandleFunc("/v1/chat/completions", s.only(http.MethodPost, s.chat))
	mux.HandleFunc("/v1/models", s.only(http.MethodGet, s.models))
	mux.HandleFunc("/v1/models/{id}", s.only(http.MethodGet, s.model))
	mux.HandleFunc("/health", s.only(http.MethodGet, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, &apiError{status: http.StatusNotFound, Type: "invalid_request_error", CodeStr: "not_found",
			Message: fmt.Sprintf("no route %s %s; the API serves POST /v1/completions, POST /v1/chat/completions and GET /v1/models", r.Method, r.URL.Path)})
	})
	s.handler = s.metrics.count(s.guard(mux))
	return s, nil
}

func contains(ids []int, id int) bool {
	for _, v := range ids {
		if v == id {
			return true
		}
	}
	return false
}

// Handler is the API's HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Serve answers requests on l until Shutdown.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.http == nil {
		s.http = &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
	}
	hs := s.http
	s.mu.Unlock()
	err := hs.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops accepting requests and waits for those in progress
// (streams included) until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	hs := s.http
	s.mu.Unlock()
	if hs == nil {
		return nil
	}
	return hs.Shutdown(ctx)
}

func (s *Server) only(method string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method {
			w.Header().Set("Allow", method)
			s.writeError(w, &apiError{status: http.StatusMethodNotAllowed, Type: "invalid_request_error", CodeStr: "method_not_allowed",
				Message: fmt.Sprintf("%s %s is not allowed; use %s", r.Method, r.URL.Path, method)})
			return
		}
		h(w, r)
	}
}

// newSeed draws a seed for a request that gave none.
func newSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

func newID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
