// Package node assembles a running holopeer daemon from its parts: the
// network presence (peer.Host), the control API, and the services that
// later issues add (gossip and election, stage work, the dashboard). It is
// what `holopeer up` runs and what in-process swarm tests start.
package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime"
	"sync"
	"time"

	lpeer "github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/holopeer/holopeer/gossip"
	"github.com/holopeer/holopeer/gossip/coord"
	hpeer "github.com/holopeer/holopeer/peer"
	"github.com/holopeer/holopeer/peer/api"
	"github.com/holopeer/holopeer/peer/dashboard"
	"github.com/holopeer/holopeer/peer/ledger"
	"github.com/holopeer/holopeer/peer/metrics"
	"github.com/holopeer/holopeer/stage/pipeline"
	"github.com/holopeer/holopeer/stage/tensor"
)

// Config describes one node. Zero values take the documented defaults.
type Config struct {
	DataDir   string           // identity and lock; required
	Swarm     string           // swarm name; required
	Listen    []ma.Multiaddr   // default TCP and QUIC on ephemeral ports
	Bootstrap []lpeer.AddrInfo // peers to join through; none for the first node
	API       string           // control API address; default api.DefaultAddr, "" keeps default, "off" disables
	Offer     hpeer.Offer      // what the node lends
	Logger    *slog.Logger     // default slog.Default()
	PeerOpts  []hpeer.Option   // extra options for the host (NAT traversal, tests)
	Clock     func() time.Time // default time.Now

	// TEE is how the node attests for the coordinator election: auto, snp,
	// tdx, sim or none (default none: it votes and computes, never stands).
	TEE string
	// AllowSim makes the node accept sim (INSECURE) evidence: testnets only.
	AllowSim bool
	// TEEPolicy is a JSON tee.Policy file (allowed measurements, minimum
	// TCB) for real SNP/TDX coordinators; empty accepts none of them.
	TEEPolicy string
	// Backend runs this node's stages (default: the cpu backend).
	Backend tensor.Backend
	// GossipTiming overrides election and presence timing (tests).
	GossipTiming *gossip.Timing
	// Dashboard serves the web dashboard at the API address's root.
	Dashboard bool
}

func (c *Config) validate() error {
	if c.DataDir == "" {
		return errors.New("node: a data dir is required (--data-dir)")
	}
	if err := hpeer.ValidateSwarmName(c.Swarm); err != nil {
		return err
	}
	if c.API == "" {
		c.API = api.DefaultAddr
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Offer.Backend == "" {
		c.Offer.Backend = "cpu"
	}
	if c.Offer.CPUs == 0 {
		c.Offer.CPUs = runtime.GOMAXPROCS(0)
	}
	if c.TEE == "" {
		c.TEE = "none"
	}
	if c.Offer.TEE == "" {
		c.Offer.TEE = c.TEE
	}
	c.Offer.CanAttest = c.TEE != "none"
	if c.Offer.Hours == "" {
		c.Offer.Hours = "always"
	}
	return nil
}

// Node is a running daemon.
type Node struct {
	cfg      Config
	log      *slog.Logger
	host     *hpeer.Host
	api      *api.Server
	gossip   *gossip.Service
	coord    *coord.Service
	runtime  *pipeline.Runtime
	teeLabel string
	jobs     jobBook
	cancel   context.CancelFunc // stops the background loops below
	bg       sync.WaitGroup     // the background loops: jobs, election, presence
	ledger   *ledger.Ledger
	issuer   *ledger.Issuer
	metrics  *metrics.Metrics
	dash     *dashboard.Dashboard

	mu       sync.Mutex
	warnings []string
	closed   bool
}

// Start brings a node up. On error everything already started is stopped.
func Start(ctx context.Context, cfg Config) (_ *Node, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, log: cfg.Logger}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	opts := []hpeer.Option{
		hpeer.WithDataDir(cfg.DataDir),
		hpeer.WithSwarm(cfg.Swarm),
		hpeer.WithBootstrap(cfg.Bootstrap...),
		hpeer.WithLogger(cfg.Logger),
	}
	if len(cfg.Listen) > 0 {
		opts = append(opts, hpeer.WithListen(cfg.Listen...))
	}
	offer := cfg.Offer
	if cfg.API != "off" {
		offer.APIAddr = cfg.API
	}
	opts = append(opts, hpeer.WithOffer(offer))
	opts = append(opts, cfg.PeerOpts...)
	if n.host, err = hpeer.New(ctx, opts...); err != nil {
		return nil, err
	}
	if err := n.openLedger(); err != nil {
		return nil, err
	}
	if err := n.startServices(ctx); err != nil {
		return nil, err
	}
	if err := n.startReporting(); err != nil {
		return nil, err
	}
	bg, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	for _, loop := range []func(context.Context){n.followJobs, n.followElection, n.countPresence} {
		n.bg.Add(1)
		go func() {
			defer n.bg.Done()
			loop(bg)
		}()
	}
	if cfg.API != "off" {
		token, err := api.LoadOrCreateToken(cfg.DataDir)
		if err != nil {
			return nil, err
		}
		n.api = api.NewServer(n.Status, cfg.Logger, api.WithToken(token),
			api.WithRefusals(func(reason string) { n.metrics.Refused("control-api", reason) }))
		n.api.Handle("POST /v1/probe", http.HandlerFunc(n.serveProbe))
		n.api.Handle("GET /v1/jobs", http.HandlerFunc(n.serveJobs))
		n.api.Handle("GET /metrics", n.metrics.Handler())
		n.api.Handle("GET /v1/ledger/", n.ledger.Handler())
		if n.dash != nil {
			n.api.Handle("/", n.dash)
		}
		if err := n.api.Start(cfg.API); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// Logger is the node's logger.
func (n *Node) Logger() *slog.Logger { return n.log }

// Host is the node's network presence.
func (n *Node) Host() *hpeer.Host { return n.host }

// APIAddr is the address the control API listens on ("" when off).
func (n *Node) APIAddr() string {
	if n.api == nil {
		return ""
	}
	return n.api.Addr()
}

// Status is the node's current view, as served on /v1/status.
func (n *Node) Status() api.Status {
	h := n.host
	capab, _ := h.Capability()
	st := api.Status{
		PeerID:       h.ID().String(),
		Swarm:        h.Swarm(),
		Version:      hpeer.Version,
		Reachability: h.Reachability(),
		DHTMode:      h.DHTMode(),
		Backend:      capab.Backend,
		TEE:          capab.TEE,
		Peers:        []api.PeerStatus{},
	}
	for _, a := range h.Addrs() {
		st.Addrs = append(st.Addrs, a.String())
	}
	for _, m := range h.Members() {
		ps := api.PeerStatus{
			PeerID:       m.ID.String(),
			Conn:         string(m.Conn),
			Platform:     m.Capability.Platform,
			Backend:      m.Capability.Backend,
			GFLOPS:       m.Capability.GFLOPS,
			MemoryBytes:  m.Capability.MemoryBytes,
			TEE:          m.Capability.TEE,
			Reachability: m.Capability.Reachability,
			Relayed:      m.Capability.Relayed,
			NATMapping:   m.Capability.NATMapping,
			RelayReason:  m.RelayReason,
		}
		for _, a := range m.Addrs {
			ps.Addrs = append(ps.Addrs, a.String())
		}
		st.Peers = append(st.Peers, ps)
	}
	st.NAT = natStatus(h.NAT())
	st.TEE = n.teeLabel
	if c := n.gossip.Coordinator(); c != nil {
		st.Coordinator = &api.Coordinator{PeerID: c.PeerID.String(), Term: c.Term, TEE: c.TEE, Insecure: c.Insecure, LeaseExpires: c.LeaseExpires}
	}
	n.mu.Lock()
	st.Warnings = append(st.Warnings, n.warnings...)
	n.mu.Unlock()
	return st
}

func natStatus(info hpeer.NATInfo) *api.NATStatus {
	rs := info.RelayService
	st := &api.NATStatus{
		ReachabilityReason: info.Reason,
		Relays:             info.Relays,
		PortMapped:         info.PortMapped,
		RelayService: api.RelayService{
			Enabled: rs.Enabled, Refused: rs.Refused, Reservations: rs.Reservations,
			CircuitsOpen: rs.CircuitsOpen, CircuitsTotal: rs.CircuitsTotal, CircuitsDenied: rs.CircuitsDenied,
			BytesRelayed: rs.BytesRelayed, LimitBytes: rs.LimitBytes, LimitDuration: rs.LimitDuration.String(),
		},
	}
	if len(info.Mapping) > 0 {
		st.Mapping = map[string]string{}
		for tr, m := range info.Mapping {
			st.Mapping[tr] = string(m)
		}
	}
	for _, o := range info.Observed {
		st.Observed = append(st.Observed, api.ObservedAddr{Observer: o.Observer, Observed: o.Observed, Local: o.Local, At: o.At})
	}
	for _, e := range info.HolePunches {
		ev := api.HolePunchEvent{Peer: e.Peer.String(), At: e.At, Kind: e.Kind, Attempt: e.Attempt, Success: e.Success, Error: e.Error, Addrs: e.Addrs}
		if e.Elapsed > 0 {
			ev.Elapsed = e.Elapsed.Round(time.Millisecond).String()
		}
		st.HolePunch = append(st.HolePunch, ev)
	}
	for _, p := range info.DHTPeers {
		st.DHTPeers = append(st.DHTPeers, p.String())
	}
	return st
}

// serveProbe runs a connectivity probe to a peer (POST /v1/probe).
func (n *Node) serveProbe(w http.ResponseWriter, r *http.Request) {
	var req api.ProbeRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<10)).Decode(&req); err != nil {
		api.WriteJSON(w, http.StatusBadRequest, api.ErrorReply{Error: "probe request: " + err.Error()})
		return
	}
	p, err := lpeer.Decode(req.Peer)
	if err != nil {
		api.WriteJSON(w, http.StatusBadRequest, api.ErrorReply{Error: fmt.Sprintf("probe: peer %q is not a peer id: %v", req.Peer, err)})
		return
	}
	opts := hpeer.ProbeOptions{Bytes: req.Bytes, DirectOnly: req.DirectOnly}
	if req.Timeout != "" {
		if opts.Timeout, err = time.ParseDuration(req.Timeout); err != nil || opts.Timeout <= 0 {
			api.WriteJSON(w, http.StatusBadRequest, api.ErrorReply{Error: fmt.Sprintf("probe: timeout %q is not a positive duration such as 30s", req.Timeout)})
			return
		}
	}
	res, err := n.host.Probe(r.Context(), p, opts)
	if err != nil {
		api.WriteJSON(w, http.StatusBadGateway, api.ErrorReply{Error: err.Error()})
		return
	}
	api.WriteJSON(w, http.StatusOK, api.ProbeResult{
		Peer: res.Peer.String(), Bytes: res.Bytes, SHA256: res.SHA256,
		Elapsed: res.Elapsed.Round(time.Millisecond).String(), Seconds: res.Elapsed.Seconds(), MiBps: res.MiBps(),
		Conn: string(res.Conn), RemoteAddr: res.RemoteAddr,
	})
}

// Close stops the node: the API first (so no one reads a half-closed
// node), then the host.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.mu.Unlock()
	var errs []error
	if n.api != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		errs = append(errs, n.api.Close(ctx))
		cancel()
	}
	if n.cancel != nil {
		n.cancel()
	}
	n.bg.Wait() // before the ledger they write to closes
	errs = append(errs, n.closeReporting())
	if n.runtime != nil {
		errs = append(errs, n.runtime.Close())
	}
	if n.coord != nil {
		errs = append(errs, n.coord.Close())
	}
	if n.gossip != nil {
		errs = append(errs, n.gossip.Close())
	}
	if n.host != nil {
		errs = append(errs, n.host.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("node close: %w", err)
	}
	return nil
}
