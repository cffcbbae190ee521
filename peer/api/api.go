// Package api is a node's local control API: an HTTP server on loopback
// that `holopeer status`, tests and the dashboard read, and a client for
// it. The JSON field names are a contract: tools read them.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
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
	Reachability string       `json:"reachability"` // public | private | unknown
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
	Relays     []string         `json:"relays,omitempty"`
	HolePunch  []HolePunchEvent `json:"hole_punch,omitempty"`
	PortMapped []string         `json:"port_mapped,omitempty"`
}

// HolePunchEvent is one hole-punch attempt and its outcome.
type HolePunchEvent struct {
	Peer    string    `json:"peer"`
	At      time.Time `json:"at"`
	Success bool      `json:"success"`
	Error   string    `json:"error,omitempty"`
	Elapsed string    `json:"elapsed,omitempty"`
}

// Server serves the control API. Routes beyond /v1/status are added with
// Handle before Start.
type Server struct {
	mux    *http.ServeMux
	status func() Status
	log    *slog.Logger
	srv    *http.Server
	ln     net.Listener
}

// NewServer builds a server whose /v1/status returns status().
func NewServer(status func() Status, log *slog.Logger) *Server {
	s := &Server{mux: http.NewServeMux(), status: status, log: log}
	s.mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusOK, s.status())
	})
	return s
}

// Handle adds a route.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Start listens on addr and serves in the background.
func (s *Server) Start(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if strings.Contains(err.Error(), "address already in use") {
			return fmt.Errorf("control API: %s is already in use; pick another with --api HOST:PORT", addr)
		}
		return fmt.Errorf("control API: %w", err)
	}
	if host, _, _ := net.SplitHostPort(addr); host != "" {
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			s.log.Warn("control API listens beyond loopback; anyone who can reach it can read node status", "addr", addr)
		}
	}
	s.ln = ln
	s.srv = &http.Server{Handler: s.mux, ReadHeaderTimeout: 5 * time.Second}
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
	Addr string
	HTTP *http.Client
}

// Status fetches /v1/status.
func (c Client) Status(ctx context.Context) (Status, error) {
	var st Status
	err := c.GetJSON(ctx, "/v1/status", &st)
	return st, err
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
	body := io.LimitReader(resp.Body, 16<<20)
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(body, 512))
		return fmt.Errorf("control API %s: %s: %s", path, resp.Status, strings.TrimSpace(string(b)))
	}
	if err := json.NewDecoder(body).Decode(v); err != nil {
		return fmt.Errorf("control API %s: bad JSON: %w", path, err)
	}
	return nil
}
