package election

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
)

// Sentinel errors. Step and Attested wrap one of them, so callers can log
// the reason and count rejections by kind.
var (
	// ErrMalformed: the message breaks a structural rule (term 0, a claim
	// whose coordinator is not its author, a parent not older than its term).
	ErrMalformed = errors.New("election: malformed message")
	// ErrStaleTerm: the message is for a term older than the newest accepted.
	ErrStaleTerm = errors.New("election: stale term")
	// ErrConflict: a valid claim for a term whose coordinator this peer has
	// already accepted from someone else; never followed.
	ErrConflict = errors.New("election: term already has a coordinator")
	// ErrEvidence: the claim's evidence does not verify.
	ErrEvidence = errors.New("election: evidence rejected")
	// ErrForgedParent: the claim names this peer's own coordinator and term
	// as its parent with a beacon that coordinator never sent.
	ErrForgedParent = errors.New("election: parent beacon is not the coordinator's")
	// ErrUncheckedParent: the claim's parent cannot be checked and this
	// peer's coordinator is live; it is refused for now, not for good.
	ErrUncheckedParent = errors.New("election: claim cannot prove it is newer than the live coordinator")
	// ErrStaleAttestation: an attestation arrived for a claim no longer wanted.
	ErrStaleAttestation = errors.New("election: attestation no longer wanted")
	// ErrTermJump: the message's term is more than Config.MaxTermJump above
	// the newest term this peer accepted; it is ignored, not remembered.
	ErrTermJump = errors.New("election: term jumps too far past the accepted term")
)

type stepFunc func(n *Node, m Message) error

// seqBeacon is one remembered heartbeat of the followed coordinator.
type seqBeacon struct {
	seq    uint64
	beacon [BeaconSize]byte
}

// pendingClaim is a candidacy waiting for its attestation.
type pendingClaim struct {
	term   uint64
	parent Parent
	salt   [SaltSize]byte
	nonce  [NonceSize]byte
	waited int
}

// deferredClaim is a valid claim put off while our coordinator was live.
type deferredClaim struct {
	m  Message
	at int // tick it was last heard
}

// ownClaim is what this node, as coordinator, repeats in every heartbeat.
type ownClaim struct {
	parent   Parent
	salt     [SaltSize]byte
	evidence []byte
}

// Node is one peer's election state machine. It is not safe for concurrent
// use: one goroutine owns it (see gossip.Service).
type Node struct {
	cfg  Config
	role Role
	step stepFunc
	tick func(n *Node)

	// The view. term only grows; coord is fixed once term is set.
	term     uint64
	coord    string
	att      Attestation
	claimKey [32]byte   // digest of the accepted claim's nonce and evidence
	proof    ClaimProof // of coord's claim for term, when known
	live     bool
	lease    int // ticks a lapse takes (follower) / wait before standing (not live)
	elapsed  int // ticks since the coordinator was last heard
	ring     []seqBeacon
	parent   Parent // newest heartbeat accepted: the parent of our next claim
	highest  uint64 // highest term seen with valid evidence
	voteWait int
	// deferred is the newest valid claim refused only because our
	// coordinator was live and the claim could not show it was newer.
	deferred *deferredClaim
	// conflictVoteAt is the tick of our last vote sent because of a
	// same-term conflict or a stale claim (rate limit).
	conflictVoteAt int

	candidates map[string]bool

	// Candidate (and a coordinator re-claiming after a conflict).
	claimTerm uint64
	backoff   int
	pending   *pendingClaim

	// Coordinator. secret survives a step-down so that this node can still
	// recognise its own beacons in a successor's parent.
	secret     [32]byte
	secretTerm uint64
	seq        uint64
	hbWait     int
	own        ownClaim
	voters     map[string]int

	ticks  int
	msgs   []Message
	attest *AttestRequest
	prev   Status
}

// New returns a node that starts as a follower and listens for a lease
// before it may stand.
func New(cfg Config) (*Node, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, candidates: map[string]bool{}}
	n.term, n.coord = cfg.RestoreTerm, cfg.RestoreCoordinator
	n.highest = n.term
	if p := cfg.RestoreProof; len(p.Evidence) > 0 {
		// Keep the proof only if it still proves the restored claim: a
		// vote carrying a bad one would be refused anyway.
		nonce := Nonce(cfg.Swarm, n.term, p.Parent, p.Salt)
		if att, err := cfg.Verify(n.coord, n.term, nonce[:], p.Evidence); err == nil && p.Parent.Term < n.term {
			n.proof, n.att = p, att
			n.claimKey = claimDigest(nonce, p.Evidence)
		}
	}
	n.becomeFollower(false)
	n.prev = n.Status()
	return n, nil
}

// ID returns the node's peer ID.
func (n *Node) ID() string { return n.cfg.ID }

// Config returns the validated configuration (defaults filled in).
func (n *Node) Config() Config { return n.cfg }

// Status returns the node's current view.
func (n *Node) Status() Status {
	s := Status{Role: n.role, Term: n.term, Coordinator: n.coord, Attestation: n.att, Proof: n.proof}
	switch {
	case n.role == Coordinator:
		s.Live, s.LeaseLeft = true, n.cfg.LeaseTicks
	case n.live:
		s.Live, s.LeaseLeft = true, n.lease-n.elapsed
	}
	return s
}

// AcceptTerm is the fencing check: nil when term is not older than the
// newest term this node accepted.
func (n *Node) AcceptTerm(term uint64) error {
	if term < n.term {
		return fmt.Errorf("%w: term %d is older than accepted term %d", ErrStaleTerm, term, n.term)
	}
	return nil
}

// SetCandidates tells the node which peers are standing (from presence),
// for its backoff. It is a hint for ordering only, never trusted for safety.
func (n *Node) SetCandidates(ids []string) {
	clear(n.candidates)
	for _, id := range ids {
		n.candidates[id] = true
	}
}

// Followers returns the peers that voted for this node in its current term
// recently. Empty unless this node is coordinator.
func (n *Node) Followers() []string {
	if n.role != Coordinator {
		return nil
	}
	out := make([]string, 0, len(n.voters))
	for id := range n.voters {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// HasReady reports whether Ready has something new.
func (n *Node) HasReady() bool {
	return len(n.msgs) > 0 || n.attest != nil || changed(n.prev, n.Status())
}

// Ready returns what the caller must do and clears it.
func (n *Node) Ready() Ready {
	st := n.Status()
	rd := Ready{Messages: n.msgs, Attest: n.attest, Status: st, StatusChanged: changed(n.prev, st)}
	n.msgs, n.attest, n.prev = nil, nil, st
	return rd
}

func changed(a, b Status) bool {
	return a.Role != b.Role || a.Term != b.Term || a.Coordinator != b.Coordinator || a.Live != b.Live
}

// Tick advances logical time by one tick.
func (n *Node) Tick() {
	n.ticks++
	n.tick(n)
}

// Step feeds one received message. Its author (From) must already be
// authenticated by the transport. The error says why a message was not
// acted on; the node's state is consistent either way.
func (n *Node) Step(m Message) error {
	if err := checkShape(m); err != nil {
		return err
	}
	if m.From == n.cfg.ID {
		return nil // our own message, echoed back by the transport
	}
	if m.Type == MsgVote {
		return n.step(n, m)
	}
	switch {
	case m.Term < n.term:
		n.tellStale()
		return fmt.Errorf("%w: %s term %d, accepted %d", ErrStaleTerm, m.Type, m.Term, n.term)
	case m.Term > n.term:
		return n.stepNewer(m)
	}
	return n.step(n, m)
}

// nextTerm is t+1, or false at the top of the term space: term arithmetic
// never wraps to 0 (with MaxTermJump in place the top is out of reach, but
// a restored floor is not checked against it).
func nextTerm(t uint64) (uint64, bool) {
	if t == math.MaxUint64 {
		return 0, false
	}
	return t + 1, true
}

// jumpErr refuses a term more than MaxTermJump above the accepted one. The
// anchor is this peer's own accepted term, never a merely seen one, so a
// refused claim cannot raise the bar for the next.
func (n *Node) jumpErr(m Message) error {
	if m.Term > n.term && m.Term-n.term > n.cfg.MaxTermJump {
		return fmt.Errorf("%w: %s term %d, accepted %d, bound +%d", ErrTermJump, m.Type, m.Term, n.term, n.cfg.MaxTermJump)
	}
	return nil
}

// tellStale answers a claim older than our accepted term while we follow
// no one: a peer that accepted a term whose coordinator died (it won a
// term only we heard) would otherwise refuse the live coordinator of an
// older term forever. The vote carries the proof of our term, so that
// coordinator can open a term above it, which we can follow. Votes
// without proof move nothing, so this cannot be used to force churn.
func (n *Node) tellStale() {
	if n.role != Follower || n.live || len(n.proof.Evidence) == 0 {
		return
	}
	if n.ticks-n.conflictVoteAt < 2*n.cfg.HeartbeatTicks {
		return
	}
	n.conflictVoteAt = n.ticks
	n.sendVote()
}

func checkShape(m Message) error {
	bad := func(why string) error { return fmt.Errorf("%w: %s: %s", ErrMalformed, m.Type, why) }
	switch {
	case m.Type != MsgCandidacy && m.Type != MsgHeartbeat && m.Type != MsgVote:
		return bad("unknown type")
	case m.From == "":
		return bad("no author")
	case m.Term == 0:
		return bad("term 0")
	case m.Coordinator == "":
		return bad("no coordinator")
	case m.Type == MsgVote && len(m.Evidence) == 0:
		return nil // an unproven vote: it can only count a follower
	case m.Type != MsgVote && m.Coordinator != m.From:
		return bad("claimant is not the author")
	case m.Parent.Term >= m.Term:
		return bad("parent term not older than term")
	case m.Parent.Term == 0 && (m.Parent.Coordinator != "" || m.Parent.Seq != 0 || m.Parent.Beacon != [BeaconSize]byte{}):
		return bad("genesis parent with content")
	case m.Parent.Term != 0 && m.Parent.Coordinator == "":
		return bad("parent without coordinator")
	case m.Type == MsgVote:
		return nil
	case m.Type == MsgCandidacy && m.Seq != 0:
		return bad("candidacy with seq ≠ 0")
	case m.Type == MsgHeartbeat && m.Seq == 0:
		return bad("heartbeat with seq 0")
	case m.Resign && m.Type != MsgHeartbeat:
		return bad("only a heartbeat resigns")
	case m.LeaseTicks <= 0:
		return bad("no lease")
	case len(m.Evidence) == 0:
		return bad("no evidence")
	}
	return nil
}

// stepNewer handles a claim for a term above the newest accepted: the one
// path by which a node's view moves forward, whatever its role.
func (n *Node) stepNewer(m Message) error {
	if err := n.jumpErr(m); err != nil {
		return err
	}
	checked, err := n.checkParent(m)
	if err != nil {
		return err
	}
	nonce := Nonce(n.cfg.Swarm, m.Term, m.Parent, m.Salt)
	att, err := n.cfg.Verify(m.From, m.Term, nonce[:], m.Evidence)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrEvidence, m, err)
	}
	n.highest = max(n.highest, m.Term)
	if !checked && n.live && n.role != Coordinator {
		// Keep it: if our coordinator lapses or resigns, this is the claim
		// to follow rather than start yet another term.
		if n.deferred == nil || m.Term >= n.deferred.m.Term {
			n.deferred = &deferredClaim{m: m, at: n.ticks}
		}
		return fmt.Errorf("%w: %s: parent %d/%s/%d is not among our recent heartbeats of %d/%s",
			ErrUncheckedParent, m, m.Parent.Term, short(m.Parent.Coordinator), m.Parent.Seq, n.term, short(n.coord))
	}
	if n.role == Coordinator {
		n.resign()
	}
	n.term, n.coord, n.att = m.Term, m.From, att
	n.proof = ClaimProof{Parent: m.Parent, Salt: m.Salt, Evidence: m.Evidence}
	n.deferred = nil
	n.claimKey = claimDigest(nonce, m.Evidence)
	n.ring = n.ring[:0]
	n.parent = Parent{}
	n.record(m)
	n.becomeFollower(true)
	n.lease = min(n.cfg.LeaseTicks, m.LeaseTicks)
	n.sendVote()
	return nil
}

// checkParent applies the parent rule of the package doc. It returns an
// error for a parent that names our own coordinator and term with a beacon
// it never sent, and checked=false for a parent it cannot check.
func (n *Node) checkParent(m Message) (checked bool, err error) {
	p := m.Parent
	if n.term == 0 || p.Term != n.term || p.Coordinator != n.coord {
		return false, nil
	}
	if n.coord == n.cfg.ID && n.secretTerm == n.term {
		if p.Seq > n.seq || beacon(n.secret, p.Term, p.Seq) != p.Beacon {
			return false, fmt.Errorf("%w: %s: beacon for our own heartbeat %d", ErrForgedParent, m, p.Seq)
		}
		return true, nil
	}
	for _, sb := range n.ring {
		if sb.seq == p.Seq {
			if sb.beacon != p.Beacon {
				return false, fmt.Errorf("%w: %s: heartbeat %d had another beacon", ErrForgedParent, m, p.Seq)
			}
			return true, nil
		}
	}
	return false, nil
}

// record remembers a heartbeat of the followed coordinator.
func (n *Node) record(m Message) {
	for _, sb := range n.ring {
		if sb.seq == m.Seq {
			return
		}
	}
	n.ring = append(n.ring, seqBeacon{m.Seq, m.Beacon})
	if len(n.ring) > n.cfg.BeaconMemory {
		oldest := 0
		for i, sb := range n.ring {
			if sb.seq < n.ring[oldest].seq {
				oldest = i
			}
		}
		n.ring = append(n.ring[:oldest], n.ring[oldest+1:]...)
	}
	if n.parent.Term != m.Term || n.parent.Coordinator != m.From || m.Seq >= n.parent.Seq {
		n.parent = Parent{Term: m.Term, Coordinator: m.From, Seq: m.Seq, Beacon: m.Beacon}
	}
}

// renew handles a claim of the followed coordinator in the accepted term.
func (n *Node) renew(m Message) error {
	nonce := Nonce(n.cfg.Swarm, m.Term, m.Parent, m.Salt)
	if key := claimDigest(nonce, m.Evidence); key != n.claimKey {
		// Same coordinator, same term, different proof: check it before
		// it renews anything.
		att, err := n.cfg.Verify(m.From, m.Term, nonce[:], m.Evidence)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrEvidence, m, err)
		}
		n.claimKey, n.att = key, att
		n.proof = ClaimProof{Parent: m.Parent, Salt: m.Salt, Evidence: m.Evidence}
	}
	for _, sb := range n.ring {
		if sb.seq == m.Seq && sb.beacon != m.Beacon {
			return fmt.Errorf("%w: %s: heartbeat %d repeated with another beacon", ErrMalformed, m, m.Seq)
		}
	}
	n.record(m)
	if n.role != Follower {
		n.becomeFollower(true)
	}
	if m.Resign {
		// Our coordinator yielded to someone we may not have heard yet:
		// stop following now, but give its successor a lease to reach us
		// before we stand ourselves.
		n.live, n.elapsed, n.lease = false, 0, n.cfg.LeaseTicks
		n.takeDeferred()
		return nil
	}
	if !n.live {
		n.voteWait = n.cfg.VoteTicks // say at once that we follow again
	}
	n.live, n.elapsed = true, 0
	n.lease = min(n.cfg.LeaseTicks, m.LeaseTicks)
	return nil
}

// refuseConflict handles a claim for the accepted term by someone other
// than the accepted coordinator. Verifying first makes the logged reason
// honest: a forgery is reported as such, not as a conflict.
func (n *Node) refuseConflict(m Message) error {
	nonce := Nonce(n.cfg.Swarm, m.Term, m.Parent, m.Salt)
	if _, err := n.cfg.Verify(m.From, m.Term, nonce[:], m.Evidence); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrEvidence, m, err)
	}
	// Tell the swarm whom we follow in this term. The other claimant (or
	// whoever coordinates this term where it is) learns that the term is
	// contested and moves to the next one, which we can then follow. This
	// matters when our own coordinator died: no one else would tell it.
	if n.role != Coordinator && n.ticks-n.conflictVoteAt >= 2*n.cfg.HeartbeatTicks {
		n.conflictVoteAt = n.ticks
		n.sendVote()
	}
	return fmt.Errorf("%w: %s, term %d accepted from %s", ErrConflict, m, n.term, short(n.coord))
}

func claimDigest(nonce [NonceSize]byte, evidence []byte) [32]byte {
	h := sha256.New()
	h.Write(nonce[:])
	h.Write(evidence)
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// --- follower ---------------------------------------------------------

func (n *Node) becomeFollower(live bool) {
	n.role, n.step, n.tick = Follower, stepFollower, tickFollower
	n.live, n.elapsed, n.pending, n.attest = live, 0, nil, nil
	n.lease = n.cfg.LeaseTicks
	n.voteWait = 0
}

func stepFollower(n *Node, m Message) error {
	if m.Type == MsgVote {
		return nil // only a coordinator counts votes
	}
	if m.From != n.coord {
		return n.refuseConflict(m)
	}
	return n.renew(m)
}

func tickFollower(n *Node) {
	n.elapsed++
	if n.live {
		if n.voteWait++; n.voteWait >= n.cfg.VoteTicks {
			n.sendVote()
		}
		if n.elapsed >= n.lease {
			n.live, n.elapsed = false, 0
			n.lease = 0 // a lapse is the wait: stand at once
			if n.takeDeferred() {
				return
			}
		}
	}
	if n.cfg.CanStand && !n.live && n.elapsed >= n.lease {
		n.becomeCandidate()
	}
}

// takeDeferred follows the claim we put off while our coordinator was
// live, if it is recent: someone already holds a newer term, so follow it
// rather than open another one.
func (n *Node) takeDeferred() bool {
	d := n.deferred
	if d == nil || d.m.Term <= n.term || n.ticks-d.at >= d.m.LeaseTicks || n.live {
		return false
	}
	if n.stepNewer(d.m) != nil {
		return false
	}
	n.elapsed = n.ticks - d.at
	return true
}

func (n *Node) sendVote() {
	n.voteWait = 0
	if n.coord == "" || n.coord == n.cfg.ID {
		return
	}
	// The proof lets the coordinator of another claim for this term (or of
	// an older term) check that our term is real before it acts on it.
	p := n.proof
	n.msgs = append(n.msgs, Message{Type: MsgVote, From: n.cfg.ID, Term: n.term, Coordinator: n.coord,
		Parent: p.Parent, Salt: p.Salt, Evidence: p.Evidence})
}

// --- candidate --------------------------------------------------------

func (n *Node) becomeCandidate() {
	next, ok := nextTerm(max(n.term, n.highest))
	if !ok {
		return // the term space is spent: follow, never stand
	}
	n.role, n.step, n.tick = Candidate, stepCandidate, tickCandidate
	n.live, n.pending = false, nil
	n.claimTerm = next
	ahead := 0
	for id := range n.candidates {
		// The coordinator whose lease lapsed is presumed gone.
		if id != n.cfg.ID && id != n.coord && Better(id, n.cfg.ID, n.claimTerm) {
			ahead++
		}
	}
	n.backoff = min(ahead*n.cfg.BackoffTicks, n.cfg.MaxBackoffTicks)
	if n.backoff == 0 {
		n.startClaim(n.claimTerm)
	}
}

func stepCandidate(n *Node, m Message) error {
	if m.Type == MsgVote {
		return nil
	}
	if m.From != n.coord {
		return n.refuseConflict(m)
	}
	return n.renew(m) // the coordinator is alive after all
}

func tickCandidate(n *Node) {
	if p := n.pending; p != nil {
		if p.waited++; p.waited > n.cfg.AttestTimeoutTicks {
			n.pending, n.attest = nil, nil
			n.backoff = n.cfg.BackoffTicks
		}
		return
	}
	if n.backoff > 0 {
		n.backoff--
		return
	}
	next, ok := nextTerm(max(n.term, n.highest))
	if !ok {
		n.becomeFollower(false)
		return
	}
	n.claimTerm = max(n.claimTerm, next)
	n.startClaim(n.claimTerm)
}

// startClaim draws a salt, derives the nonce from our newest parent and
// asks the caller to attest.
func (n *Node) startClaim(term uint64) {
	p := &pendingClaim{term: term, parent: n.parent}
	n.read(p.salt[:])
	p.nonce = Nonce(n.cfg.Swarm, term, p.parent, p.salt)
	n.pending = p
	n.attest = &AttestRequest{Term: term, Nonce: p.nonce}
}

// Attested gives the node the evidence it asked for in an AttestRequest
// (or the error that prevented it).
func (n *Node) Attested(term uint64, evidence []byte, attestErr error) error {
	p := n.pending
	if p == nil || p.term != term {
		return fmt.Errorf("%w: term %d", ErrStaleAttestation, term)
	}
	n.pending = nil
	if attestErr != nil {
		n.backoff = n.cfg.BackoffTicks
		return fmt.Errorf("election: attest for term %d: %w", term, attestErr)
	}
	if term <= n.term {
		return fmt.Errorf("%w: term %d already accepted", ErrStaleAttestation, term)
	}
	// Check our own evidence as every peer will: a node whose evidence
	// its swarm refuses (say, sim on a swarm without --allow-sim) must not
	// believe itself coordinator.
	att, err := n.cfg.Verify(n.cfg.ID, term, p.nonce[:], evidence)
	if err != nil {
		if n.role == Candidate {
			n.becomeFollower(false)
		}
		return fmt.Errorf("%w: own evidence for term %d: %w", ErrEvidence, term, err)
	}
	n.becomeCoordinator(p, evidence, att)
	return nil
}

// --- coordinator ------------------------------------------------------

func (n *Node) becomeCoordinator(p *pendingClaim, evidence []byte, att Attestation) {
	n.role, n.step, n.tick = Coordinator, stepCoordinator, tickCoordinator
	n.term, n.coord, n.att, n.live = p.term, n.cfg.ID, att, true
	n.highest = max(n.highest, p.term)
	n.claimKey = claimDigest(p.nonce, evidence)
	n.proof = ClaimProof{Parent: p.parent, Salt: p.salt, Evidence: evidence}
	n.read(n.secret[:])
	n.secretTerm, n.seq, n.hbWait = p.term, 0, 0
	n.own = ownClaim{parent: p.parent, salt: p.salt, evidence: evidence}
	n.deferred = nil
	n.ring = n.ring[:0]
	n.voters = map[string]int{}
	n.sendClaim(MsgCandidacy)
}

func (n *Node) sendClaim(t MsgType) {
	b := beacon(n.secret, n.term, n.seq)
	n.parent = Parent{Term: n.term, Coordinator: n.cfg.ID, Seq: n.seq, Beacon: b}
	n.msgs = append(n.msgs, Message{
		Type: t, From: n.cfg.ID, Term: n.term, Coordinator: n.cfg.ID,
		Seq: n.seq, Beacon: b, Parent: n.own.parent, Salt: n.own.salt,
		Evidence: n.own.evidence, LeaseTicks: n.cfg.LeaseTicks,
	})
}

func stepCoordinator(n *Node, m Message) error {
	if m.Type == MsgVote {
		switch {
		case m.Term < n.term:
		case m.Coordinator == n.cfg.ID:
			if m.Term == n.term {
				n.voters[m.From] = n.ticks
			}
		default:
			return n.stepContested(m)
		}
		return nil
	}
	// A valid claim for our own term by someone else: settle it by rank.
	nonce := Nonce(n.cfg.Swarm, m.Term, m.Parent, m.Salt)
	if _, err := n.cfg.Verify(m.From, m.Term, nonce[:], m.Evidence); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrEvidence, m, err)
	}
	if Better(n.cfg.ID, m.From, n.term) {
		next, ok := nextTerm(max(n.term, n.highest))
		if ok && n.pending == nil {
			n.startClaim(next)
		}
		return fmt.Errorf("%w: %s; we outrank it and claim term %d", ErrConflict, m, next)
	}
	n.resign()
	n.becomeFollower(false) // keep term and coord (ourselves): never follow the other in this term
	return fmt.Errorf("%w: %s outranks us; yielding", ErrConflict, m)
}

// stepContested handles a vote, for our term or a newer one, for someone
// else: the voter can never follow us in our term, either because another
// claim won it there or because the voter accepted a newer term whose
// coordinator may be gone. Open a term above both, which the voter can
// follow. Only a vote that carries a valid proof of that other claim acts:
// votes are signed by any peer, so an unproven one (a ghost coordinator)
// moves nothing, and a proven one only once, since the next term leaves
// its claim behind.
func (n *Node) stepContested(m Message) error {
	if len(m.Evidence) == 0 || n.pending != nil {
		return nil
	}
	if err := n.jumpErr(m); err != nil {
		return err
	}
	nonce := Nonce(n.cfg.Swarm, m.Term, m.Parent, m.Salt)
	if _, err := n.cfg.Verify(m.Coordinator, m.Term, nonce[:], m.Evidence); err != nil {
		return fmt.Errorf("%w: %s: proof of %s's claim: %w", ErrEvidence, m, short(m.Coordinator), err)
	}
	n.highest = max(n.highest, m.Term)
	next, ok := nextTerm(n.highest)
	if !ok {
		return nil
	}
	n.startClaim(next)
	return fmt.Errorf("%w: %s proves term %d is taken elsewhere; claiming term %d", ErrConflict, m, m.Term, next)
}

// resign sends a last heartbeat whose one-tick lease lets our followers go
// at once instead of a lease later. Only an optimisation: a lost resign
// costs a lease of waiting, never safety.
func (n *Node) resign() {
	n.seq++
	n.sendClaim(MsgHeartbeat)
	n.msgs[len(n.msgs)-1].Resign = true
}

func tickCoordinator(n *Node) {
	if n.hbWait++; n.hbWait >= n.cfg.HeartbeatTicks {
		n.hbWait = 0
		n.seq++
		n.sendClaim(MsgHeartbeat)
	}
	if p := n.pending; p != nil {
		if p.waited++; p.waited > n.cfg.AttestTimeoutTicks {
			n.pending, n.attest = nil, nil
		}
	}
	for id, at := range n.voters {
		if n.ticks-at > 2*n.cfg.VoteTicks+n.cfg.HeartbeatTicks {
			delete(n.voters, id)
		}
	}
}

func (n *Node) read(b []byte) {
	if _, err := io.ReadFull(n.cfg.Rand, b); err != nil {
		// A node without randomness cannot make unpredictable beacons or
		// salts; carrying on would weaken every nonce.
		panic(fmt.Sprintf("election: randomness source failed: %v", err))
	}
}
