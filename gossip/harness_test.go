package gossip

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	lpeer "github.com/libp2p/go-libp2p/core/peer"

	hpeer "github.com/holopeer/holopeer/peer"
	"github.com/holopeer/holopeer/tee"
	"github.com/holopeer/holopeer/tee/sim"
)

// Test harness: real libp2p hosts on loopback TCP (Noise, yamux), real
// GossipSub, real tee attesters and verifiers.

// fastTiming makes elections take a fraction of a second.
// fastTiming makes elections take a second or two. It leaves room for a
// machine shared by many builds: a lease is six heartbeats.
var fastTiming = Timing{
	Tick: 50 * time.Millisecond, Heartbeat: 200 * time.Millisecond, Lease: 1200 * time.Millisecond,
	BackoffStep: 200 * time.Millisecond, MaxBackoff: 800 * time.Millisecond,
	AttestTimeout: 5 * time.Second, Presence: 200 * time.Millisecond, PresenceTTL: 2 * time.Second,
}

// patience bounds every wait in these tests. Waits end as soon as their
// condition holds; the bound only matters on a badly overloaded machine.
const patience = 30 * time.Second

// logCapture is a slog handler that keeps every record, so tests can check
// that a rejection was logged with its reason.
type logCapture struct {
	mu    *sync.Mutex
	recs  *[]capturedLog
	attrs []slog.Attr
}

type capturedLog struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func newLogCapture() *logCapture {
	return &logCapture{mu: &sync.Mutex{}, recs: &[]capturedLog{}}
}

func (l *logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCapture) WithGroup(string) slog.Handler            { return l }
func (l *logCapture) WithAttrs(as []slog.Attr) slog.Handler {
	return &logCapture{mu: l.mu, recs: l.recs, attrs: append(append([]slog.Attr{}, l.attrs...), as...)}
}
func (l *logCapture) Handle(_ context.Context, r slog.Record) error {
	c := capturedLog{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	for _, a := range l.attrs {
		c.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		c.attrs[a.Key] = a.Value.String()
		return true
	})
	l.mu.Lock()
	*l.recs = append(*l.recs, c)
	l.mu.Unlock()
	return nil
}

// rejected reports whether a rejection of a message from author was logged
// whose reason is reason and whose error mentions want.
func (l *logCapture) rejected(author lpeer.ID, reason, want string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range *l.recs {
		if r.msg == "gossip: message rejected" && r.attrs["from"] == author.String() &&
			r.attrs["reason"] == reason && strings.Contains(r.attrs["err"], want) {
			return true
		}
	}
	return false
}

type testNode struct {
	name string
	key  crypto.PrivKey
	h    host.Host
	svc  *Service
	logs *logCapture
	tee  string // sim, snp, none
	// history is every coordinator (term → peer) this node reported.
	mu      sync.Mutex
	history map[uint64]lpeer.ID
	self    bool // was ever coordinator
	dead    bool
}

type nodeOpts struct {
	swarm    string
	key      crypto.PrivKey // nil: generate
	attester tee.Attester   // nil: --tee none
	teeName  string
	verifier *tee.Verifier
	allowSim bool
	extra    []Option
}

func newHost(t testing.TB, key crypto.PrivKey) host.Host {
	t.Helper()
	h, err := libp2p.New(libp2p.Identity(key), libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func genKey(t testing.TB) crypto.PrivKey {
	k, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func sealFor(t testing.TB, key crypto.PrivKey, swarm, teeName string) CapabilityFunc {
	id, err := lpeer.IDFromPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return func() ([]byte, error) {
		return hpeer.SealCapability(hpeer.Capability{
			PeerID: id.String(), Swarm: swarm, Seq: 1, IssuedAt: time.Now(), Backend: "cpu", CPUs: 1,
			Hours: "always", TEE: teeName, CanAttest: teeName != "none", Reachability: "public",
		}, key)
	}
}

func startNode(t testing.TB, name string, o nodeOpts) *testNode {
	t.Helper()
	key := o.key
	if key == nil {
		key = genKey(t)
	}
	n := &testNode{name: name, key: key, h: newHost(t, key), logs: newLogCapture(), history: map[uint64]lpeer.ID{}}
	n.tee = o.teeName
	if n.tee == "" {
		n.tee = "none"
	}
	opts := []Option{
		WithSwarm(o.swarm), WithTEE(o.attester, o.verifier), WithAllowSim(o.allowSim),
		WithTiming(fastTiming), WithLogger(slog.New(n.logs)),
		WithCapability(sealFor(t, key, o.swarm, n.tee)),
	}
	svc, err := New(context.Background(), n.h, append(opts, o.extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	n.svc = svc
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); n.stop() })
	go func() {
		for c := range svc.WatchCoordinator(ctx) {
			if c == nil {
				continue
			}
			n.mu.Lock()
			if prev, ok := n.history[c.Term]; ok && prev != c.PeerID {
				t.Errorf("%s followed two coordinators in term %d: %s and %s", name, c.Term, prev, c.PeerID)
			}
			n.history[c.Term] = c.PeerID
			n.self = n.self || c.Self
			n.mu.Unlock()
		}
	}()
	return n
}

func (n *testNode) stop() {
	n.mu.Lock()
	dead := n.dead
	n.dead = true
	n.mu.Unlock()
	if !dead {
		n.svc.Close()
		n.h.Close()
	}
}

func (n *testNode) id() lpeer.ID { return n.h.ID() }

func connectAll(t testing.TB, nodes ...host.Host) {
	t.Helper()
	for i, a := range nodes {
		for _, b := range nodes[i+1:] {
			if err := a.Connect(context.Background(), lpeer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func hosts(nodes []*testNode) []host.Host {
	var hs []host.Host
	for _, n := range nodes {
		hs = append(hs, n.h)
	}
	return hs
}

// waitAgree polls (every 10 ms) until every live node follows the same
// coordinator for which ok returns true, and returns it.
func waitAgree(t testing.TB, nodes []*testNode, within time.Duration, ok func(*CoordinatorInfo) bool) *CoordinatorInfo {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var first *CoordinatorInfo
		agreed := true
		for _, n := range nodes {
			if n.dead {
				continue
			}
			c := n.svc.Coordinator()
			switch {
			case c == nil || !ok(c):
				agreed = false
			case first == nil:
				first = c
			case c.PeerID != first.PeerID || c.Term != first.Term:
				agreed = false
			}
		}
		if agreed && first != nil {
			return first
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, n := range nodes {
				if !n.dead {
					fmt.Fprintf(&b, "\n  %s %s: %+v\n    rejections %v, election peers %d",
						n.name, n.id().ShortString(), n.svc.Coordinator(), n.svc.Stats().Rejections, len(n.svc.ps.ListPeers(n.svc.names.election)))
				}
			}
			t.Fatalf("no agreement within %v:%s", within, b.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// simAttester is the production sim attester with the swarm's testnet key.
// It reports a fixed measurement rather than hashing the test binary.
func simAttester(t testing.TB, swarm string) tee.Attester {
	a, err := sim.NewAttester(tee.SimTestnetKey(swarm), sim.WithMeasurement(make([]byte, sim.MeasurementSize)))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func verifier(t testing.TB, p tee.Policy, opts ...tee.Option) *tee.Verifier {
	v, err := tee.NewVerifier(p, append(opts, tee.WithLogger(slog.New(slog.DiscardHandler)))...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func nodeByID(nodes []*testNode, id lpeer.ID) *testNode {
	for _, n := range nodes {
		if n.id() == id {
			return n
		}
	}
	return nil
}

// rawPublisher is a forger: a plain GossipSub on its own host, with strict
// signing but none of our validators, so it can publish anything.
type rawPublisher struct {
	h     host.Host
	ps    *pubsub.PubSub
	topic *pubsub.Topic
	sub   *pubsub.Subscription
}

func newRawPublisher(t testing.TB, key crypto.PrivKey, topic string, peers []*testNode) *rawPublisher {
	t.Helper()
	h := newHost(t, key)
	ctx, cancel := context.WithCancel(context.Background())
	// Flood publishing sends to every topic peer at once, mesh or not.
	ps, err := pubsub.NewGossipSub(ctx, h, pubsub.WithMessageSignaturePolicy(pubsub.StrictSign), pubsub.WithFloodPublish(true))
	if err != nil {
		t.Fatal(err)
	}
	tp, err := ps.Join(topic)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := tp.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Cancel(); cancel(); h.Close() })
	r := &rawPublisher{h: h, ps: ps, topic: tp, sub: sub}
	for _, p := range peers {
		if p.dead {
			continue
		}
		if err := h.Connect(context.Background(), lpeer.AddrInfo{ID: p.id(), Addrs: p.h.Addrs()}); err != nil {
			t.Fatal(err)
		}
	}
	// Wait until every peer's subscription is known, so a flood publish
	// reaches each of them directly.
	deadline := time.Now().Add(patience)
	for {
		known := map[lpeer.ID]bool{}
		for _, id := range ps.ListPeers(topic) {
			known[id] = true
		}
		all := true
		for _, p := range peers {
			all = all && (p.dead || known[p.id()])
			// And each peer must know the forger, or it drops the first
			// message as from an unknown peer.
			// Our outbound pubsub stream must be open too, or pubsub drops
			// what we publish to that peer.
			if !p.dead && !outboundPubsubStream(h, p.id()) {
				all = false
			}
			if !p.dead {
				theirs := false
				for _, id := range p.svc.ps.ListPeers(topic) {
					theirs = theirs || id == h.ID()
				}
				all = all && theirs
			}
		}
		if all {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("forger never saw all peers on %s", topic)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func outboundPubsubStream(h host.Host, p lpeer.ID) bool {
	for _, c := range h.Network().ConnsToPeer(p) {
		for _, s := range c.GetStreams() {
			if s.Stat().Direction == network.DirOutbound && strings.HasPrefix(string(s.Protocol()), "/meshsub/") {
				return true
			}
		}
	}
	return false
}

func (r *rawPublisher) publish(t testing.TB, b []byte) {
	t.Helper()
	if err := r.topic.Publish(context.Background(), b); err != nil {
		t.Fatal(err)
	}
}

// nextClaim waits for a claim by author on the forger's subscription.
func (r *rawPublisher) nextClaim(t testing.TB, author lpeer.ID, term uint64) *Claim {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for {
		m, err := r.sub.Next(ctx)
		if err != nil {
			t.Fatalf("no claim from %s for term %d: %v", author, term, err)
		}
		if m.GetFrom() != author {
			continue
		}
		if c, _, err := DecodeElection(m.GetData()); err == nil && c != nil && c.Term == term {
			return c
		}
	}
}

// dump renders the log for a failure message.
func (l *logCapture) dump() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := ""
	for _, r := range *l.recs {
		if r.attrs["component"] == "pubsub" {
			continue
		}
		s += fmt.Sprintf("%v %s %v\n", r.level, r.msg, r.attrs)
	}
	return s
}

func peerIDOf(k crypto.PrivKey) (lpeer.ID, error) { return lpeer.IDFromPrivateKey(k) }
