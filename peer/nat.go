package peer

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p"
	lpconfig "github.com/libp2p/go-libp2p/config"
	"github.com/libp2p/go-libp2p/core/network"
	lpeer "github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/host/autorelay"
	bhost "github.com/libp2p/go-libp2p/p2p/host/basic"
	pbv2 "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/pb"
	circuitproto "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/proto"
	relayv2 "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// NAT traversal: how a node behind a home router becomes reachable.
//
//   - Reachability is decided in reachability.go and announced on the
//     event bus; libp2p's relay service, auto-relay and the DHT follow it.
//   - Public nodes run a circuit relay v2 service (WithRelayService(false)
//     refuses). Its limits (DefaultRelayLimit) leave room for control
//     traffic, hole punching and a connectivity probe, not for stage data.
//     Relayed connections are "limited": a stream only crosses one when its
//     opener says so with network.WithAllowLimitedConn, so nothing pushes
//     bulk data through a relay by accident.
//   - Private nodes reserve slots on relays: static ones (WithStaticRelays),
//     their bootstrap peers, and any connected peer that serves the relay
//     protocol.
//   - DCUtR upgrades a relayed connection to a direct one by hole punching;
//     every attempt and outcome is recorded for status and logged.
//   - UPnP/NAT-PMP asks the home router to forward a port.
//   - The node watches how peers see it (identify) and classifies its own
//     NAT's mapping, which says why hole punching fails where it does.

// DefaultRelayLimit bounds one relayed connection on the relay service:
// 2 minutes (libp2p's default) and 32 MiB each way (libp2p's default is
// 128 KiB, too little to check a relayed path with a real payload). Stage
// data must never use a relay; the placement planner keeps relayed nodes
// off pipeline links.
var DefaultRelayLimit = relayv2.RelayLimit{Duration: 2 * time.Minute, Data: 32 << 20}

// NATMapping is how a NAT maps one local socket to public addresses for
// different destinations (RFC 4787 terms). Hole punching needs
// endpoint-independent mapping on at least one side.
type NATMapping string

const (
	MappingUnknown     NATMapping = "unknown"
	MappingIndependent NATMapping = "endpoint-independent"
	MappingDependent   NATMapping = "endpoint-dependent" // a "symmetric" NAT
)

// observation is one peer's view of our address on one direct connection
// (identify's observed address).
type observation struct {
	Local    ma.Multiaddr // our end of the connection
	Observer ma.Multiaddr // the peer's end
	Observed ma.Multiaddr // where the peer says it sees us
	At       time.Time
}

const (
	maxObservations = 64
	observationTTL  = 30 * time.Minute
	maxPunchLog     = 64
)

// endpoint reduces a multiaddr to transport, IP and port ("udp", ip, port).
func endpoint(a ma.Multiaddr) (transport string, ip net.IP, port int, ok bool) {
	ip, err := manet.ToIP(a)
	if err != nil {
		return "", nil, 0, false
	}
	for _, c := range a {
		switch c.Protocol().Code {
		case ma.P_TCP, ma.P_UDP:
			p, err := strconv.Atoi(c.Value())
			if err != nil {
				return "", nil, 0, false
			}
			return c.Protocol().Name, ip, p, true
		}
	}
	return "", nil, 0, false
}

// classifyMapping says, per transport, whether our NAT keeps one public
// address for one local socket whatever the destination (independent) or
// picks a new one per destination (dependent). It needs two observers of
// the same local socket; with fewer it says unknown. Observations where
// peers see one of our own IPs (no NAT) are left out by the caller.
func classifyMapping(obs []observation) map[string]NATMapping {
	type group struct {
		observers map[string]bool
		observed  map[string]bool
	}
	groups := map[string]*group{}
	for _, o := range obs {
		tr, lip, lport, ok := endpoint(o.Local)
		if !ok {
			continue
		}
		_, rip, rport, ok1 := endpoint(o.Observer)
		_, oip, oport, ok2 := endpoint(o.Observed)
		if !ok1 || !ok2 {
			continue
		}
		key := tr + " " + net.JoinHostPort(lip.String(), strconv.Itoa(lport))
		g := groups[key]
		if g == nil {
			g = &group{observers: map[string]bool{}, observed: map[string]bool{}}
			groups[key] = g
		}
		g.observers[net.JoinHostPort(rip.String(), strconv.Itoa(rport))] = true
		g.observed[net.JoinHostPort(oip.String(), strconv.Itoa(oport))] = true
	}
	out := map[string]NATMapping{}
	for key, g := range groups {
		tr := key[:strings.IndexByte(key, ' ')]
		if len(g.observers) < 2 {
			if _, ok := out[tr]; !ok {
				out[tr] = MappingUnknown
			}
			continue
		}
		m := MappingIndependent
		if len(g.observed) > 1 {
			m = MappingDependent
		}
		// Dependent on any socket is decisive for that transport.
		if out[tr] != MappingDependent {
			out[tr] = m
		}
	}
	return out
}

// overallMapping folds per-transport mappings into one word for the
// capability record: independent if any transport can be punched.
func overallMapping(m map[string]NATMapping) NATMapping {
	switch {
	case m["tcp"] == MappingIndependent || m["udp"] == MappingIndependent:
		return MappingIndependent
	case m["tcp"] == MappingDependent || m["udp"] == MappingDependent:
		return MappingDependent
	}
	return MappingUnknown
}

// HolePunchRecord is one hole-punch event as the node saw it.
type HolePunchRecord struct {
	Peer    lpeer.ID
	At      time.Time
	Kind    string // direct-dial | attempt | protocol-error
	Attempt int    // for attempts: the attempt number with this peer
	Success bool
	Error   string
	Elapsed time.Duration
	Addrs   []string // for attempts: the addresses punched towards
}

// punchSummary is the latest hole-punch state with one peer.
type punchSummary struct {
	active    bool
	attempts  int // attempts since the last success
	successAt time.Time
	lastErr   string
	lastAt    time.Time
	addrs     []string
}

// RelayServiceInfo counts what this node's relay service did.
type RelayServiceInfo struct {
	Enabled         bool   // the service runs (public and not refused)
	Refused         bool   // --relay=false
	Reservations    int64  // active reservations
	CircuitsOpen    int64  // relayed connections open now
	CircuitsTotal   uint64 // relayed connections opened since start
	CircuitsDenied  uint64 // circuit requests refused
	BytesRelayed    uint64 // payload bytes forwarded, both directions
	LimitBytes      int64  // per circuit and direction
	LimitDuration   time.Duration
	MaxReservations int
}

// relayStats implements relayv2.MetricsTracer with plain counters.
type relayStats struct {
	log          *slog.Logger
	enabled      atomic.Bool
	reservations atomic.Int64
	circuitsOpen atomic.Int64
	circuits     atomic.Uint64
	denied       atomic.Uint64
	bytes        atomic.Uint64
}

func (s *relayStats) RelayStatus(enabled bool) {
	s.enabled.Store(enabled)
	if s.log != nil {
		s.log.Info("relay service", "serving", enabled)
	}
}
func (s *relayStats) ConnectionOpened() { s.circuitsOpen.Add(1); s.circuits.Add(1) }
func (s *relayStats) ConnectionClosed(time.Duration) {
	s.circuitsOpen.Add(-1)
}
func (s *relayStats) ConnectionRequestHandled(st pbv2.Status) {
	if st != pbv2.Status_OK {
		s.denied.Add(1)
	}
}
func (s *relayStats) ReservationAllowed(isRenewal bool) {
	if !isRenewal {
		s.reservations.Add(1)
	}
}
func (s *relayStats) ReservationClosed(cnt int)             { s.reservations.Add(-int64(cnt)) }
func (s *relayStats) ReservationRequestHandled(pbv2.Status) {}
func (s *relayStats) BytesTransferred(cnt int)              { s.bytes.Add(uint64(cnt)) }
func (s *relayStats) snapshot(refused bool, res relayv2.Resources) RelayServiceInfo {
	return RelayServiceInfo{
		Enabled:         s.enabled.Load(),
		Refused:         refused,
		Reservations:    max(s.reservations.Load(), 0),
		CircuitsOpen:    max(s.circuitsOpen.Load(), 0),
		CircuitsTotal:   s.circuits.Load(),
		CircuitsDenied:  s.denied.Load(),
		BytesRelayed:    s.bytes.Load(),
		LimitBytes:      res.Limit.Data,
		LimitDuration:   res.Limit.Duration,
		MaxReservations: res.MaxReservations,
	}
}

// natState is the node's record of its own connectivity. Static fields
// are set before the libp2p host starts; mu guards all others.
type natState struct {
	log      *slog.Logger
	relay    relayStats
	relayRes relayv2.Resources
	ports    portMapper

	mu       sync.Mutex
	verdict  reachVerdict
	observed []observation
	relays   []ma.Multiaddr // our circuit addresses (reservations held)
	mapped   []ma.Multiaddr // port mappings last seen
	punchLog []HolePunchRecord
	punches  map[lpeer.ID]*punchSummary
}

func newNATState(log *slog.Logger, limit relayv2.RelayLimit) *natState {
	res := relayv2.DefaultResources()
	res.Limit = &limit
	l := log.With("component", "nat")
	return &natState{
		log:      l,
		relay:    relayStats{log: l},
		relayRes: res,
		verdict:  reachVerdict{network.ReachabilityUnknown, "not decided yet"},
		punches:  map[lpeer.ID]*punchSummary{},
	}
}

// Trace implements holepunch.EventTracer: it records and logs every
// hole-punch step.
func (s *natState) Trace(evt *holepunch.Event) {
	now := time.Unix(0, evt.Timestamp)
	// libp2p lists each failed dial on its own line; status wants one.
	oneLine := func(s string) string { return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n  * ", "; ")), " ") }
	rec := HolePunchRecord{Peer: evt.Remote, At: now}
	s.mu.Lock()
	sum := s.punches[evt.Remote]
	if sum == nil {
		sum = &punchSummary{}
		s.punches[evt.Remote] = sum
	}
	switch e := evt.Evt.(type) {
	case *holepunch.StartHolePunchEvt:
		sum.active = true
		sum.addrs = e.RemoteAddrs
		s.mu.Unlock()
		s.log.Info("hole punch starting", "peer", evt.Remote, "addrs", e.RemoteAddrs, "rtt", e.RTT)
		return
	case *holepunch.HolePunchAttemptEvt:
		s.mu.Unlock()
		s.log.Debug("hole punch attempt", "peer", evt.Remote, "attempt", e.Attempt)
		return
	case *holepunch.EndHolePunchEvt:
		sum.active = false
		sum.lastAt = now
		if e.Success {
			sum.attempts, sum.successAt, sum.lastErr = 0, now, ""
		} else {
			sum.attempts++
			sum.lastErr = compactDialError(e.Error)
		}
		rec.Kind, rec.Attempt, rec.Success, rec.Error, rec.Elapsed, rec.Addrs = "attempt", sum.attempts, e.Success, oneLine(e.Error), e.EllapsedTime, sum.addrs
		if e.Success {
			rec.Attempt = 0
		}
	case *holepunch.DirectDialEvt:
		rec.Kind, rec.Success, rec.Error, rec.Elapsed = "direct-dial", e.Success, oneLine(e.Error), e.EllapsedTime
		if e.Success {
			sum.successAt = now
		}
	case *holepunch.ProtocolErrorEvt:
		sum.active = false
		sum.lastAt, sum.lastErr = now, "protocol: "+oneLine(e.Error)
		rec.Kind, rec.Error = "protocol-error", oneLine(e.Error)
	default:
		s.mu.Unlock()
		return
	}
	s.punchLog = append(s.punchLog, rec)
	if len(s.punchLog) > maxPunchLog {
		s.punchLog = slices.Delete(s.punchLog, 0, len(s.punchLog)-maxPunchLog)
	}
	s.mu.Unlock()
	switch {
	case rec.Kind == "attempt" && rec.Success:
		s.log.Info("hole punch succeeded: direct connection", "peer", rec.Peer, "elapsed", rec.Elapsed.Round(time.Millisecond))
	case rec.Kind == "attempt":
		s.log.Info("hole punch attempt failed", "peer", rec.Peer, "failures", rec.Attempt, "err", rec.Error, "addrs", rec.Addrs)
	case rec.Kind == "direct-dial":
		s.log.Info("direct dial before hole punch", "peer", rec.Peer, "success", rec.Success, "err", rec.Error)
	default:
		s.log.Info("hole punch protocol error", "peer", rec.Peer, "err", rec.Error)
	}
}

// observe records one peer's view of our address.
func (s *natState) observe(o observation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// One entry per (local, observer): a newer view replaces the old.
	s.observed = slices.DeleteFunc(s.observed, func(x observation) bool {
		return x.Local.Equal(o.Local) && x.Observer.Equal(o.Observer) || time.Since(x.At) > observationTTL
	})
	s.observed = append(s.observed, o)
	if len(s.observed) > maxObservations {
		s.observed = slices.Delete(s.observed, 0, len(s.observed)-maxObservations)
	}
}

func (s *natState) observations() []observation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.observed)
}

// mapping classifies our NAT from observations that show one (peers at
// public addresses seeing us at a public address that is not ours).
func (s *natState) mapping(own []ma.Multiaddr) map[string]NATMapping {
	ips := ownIPs(own)
	var natted []observation
	for _, o := range s.observations() {
		if !manet.IsPublicAddr(o.Observer) || !manet.IsPublicAddr(o.Observed) {
			continue
		}
		if ip, err := manet.ToIP(o.Observed); err == nil && slices.ContainsFunc(ips, ip.Equal) {
			continue
		}
		natted = append(natted, o)
	}
	return classifyMapping(natted)
}

func (s *natState) setRelays(addrs []ma.Multiaddr) (changed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if slices.EqualFunc(s.relays, addrs, ma.Multiaddr.Equal) {
		return false
	}
	s.relays = slices.Clone(addrs)
	return true
}

// relayIDs returns the relays we hold reservations on.
func relayIDs(circuits []ma.Multiaddr) []lpeer.ID {
	var out []lpeer.ID
	for _, a := range circuits {
		relay, _ := ma.SplitFunc(a, func(c ma.Component) bool { return c.Protocol().Code == ma.P_CIRCUIT })
		if ai, err := lpeer.AddrInfoFromP2pAddr(relay); err == nil && !slices.Contains(out, ai.ID) {
			out = append(out, ai.ID)
		}
	}
	return out
}

// relayReason says, in words, why we reach p only through a relay.
func (s *natState) relayReason(p lpeer.ID, ownMapping map[string]NATMapping, theirs string, havePunchAddr bool) string {
	s.mu.Lock()
	sum := s.punches[p]
	var cp punchSummary
	if sum != nil {
		cp = *sum
	}
	s.mu.Unlock()
	var why []string
	switch {
	case sum == nil && !havePunchAddr:
		why = append(why, "no hole punch yet: this node has no public address to punch from (no peer has observed it)")
	case sum == nil:
		why = append(why, "no hole punch attempted yet")
	case cp.active:
		why = append(why, "hole punch in progress")
	case cp.lastErr != "":
		why = append(why, fmt.Sprintf("hole punch failed (%d attempts, last at %s): %s", cp.attempts, cp.lastAt.Format(time.TimeOnly), cp.lastErr))
	case !cp.successAt.IsZero():
		why = append(why, "hole punch succeeded earlier but the direct connection closed")
	}
	switch overallMapping(ownMapping) {
	case MappingDependent:
		why = append(why, "this node's NAT maps each destination to a new port (endpoint-dependent, symmetric): "+mappingWords(ownMapping))
	case MappingUnknown:
		if hint := s.portHint(); hint != "" {
			why = append(why, hint)
		}
	}
	if theirs == string(MappingDependent) {
		why = append(why, "the peer's NAT is endpoint-dependent (symmetric)")
	}
	if overallMapping(ownMapping) == MappingDependent && theirs == string(MappingDependent) {
		why = append(why, "two symmetric NATs cannot be punched; a relay is the only path")
	}
	return strings.Join(why, "; ")
}

func mappingWords(m map[string]NATMapping) string {
	var parts []string
	for _, tr := range []string{"tcp", "udp"} {
		if v, ok := m[tr]; ok {
			parts = append(parts, tr+" "+string(v))
		}
	}
	return strings.Join(parts, ", ")
}

// portMapper wraps libp2p's UPnP/NAT-PMP manager so status can list the
// mappings the router granted.
type portMapper struct {
	mu  sync.Mutex
	nm  bhost.NATManager
	net network.Network
}

func (p *portMapper) constructor() lpconfig.NATManagerC {
	return func(n network.Network) bhost.NATManager {
		nm := bhost.NewNATManager(n)
		p.mu.Lock()
		p.nm, p.net = nm, n
		p.mu.Unlock()
		return nm
	}
}

// mapped returns the external addresses the router maps to our listeners.
func (p *portMapper) mapped() []ma.Multiaddr {
	p.mu.Lock()
	nm, n := p.nm, p.net
	p.mu.Unlock()
	if nm == nil || !nm.HasDiscoveredNAT() {
		return nil
	}
	var out []ma.Multiaddr
	for _, a := range n.ListenAddresses() {
		if m := nm.GetMapping(a); m != nil {
			out = append(out, m)
		}
	}
	return out
}

// pinAutoNATv1 pins libp2p's AutoNAT v1 to "unknown": reachability is
// decided in reachability.go, and v1, which needs several dial-back
// servers, would otherwise contradict it on the same event.
func pinAutoNATv1() libp2p.Option {
	return func(c *libp2p.Config) error {
		r := network.ReachabilityUnknown
		c.AutoNATConfig.ForceReachability = &r
		return nil
	}
}

// natOptions are the libp2p options for NAT traversal.
func (n *Host) natOptions() []libp2p.Option {
	cfg := n.cfg
	opts := []libp2p.Option{
		pinAutoNATv1(),
		libp2p.EnableAutoNATv2(),
		libp2p.EnableHolePunching(holepunch.WithTracer(n.nat)),
		// Auto-relay is armed always and acts only while we are private
		// (the candidate source returns nothing otherwise). Defaults are
		// for a large public network (3-minute boot delay, 4 candidates
		// before the first reservation); a holopeer swarm may have one relay.
		libp2p.EnableAutoRelayWithPeerSource(n.relayCandidates,
			autorelay.WithBootDelay(0),
			autorelay.WithMinCandidates(1),
			autorelay.WithNumRelays(2),
			autorelay.WithMinInterval(2*time.Second),
			autorelay.WithBackoff(time.Minute),
		),
	}
	if cfg.relayService {
		opts = append(opts, libp2p.EnableRelayService(
			relayv2.WithResources(n.nat.relayRes),
			relayv2.WithMetricsTracer(&n.nat.relay),
		))
	}
	if cfg.portMapping && !loopbackOnly(cfg.listen) {
		opts = append(opts, libp2p.NATManager(n.nat.ports.constructor()))
	}
	if len(cfg.announce) > 0 {
		announce := cfg.announce
		opts = append(opts, libp2p.AddrsFactory(func(addrs []ma.Multiaddr) []ma.Multiaddr {
			return ma.Unique(append(slices.Clone(addrs), announce...))
		}))
	}
	return opts
}

func loopbackOnly(addrs []ma.Multiaddr) bool {
	for _, a := range addrs {
		if !manet.IsIPLoopback(a) {
			return false
		}
	}
	return true
}

// relayCandidates is auto-relay's source of relays: static relays, then
// bootstrap peers, then connected peers that serve the relay protocol.
// It offers nothing unless we are private.
func (n *Host) relayCandidates(_ context.Context, num int) <-chan lpeer.AddrInfo {
	out := make(chan lpeer.AddrInfo, max(num, 0))
	defer close(out)
	n.mu.Lock()
	private := n.reach == network.ReachabilityPrivate
	n.mu.Unlock()
	if !private {
		return out
	}
	self, _ := lpeer.IDFromPrivateKey(n.cfg.key)
	seen := map[lpeer.ID]bool{self: true}
	offer := func(ai lpeer.AddrInfo) {
		if len(out) < cap(out) && !seen[ai.ID] {
			seen[ai.ID] = true
			out <- ai
		}
	}
	for _, ai := range n.cfg.staticRelays {
		offer(ai)
	}
	for _, ai := range n.cfg.bootstrap {
		if anyPublic(ai.Addrs) {
			offer(ai)
		}
	}
	h := n.lh.Load() // nil while libp2p builds the host
	if h == nil {
		return out
	}
	for _, p := range (*h).Network().Peers() {
		if protos, err := (*h).Peerstore().SupportsProtocols(p, circuitproto.ProtoIDv2Hop); err == nil && len(protos) > 0 {
			offer(lpeer.AddrInfo{ID: p, Addrs: (*h).Peerstore().Addrs(p)})
		}
	}
	return out
}

// setVerdict stores the latest reachability decision; it reports whether
// the reason changed.
func (s *natState) setVerdict(v reachVerdict) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := s.verdict != v
	s.verdict = v
	return changed
}

// ObservedAddr is how one peer sees this node.
type ObservedAddr struct {
	Local    string // our end of the connection
	Observer string // the peer's end
	Observed string // our address as the peer sees it
	At       time.Time
}

// NATInfo is what a node knows about its own connectivity (for status).
type NATInfo struct {
	Reachability string                // public | private | unknown
	Reason       string                // the evidence, in words
	Mapping      map[string]NATMapping // per transport, when behind NAT
	Observed     []ObservedAddr
	Relays       []string // our relay (circuit) addresses: reservations held
	RelayService RelayServiceInfo
	HolePunches  []HolePunchRecord // latest first
	PortMapped   []string          // external addresses the router maps to us
	DHTMode      string            // server | client
	DHTPeers     []lpeer.ID        // the DHT routing table
}

// NAT reports the node's connectivity: reachability and why, NAT mapping,
// relays, the relay service's counters and hole-punch history.
func (n *Host) NAT() NATInfo {
	s := n.nat
	info := NATInfo{
		Reachability: n.Reachability(),
		RelayService: s.relay.snapshot(!n.cfg.relayService, s.relayRes),
		DHTMode:      n.DHTMode(),
		DHTPeers:     n.kad.RoutingTable().ListPeers(),
	}
	if n.reachability() == network.ReachabilityPrivate {
		info.Mapping = n.ownMapping()
	}
	for _, a := range s.ports.mapped() {
		info.PortMapped = append(info.PortMapped, a.String())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	info.Reason = s.verdict.Reason
	for _, o := range s.observed {
		info.Observed = append(info.Observed, ObservedAddr{Local: o.Local.String(), Observer: o.Observer.String(), Observed: o.Observed.String(), At: o.At})
	}
	for _, a := range s.relays {
		info.Relays = append(info.Relays, a.String())
	}
	for i := len(s.punchLog) - 1; i >= 0; i-- {
		info.HolePunches = append(info.HolePunches, s.punchLog[i])
	}
	return info
}

// portHint says whether our NAT rewrote our source port, a hint of an
// endpoint-dependent NAT when too few peers observed us to tell for sure.
func (s *natState) portHint() string {
	for _, o := range s.observations() {
		_, _, lport, ok1 := endpoint(o.Local)
		_, _, oport, ok2 := endpoint(o.Observed)
		if ok1 && ok2 && manet.IsPublicAddr(o.Observed) && lport != oport {
			return fmt.Sprintf("this node's NAT rewrote its port (%d seen as %d by %s), often a sign of a symmetric NAT; one more public peer would tell", lport, oport, o.Observer)
		}
	}
	return ""
}

// compactDialError shortens libp2p's "all dials failed" list (one line per
// address, loopback and self-dials included) to what a person needs: how
// many addresses failed and why the public ones did.
func compactDialError(s string) string {
	head, list, ok := strings.Cut(s, "\n  * ")
	if !ok {
		return strings.Join(strings.Fields(s), " ")
	}
	if strings.Contains(head, "all dials failed") {
		head = "all dials failed"
	}
	var public []string
	n := 0
	for _, line := range strings.Split(list, "\n  * ") {
		n++
		addr, why, _ := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "["), "] ")
		if a, err := ma.NewMultiaddr(addr); err == nil && manet.IsPublicAddr(a) {
			if i := strings.LastIndex(why, ": "); i >= 0 {
				why = why[i+2:]
			}
			public = append(public, addr+" "+why)
		}
	}
	out := fmt.Sprintf("%s (%d addresses", strings.Join(strings.Fields(head), " "), n)
	if len(public) > 0 {
		out += "; public: " + strings.Join(public, ", ")
	}
	return out + ")"
}

// noteMapped logs when the router's port mappings change.
func (s *natState) noteMapped(addrs []ma.Multiaddr) {
	s.mu.Lock()
	changed := !slices.EqualFunc(s.mapped, addrs, ma.Multiaddr.Equal)
	s.mapped = slices.Clone(addrs)
	s.mu.Unlock()
	if changed {
		s.log.Info("router port mapping (UPnP/NAT-PMP)", "mapped", addrs)
	}
}
