package gossip

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	pb "github.com/libp2p/go-libp2p-pubsub/pb"
	"github.com/libp2p/go-libp2p/core/crypto"
	lpeer "github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/gossip/election"
	"github.com/holopeer/holopeer/tee"
)

// fixedClock is a clock that stands still; validators only read Now.
type fixedClock struct{ now time.Time }

func (c fixedClock) Now() time.Time                 { return c.now }
func (c fixedClock) NewTicker(time.Duration) Ticker { panic("validators need no ticker") }

// validatorService builds just enough of a Service to run its validators,
// with the real tee verifier (sim allowed by policy) behind them.
func validatorService(t *testing.T, now time.Time, allowSim bool) *Service {
	t.Helper()
	return newValidatorService(t, now, allowSim)
}

func validatorServiceB(b *testing.B, now time.Time) *Service {
	return newValidatorService(b, now, true)
}

func newValidatorService(t testing.TB, now time.Time, allowSim bool) *Service {
	timing := Timing{}
	if err := timing.fill(); err != nil {
		t.Fatal(err)
	}
	const swarm = "unit"
	verify, err := TEEVerifier(verifier(t, tee.Policy{AllowSim: true}), swarm)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	s := &Service{
		cfg:      config{swarm: swarm, clock: fixedClock{now}, timing: timing, verify: verify, allowSim: allowSim},
		log:      log,
		ctx:      context.Background(),
		vcache:   map[[32]byte]verifyResult{},
		presence: map[lpeer.ID]*PresenceInfo{},
	}
	s.names.presence, s.names.election, s.names.jobs = PresenceTopic(swarm), ElectionTopic(swarm), JobsTopic(swarm)
	s.rejects = newRejectLog(log, s.cfg.clock, time.Second)
	return s
}

func pmsg(author lpeer.ID, data []byte) *pubsub.Message {
	return &pubsub.Message{Message: &pb.Message{From: []byte(author), Data: data}}
}

type signer struct {
	key crypto.PrivKey
	id  lpeer.ID
}

func newSigner(t *testing.T) signer {
	k := genKey(t)
	id, err := lpeer.IDFromPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return signer{k, id}
}

// claimBy builds a claim by s for term with sim evidence bound as the
// election binds it; evTerm lets a test bind the evidence to another term.
func claimBy(t testing.TB, svc *Service, s signer, term, evTerm uint64, issued time.Time) *Claim {
	t.Helper()
	c := &Claim{Candidacy: true, Term: term, IssuedAt: issued, Lease: 5 * time.Second, Coordinator: s.id}
	c.Salt[0] = 9
	em := svc.toElection(s.id, c)
	nonce := election.Nonce(svc.cfg.swarm, evTerm, em.Parent, c.Salt)
	attest, err := TEEAttester(simAttester(t, svc.cfg.swarm), svc.cfg.swarm, s.key.GetPublic())
	if err != nil {
		t.Fatal(err)
	}
	if c.Evidence, err = attest(context.Background(), evTerm, nonce[:]); err != nil {
		t.Fatal(err)
	}
	return c
}

// proofVote is voter's vote for coord in term carrying coord's claim proof,
// attested for evTerm.
func proofVote(t testing.TB, svc *Service, voter, coord signer, term, evTerm uint64, issued time.Time) *Vote {
	t.Helper()
	c := claimBy(t, svc, coord, term, evTerm, issued)
	return &Vote{Term: term, IssuedAt: issued, Voter: voter.id, Coordinator: coord.id, Salt: c.Salt, Parent: c.Parent, Evidence: c.Evidence}
}

func TestValidateElection(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	a, b := newSigner(t), newSigner(t)
	tests := []struct {
		name     string
		allowSim bool
		fence    uint64
		author   lpeer.ID
		data     func(*Service) []byte
		want     pubsub.ValidationResult
		reason   string
	}{
		{"valid candidacy", true, 0, a.id, func(s *Service) []byte { return mustMarshal(t, claimBy(t, s, a, 1, 1, now)) }, pubsub.ValidationAccept, ""},
		{"oversized", true, 0, a.id, func(*Service) []byte { return make([]byte, MaxElectionBytes+1) }, pubsub.ValidationReject, ReasonSize},
		{"not a message", true, 0, a.id, func(*Service) []byte { return []byte{0x01, 0x01, 0xff} }, pubsub.ValidationReject, ReasonSchema},
		{"signed by another peer", true, 0, b.id, func(s *Service) []byte { return mustMarshal(t, claimBy(t, s, a, 1, 1, now)) }, pubsub.ValidationReject, ReasonAuthor},
		{"issued before the window", true, 0, a.id, func(s *Service) []byte {
			return mustMarshal(t, claimBy(t, s, a, 1, 1, now.Add(-2*time.Minute)))
		}, pubsub.ValidationIgnore, ReasonStale},
		{"issued in the future", true, 0, a.id, func(s *Service) []byte {
			return mustMarshal(t, claimBy(t, s, a, 1, 1, now.Add(time.Minute)))
		}, pubsub.ValidationIgnore, ReasonFuture},
		{"older term than accepted", true, 5, a.id, func(s *Service) []byte { return mustMarshal(t, claimBy(t, s, a, 4, 4, now)) }, pubsub.ValidationIgnore, ReasonStaleTerm},
		{"evidence of another term", true, 0, a.id, func(s *Service) []byte { return mustMarshal(t, claimBy(t, s, a, 3, 2, now)) }, pubsub.ValidationReject, ReasonEvidence},
		{"sim where sim is not allowed", false, 0, a.id, func(s *Service) []byte { return mustMarshal(t, claimBy(t, s, a, 1, 1, now)) }, pubsub.ValidationReject, ReasonEvidence},
		{"vote", true, 0, a.id, func(*Service) []byte {
			return mustMarshal(t, &Vote{Term: 1, IssuedAt: now, Voter: a.id, Coordinator: b.id})
		}, pubsub.ValidationAccept, ""},
		{"vote for someone else's voter", true, 0, b.id, func(*Service) []byte {
			return mustMarshal(t, &Vote{Term: 1, IssuedAt: now, Voter: a.id, Coordinator: b.id})
		}, pubsub.ValidationReject, ReasonAuthor},
		// Issue 16 finding 2: one claim for the last term must not travel.
		{"term far past accepted", true, 3, a.id, func(s *Service) []byte {
			return mustMarshal(t, claimBy(t, s, a, math.MaxUint64, math.MaxUint64, now))
		}, pubsub.ValidationIgnore, ReasonTermJump},
		{"vote carrying the proof of its coordinator's claim", true, 0, a.id, func(s *Service) []byte {
			return mustMarshal(t, proofVote(t, s, a, b, 2, 2, now))
		}, pubsub.ValidationAccept, ""},
		// A vote for a ghost: the proof is not the coordinator's.
		{"vote with a proof for another term", true, 0, a.id, func(s *Service) []byte {
			return mustMarshal(t, proofVote(t, s, a, b, 2, 3, now))
		}, pubsub.ValidationReject, ReasonEvidence},
		{"vote far past accepted", true, 3, a.id, func(s *Service) []byte {
			return mustMarshal(t, &Vote{Term: math.MaxUint64, IssuedAt: now, Voter: a.id, Coordinator: b.id})
		}, pubsub.ValidationIgnore, ReasonTermJump},
	}
	for _, tt := range tests {
		s := validatorService(t, now, tt.allowSim)
		s.maxJump = 1 << 16
		s.fence.Advance(tt.fence)
		m := pmsg(tt.author, tt.data(s))
		got := s.validateElection(context.Background(), tt.author, m)
		if got != tt.want {
			t.Errorf("%s: %v, want %v (rejections %v)", tt.name, got, tt.want, s.rejects.snapshot())
			continue
		}
		if tt.reason != "" && s.rejects.snapshot()[tt.reason] != 1 {
			t.Errorf("%s: reasons %v, want one %q", tt.name, s.rejects.snapshot(), tt.reason)
		}
		if got == pubsub.ValidationAccept {
			if _, ok := m.ValidatorData.(election.Message); !ok {
				t.Errorf("%s: accepted without election.Message validator data", tt.name)
			}
		}
	}
}

func TestValidatePresence(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	a, b := newSigner(t), newSigner(t)
	seal := func(s signer, swarm string) []byte {
		c, err := sealFor(t, s.key, swarm, "none")()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	msg := func(issued time.Time, c []byte) []byte {
		return mustMarshal(t, &PresenceMsg{IssuedAt: issued, Capability: c})
	}
	s := validatorService(t, now, false)
	for _, tt := range []struct {
		name   string
		author lpeer.ID
		data   []byte
		want   pubsub.ValidationResult
		reason string
	}{
		{"valid", a.id, msg(now, seal(a, "unit")), pubsub.ValidationAccept, ""},
		{"someone else's capability", b.id, msg(now, seal(a, "unit")), pubsub.ValidationReject, ReasonAuthor},
		{"another swarm", a.id, msg(now, seal(a, "other")), pubsub.ValidationReject, ReasonSwarm},
		{"not a sealed record", a.id, msg(now, []byte("forged")), pubsub.ValidationReject, ReasonCapability},
		{"stale", a.id, msg(now.Add(-time.Hour), seal(a, "unit")), pubsub.ValidationIgnore, ReasonStale},
	} {
		before := s.rejects.snapshot()[tt.reason]
		m := pmsg(tt.author, tt.data)
		if got := s.validatePresence(context.Background(), tt.author, m); got != tt.want {
			t.Errorf("%s: %v, want %v (%v)", tt.name, got, tt.want, s.rejects.snapshot())
		} else if tt.reason != "" && s.rejects.snapshot()[tt.reason] != before+1 {
			t.Errorf("%s: reasons %v, want %q", tt.name, s.rejects.snapshot(), tt.reason)
		} else if got == pubsub.ValidationAccept {
			s.readPresence(m)
		}
	}
	// A replay of an older heartbeat is ignored as a duplicate.
	m := pmsg(a.id, msg(now.Add(-time.Second), seal(a, "unit")))
	if got := s.validatePresence(context.Background(), a.id, m); got != pubsub.ValidationIgnore {
		t.Errorf("older heartbeat: %v, want ignore", got)
	}
	if p := s.Presence(); len(p) != 1 || p[a.id].Capability.PeerID != a.id.String() {
		t.Errorf("presence %v, want just %s", p, a.id)
	}
}

func TestValidateJob(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	a := newSigner(t)
	s := validatorService(t, now, false)
	s.fence.Advance(3)
	job := func(term uint64) []byte {
		return mustMarshal(t, &JobMsg{Term: term, IssuedAt: now, Payload: []byte("x")})
	}
	if got := s.validateJob(context.Background(), a.id, pmsg(a.id, job(3))); got != pubsub.ValidationAccept {
		t.Errorf("current term: %v", got)
	}
	if got := s.validateJob(context.Background(), a.id, pmsg(a.id, job(2))); got != pubsub.ValidationIgnore {
		t.Errorf("older term: %v, want ignore", got)
	}
	if got := s.validateJob(context.Background(), a.id, pmsg(a.id, make([]byte, MaxJobBytes+1))); got != pubsub.ValidationReject {
		t.Errorf("oversized: %v, want reject", got)
	}
}

// TestVerifyCache: a verification our own deadline cut short is neither
// cached nor blamed on the sender.
func TestVerifyCache(t *testing.T) {
	s := validatorService(t, time.Now(), true)
	calls := 0
	fail := true
	s.cfg.verify = func(ctx context.Context, _ lpeer.ID, _ uint64, _, _ []byte) (election.Attestation, error) {
		calls++
		if fail {
			return election.Attestation{}, context.DeadlineExceeded
		}
		return election.Attestation{TEE: "sim", Insecure: true}, nil
	}
	id := newSigner(t).id
	if _, err := s.verify(context.Background(), id, 1, []byte("nonce"), []byte("ev")); !errors.Is(err, errVerifyInterrupted) {
		t.Fatalf("err = %v, want interrupted", err)
	}
	fail = false
	for range 3 {
		if _, err := s.verify(context.Background(), id, 1, []byte("nonce"), []byte("ev")); err != nil {
			t.Fatal(err)
		}
	}
	if calls != 2 {
		t.Errorf("verifier called %d times, want 2 (one interrupted, then cached)", calls)
	}
}
