package peer

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	lpeer "github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	drouting "github.com/libp2p/go-libp2p/p2p/discovery/routing"
	"github.com/libp2p/go-libp2p/p2p/host/eventbus"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	quic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// DHTPrefix is the protocol prefix of holopeer's private DHT
// (/holopeer/kad/1.0.0). It keeps holopeer nodes out of the public IPFS DHT
// and the public DHT out of ours.
const DHTPrefix = "/holopeer"

// dhtProtocol is the DHT protocol a node serves in server mode.
const dhtProtocol protocol.ID = DHTPrefix + "/kad/1.0.0"

// Version is reported in capability records; cmd/holopeer sets it.
var Version = "dev"

// ErrBootstrapUnreachable is returned by New when bootstrap peers were
// given and none could be reached.
var ErrBootstrapUnreachable = errors.New("no bootstrap peer could be reached")

// ConnType says how a peer is connected: directly (including a
// hole-punched path) or only through a relay.
type ConnType string

const (
	ConnDirect  ConnType = "direct"
	ConnRelayed ConnType = "relayed"
)

// Member is a connected peer holding a valid capability record for our
// swarm.
type Member struct {
	ID    lpeer.ID
	Addrs []ma.Multiaddr
	Conn  ConnType
	// RelayReason says why the connection is relayed rather than direct
	// (empty when direct).
	RelayReason string
	Capability  Capability
	Sealed      []byte // the signed record, to hand on
	LastSeen    time.Time

	fetched time.Time // when the record arrived
}

// Host is a running holopeer node's network presence. Its methods are safe
// for concurrent use.
type Host struct {
	// Static after New.
	cfg        config
	log        *slog.Logger
	h          host.Host
	kad        *dht.IpfsDHT
	disc       *drouting.RoutingDiscovery
	lock       *dirLock
	instance   instanceInfo
	ctx        context.Context
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	sub        event.Subscription
	nat        *natState                 // NAT traversal record; see nat.go
	lh         atomic.Pointer[host.Host] // h, for callbacks libp2p may run before New returns
	reachOut   event.Emitter             // our reachability verdicts; see reachability.go
	probeSlots chan struct{}             // probes being answered; see probe.go
	dcutrAt    atomic.Int64              // when we began to speak /libp2p/dcutr (unix ns); see direct.go

	// Wholly owned by the watchEvents goroutine.
	connState map[lpeer.ID]network.Connectedness

	// mu guards all following fields.
	mu      sync.Mutex
	members map[lpeer.ID]*Member
	fetches map[lpeer.ID]bool // capability fetches in flight
	reach   network.Reachability
	decided bool // reach holds a verdict (not just the zero value)
	mapping NATMapping
	offer   Offer
	seq     uint64
	sealed  []byte
	capab   Capability
	closed  bool
}

// New starts a node: it opens the identity, listens, joins the swarm's
// private DHT through the bootstrap peers, refuses to run beside a clone
// of itself, and starts rendezvous. Close stops it.
func New(ctx context.Context, opts ...Option) (_ *Host, err error) {
	cfg := config{set: map[string]bool{}}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if err := cfg.applyDefaults(); err != nil {
		return nil, err
	}
	n := &Host{cfg: cfg, log: cfg.log.With("component", "peer"), members: map[lpeer.ID]*Member{}, fetches: map[lpeer.ID]bool{}, offer: *cfg.offer,
		nat: newNATState(cfg.log, cfg.relayLimit), connState: map[lpeer.ID]network.Connectedness{},
		probeSlots: make(chan struct{}, maxProbesServed), mapping: MappingUnknown}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	if cfg.dataDir != "" {
		if n.lock, err = lockDataDir(cfg.dataDir); err != nil {
			return nil, err
		}
		if n.cfg.key == nil {
			if n.cfg.key, err = LoadOrCreateIdentity(cfg.dataDir); err != nil {
				return nil, err
			}
		}
	}
	if _, err := rand.Read(n.instance.ID[:]); err != nil {
		return nil, err
	}
	n.instance.Started = time.Now()
	n.ctx, n.cancel = context.WithCancel(context.Background())

	if err := checkPortsFree(cfg.listen); err != nil {
		return nil, err
	}
	// A first verdict from configuration alone, so that auto-relay, which
	// libp2p starts while the host is built, already finds relays.
	n.reach = decideReachability(n.staticEvidence()).Reachability
	if n.h, err = newLibp2pHost(n.cfg, n.natOptions()); err != nil {
		return nil, err
	}
	n.lh.Store(&n.h)
	n.h.SetStreamHandler(CapabilityProtocol, n.serveCapability)
	n.h.SetStreamHandler(instanceProtocol, n.serveInstance)
	n.h.SetStreamHandler(cloneCheckProtocol, n.serveCloneCheck)
	n.h.SetStreamHandler(ProbeProtocol, n.serveProbe)

	// Decide reachability before the DHT starts, so that a node presumed
	// private never serves the DHT, not even for a moment.
	if n.reachOut, err = n.h.EventBus().Emitter(new(event.EvtLocalReachabilityChanged), eventbus.Stateful); err != nil {
		return nil, fmt.Errorf("event bus: %w", err)
	}
	n.reevaluate()

	// The DHT follows our reachability events: server when public, client
	// when private. Unknown (nothing NATed: a LAN or loopback) serves, so a
	// swarm on one network still has DHT servers.
	mode := dht.ModeAutoServer
	if n.reachability() == network.ReachabilityPrivate {
		mode = dht.ModeAuto // starts as a client
	}
	switch *cfg.dhtMode {
	case DHTServer:
		mode = dht.ModeServer
	case DHTClient:
		mode = dht.ModeClient
	}
	n.kad, err = dht.New(n.h,
		dht.ProtocolPrefix(DHTPrefix),
		dht.Mode(mode),
		dht.DisableValues(), // the swarm shares provider records only; no unauthenticated values
		dht.BootstrapPeers(cfg.bootstrap...),
	)
	if err != nil {
		return nil, fmt.Errorf("dht: %w", err)
	}
	n.disc = drouting.NewRoutingDiscovery(n.kad)
	n.reseal()

	n.sub, err = n.h.EventBus().Subscribe([]any{
		new(event.EvtPeerIdentificationCompleted),
		new(event.EvtPeerConnectednessChanged),
		new(event.EvtLocalAddressesUpdated),
		new(event.EvtHostReachableAddrsChanged),
		new(event.EvtAutoRelayAddrsUpdated),
		new(event.EvtLocalProtocolsUpdated),
		new(event.EvtNATDeviceTypeChanged),
	})
	if err != nil {
		return nil, fmt.Errorf("event bus: %w", err)
	}
	if n.speaksDCUtR() { // registered before we subscribed
		n.dcutrAt.CompareAndSwap(0, time.Now().UnixNano())
	}
	n.wg.Add(1)
	go n.watchEvents()

	if err := n.joinBootstrap(ctx); err != nil {
		return nil, err
	}
	if err := n.checkClones(ctx); err != nil {
		return nil, err
	}
	if err := n.kad.Bootstrap(n.ctx); err != nil {
		return nil, fmt.Errorf("dht bootstrap: %w", err)
	}
	n.wg.Add(2)
	go n.rendezvousLoop()
	go n.directPathKeeper()
	n.log.Info("node started", "peer", n.h.ID(), "swarm", cfg.swarm, "addrs", n.Addrs(), "reachability", reachString(n.reachability()), "dht", n.DHTMode())
	return n, nil
}

func newLibp2pHost(cfg config, natOpts []libp2p.Option) (host.Host, error) {
	cm, err := connmgr.NewConnManager(cfg.connLow, cfg.connHigh, connmgr.WithGracePeriod(time.Minute))
	if err != nil {
		return nil, fmt.Errorf("connection manager: %w", err)
	}
	limits := rcmgr.DefaultLimits
	libp2p.SetDefaultServiceLimits(&limits)
	// Explicit caps on top of the memory-scaled defaults: a node lends
	// spare capacity and must not let the network take all of it.
	caps := rcmgr.PartialLimitConfig{
		System: rcmgr.ResourceLimits{
			Conns:         rcmgr.LimitVal(cfg.maxConns),
			ConnsInbound:  rcmgr.LimitVal(cfg.maxConns / 2),
			ConnsOutbound: rcmgr.LimitVal(cfg.maxConns),
			Streams:       rcmgr.LimitVal(16 * cfg.maxConns),
		},
	}
	rm, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(caps.Build(limits.AutoScale())))
	if err != nil {
		return nil, fmt.Errorf("resource manager: %w", err)
	}
	opts := []libp2p.Option{
		libp2p.Identity(cfg.key),
		libp2p.ListenAddrs(cfg.listen...),
		libp2p.Transport(tcp.NewTCPTransport),
		libp2p.Transport(quic.NewTransport),
		// TLS first, as libp2p's own default: its AES-GCM runs on the CPU's
		// AES instructions, and stage links already pay for ChaCha20 once
		// in their own Noise session on top.
		libp2p.Security(libp2ptls.ID, libp2ptls.New),
		libp2p.Security(noise.ID, noise.New),
		libp2p.Muxer(yamux.ID, yamux.DefaultTransport),
		libp2p.ConnectionManager(cm),
		libp2p.ResourceManager(rm),
		libp2p.UserAgent("holopeer/" + Version),
		libp2p.DisableMetrics(), // the node exports its own metrics; many hosts may share a process in tests
	}
	opts = append(opts, natOpts...)
	opts = append(opts, cfg.extra...)
	h, err := libp2p.New(opts...)
	if err != nil {
		return nil, listenError(err)
	}
	return h, nil
}

// joinBootstrap connects to the bootstrap peers in parallel. It fails only
// when peers were given and none answered.
func (n *Host) joinBootstrap(ctx context.Context) error {
	boot := n.cfg.bootstrap
	if len(boot) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, n.cfg.bootTO)
	defer cancel()
	errs := make([]error, len(boot))
	var wg sync.WaitGroup
	for i, ai := range boot {
		if ai.ID == n.h.ID() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.h.Connect(ctx, ai); err != nil {
				errs[i] = fmt.Errorf("%s: %w", ai.ID, err)
				n.log.Warn("bootstrap peer unreachable", "peer", ai.ID, "addrs", ai.Addrs, "err", err)
				return
			}
			n.h.ConnManager().Protect(ai.ID, "bootstrap")
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err == nil {
			return nil
		}
	}
	return fmt.Errorf("%w (tried %d; first: %v); check the --bootstrap address and that that node is running", ErrBootstrapUnreachable, len(boot), errs[0])
}

// ID is the node's peer ID.
func (n *Host) ID() lpeer.ID { return n.h.ID() }

// Libp2p exposes the underlying host for protocols built on top (gossip,
// the stage wire).
func (n *Host) Libp2p() host.Host { return n.h }

// DHT exposes the swarm's private DHT.
func (n *Host) DHT() *dht.IpfsDHT { return n.kad }

// Swarm is the swarm name.
func (n *Host) Swarm() string { return n.cfg.swarm }

// PrivateKey is the identity key (for signing records and the stage
// handshake).
func (n *Host) PrivateKey() crypto.PrivKey { return n.cfg.key }

// Addrs returns the node's dialable addresses with its /p2p/ID suffix.
func (n *Host) Addrs() []ma.Multiaddr {
	p2p, _ := ma.NewComponent("p2p", n.h.ID().String())
	var out []ma.Multiaddr
	for _, a := range n.h.Addrs() {
		out = append(out, a.Encapsulate(p2p.Multiaddr()))
	}
	return out
}

// Reachability is what the node has learned about being dialable from
// outside: public, private or unknown.
func (n *Host) Reachability() string { return reachString(n.reachability()) }

func (n *Host) reachability() network.Reachability {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.reach
}

func reachString(r network.Reachability) string {
	switch r {
	case network.ReachabilityPublic:
		return "public"
	case network.ReachabilityPrivate:
		return "private"
	}
	return "unknown"
}

// ConnTypeTo says how we are connected to p now ("" when not connected).
func (n *Host) ConnTypeTo(p lpeer.ID) ConnType {
	conns := n.h.Network().ConnsToPeer(p)
	if len(conns) == 0 {
		return ""
	}
	for _, c := range conns {
		if !c.Stat().Limited && !isRelayAddr(c.RemoteMultiaddr()) {
			return ConnDirect
		}
	}
	return ConnRelayed
}

func isRelayAddr(a ma.Multiaddr) bool {
	_, err := a.ValueForProtocol(ma.P_CIRCUIT)
	return err == nil
}

// Members returns the connected members of the swarm, sorted by peer ID.
func (n *Host) Members() []Member {
	n.mu.Lock()
	ids := make([]lpeer.ID, 0, len(n.members))
	for id := range n.members {
		ids = append(ids, id)
	}
	n.mu.Unlock()
	var out []Member
	var ownMapping map[string]NATMapping
	for _, id := range ids {
		ct := n.ConnTypeTo(id)
		if ct == "" {
			continue
		}
		n.mu.Lock()
		m, ok := n.members[id]
		var cp Member
		if ok {
			cp = *m
		}
		n.mu.Unlock()
		if !ok {
			continue
		}
		cp.Conn = ct
		cp.Addrs = n.h.Peerstore().Addrs(id)
		if ct == ConnRelayed {
			if ownMapping == nil {
				ownMapping = n.ownMapping()
			}
			cp.RelayReason = n.nat.relayReason(id, ownMapping, cp.Capability.NATMapping, n.havePunchAddr())
		}
		out = append(out, cp)
	}
	slices.SortFunc(out, func(a, b Member) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return out
}

// Capability returns the node's own current capability record.
func (n *Host) Capability() (Capability, []byte) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.capab, n.sealed
}

// SetOffer replaces what the node lends and re-signs its record.
func (n *Host) SetOffer(o Offer) {
	n.mu.Lock()
	n.offer = o
	n.mu.Unlock()
	n.reseal()
}

// AddMember records a capability learned elsewhere (for example from
// gossip presence). The record must verify and be for our swarm.
func (n *Host) AddMember(sealed []byte) error {
	c, err := OpenCapability(sealed)
	if err != nil {
		return err
	}
	return n.storeMember(c, sealed)
}

func (n *Host) storeMember(c Capability, sealed []byte) error {
	if c.Swarm != n.cfg.swarm {
		return fmt.Errorf("capability of %s is for swarm %q, not %q", c.PeerID, c.Swarm, n.cfg.swarm)
	}
	id, err := lpeer.Decode(c.PeerID)
	if err != nil {
		return fmt.Errorf("capability peer id: %w", err)
	}
	if id == n.h.ID() {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if old, ok := n.members[id]; ok && old.Capability.Seq > c.Seq {
		return nil // an older record arrived late
	}
	n.members[id] = &Member{ID: id, Capability: c, Sealed: sealed, LastSeen: time.Now(), fetched: time.Now()}
	return nil
}

// reseal signs a fresh capability record from the current offer and
// reachability.
func (n *Host) reseal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	// Seq must grow across restarts too, so it follows the clock and never
	// goes backwards within a process.
	seq := uint64(time.Now().UnixNano())
	if seq <= n.seq {
		seq = n.seq + 1
	}
	n.seq = seq
	o := n.offer
	c := Capability{
		PeerID:       n.h.ID().String(),
		Swarm:        n.cfg.swarm,
		Seq:          seq,
		IssuedAt:     time.Now().UTC(),
		Version:      Version,
		Platform:     runtime.GOOS + "/" + runtime.GOARCH,
		Backend:      o.Backend,
		CPUs:         o.CPUs,
		MemoryBytes:  o.MemoryBytes,
		GFLOPS:       o.GFLOPS,
		Hours:        o.Hours,
		TEE:          o.TEE,
		CanAttest:    o.CanAttest,
		Reachability: reachString(n.reach),
		Relayed:      n.reach == network.ReachabilityPrivate && n.noDirectPublicAddr(),
		APIAddr:      o.APIAddr,
	}
	if n.reach == network.ReachabilityPrivate {
		c.NATMapping = string(n.mapping)
		if c.NATMapping == "" {
			c.NATMapping = string(MappingUnknown)
		}
	}
	if c.Backend == "" {
		c.Backend = "cpu"
	}
	sealed, err := SealCapability(c, n.cfg.key)
	if err != nil {
		n.log.Error("cannot sign capability record", "err", err)
		return
	}
	n.capab, n.sealed = c, sealed
}

// noDirectPublicAddr reports whether nobody can dial the node directly:
// it advertises no public address other than relay circuits. Together
// with private reachability this is what Capability.Relayed means; it
// holds from start-up, before a relay reservation exists.
func (n *Host) noDirectPublicAddr() bool {
	return !directDialable(n.h.Addrs())
}

func (n *Host) watchEvents() {
	defer n.wg.Done()
	for {
		select {
		case <-n.ctx.Done():
			return
		case e, ok := <-n.sub.Out():
			if !ok {
				return
			}
			switch ev := e.(type) {
			case event.EvtPeerIdentificationCompleted:
				if slices.Contains(ev.Protocols, CapabilityProtocol) {
					n.fetchCapabilityAsync(ev.Peer)
				}
				if n.recordObservation(ev) {
					n.reevaluate()
				}
			case event.EvtPeerConnectednessChanged:
				n.logConnChange(ev)
				if ev.Connectedness == network.Connected {
					n.reevaluate() // a peer at a public address is evidence
				}
			case event.EvtLocalAddressesUpdated, event.EvtHostReachableAddrsChanged:
				n.reevaluate()
				n.reseal() // Relayed follows our addresses
			case event.EvtAutoRelayAddrsUpdated:
				if n.nat.setRelays(ev.RelayAddrs) {
					n.nat.log.Info("relay reservations", "relays", relayIDs(ev.RelayAddrs), "addrs", len(ev.RelayAddrs))
				}
			case event.EvtLocalProtocolsUpdated:
				if slices.Contains(ev.Added, dhtProtocol) {
					n.nat.log.Info("DHT mode", "mode", "server")
				}
				if slices.Contains(ev.Removed, dhtProtocol) {
					n.nat.log.Info("DHT mode", "mode", "client")
				}
				if slices.Contains(ev.Added, holepunch.Protocol) {
					n.dcutrAt.Store(time.Now().UnixNano())
					n.nat.log.Info("hole punching ready (a peer observed a public address of ours)")
				}
			case event.EvtNATDeviceTypeChanged:
				n.nat.log.Info("libp2p classified the NAT", "transport", ev.TransportProtocol.String(), "type", ev.NatDeviceType.String())
			}
		}
	}
}

// logConnChange logs when a peer's connection becomes relayed or direct,
// the facts an operator asks about first.
func (n *Host) logConnChange(ev event.EvtPeerConnectednessChanged) {
	prev := n.connState[ev.Peer]
	switch ev.Connectedness {
	case network.NotConnected:
		delete(n.connState, ev.Peer)
		n.log.Debug("peer disconnected", "peer", ev.Peer)
		return
	case network.Limited:
		n.log.Info("peer connected through a relay", "peer", ev.Peer)
	case network.Connected:
		if prev == network.Limited {
			n.log.Info("direct connection to a peer that was relayed", "peer", ev.Peer, "addr", n.directAddr(ev.Peer))
		}
	}
	n.connState[ev.Peer] = ev.Connectedness
}

func (n *Host) directAddr(p lpeer.ID) string {
	for _, c := range n.h.Network().ConnsToPeer(p) {
		if !c.Stat().Limited && !isRelayAddr(c.RemoteMultiaddr()) {
			return c.RemoteMultiaddr().String()
		}
	}
	return ""
}

// recordObservation keeps identify's view of our address on a direct
// connection. It reports whether the view is new evidence.
func (n *Host) recordObservation(ev event.EvtPeerIdentificationCompleted) bool {
	if ev.Conn == nil || ev.ObservedAddr == nil || ev.Conn.Stat().Limited || isRelayAddr(ev.Conn.RemoteMultiaddr()) {
		return false
	}
	n.nat.observe(observation{Local: ev.Conn.LocalMultiaddr(), Observer: ev.Conn.RemoteMultiaddr(), Observed: ev.ObservedAddr, At: time.Now()})
	m := overallMapping(n.ownMapping())
	n.mu.Lock()
	changed := m != n.mapping
	n.mapping = m
	n.mu.Unlock()
	if changed {
		n.nat.log.Info("NAT mapping", "mapping", m, "detail", mappingWords(n.ownMapping()))
		n.reseal()
	}
	return true
}

func (n *Host) ownAddrs() []ma.Multiaddr {
	own, _ := n.h.Network().InterfaceListenAddresses()
	return own
}

func (n *Host) ownMapping() map[string]NATMapping { return n.nat.mapping(n.ownAddrs()) }

// havePunchAddr reports whether we have a public address to hole-punch
// from: one of our own, or one a peer observed.
func (n *Host) havePunchAddr() bool {
	if anyPublic(n.ownAddrs()) {
		return true
	}
	for _, o := range n.nat.observations() {
		if manet.IsPublicAddr(o.Observed) {
			return true
		}
	}
	return false
}

// staticEvidence is what is known before the host runs: configuration
// and the interface addresses we are about to listen on.
func (n *Host) staticEvidence() reachEvidence {
	e := reachEvidence{Forced: n.cfg.reachability, Announced: n.cfg.announce}
	if ifaces, err := manet.InterfaceMultiaddrs(); err == nil {
		e.Own, _ = manet.ResolveUnspecifiedAddresses(n.cfg.listen, ifaces)
	}
	for _, ai := range n.cfg.bootstrap {
		e.PublicPeers = e.PublicPeers || anyPublic(ai.Addrs)
	}
	return e
}

// evidence gathers what reachability is decided on (reachability.go).
func (n *Host) evidence() reachEvidence {
	e := reachEvidence{
		Forced:    n.cfg.reachability,
		Announced: n.cfg.announce,
		Own:       n.ownAddrs(),
		Mapped:    n.nat.ports.mapped(),
		Observed:  n.nat.observations(),
	}
	n.nat.noteMapped(e.Mapped)
	if ch, ok := n.h.(interface {
		ConfirmedAddrs() (reachable, unreachable, unknown []ma.Multiaddr)
	}); ok {
		e.Reachable, e.Unreachable, _ = ch.ConfirmedAddrs()
	}
	for _, ai := range n.cfg.bootstrap {
		e.PublicPeers = e.PublicPeers || anyPublic(ai.Addrs)
	}
	if !e.PublicPeers {
		for _, c := range n.h.Network().Conns() {
			if !c.Stat().Limited && manet.IsPublicAddr(c.RemoteMultiaddr()) {
				e.PublicPeers = true
				break
			}
		}
	}
	return e
}

// reevaluate decides reachability again and, when it changed, tells
// libp2p (relay service, auto-relay, DHT mode) and re-signs our record.
func (n *Host) reevaluate() {
	v := decideReachability(n.evidence())
	n.mu.Lock()
	changed := !n.decided || v.Reachability != n.reach
	n.decided, n.reach = true, v.Reachability
	n.mu.Unlock()
	if n.nat.setVerdict(v) && !changed {
		n.nat.log.Debug("reachability evidence", "reachability", reachString(v.Reachability), "reason", v.Reason)
	}
	if !changed {
		return
	}
	n.nat.log.Info("reachability", "reachability", reachString(v.Reachability), "reason", v.Reason)
	if err := n.reachOut.Emit(event.EvtLocalReachabilityChanged{Reachability: v.Reachability}); err != nil {
		n.log.Warn("cannot announce reachability", "err", err)
	}
	n.reseal()
}

// DHTMode says whether the node serves the swarm's DHT now: "server" or
// "client".
func (n *Host) DHTMode() string {
	if slices.Contains(n.h.Mux().Protocols(), dhtProtocol) {
		return "server"
	}
	return "client"
}

// Close stops rendezvous, leaves the network and releases the data dir.
// It is safe to call more than once.
func (n *Host) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.mu.Unlock()
	if n.cancel != nil {
		n.cancel()
	}
	if n.sub != nil {
		n.sub.Close()
	}
	if n.reachOut != nil {
		n.reachOut.Close()
	}
	var errs []error
	if n.kad != nil {
		errs = append(errs, n.kad.Close())
	}
	if n.h != nil {
		errs = append(errs, n.h.Close())
	}
	n.wg.Wait()
	n.lock.release()
	return errors.Join(errs...)
}
