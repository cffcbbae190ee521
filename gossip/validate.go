package gossip

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	lpeer "github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/gossip/election"
	hpeer "github.com/holopeer/holopeer/peer"
)

// Rejection reasons, as logged and counted in Stats.
const (
	ReasonSize        = "size"          // larger than the topic allows
	ReasonSchema      = "schema"        // does not decode
	ReasonAuthor      = "author"        // signed author is not the peer the message names
	ReasonSwarm       = "swarm"         // capability of another swarm
	ReasonCapability  = "capability"    // sealed capability does not open
	ReasonEvidence    = "evidence"      // TEE evidence does not verify (or is sim where sim is not allowed)
	ReasonStale       = "stale"         // issued before the freshness window
	ReasonFuture      = "future"        // issued too far ahead of our clock
	ReasonStaleTerm   = "stale-term"    // older term than the newest accepted (fencing)
	ReasonTermJump    = "term-jump"     // more than the election's MaxTermJump above the newest accepted
	ReasonDuplicate   = "duplicate"     // not newer than what we have
	ReasonConflict    = "conflict"      // a second coordinator for an accepted term
	ReasonParent      = "forged-parent" // nonce descends from a beacon never sent
	ReasonUnchecked   = "unchecked-parent"
	ReasonMalformed   = "malformed" // breaks an election rule
	ReasonAttestation = "attestation"
	// ReasonVerifyTimeout: verification ran out of time here; the message
	// is ignored without blame and its next copy is verified afresh.
	ReasonVerifyTimeout = "verify-timeout"
)

// reject logs (rate-limited) and returns Reject: the forwarder is
// penalised in its peer score.
func (s *Service) reject(topic, reason string, author lpeer.ID, err error) pubsub.ValidationResult {
	s.rejects.note(slog.LevelWarn, topic, reason, author.String(), err)
	return pubsub.ValidationReject
}

// ignore logs at debug and returns Ignore: dropped without penalty, for
// messages an honest peer may forward (stale, duplicate, older term).
func (s *Service) ignore(topic, reason string, author lpeer.ID, err error) pubsub.ValidationResult {
	s.rejects.note(slog.LevelDebug, topic, reason, author.String(), err)
	return pubsub.ValidationIgnore
}

// freshness says why issued is outside the window, or "".
func (s *Service) freshness(issued time.Time) (string, error) {
	now := s.cfg.clock.Now()
	switch {
	case issued.Before(now.Add(-s.cfg.timing.Freshness)):
		return ReasonStale, fmt.Errorf("issued %v ago, window %v", now.Sub(issued).Round(time.Millisecond), s.cfg.timing.Freshness)
	case issued.After(now.Add(s.cfg.timing.MaxSkew)):
		return ReasonFuture, fmt.Errorf("issued %v ahead of our clock, skew allowed %v", issued.Sub(now).Round(time.Millisecond), s.cfg.timing.MaxSkew)
	}
	return "", nil
}

func (s *Service) validateElection(ctx context.Context, _ lpeer.ID, m *pubsub.Message) pubsub.ValidationResult {
	topic, author, data := s.names.election, m.GetFrom(), m.GetData()
	if len(data) > MaxElectionBytes {
		return s.reject(topic, ReasonSize, author, fmt.Errorf("%d bytes, limit %d", len(data), MaxElectionBytes))
	}
	claim, vote, err := DecodeElection(data)
	if err != nil {
		return s.reject(topic, ReasonSchema, author, err)
	}
	if vote != nil {
		if vote.Voter != author {
			return s.reject(topic, ReasonAuthor, author, fmt.Errorf("vote names voter %s", vote.Voter))
		}
		if r, err := s.freshness(vote.IssuedAt); r != "" {
			return s.ignore(topic, r, author, err)
		}
		if vote.Term < s.fence.Newest() {
			return s.ignore(topic, ReasonStaleTerm, author, fmt.Errorf("vote for term %d, accepted %d", vote.Term, s.fence.Newest()))
		}
		if err := s.termJump(vote.Term); err != nil {
			return s.ignore(topic, ReasonTermJump, author, err)
		}
		em := election.Message{Type: election.MsgVote, From: author.String(), Term: vote.Term, Coordinator: vote.Coordinator.String()}
		if len(vote.Evidence) > 0 {
			// A proof moves a coordinator to a new term, so check it here
			// as a claim's evidence is: a forged one costs its sender score
			// and never reaches the election. Honest votes repeat the same
			// proof, which the verify cache answers.
			em.Salt, em.Evidence = vote.Salt, vote.Evidence
			em.Parent = election.Parent{Term: vote.Parent.Term, Seq: vote.Parent.Seq, Beacon: vote.Parent.Beacon}
			if vote.Parent.Coordinator != "" {
				em.Parent.Coordinator = vote.Parent.Coordinator.String()
			}
			nonce := election.Nonce(s.cfg.swarm, em.Term, em.Parent, em.Salt)
			if _, err := s.verify(ctx, vote.Coordinator, vote.Term, nonce[:], vote.Evidence); err != nil {
				if errors.Is(err, errVerifyInterrupted) {
					return s.ignore(topic, ReasonVerifyTimeout, author, err)
				}
				return s.reject(topic, ReasonEvidence, author, fmt.Errorf("vote proof for %s term %d: %w", vote.Coordinator, vote.Term, err))
			}
		}
		m.ValidatorData = em
		return pubsub.ValidationAccept
	}
	if claim.Coordinator != author {
		return s.reject(topic, ReasonAuthor, author, fmt.Errorf("claim for coordinator %s", claim.Coordinator))
	}
	if r, err := s.freshness(claim.IssuedAt); r != "" {
		return s.ignore(topic, r, author, err)
	}
	if newest := s.fence.Newest(); claim.Term < newest {
		return s.ignore(topic, ReasonStaleTerm, author, fmt.Errorf("claim for term %d, accepted %d", claim.Term, newest))
	}
	if err := s.termJump(claim.Term); err != nil {
		return s.ignore(topic, ReasonTermJump, author, err)
	}
	em := s.toElection(author, claim)
	nonce := election.Nonce(s.cfg.swarm, em.Term, em.Parent, em.Salt)
	if _, err := s.verify(ctx, author, claim.Term, nonce[:], claim.Evidence); err != nil {
		if errors.Is(err, errVerifyInterrupted) {
			return s.ignore(topic, ReasonVerifyTimeout, author, err)
		}
		return s.reject(topic, ReasonEvidence, author, fmt.Errorf("term %d: %w", claim.Term, err))
	}
	m.ValidatorData = em
	return pubsub.ValidationAccept
}

// termJump refuses, before any verification and before it is forwarded, a
// term the election would refuse as too far above the newest accepted
// (election.Config.MaxTermJump): one hostile claim for term 2^64-1 must not
// travel the swarm. Ignored, not rejected: an honest peer far ahead after a
// long partition is not at fault.
func (s *Service) termJump(term uint64) error {
	newest, bound := s.fence.Newest(), s.maxJump
	if bound > 0 && term > newest && term-newest > bound {
		return fmt.Errorf("term %d is more than %d above accepted term %d", term, bound, newest)
	}
	return nil
}

// toElection converts a decoded claim to the state machine's message.
func (s *Service) toElection(author lpeer.ID, c *Claim) election.Message {
	t := election.MsgHeartbeat
	if c.Candidacy {
		t = election.MsgCandidacy
	}
	var parent string
	if c.Parent.Coordinator != "" {
		parent = c.Parent.Coordinator.String()
	}
	return election.Message{
		Type: t, From: author.String(), Term: c.Term, Coordinator: c.Coordinator.String(),
		Seq: c.Seq, Beacon: c.Beacon, Salt: c.Salt, Evidence: c.Evidence, Resign: c.Resign,
		Parent:     election.Parent{Term: c.Parent.Term, Coordinator: parent, Seq: c.Parent.Seq, Beacon: c.Parent.Beacon},
		LeaseTicks: max(1, s.cfg.timing.ticks(c.Lease)),
	}
}

func (s *Service) validatePresence(_ context.Context, _ lpeer.ID, m *pubsub.Message) pubsub.ValidationResult {
	topic, author, data := s.names.presence, m.GetFrom(), m.GetData()
	if len(data) > MaxPresenceBytes {
		return s.reject(topic, ReasonSize, author, fmt.Errorf("%d bytes, limit %d", len(data), MaxPresenceBytes))
	}
	p, err := DecodePresence(data)
	if err != nil {
		return s.reject(topic, ReasonSchema, author, err)
	}
	if r, err := s.freshness(p.IssuedAt); r != "" {
		return s.ignore(topic, r, author, err)
	}
	c, err := hpeer.OpenCapability(p.Capability)
	if err != nil {
		return s.reject(topic, ReasonCapability, author, err)
	}
	if c.PeerID != author.String() {
		return s.reject(topic, ReasonAuthor, author, fmt.Errorf("capability of %s", c.PeerID))
	}
	if c.Swarm != s.cfg.swarm {
		return s.reject(topic, ReasonSwarm, author, fmt.Errorf("capability for swarm %q", c.Swarm))
	}
	s.mu.Lock()
	prev := s.presence[author]
	s.mu.Unlock()
	if prev != nil && !p.IssuedAt.After(prev.IssuedAt) {
		return s.ignore(topic, ReasonDuplicate, author, fmt.Errorf("issued %v, have %v", p.IssuedAt, prev.IssuedAt))
	}
	m.ValidatorData = &PresenceInfo{Capability: c, Sealed: p.Capability, IssuedAt: p.IssuedAt}
	return pubsub.ValidationAccept
}

func (s *Service) validateJob(_ context.Context, _ lpeer.ID, m *pubsub.Message) pubsub.ValidationResult {
	topic, author, data := s.names.jobs, m.GetFrom(), m.GetData()
	if len(data) > MaxJobBytes {
		return s.reject(topic, ReasonSize, author, fmt.Errorf("%d bytes, limit %d", len(data), MaxJobBytes))
	}
	j, err := DecodeJob(data)
	if err != nil {
		return s.reject(topic, ReasonSchema, author, err)
	}
	if r, err := s.freshness(j.IssuedAt); r != "" {
		return s.ignore(topic, r, author, err)
	}
	if newest := s.fence.Newest(); j.Term < newest {
		return s.ignore(topic, ReasonStaleTerm, author, fmt.Errorf("job of term %d, accepted %d", j.Term, newest))
	}
	m.ValidatorData = j
	return pubsub.ValidationAccept
}

// --- readers: messages that passed validation -------------------------

func (s *Service) readElection(m *pubsub.Message) {
	if m.GetFrom() == s.self {
		return
	}
	em, ok := m.ValidatorData.(election.Message)
	if !ok {
		return
	}
	select {
	case s.electionIn <- em:
	case <-s.ctx.Done():
	}
}

func (s *Service) readPresence(m *pubsub.Message) {
	p, ok := m.ValidatorData.(*PresenceInfo)
	if !ok {
		return
	}
	p.LastSeen = s.cfg.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev := s.presence[m.GetFrom()]; prev == nil || p.IssuedAt.After(prev.IssuedAt) {
		s.presence[m.GetFrom()] = p
	}
}

// prunePresence forgets peers long gone, so the map does not grow without
// bound (the run loop calls it once per presence interval).
func (s *Service) prunePresence() {
	now := s.cfg.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, q := range s.presence {
		if now.Sub(q.LastSeen) > 10*s.cfg.timing.PresenceTTL {
			delete(s.presence, id)
		}
	}
}

func (s *Service) readJob(m *pubsub.Message) {
	j, ok := m.ValidatorData.(*JobMsg)
	if !ok {
		return
	}
	from := m.GetFrom()
	job := Job{From: from, Term: j.Term, IssuedAt: j.IssuedAt, Payload: j.Payload}
	if c := s.coord.Load(); c != nil && c.Term == j.Term && c.PeerID == from {
		job.FromCoordinator = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.jobSubs {
		select {
		case ch <- job:
		default:
			s.jobsDropped++
		}
	}
}

// stepReason maps an election error to a reason and a log level.
func stepReason(err error) (string, slog.Level) {
	switch {
	case errors.Is(err, errVerifyInterrupted):
		return ReasonVerifyTimeout, slog.LevelInfo
	case errors.Is(err, election.ErrEvidence):
		return ReasonEvidence, slog.LevelWarn
	case errors.Is(err, election.ErrForgedParent):
		return ReasonParent, slog.LevelWarn
	case errors.Is(err, election.ErrMalformed):
		return ReasonMalformed, slog.LevelWarn
	case errors.Is(err, election.ErrConflict):
		return ReasonConflict, slog.LevelInfo
	case errors.Is(err, election.ErrUncheckedParent):
		return ReasonUnchecked, slog.LevelInfo
	case errors.Is(err, election.ErrStaleTerm):
		return ReasonStaleTerm, slog.LevelDebug
	case errors.Is(err, election.ErrTermJump):
		return ReasonTermJump, slog.LevelWarn
	}
	return ReasonAttestation, slog.LevelWarn
}
