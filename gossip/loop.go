package gossip

import (
	"context"
	"time"

	lpeer "github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/gossip/election"
)

// run is the one goroutine that owns the election node: ticks from the
// clock, messages from the election subscription, attestation results
// from attest goroutines; it publishes what the node returns.
func (s *Service) run() {
	defer s.wg.Done()
	t := s.cfg.timing
	tick := s.cfg.clock.NewTicker(t.Tick)
	defer tick.Stop()
	presence := s.cfg.clock.NewTicker(t.Presence)
	defer presence.Stop()
	s.publishPresence()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-tick.C():
			s.node.SetCandidates(s.candidates())
			s.node.Tick()
		case <-presence.C():
			s.publishPresence()
			s.prunePresence()
		case m := <-s.electionIn:
			if err := s.node.Step(m); err != nil {
				reason, level := stepReason(err)
				s.rejects.note(level, s.names.election, reason, m.From, err)
			}
		case r := <-s.attested:
			if err := s.node.Attested(r.term, r.evidence, r.err); err != nil {
				reason, level := stepReason(err)
				s.rejects.note(level, s.names.election, reason, s.self.String(), err)
			}
		}
		if s.node.HasReady() {
			s.handle(s.node.Ready())
		}
		s.refresh()
	}
}

// candidates lists the peers presence says can stand (a hint for the
// backoff order; evidence is what counts).
func (s *Service) candidates() []string {
	now := s.cfg.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for id, p := range s.presence {
		if p.Capability.CanAttest && p.Capability.TEE != "" && p.Capability.TEE != "none" &&
			now.Sub(p.LastSeen) <= s.cfg.timing.PresenceTTL {
			out = append(out, id.String())
		}
	}
	if s.node.Config().CanStand {
		out = append(out, s.self.String())
	}
	return out
}

func (s *Service) handle(rd election.Ready) {
	for _, m := range rd.Messages {
		s.publishElection(m)
	}
	if a := rd.Attest; a != nil {
		s.startAttest(a.Term, a.Nonce)
	}
	if rd.StatusChanged {
		s.onStatus(rd.Status)
	}
}

func (s *Service) publishElection(m election.Message) {
	now := s.cfg.clock.Now()
	var b []byte
	var err error
	switch m.Type {
	case election.MsgVote:
		coord, derr := lpeer.Decode(m.Coordinator)
		if derr != nil {
			s.log.Error("gossip: vote for undecodable peer", "peer", m.Coordinator, "err", derr)
			return
		}
		v := &Vote{Term: m.Term, IssuedAt: now, Voter: s.self, Coordinator: coord,
			Salt: m.Salt, Evidence: m.Evidence,
			Parent: ClaimParent{Term: m.Parent.Term, Seq: m.Parent.Seq, Beacon: m.Parent.Beacon}}
		if m.Parent.Coordinator != "" {
			if v.Parent.Coordinator, err = lpeer.Decode(m.Parent.Coordinator); err != nil {
				s.log.Error("gossip: vote proof parent undecodable", "peer", m.Parent.Coordinator, "err", err)
				return
			}
		}
		b, err = v.Marshal()
	default:
		c := &Claim{
			Candidacy: m.Type == election.MsgCandidacy, Term: m.Term, IssuedAt: now,
			Lease: time.Duration(m.LeaseTicks) * s.cfg.timing.Tick, Seq: m.Seq, Resign: m.Resign,
			Coordinator: s.self, Beacon: m.Beacon, Salt: m.Salt, Evidence: m.Evidence,
			Parent: ClaimParent{Term: m.Parent.Term, Seq: m.Parent.Seq, Beacon: m.Parent.Beacon},
		}
		if m.Parent.Coordinator != "" {
			if c.Parent.Coordinator, err = lpeer.Decode(m.Parent.Coordinator); err != nil {
				s.log.Error("gossip: parent coordinator undecodable", "peer", m.Parent.Coordinator, "err", err)
				return
			}
		}
		b, err = c.Marshal()
	}
	if err != nil {
		s.log.Error("gossip: encode election message", "type", m.Type, "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.timing.Heartbeat)
	defer cancel()
	if err := s.topics[s.names.election].Publish(ctx, b); err != nil && s.ctx.Err() == nil {
		s.log.Warn("gossip: publish election message", "type", m.Type, "term", m.Term, "err", err)
	}
}

func (s *Service) startAttest(term uint64, nonce [election.NonceSize]byte) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.timing.AttestTimeout)
		defer cancel()
		ev, err := s.cfg.attest(ctx, term, nonce[:])
		select {
		case s.attested <- attestResult{term, ev, err}:
		case <-s.ctx.Done():
		}
	}()
}

func (s *Service) publishPresence() {
	if s.cfg.capability == nil {
		return
	}
	c, err := s.cfg.capability()
	if err != nil {
		s.log.Warn("gossip: capability for presence", "err", err)
		return
	}
	b, err := (&PresenceMsg{IssuedAt: s.cfg.clock.Now(), Capability: c}).Marshal()
	if err != nil {
		s.log.Warn("gossip: encode presence", "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.timing.Presence)
	defer cancel()
	if err := s.topics[s.names.presence].Publish(ctx, b); err != nil && s.ctx.Err() == nil {
		s.log.Warn("gossip: publish presence", "err", err)
	}
}

// onStatus reacts to a changed view: fence, persist, tell watchers, log.
func (s *Service) onStatus(st election.Status) {
	if s.cfg.statusHook != nil {
		s.cfg.statusHook(st)
	}
	s.fence.Advance(st.Term)
	if st.Term != s.lastTerm {
		s.lastTerm = st.Term
		if err := saveState(s.cfg.stateFile, s.cfg.swarm, st.Term, st.Coordinator); err != nil {
			s.log.Error("gossip: persist election state", "err", err)
		}
	}
	old := s.coord.Load()
	s.refresh()
	c := s.coord.Load()
	if sameCoordinator(old, c) {
		return
	}
	if c == nil {
		s.log.Info("gossip: no coordinator", "term", st.Term, "role", st.Role)
	} else {
		attrs := []any{"coordinator", c.PeerID, "term", c.Term, "tee", c.Label(), "self", c.Self}
		if c.Insecure {
			s.log.Warn("gossip: following an INSECURE (sim) coordinator: its evidence proves nothing", attrs...)
		} else {
			s.log.Info("gossip: following coordinator", attrs...)
		}
	}
	s.notifyWatchers(s.Coordinator())
}

func sameCoordinator(a, b *CoordinatorInfo) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.PeerID == b.PeerID && a.Term == b.Term
}

// refresh publishes the node's view for readers on other goroutines.
func (s *Service) refresh() {
	st := s.node.Status()
	if f := st.Following(); f != "" {
		id, err := lpeer.Decode(f)
		if err == nil {
			s.coord.Store(&CoordinatorInfo{
				PeerID: id, Term: st.Term, TEE: st.Attestation.TEE, Insecure: st.Attestation.Insecure,
				LeaseExpires: s.cfg.clock.Now().Add(time.Duration(st.LeaseLeft) * s.cfg.timing.Tick),
				Self:         id == s.self,
			})
		}
	} else {
		s.coord.Store(nil)
	}
	var fs []lpeer.ID
	for _, f := range s.node.Followers() {
		if id, err := lpeer.Decode(f); err == nil {
			fs = append(fs, id)
		}
	}
	s.followers.Store(&fs)
}
