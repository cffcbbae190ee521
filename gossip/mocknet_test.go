package gossip

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	lpeer "github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/holopeer/holopeer/gossip/election"
	"github.com/holopeer/holopeer/tee"
)

// withStatusHook sees every change of the node's view (tests only).
func withStatusHook(f func(election.Status)) Option {
	return func(c *config) error {
		c.statusHook = f
		return nil
	}
}

var (
	mockRun   = flag.Bool("mocknet", false, "run TestElectionMocknet: 30 services, about 40 s of two otherwise idle cores")
	mockTrace = flag.Bool("mock.trace", false, "log every view change in TestElectionMocknet")
)

func short(id string) string {
	if len(id) > 6 {
		return id[len(id)-6:]
	}
	return id
}

// mockTiming is slower than fastTiming: thirty services share two cores.
var mockTiming = Timing{
	Tick: 100 * time.Millisecond, Heartbeat: 400 * time.Millisecond, Lease: 2400 * time.Millisecond,
	BackoffStep: 400 * time.Millisecond, MaxBackoff: 1600 * time.Millisecond,
	AttestTimeout: 5 * time.Second, Presence: time.Second, PresenceTTL: 4 * time.Second,
}

type mockPeer struct {
	testNode
	standing bool
}

// TestElectionMocknet runs the real service on 30 mocknet hosts (20 can
// attest with sim, 10 cannot) through seeded rounds of coordinator kills,
// partitions, isolations and heals at random moments. Every change of
// every peer's view is checked as it happens: no peer follows two
// coordinators in a term, terms never go back, a peer that cannot attest
// never coordinates. After each heal all live peers must agree again.
func TestElectionMocknet(t *testing.T) {
	if !*mockRun || testing.Short() {
		// Thirty services with real GossipSub need more CPU than a shared
		// CI box reliably gives within the package's time budget; the
		// same rules are checked at 32 peers, under -race, by
		// election.TestChaos. Run with -mocknet.
		t.Skip("heavy: run with -mocknet")
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	swarm := swarmName(t, "mock")
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	v := verifier(t, tee.Policy{AllowSim: true})
	att := simAttester(t, swarm)

	var peers []*mockPeer
	var mu sync.Mutex
	violations := 0
	for i := range 30 {
		key := genKey(t)
		h, err := mn.AddPeer(key, ma.StringCast(fmt.Sprintf("/ip4/10.0.0.%d/tcp/4001", i+1)))
		if err != nil {
			t.Fatal(err)
		}
		p := &mockPeer{testNode: testNode{name: fmt.Sprintf("p%02d", i), key: key, h: h, logs: newLogCapture(), history: map[uint64]lpeer.ID{}}, standing: i < 20}
		var newest uint64
		hook := func(st election.Status) {
			mu.Lock()
			defer mu.Unlock()
			fail := func(format string, a ...any) {
				violations++
				t.Errorf("%s: "+format, append([]any{p.name}, a...)...)
			}
			if st.Term < newest {
				fail("term went back from %d to %d", newest, st.Term)
			}
			newest = st.Term
			if st.Term > 0 {
				id, _ := lpeer.Decode(st.Coordinator)
				if prev, ok := p.history[st.Term]; ok && prev != id {
					fail("followed %s and %s in term %d", prev, id, st.Term)
				}
				p.history[st.Term] = id
			}
			if *mockTrace {
				t.Logf("%s %s: %s term %d coord %s live=%v", time.Now().Format("05.000"), p.name, st.Role, st.Term, short(st.Coordinator), st.Live)
			}
			if st.Role == election.Coordinator && !p.standing {
				fail("coordinates without being able to attest")
			}
		}
		o := []Option{
			WithSwarm(swarm), WithAllowSim(true), WithTiming(mockTiming),
			WithLogger(slog.New(slog.DiscardHandler)), withStatusHook(hook),
		}
		teeName := "none"
		if p.standing {
			teeName = "sim"
			o = append(o, WithTEE(att, v))
		} else {
			o = append(o, WithTEE(nil, v))
		}
		p.tee = teeName
		o = append(o, WithCapability(sealFor(t, key, swarm, teeName)))
		if p.svc, err = New(context.Background(), h, o...); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.stop() })
		peers = append(peers, p)
	}
	if err := mn.LinkAll(); err != nil {
		t.Fatal(err)
	}
	if err := mn.ConnectAllButSelf(); err != nil {
		t.Fatal(err)
	}
	nodes := func() []*testNode {
		var out []*testNode
		for _, p := range peers {
			out = append(out, &p.testNode)
		}
		return out
	}
	live := func() []*mockPeer {
		var out []*mockPeer
		for _, p := range peers {
			if !p.dead {
				out = append(out, p)
			}
		}
		return out
	}
	setLinks := func(a, b host.Host, up bool) {
		if up {
			if _, err := mn.LinkPeers(a.ID(), b.ID()); err != nil {
				t.Fatal(err)
			}
			if _, err := mn.ConnectPeers(a.ID(), b.ID()); err != nil {
				t.Fatal(err)
			}
			return
		}
		if err := mn.UnlinkPeers(a.ID(), b.ID()); err != nil {
			t.Fatal(err)
		}
		if err := mn.DisconnectPeers(a.ID(), b.ID()); err != nil {
			t.Fatal(err)
		}
	}
	// split cuts every link between the two sides; heal restores them.
	var cut [][2]*mockPeer
	split := func(side map[*mockPeer]bool) {
		for _, a := range live() {
			for _, b := range live() {
				if side[a] && !side[b] {
					setLinks(a.h, b.h, false)
					cut = append(cut, [2]*mockPeer{a, b})
				}
			}
		}
	}
	heal := func() {
		for _, c := range cut {
			if !c[0].dead && !c[1].dead {
				setLinks(c[0].h, c[1].h, true)
			}
		}
		cut = nil
	}
	wait := func() { time.Sleep(time.Duration(float64(mockTiming.Lease) * (0.3 + 2*rng.Float64()))) }

	start := time.Now()
	c := waitAgree(t, nodes(), 2*patience, func(*CoordinatorInfo) bool { return true })
	t.Logf("30 peers agreed on term %d after %v", c.Term, time.Since(start).Round(time.Millisecond))
	var ops []string
	for round := range 5 {
		coord := func() *mockPeer {
			for _, p := range live() {
				if x := p.svc.Coordinator(); x != nil && x.Self {
					return p
				}
			}
			return nil
		}
		switch op := rng.IntN(3); op {
		case 0: // kill the coordinator
			if cp := coord(); cp != nil {
				cp.stop()
				ops = append(ops, "kill")
			}
			wait()
		case 1: // random split, sometimes a minority with standing peers
			side := map[*mockPeer]bool{}
			for _, p := range live() {
				side[p] = rng.IntN(3) == 0
			}
			split(side)
			ops = append(ops, "partition")
			wait()
		case 2: // isolate the coordinator
			if cp := coord(); cp != nil {
				split(map[*mockPeer]bool{cp: true})
				ops = append(ops, "isolate")
			}
			wait()
		}
		heal()
		healed := time.Now()
		c = waitAgree(t, nodes(), 2*patience, func(*CoordinatorInfo) bool { return true })
		t.Logf("round %d (%s): agreed on term %d %v after the heal", round, ops[len(ops)-1:], c.Term, time.Since(healed).Round(time.Millisecond))
	}
	mu.Lock()
	defer mu.Unlock()
	if violations > 0 {
		t.Fatalf("%d safety violations (seed %d)", violations, seed)
	}
}
