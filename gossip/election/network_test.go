package election

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
)

// This file is the in-memory network the election is tested on, after
// etcd raft's raft_test.go network and rafttest/network.go: every message
// goes through one queue with seeded drop and delay; peers can be cut,
// isolated, partitioned, paused, killed and restarted; and the safety
// property is checked after every step of every peer, from its own view.

const testSwarm = "electiontest"

// testRoot keys the TEST-ONLY evidence below. It stands for attestation
// hardware in these unit tests of the algorithm; the gossip package tests
// the same rules with tee/sim evidence through the real tee verifier.
var testRoot = []byte("TEST-ONLY election evidence root")

var errTestBinding = errors.New("test evidence does not bind these claims")

// testEvidence is what a standing peer's "hardware" would sign.
func testEvidence(id string, term uint64, nonce []byte) []byte {
	m := hmac.New(sha256.New, testRoot)
	m.Write([]byte(testSwarm))
	m.Write([]byte{0})
	m.Write([]byte(id))
	m.Write([]byte{0})
	binary.Write(m, binary.BigEndian, term)
	m.Write(nonce)
	return append([]byte("TEST-ONLY:"), m.Sum(nil)...)
}

func testVerify(author string, term uint64, nonce, evidence []byte) (Attestation, error) {
	if !hmac.Equal(evidence, testEvidence(author, term, nonce)) {
		return Attestation{}, errTestBinding
	}
	return Attestation{TEE: "test"}, nil
}

type inflight struct {
	at       int
	seq      int // FIFO among equal at
	from, to string
	m        Message
}

type attestJob struct {
	at    int
	id    string
	term  uint64
	nonce [NonceSize]byte
	inc   int // incarnation that asked
}

type tnode struct {
	id          string
	stand       bool
	n           *Node
	dead        bool
	inc         int // incarnation: bumped by restart
	pausedUntil int
}

type netOpts struct {
	hb, lease, backoff, maxBackoff int
	attestDelay                    int
	maxJump                        uint64
}

type network struct {
	t     testing.TB
	rng   *rand.Rand
	seed  uint64
	opts  netOpts
	ids   []string
	nodes map[string]*tnode
	queue []inflight
	qseq  int
	jobs  []attestJob
	now   int
	drop  float64
	delay int     // max extra delay in ticks
	dup   float64 // chance that a delivery is duplicated (its own delay)
	// rate is a peer's clock speed against the network's (clock skew: 1.2
	// ticks 20% fast); acc carries its fractional ticks. Absent: 1.
	rate  map[string]float64
	acc   map[string]float64
	group map[string]int
	cut   map[[2]string]bool
	// hook sees every delivery; returning false drops it (raft's msgHook).
	hook func(from, to string, m Message) bool

	// Safety: each peer's view, kept across restarts.
	views    map[string]map[uint64]string
	newest   map[string]uint64
	honest   map[string]bool // peers whose evidence is real (standing peers)
	errs     map[string]int  // rejection counts by sentinel name
	lastErrs []string
	trace    bool // log every status change and rejection (debugging a seed)
}

func newNetwork(t testing.TB, seed uint64, o netOpts) *network {
	if o.hb == 0 {
		o.hb = 2
	}
	if o.lease == 0 {
		o.lease = 5 * o.hb
	}
	if o.backoff == 0 {
		o.backoff = o.hb
	}
	if o.maxBackoff == 0 {
		o.maxBackoff = 4 * o.backoff
	}
	if o.attestDelay == 0 {
		o.attestDelay = 1
	}
	return &network{
		t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x5eed)), opts: o,
		nodes: map[string]*tnode{}, group: map[string]int{}, cut: map[[2]string]bool{},
		rate: map[string]float64{}, acc: map[string]float64{},
		views: map[string]map[uint64]string{}, newest: map[string]uint64{},
		honest: map[string]bool{}, errs: map[string]int{},
	}
}

func (nw *network) config(id string, stand bool, restore Status) Config {
	// Each incarnation gets its own seeded randomness: runs replay exactly.
	src := rand.New(rand.NewPCG(nw.seed, uint64(len(nw.ids))<<32|uint64(nw.rng.Uint32())))
	cfg := Config{
		ID: id, Swarm: testSwarm, CanStand: stand, Verify: testVerify,
		HeartbeatTicks: nw.opts.hb, LeaseTicks: nw.opts.lease,
		BackoffTicks: nw.opts.backoff, MaxBackoffTicks: nw.opts.maxBackoff,
		MaxTermJump: nw.opts.maxJump,
		Rand:        randReader{src},
	}
	if restore.Term > 0 {
		// The caller persists the floor with the proof of its claim.
		cfg.RestoreTerm, cfg.RestoreCoordinator, cfg.RestoreProof = restore.Term, restore.Coordinator, restore.Proof
	}
	return cfg
}

type randReader struct{ r *rand.Rand }

func (r randReader) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = byte(r.r.Uint32())
	}
	return len(b), nil
}

func (nw *network) add(id string, stand bool) {
	nw.t.Helper()
	if _, ok := nw.nodes[id]; ok {
		nw.t.Fatalf("peer %s added twice", id)
	}
	n, err := New(nw.config(id, stand, Status{}))
	if err != nil {
		nw.t.Fatal(err)
	}
	nw.ids = append(nw.ids, id)
	sort.Strings(nw.ids)
	nw.nodes[id] = &tnode{id: id, stand: stand, n: n}
	nw.views[id] = map[uint64]string{}
	nw.honest[id] = stand
}

// presence tells every live peer which standing peers are alive, as
// presence heartbeats would.
func (nw *network) presence() {
	var c []string
	for _, id := range nw.ids {
		if tn := nw.nodes[id]; tn.stand && !tn.dead {
			c = append(c, id)
		}
	}
	for _, id := range nw.ids {
		nw.nodes[id].n.SetCandidates(c)
	}
}

func (nw *network) alive(id string) bool {
	tn := nw.nodes[id]
	return !tn.dead && tn.pausedUntil <= nw.now
}

// connected says whether messages from a reach b now. Cuts are one-way.
func (nw *network) connected(a, b string) bool {
	return nw.group[a] == nw.group[b] && !nw.cut[[2]string{a, b}]
}

// tick advances every live peer by one tick and delivers what is due.
func (nw *network) tick() {
	nw.now++
	order := slices.Clone(nw.ids)
	nw.rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	for _, id := range order {
		if !nw.alive(id) {
			continue
		}
		k := 1
		if r, ok := nw.rate[id]; ok {
			nw.acc[id] += r
			k = int(nw.acc[id])
			nw.acc[id] -= float64(k)
		}
		for range k {
			nw.nodes[id].n.Tick()
			nw.after(id)
		}
	}
	nw.deliver()
}

func (nw *network) deliver() {
	for {
		progressed := false
		// Attestations due.
		jobs := nw.jobs[:0:0]
		for _, j := range nw.jobs {
			tn := nw.nodes[j.id]
			if j.at > nw.now || tn.pausedUntil > nw.now {
				jobs = append(jobs, j)
				continue
			}
			if tn.dead || tn.inc != j.inc {
				continue
			}
			progressed = true
			nw.record(tn.n.Attested(j.term, testEvidence(j.id, j.term, j.nonce[:]), nil))
			nw.after(j.id)
		}
		nw.jobs = jobs
		// Messages due, in (at, seq) order.
		sort.Slice(nw.queue, func(i, j int) bool {
			if nw.queue[i].at != nw.queue[j].at {
				return nw.queue[i].at < nw.queue[j].at
			}
			return nw.queue[i].seq < nw.queue[j].seq
		})
		var keep []inflight
		var due []inflight
		for _, f := range nw.queue {
			if f.at <= nw.now && nw.alive(f.to) {
				due = append(due, f)
			} else if !nw.nodes[f.to].dead {
				keep = append(keep, f) // paused peers get their mail late
			}
		}
		nw.queue = keep
		for _, f := range due {
			progressed = true
			if !nw.connected(f.from, f.to) {
				continue // the partition swallowed it in flight
			}
			if nw.hook != nil && !nw.hook(f.from, f.to, f.m) {
				continue
			}
			nw.record(nw.nodes[f.to].n.Step(f.m))
			nw.after(f.to)
		}
		if !progressed {
			return
		}
	}
}

// record counts a Step/Attested error by its sentinel.
func (nw *network) record(err error) {
	if err == nil {
		return
	}
	for _, s := range []error{ErrMalformed, ErrStaleTerm, ErrConflict, ErrEvidence, ErrForgedParent, ErrUncheckedParent, ErrStaleAttestation, ErrTermJump} {
		if errors.Is(err, s) {
			nw.errs[s.Error()]++
			break
		}
	}
	if nw.trace {
		nw.t.Logf("tick %d: %v", nw.now, err)
	}
	nw.lastErrs = append(nw.lastErrs, err.Error())
	if len(nw.lastErrs) > 64 {
		nw.lastErrs = nw.lastErrs[1:]
	}
}

// after drains a peer's Ready into the network and checks its view.
func (nw *network) after(id string) {
	tn := nw.nodes[id]
	nw.checkSafety(id, tn.n.Status())
	if !tn.n.HasReady() {
		return
	}
	rd := tn.n.Ready()
	if nw.trace && rd.StatusChanged {
		nw.t.Logf("tick %d: %s now %s term %d coord %s live=%v", nw.now, id, rd.Status.Role, rd.Status.Term, rd.Status.Coordinator, rd.Status.Live)
	}
	if nw.trace && rd.Attest != nil {
		nw.t.Logf("tick %d: %s attests for term %d", nw.now, id, rd.Attest.Term)
	}
	for _, m := range rd.Messages {
		nw.broadcast(id, m)
	}
	if rd.Attest != nil {
		nw.jobs = append(nw.jobs, attestJob{at: nw.now + nw.opts.attestDelay, id: id, term: rd.Attest.Term, nonce: rd.Attest.Nonce, inc: tn.inc})
	}
}

// inject sends m as if from its author (which may be a forger).
func (nw *network) inject(from string, m Message) { nw.broadcast(from, m) }

func (nw *network) broadcast(from string, m Message) {
	for _, to := range nw.ids {
		if to == from || nw.nodes[to].dead {
			continue
		}
		if !nw.connected(from, to) || (nw.drop > 0 && nw.rng.Float64() < nw.drop) {
			continue
		}
		copies := 1
		if nw.dup > 0 && nw.rng.Float64() < nw.dup {
			copies = 2
		}
		for range copies {
			d := 0
			if nw.delay > 0 {
				d = nw.rng.IntN(nw.delay + 1)
			}
			nw.qseq++
			nw.queue = append(nw.queue, inflight{at: nw.now + d, seq: nw.qseq, from: from, to: to, m: m})
		}
	}
}

// checkSafety is the property the whole package exists for, checked from
// this peer's own view after everything it does.
func (nw *network) checkSafety(id string, st Status) {
	nw.t.Helper()
	if st.Term < nw.newest[id] {
		nw.t.Fatalf("tick %d: %s went back from term %d to %d", nw.now, id, nw.newest[id], st.Term)
	}
	nw.newest[id] = st.Term
	if st.Term == 0 {
		return
	}
	if prev, ok := nw.views[id][st.Term]; ok && prev != st.Coordinator {
		nw.t.Fatalf("tick %d: %s followed two coordinators in term %d: %s and %s", nw.now, id, st.Term, prev, st.Coordinator)
	}
	nw.views[id][st.Term] = st.Coordinator
	if !nw.honest[st.Coordinator] {
		nw.t.Fatalf("tick %d: %s accepted %s, who has no valid evidence, for term %d", nw.now, id, st.Coordinator, st.Term)
	}
	if st.Role == Coordinator && !nw.nodes[id].stand {
		nw.t.Fatalf("tick %d: %s cannot attest yet is coordinator", nw.now, id)
	}
}

func (nw *network) kill(id string) {
	tn := nw.nodes[id]
	tn.dead = true
	var keep []inflight
	for _, f := range nw.queue {
		if f.to != id {
			keep = append(keep, f)
		}
	}
	nw.queue = keep
}

// restart brings a dead peer back with the view it persisted.
func (nw *network) restart(id string) {
	nw.t.Helper()
	tn := nw.nodes[id]
	st := tn.n.Status()
	n, err := New(nw.config(id, tn.stand, st))
	if err != nil {
		nw.t.Fatal(err)
	}
	tn.n, tn.dead = n, false
	tn.inc++
	nw.checkSafety(id, n.Status())
}

func (nw *network) pause(id string, ticks int) { nw.nodes[id].pausedUntil = nw.now + ticks }

func (nw *network) partition(groups ...[]string) {
	clear(nw.group)
	for i, g := range groups {
		for _, id := range g {
			nw.group[id] = i + 1
		}
	}
}

func (nw *network) isolate(id string) { nw.group[id] = 1000 + len(nw.group) }

func (nw *network) heal() {
	clear(nw.group)
	clear(nw.cut)
}

// skew sets a peer's clock speed (1 is the network's).
func (nw *network) skew(id string, rate float64) {
	if rate == 1 {
		delete(nw.rate, id)
		delete(nw.acc, id)
		return
	}
	nw.rate[id] = rate
}

// agreement reports whether every live peer in ids follows the same live
// coordinator, and which.
func (nw *network) agreement(ids []string) (string, uint64, bool) {
	var coord string
	var term uint64
	first := true
	for _, id := range ids {
		tn := nw.nodes[id]
		if tn.dead {
			continue
		}
		st := tn.n.Status()
		f := st.Following()
		if f == "" || nw.nodes[f].dead {
			return "", 0, false
		}
		if first {
			coord, term, first = f, st.Term, false
		} else if f != coord || st.Term != term {
			return "", 0, false
		}
	}
	return coord, term, !first
}

func (nw *network) live() []string {
	var out []string
	for _, id := range nw.ids {
		if !nw.nodes[id].dead {
			out = append(out, id)
		}
	}
	return out
}

// stabilize ticks until the live peers agree or max ticks pass; it returns
// the ticks taken or -1.
func (nw *network) stabilize(max int) (string, uint64, int) {
	for i := 0; i <= max; i++ {
		if c, term, ok := nw.agreement(nw.live()); ok {
			return c, term, i
		}
		nw.tick()
	}
	return "", 0, -1
}

func (nw *network) coordinator() string {
	c, _, _ := nw.agreement(nw.live())
	return c
}

func (nw *network) describe() string {
	var b strings.Builder
	for _, id := range nw.ids {
		tn := nw.nodes[id]
		st := tn.n.Status()
		state := fmt.Sprintf("%s term %d coord %s", st.Role, st.Term, dash(st.Coordinator))
		if st.Live {
			state += " live"
		}
		switch {
		case tn.dead:
			state = "dead"
		case tn.pausedUntil > nw.now:
			state += " paused"
		}
		fmt.Fprintf(&b, "%s: %s\n", id, state)
	}
	return b.String()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
