// Package api is a node's local control API: an HTTP server on loopback
// that `holopeer status`, tests and the dashboard read, and a client for
// it. The JSON field names are a contract: tools read them.
package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// DefaultAddr is where a node serves its API unless told otherwise.
const DefaultAddr = "127.0.0.1:7601"

// Status is a node's view of itself and the swarm.
type Status struct {
	PeerID       string       `json:"peer_id"`
	Swarm        string       `json:"swarm"`
	Version      string       `json:"version"`
	Addrs        []string     `json:"addrs"`
	Reachability string       `json:"reachability"`       // public | private | unknown
	DHTMode      string       `json:"dht_mode,omitempty"` // server | client
	Backend      string       `json:"backend"`
	TEE          string       `json:"tee"`
	Peers        []PeerStatus `json:"peers"`
	Coordinator  *Coordinator `json:"coordinator"` // null until a coordinator is followed
	NAT          *NATStatus   `json:"nat,omitempty"`
	Warnings     []string     `json:"warnings,omitempty"`
}

// PeerStatus is one connected swarm member as this node sees it.
type PeerStatus struct {
	PeerID       string   `json:"peer_id"`
	Addrs        []string `json:"addrs"`
	Conn         string   `json:"conn"` // direct | relayed
	Platform     string   `json:"platform,omitempty"`
	Backend      string   `json:"backend,omitempty"`
	GFLOPS       float64  `json:"gflops,omitempty"`
	MemoryBytes  uint64   `json:"memory_bytes,omitempty"`
	TEE          string   `json:"tee,omitempty"`
	Reachability string   `json:"reachability,omitempty"`
	Relayed      bool     `json:"relayed,omitempty"`
	NATMapping   string   `json:"nat_mapping,omitempty"`  // the peer's own NAT, from its record
	RelayReason  string   `json:"relay_reason,omitempty"` // why conn is relayed, not direct
}

// Coordinator is the coordinator this node follows.
type Coordinator struct {
	PeerID       string    `json:"peer_id"`
	Term         uint64    `json:"term"`
	TEE          string    `json:"tee"`
	Insecure     bool      `json:"insecure"` // true for the sim provider: testnets only
	LeaseExpires time.Time `json:"lease_expires"`
}

// NATStatus reports what the node knows about its own connectivity.
type NATStatus struct {
	ReachabilityReason string            `json:"reachability_reason"`   // the evidence behind reachability
	Mapping            map[string]string `json:"mapping,omitempty"`     // per transport: endpoint-independent | endpoint-dependent | unknown
	Observed           []ObservedAddr    `json:"observed,omitempty"`    // how peers see this node
	Relays             []string          `json:"relays,omitempty"`      // relay (circuit) addresses: reservations held
	RelayService       RelayService      `json:"relay_service"`         // this node as a relay
	HolePunch          []HolePunchEvent  `json:"hole_punch,omitempty"`  // latest first
	PortMapped         []string          `json:"port_mapped,omitempty"` // UPnP/NAT-PMP mappings granted
	DHTPeers           []string          `json:"dht_peers,omitempty"`   // the DHT routing table
}

// ObservedAddr is how one peer sees this node.
type ObservedAddr struct {
	Observer string    `json:"observer"`
	Observed string    `json:"observed"`
	Local    string    `json:"local"`
	At       time.Time `json:"at"`
}

// RelayService counts what the node's circuit relay service did.
type RelayService struct {
	Enabled        bool   `json:"enabled"`
	Refused        bool   `json:"refused,omitempty"` // --relay=false
	Reservations   int64  `json:"reservations"`
	CircuitsOpen   int64  `json:"circuits_open"`
	CircuitsTotal  uint64 `json:"circuits_total"`
	CircuitsDenied uint64 `json:"circuits_denied,omitempty"`
	BytesRelayed   uint64 `json:"bytes_relayed"`
	LimitBytes     int64  `json:"limit_bytes"`    // per relayed connection and direction
	LimitDuration  string `json:"limit_duration"` // per relayed connection
}

// HolePunchEvent is one hole-punch step and its outcome.
type HolePunchEvent struct {
	Peer    string    `json:"peer"`
	At      time.Time `json:"at"`
	Kind    string    `json:"kind"`              // attempt | direct-dial | protocol-error
	Attempt int       `json:"attempt,omitempty"` // failures in a row with this peer
	Success bool      `json:"success"`
	Error   string    `json:"error,omitempty"`
	Elapsed string    `json:"elapsed,omitempty"`
	Addrs   []string  `json:"addrs,omitempty"` // where it punched to
}

// ProbeRequest asks the node to send a payload to a peer and check it
// arrived intact (POST /v1/probe).
type ProbeRequest struct {
	Peer       string `json:"peer"`
	Bytes      int64  `json:"bytes"`                 // default 16 MiB
	DirectOnly bool   `json:"direct_only,omitempty"` // never cross a relay
	Timeout    string `json:"timeout,omitempty"`     // Go duration; default 2m
}

// ProbeResult is what a probe measured.
type ProbeResult struct {
	Peer       string  `json:"peer"`
	Bytes      int64   `json:"bytes"`
	SHA256     string  `json:"sha256"`
	Elapsed    string  `json:"elapsed"`
	Seconds    float64 `json:"seconds"`
	MiBps      float64 `json:"mib_per_s"`
	Conn       string  `json:"conn"` // direct | relayed
	RemoteAddr string  `json:"remote_addr"`
}

// Server serves the control API. Routes beyond /v1/status are added with
// Handle before Start. Every request passes guard first.
type Server struct {
	mux      *http.ServeMux
	status   func() Status
	log      *slog.Logger
	token    string
	refusals func(reason string)
	srv      *http.Server
	ln       net.Listener

	mu    sync.Mutex // guards hosts and anyIP (Start adds the listen host)
	hosts map[string]bool
	anyIP bool
}

// Option configures a Server.
type Option func(*Server)

// WithToken sets the token that state-changing requests (every method
// but GET, HEAD and OPTIONS) must carry as Authorization: Bearer. Without
// one the server refuses them all.
func WithToken(token string) Option { return func(s *Server) { s.token = token } }

// WithAllowedHosts adds Host names the server answers to besides loopback
// and the host it listens on (a DNS name or a proxy's).
func WithAllowedHosts(hosts ...string) Option {
	return func(s *Server) {
		for _, h := range hosts {
			if h = normalHost(h); h != "" {
				s.hosts[h] = true
			}
		}
	}
}

// WithRefusals calls f with the reason (RefusedHost …) of every request
// the guard refuses, for the node's refusal metric. f must not block.
func WithRefusals(f func(reason string)) Option { return func(s *Server) { s.refusals = f } }

// NewServer builds a server whose /v1/status returns status().
func NewServer(status func() Status, log *slog.Logger, opts ...Option) *Server {
	s := &Server{mux: http.NewServeMux(), status: status, log: log, hosts: map[string]bool{}}
	for _, o := range opts {
		o(s)
	}
	s.mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusOK, s.status())
	})
	return s
}

// Handle adds a route.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Handler is every route behind the guard: what Start serves.
func (s *Server) Handler() http.Handler { return s.guard(s.mux) }

// Start listens on addr and serves in the background.
func (s *Server) Start(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if strings.Contains(err.Error(), "address already in use") {
			return fmt.Errorf("control API: %s is already in use; pick another with --api HOST:PORT", addr)
		}
		return fmt.Errorf("control API: %w", err)
	}
	host, _, _ := net.SplitHostPort(addr)
	s.mu.Lock()
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		s.anyIP = true
	} else if h := normalHost(host); h != "" {
		s.hosts[h] = true
	}
	s.mu.Unlock()
	if ip := net.ParseIP(host); host == "" || ip == nil || !ip.IsLoopback() {
		if host != "localhost" {
			s.log.Warn("control API listens beyond loopback; anyone who can reach it can read node status", "addr", addr)
		}
	}
	s.ln = ln
	s.srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second, MaxHeaderBytes: 64 << 10}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("control API stopped", "err", err)
		}
	}()
	return nil
}

// Addr is the address the server listens on (after Start).
func (s *Server) Addr() string {
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Close shuts the server down, waiting up to ctx for requests in flight.
func (s *Server) Close(ctx context.Context) error {
	if s.srv == nil {
		return nil
	}
	return s.srv.Shutdown(ctx)
}

// WriteJSON writes v as JSON with the given status code.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// Client reads a node's control API.
type Client struct {
	Addr  string
	HTTP  *http.Client
	Token string // the node's API token (ReadToken): needed by Probe and other POSTs
}

// Status fetches /v1/status.
func (c Client) Status(ctx context.Context) (Status, error) {
	var st Status
	err := c.GetJSON(ctx, "/v1/status", &st)
	return st, err
}

// Probe asks the node to probe a peer (POST /v1/probe). The HTTP timeout
// follows the probe's own.
func (c Client) Probe(ctx context.Context, req ProbeRequest) (ProbeResult, error) {
	var res ProbeResult
	err := c.PostJSON(ctx, "/v1/probe", req, &res)
	return res, err
}

// PostJSON posts in as JSON to path and decodes the JSON reply into out.
func (c Client) PostJSON(ctx context.Context, path string, in, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{} // bounded by ctx: a probe may take minutes
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+c.Addr+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the node's control API at %s (is `holopeer up` running with --api %s?): %w", c.Addr, c.Addr, err)
	}
	defer resp.Body.Close()
	return decodeReply(resp, path, out)
}

// ErrorReply is the body of a failed API call.
type ErrorReply struct {
	Error string `json:"error"`
}

func decodeReply(resp *http.Response, path string, v any) error {
	body := io.LimitReader(resp.Body, 16<<20)
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(body, 4096))
		var e ErrorReply
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			return fmt.Errorf("%s", e.Error)
		}
		return fmt.Errorf("control API %s: %s: %s", path, resp.Status, strings.TrimSpace(string(b)))
	}
	if err := json.NewDecoder(body).Decode(v); err != nil {
		return fmt.Errorf("control API %s: bad JSON: %w", path, err)
	}
	return nil
}

// GetJSON fetches path and decodes the JSON body into v (at most 16 MiB).
func (c Client) GetJSON(ctx context.Context, path string, v any) error {
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Second}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.Addr+path, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the node's control API at %s (is `holopeer up` running with --api %s?): %w", c.Addr, c.Addr, err)
	}
	defer resp.Body.Close()
	return decodeReply(resp, path, v)
}
