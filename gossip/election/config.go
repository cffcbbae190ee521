package election

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
)

// VerifyFunc checks that evidence binds (the swarm, author's identity key,
// nonce, term) and satisfies the verifier's policy. It must be a pure check:
// the same inputs give the same answer. The caller decides what "the
// author's identity key" is (in holopeer, the key inside the author's peer
// ID, whose signature pubsub has already checked).
type VerifyFunc func(author string, term uint64, nonce []byte, evidence []byte) (Attestation, error)

// Attestation is what a successful verification says about a coordinator.
type Attestation struct {
	TEE      string // provider: snp, tdx or sim
	Insecure bool   // sim evidence: proves nothing; show it wherever the coordinator is shown
}

// Config configures a Node. Durations are in ticks; a tick is whatever the
// caller's clock makes it (holopeer's gossip service uses 200 ms).
type Config struct {
	// ID is this peer's identity (the peer ID string). Required.
	ID string
	// Swarm is the swarm name, mixed into every nonce. Required.
	Swarm string
	// CanStand says whether this peer can attest and so may become
	// coordinator. A peer that cannot still follows and votes.
	CanStand bool
	// Verify checks a claim's evidence. Required.
	Verify VerifyFunc

	// HeartbeatTicks is how often a coordinator sends a heartbeat.
	// Default 5.
	HeartbeatTicks int
	// LeaseTicks is how long a follower keeps following without a
	// heartbeat. It must be at least 3 × HeartbeatTicks so that a couple of
	// lost heartbeats do not depose a live coordinator. Default
	// 5 × HeartbeatTicks.
	LeaseTicks int
	// BackoffTicks is a candidate's wait per better-ranked live candidate.
	// Default HeartbeatTicks.
	BackoffTicks int
	// MaxBackoffTicks caps the wait. Liveness is bounded by LeaseTicks +
	// MaxBackoffTicks (+ attestation and delivery). Default 4 × BackoffTicks.
	MaxBackoffTicks int
	// AttestTimeoutTicks is how long a candidate waits for its attestation
	// before it gives up and backs off. Default LeaseTicks.
	AttestTimeoutTicks int
	// BeaconMemory is how many of its coordinator's latest heartbeats a
	// follower remembers to check a candidacy's parent. It must cover the
	// heartbeats a candidate can miss before it claims. Default
	// (LeaseTicks + MaxBackoffTicks + AttestTimeoutTicks) / HeartbeatTicks + 4.
	BeaconMemory int
	// VoteTicks is how often a follower repeats its vote while its lease is
	// live, so the coordinator knows its followers. Default LeaseTicks.
	VoteTicks int
	// Rand supplies beacon secrets and salts. Default crypto/rand; tests
	// pass a seeded source to replay a run exactly.
	Rand io.Reader

	// MaxTermJump bounds how far one claim (or proven vote) may lift this
	// peer's term above the newest it has accepted. A claim beyond it is
	// refused (ErrTermJump) and not remembered, so a single hostile claim
	// for, say, term 2^64−1 can neither wrap the next term nor poison the
	// persisted floor: moving the term by J takes a claim per J terms, and
	// exhausting 64 bits at the default takes 2^48 of them. An honest swarm
	// gains a few terms per election, so only a partition holding 2^16
	// elections on one side would outrun it. Default 1 << 16.
	MaxTermJump uint64

	// RestoreTerm and RestoreCoordinator are the newest term and its
	// coordinator a previous run of this peer accepted (persisted by the
	// caller), so a restart never goes back below them or follows someone
	// else in that term. Zero for a fresh peer.
	RestoreTerm        uint64
	RestoreCoordinator string
	// RestoreProof is the proof of that coordinator's claim (Status.Proof,
	// persisted with the term). Optional: with it, a restarted peer whose
	// coordinator died can still prove its term to a live coordinator of
	// an older one (see Votes in the package doc); without it such a peer
	// waits for a standing peer to open a newer term.
	RestoreProof ClaimProof
}

// validate rejects bad combinations and fills in defaults.
func (c *Config) validate() error {
	if c.ID == "" {
		return errors.New("election: config needs an ID")
	}
	if c.Swarm == "" {
		return errors.New("election: config needs a Swarm")
	}
	if c.Verify == nil {
		return errors.New("election: config needs a Verify function")
	}
	if (c.RestoreTerm == 0) != (c.RestoreCoordinator == "") {
		return errors.New("election: RestoreTerm and RestoreCoordinator go together")
	}
	if c.RestoreTerm == 0 && len(c.RestoreProof.Evidence) > 0 {
		return errors.New("election: RestoreProof needs RestoreTerm")
	}
	if c.MaxTermJump == 0 {
		c.MaxTermJump = 1 << 16
	}
	if c.HeartbeatTicks == 0 {
		c.HeartbeatTicks = 5
	}
	if c.LeaseTicks == 0 {
		c.LeaseTicks = 5 * c.HeartbeatTicks
	}
	if c.BackoffTicks == 0 {
		c.BackoffTicks = c.HeartbeatTicks
	}
	if c.MaxBackoffTicks == 0 {
		c.MaxBackoffTicks = 4 * c.BackoffTicks
	}
	if c.AttestTimeoutTicks == 0 {
		c.AttestTimeoutTicks = c.LeaseTicks
	}
	if c.VoteTicks == 0 {
		c.VoteTicks = c.LeaseTicks
	}
	switch {
	case c.HeartbeatTicks < 1:
		return fmt.Errorf("election: HeartbeatTicks %d must be ≥ 1", c.HeartbeatTicks)
	case c.LeaseTicks < 3*c.HeartbeatTicks:
		return fmt.Errorf("election: LeaseTicks %d must be ≥ 3 × HeartbeatTicks (%d)", c.LeaseTicks, c.HeartbeatTicks)
	case c.BackoffTicks < 1 || c.MaxBackoffTicks < c.BackoffTicks:
		return fmt.Errorf("election: need 1 ≤ BackoffTicks (%d) ≤ MaxBackoffTicks (%d)", c.BackoffTicks, c.MaxBackoffTicks)
	case c.AttestTimeoutTicks < 1:
		return fmt.Errorf("election: AttestTimeoutTicks %d must be ≥ 1", c.AttestTimeoutTicks)
	case c.VoteTicks < 1:
		return fmt.Errorf("election: VoteTicks %d must be ≥ 1", c.VoteTicks)
	}
	if c.BeaconMemory == 0 {
		c.BeaconMemory = (c.LeaseTicks+c.MaxBackoffTicks+c.AttestTimeoutTicks)/c.HeartbeatTicks + 4
	}
	if c.BeaconMemory < c.LeaseTicks/c.HeartbeatTicks+1 {
		return fmt.Errorf("election: BeaconMemory %d must cover a lease (%d heartbeats)", c.BeaconMemory, c.LeaseTicks/c.HeartbeatTicks+1)
	}
	if c.Rand == nil {
		c.Rand = rand.Reader
	}
	return nil
}
