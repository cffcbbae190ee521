package gossip

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	lpeer "github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/gossip/election"
	"github.com/holopeer/holopeer/tee"
	"github.com/holopeer/holopeer/tee/snp"
	"github.com/holopeer/holopeer/tee/teetest"
)

func swarmName(t testing.TB, prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// TestElectionLoopback: four sim peers and one that cannot attest, on real
// hosts, agree on one coordinator; each time the coordinator dies the rest
// agree on a new one in a higher term and fence the old term off; the
// peer without a TEE never coordinates, even when it is the last one left.
func TestElectionLoopback(t *testing.T) {
	swarm := swarmName(t, "loop")
	v := verifier(t, tee.Policy{AllowSim: true})
	var nodes []*testNode
	for i := range 4 {
		nodes = append(nodes, startNode(t, "sim"+string(rune('A'+i)), nodeOpts{swarm: swarm, attester: simAttester(t, swarm), teeName: "sim", verifier: v, allowSim: true}))
	}
	none := startNode(t, "none", nodeOpts{swarm: swarm, verifier: v, allowSim: true})
	nodes = append(nodes, none)
	start := time.Now()
	connectAll(t, hosts(nodes)...)

	c := waitAgree(t, nodes, patience, func(*CoordinatorInfo) bool { return true })
	t.Logf("5 peers agreed on %s term %d (%s) %v after start", c.PeerID.ShortString(), c.Term, c.Label(), time.Since(start).Round(time.Millisecond))
	if c.TEE != tee.ProviderSim || !c.Insecure {
		t.Errorf("coordinator attested with %q insecure=%v, want sim and insecure", c.TEE, c.Insecure)
	}
	if !c.LeaseExpires.After(time.Now().Add(-fastTiming.Tick)) {
		t.Errorf("lease expires %v, in the past", c.LeaseExpires)
	}
	// Every peer sees the others' capabilities.
	deadline := time.Now().Add(patience)
	for _, n := range nodes {
		for len(n.svc.Presence()) != len(nodes) {
			if time.Now().After(deadline) {
				t.Fatalf("%s sees %d peers present, want %d", n.name, len(n.svc.Presence()), len(nodes))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	for round := 0; round < 4; round++ {
		old := nodeByID(nodes, c.PeerID)
		if old == none {
			t.Fatal("the peer without a TEE became coordinator")
		}
		waitFollowers(t, old, len(nodes)-1-round)
		killed := time.Now()
		old.stop()
		if round == 3 {
			break // the last sim peer is gone
		}
		prev := c.Term
		c = waitAgree(t, nodes, patience, func(c *CoordinatorInfo) bool { return c.Term > prev })
		t.Logf("coordinator killed: survivors agreed on %s term %d after %v", c.PeerID.ShortString(), c.Term, time.Since(killed).Round(time.Millisecond))
		for _, n := range nodes {
			if n.dead {
				continue
			}
			if err := n.svc.AcceptTerm(prev); err == nil {
				t.Errorf("%s still accepts commands of term %d after accepting term %d", n.name, prev, c.Term)
			}
			if err := n.svc.AcceptTerm(c.Term); err != nil {
				t.Errorf("%s refuses the current term: %v", n.name, err)
			}
		}
	}
	// Only the peer without a TEE is left: it follows no one after the
	// lease, and never stands.
	deadline = time.Now().Add(patience)
	for none.svc.Coordinator() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("lone non-attesting peer still follows %+v", none.svc.Coordinator())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(2 * fastTiming.Lease) // give it every chance to misbehave
	none.mu.Lock()
	defer none.mu.Unlock()
	if none.self || none.svc.Coordinator() != nil {
		t.Errorf("peer without a TEE coordinated or follows someone: self=%v %+v", none.self, none.svc.Coordinator())
	}
}

// waitFollowers waits until the coordinator has heard votes from n peers.
func waitFollowers(t testing.TB, c *testNode, n int) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for len(c.svc.Followers()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("coordinator %s knows %d followers, want %d", c.name, len(c.svc.Followers()), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// scoreWatch records each node's view of peer scores.
type scoreWatch struct {
	mu     sync.Mutex
	scores map[lpeer.ID]float64
}

func (s *scoreWatch) option() Option {
	return WithPubSubOptions(pubsub.WithPeerScoreInspect(func(m map[lpeer.ID]float64) {
		s.mu.Lock()
		s.scores = m
		s.mu.Unlock()
	}, 20*time.Millisecond))
}

func (s *scoreWatch) score(id lpeer.ID) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.scores[id]
}

func waitLogged(t testing.TB, nodes []*testNode, author lpeer.ID, reason, want string) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for _, n := range nodes {
		if n.dead {
			continue
		}
		for !n.logs.rejected(author, reason, want) {
			if time.Now().After(deadline) {
				t.Log(n.logs.dump())
				t.Fatalf("%s did not log a %q rejection of %s mentioning %q", n.name, reason, author.ShortString(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestForgedCoordinatorsLoopback: a peer presenting the coordinator's
// evidence as its own, and a thief holding a dead coordinator's key who
// replays its evidence in a newer term, are refused by every peer, each
// logging why; the offender's peer score falls until it is graylisted.
func TestForgedCoordinatorsLoopback(t *testing.T) {
	swarm := swarmName(t, "forge")
	v := verifier(t, tee.Policy{AllowSim: true})
	var nodes []*testNode
	var watches []*scoreWatch
	for i := range 4 {
		w := &scoreWatch{}
		o := nodeOpts{swarm: swarm, verifier: v, allowSim: true, extra: []Option{w.option()}}
		if i < 3 {
			o.attester, o.teeName = simAttester(t, swarm), "sim"
		}
		nodes = append(nodes, startNode(t, "n"+string(rune('0'+i)), o))
		watches = append(watches, w)
	}
	connectAll(t, hosts(nodes)...)
	c := waitAgree(t, nodes, patience, func(*CoordinatorInfo) bool { return true })
	coord := nodeByID(nodes, c.PeerID)
	_, electionTopic, _ := nodes[0].svc.Topics()

	// (a) Evidence for another key: the forger copies the coordinator's.
	forger := newRawPublisher(t, genKey(t), electionTopic, nodes)
	hb := forger.nextClaim(t, c.PeerID, c.Term)
	fake := *hb
	fake.Coordinator, fake.Term, fake.Candidacy, fake.Seq, fake.Resign = forger.h.ID(), c.Term+1, true, 0, false
	fake.Parent = ClaimParent{Term: c.Term, Coordinator: c.PeerID, Seq: hb.Seq, Beacon: hb.Beacon}
	fake.IssuedAt = time.Now()
	forger.publish(t, mustMarshal(t, &fake))
	waitLogged(t, nodes, forger.h.ID(), ReasonEvidence, tee.ErrIdentityMismatch.Error())

	// Persistent offender: its score falls below the graylist threshold
	// at every peer, after which its traffic is not even validated.
	for range 6 {
		fake.IssuedAt = time.Now()
		forger.publish(t, mustMarshal(t, &fake))
	}
	deadline := time.Now().Add(patience)
	for i, w := range watches {
		for w.score(forger.h.ID()) > scoreThresholds.GraylistThreshold {
			if time.Now().After(deadline) {
				t.Fatalf("%s scores the forger %.0f, above the graylist threshold %.0f", nodes[i].name, w.score(forger.h.ID()), scoreThresholds.GraylistThreshold)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	before := nodes[0].svc.Stats().Rejections[ReasonEvidence]
	for range 5 {
		fake.IssuedAt = time.Now()
		forger.publish(t, mustMarshal(t, &fake))
	}
	time.Sleep(200 * time.Millisecond)
	if after := nodes[0].svc.Stats().Rejections[ReasonEvidence]; after != before {
		t.Errorf("graylisted forger's messages still reach the validator: %d → %d rejections", before, after)
	}

	// (b) Replay: the coordinator dies, a new one is elected, and a thief
	// with the dead coordinator's key offers its old evidence for a newer term.
	coord.stop()
	c2 := waitAgree(t, nodes, patience, func(x *CoordinatorInfo) bool { return x.Term > c.Term })
	thief := newRawPublisher(t, coord.key, electionTopic, nodes)
	replay := *hb
	replay.Term, replay.Candidacy, replay.Seq, replay.IssuedAt = c2.Term+1, true, 0, time.Now()
	thief.publish(t, mustMarshal(t, &replay))
	waitLogged(t, nodes, coord.id(), ReasonEvidence, tee.ErrTermMismatch.Error())

	// Nobody followed a forger.
	if c3 := waitAgree(t, nodes, patience, func(*CoordinatorInfo) bool { return true }); c3.PeerID != c2.PeerID || c3.Term != c2.Term {
		t.Errorf("coordinator changed to %s term %d after forgeries", c3.PeerID, c3.Term)
	}
	for _, n := range nodes {
		n.mu.Lock()
		for term, id := range n.history {
			if id == forger.h.ID() || (id == coord.id() && term > c.Term) {
				t.Errorf("%s followed forged coordinator %s in term %d", n.name, id, term)
			}
		}
		n.mu.Unlock()
	}
}

// TestSimRefusedWithoutAllowSim: on a swarm that does not allow sim, a
// real SEV-SNP peer (the production verifier, fake AMD chain) coordinates;
// a peer started with sim never does, not even in its own view; and a sim
// candidacy published by a forger is refused by every peer with the reason.
func TestSimRefusedWithoutAllowSim(t *testing.T) {
	swarm := swarmName(t, "prod")
	amd, err := teetest.NewAMD(teetest.AMDOptions{})
	if err != nil {
		t.Fatal(err)
	}
	snpAtt, err := amd.Attester()
	if err != nil {
		t.Fatal(err)
	}
	v := verifier(t, tee.Policy{SNP: snp.Policy{Measurements: [][]byte{teetest.SNPMeasurement}}}, tee.WithSNPRoots(amd.Roots()))
	// First without the SNP peer: the sim peer tries, checks its own
	// evidence as everyone would, and stands down; nobody has a coordinator.
	nodes := []*testNode{
		startNode(t, "sim", nodeOpts{swarm: swarm, attester: simAttester(t, swarm), teeName: "sim", verifier: v}),
		startNode(t, "none1", nodeOpts{swarm: swarm, verifier: v}),
		startNode(t, "none2", nodeOpts{swarm: swarm, verifier: v}),
	}
	connectAll(t, hosts(nodes)...)
	waitLogged(t, nodes[:1], nodes[0].id(), ReasonEvidence, tee.ErrSimNotAllowed.Error())
	for _, n := range nodes {
		if c := n.svc.Coordinator(); c != nil {
			t.Fatalf("%s follows %+v on a swarm without a permitted TEE", n.name, c)
		}
	}
	// Then the SNP peer joins and is followed by all.
	nodes = append([]*testNode{startNode(t, "snp", nodeOpts{swarm: swarm, attester: snpAtt, teeName: "snp", verifier: v})}, nodes...)
	connectAll(t, hosts(nodes)...)
	c := waitAgree(t, nodes, patience, func(*CoordinatorInfo) bool { return true })
	if c.PeerID != nodes[0].id() || c.TEE != tee.ProviderSNP || c.Insecure {
		t.Fatalf("coordinator %s (%s), want the SNP peer, secure", c.PeerID, c.Label())
	}

	_, electionTopic, _ := nodes[0].svc.Topics()
	key := genKey(t)
	forger := newRawPublisher(t, key, electionTopic, nodes)
	claim := &Claim{Candidacy: true, Term: c.Term + 1, IssuedAt: time.Now(), Lease: fastTiming.Lease,
		Coordinator: forger.h.ID(), Parent: ClaimParent{Term: c.Term, Coordinator: c.PeerID, Seq: 1}}
	rand.Read(claim.Salt[:])
	rand.Read(claim.Beacon[:])
	em := (&Service{cfg: config{timing: fastTiming}}).toElection(forger.h.ID(), claim)
	nonce := election.Nonce(swarm, claim.Term, em.Parent, claim.Salt)
	attest, err := TEEAttester(simAttester(t, swarm), swarm, key.GetPublic())
	if err != nil {
		t.Fatal(err)
	}
	if claim.Evidence, err = attest(context.Background(), claim.Term, nonce[:]); err != nil {
		t.Fatal(err)
	}
	forger.publish(t, mustMarshal(t, claim))
	waitLogged(t, nodes, forger.h.ID(), ReasonEvidence, tee.ErrSimNotAllowed.Error())
	for _, n := range nodes {
		n.mu.Lock()
		if n.name == "sim" && n.self {
			t.Errorf("sim peer became coordinator on a swarm without allow-sim")
		}
		for term, id := range n.history {
			if id != nodes[0].id() {
				t.Errorf("%s followed %s in term %d", n.name, id, term)
			}
		}
		n.mu.Unlock()
	}
}
