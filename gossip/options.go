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
	"github.com/holopeer/holopeer/tee"
)

// AttestFunc makes evidence on this machine binding (the swarm, this node's
// identity key, nonce, term). See TEEAttester.
type AttestFunc func(ctx context.Context, term uint64, nonce []byte) (evidence []byte, err error)

// VerifyFunc checks evidence offered by author for (swarm, author's identity
// key, nonce, term) against the node's policy. It must be safe for
// concurrent use and give the same answer for the same inputs (results are
// cached). See TEEVerifier.
type VerifyFunc func(ctx context.Context, author lpeer.ID, term uint64, nonce []byte, evidence []byte) (election.Attestation, error)

// CapabilityFunc returns this node's sealed capability record
// (hpeer.SealCapability) for the next presence heartbeat.
type CapabilityFunc func() ([]byte, error)

// Timing sets the service's clocks. Zero fields take the defaults, which
// make a swarm agree on a coordinator about 5–10 s after start and replace
// a dead one within about 10 s.
type Timing struct {
	Tick          time.Duration // election tick (default 200 ms)
	Heartbeat     time.Duration // coordinator heartbeat (default 1 s)
	Lease         time.Duration // follower lease (default 5 s; ≥ 3 heartbeats)
	BackoffStep   time.Duration // candidate wait per better-ranked candidate (default 1 s)
	MaxBackoff    time.Duration // cap on that wait (default 4 s)
	AttestTimeout time.Duration // how long one attestation may take (default 5 s)
	Presence      time.Duration // presence heartbeat (default 2 s)
	PresenceTTL   time.Duration // a peer is present this long after its last heartbeat (default 3 × Presence)
	Freshness     time.Duration // messages issued longer ago are ignored (default 60 s)
	MaxSkew       time.Duration // messages issued further in the future are ignored (default 15 s)
}

func (t *Timing) fill() error {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&t.Tick, 200*time.Millisecond)
	def(&t.Heartbeat, 5*t.Tick)
	def(&t.Lease, 5*t.Heartbeat)
	def(&t.BackoffStep, t.Heartbeat)
	def(&t.MaxBackoff, 4*t.BackoffStep)
	def(&t.AttestTimeout, t.Lease)
	def(&t.Presence, 2*time.Second)
	def(&t.PresenceTTL, 3*t.Presence)
	def(&t.Freshness, 60*time.Second)
	def(&t.MaxSkew, 15*time.Second)
	switch {
	case t.Tick < time.Millisecond:
		return fmt.Errorf("gossip: tick %v is too short", t.Tick)
	case t.Heartbeat < t.Tick || t.BackoffStep < t.Tick || t.MaxBackoff < t.BackoffStep:
		return fmt.Errorf("gossip: heartbeat, backoff step and max backoff must each be ≥ tick, max backoff ≥ step")
	case t.Lease < 3*t.Heartbeat:
		return fmt.Errorf("gossip: lease %v must be at least 3 heartbeats (%v)", t.Lease, 3*t.Heartbeat)
	case t.Lease > maxLeaseMillis*time.Millisecond:
		return fmt.Errorf("gossip: lease %v too long", t.Lease)
	case t.Presence <= 0 || t.PresenceTTL < t.Presence:
		return fmt.Errorf("gossip: presence TTL must be ≥ presence interval")
	case t.Freshness < t.Lease:
		return fmt.Errorf("gossip: freshness window %v shorter than the lease %v", t.Freshness, t.Lease)
	case t.MaxSkew < 0:
		return fmt.Errorf("gossip: negative max skew")
	}
	return nil
}

func (t *Timing) ticks(d time.Duration) int { return int((d + t.Tick - 1) / t.Tick) }

// Option configures a Service. Options return an error for invalid values
// and refuse to be given twice.
type Option func(*config) error

type config struct {
	swarm      string
	log        *slog.Logger
	clock      Clock
	capability CapabilityFunc
	attest     AttestFunc
	verify     VerifyFunc
	candidate  *bool
	allowSim   bool
	timing     Timing
	psOpts     []pubsub.Option
	stateFile  string
	teeAtt     tee.Attester
	teeVer     *tee.Verifier
	statusHook func(election.Status) // tests: every change of view, from the owner goroutine
	set        map[string]bool
}

func (c *config) once(name string) error {
	if c.set[name] {
		return fmt.Errorf("gossip: option %s given twice", name)
	}
	c.set[name] = true
	return nil
}

// WithSwarm names the swarm; topics are /holopeer/<swarm>/<topic>/1.
// Required.
func WithSwarm(name string) Option {
	return func(c *config) error {
		if name == "" || len(name) > 64 {
			return fmt.Errorf("gossip: swarm name %q must be 1..64 bytes", name)
		}
		if err := c.once("swarm"); err != nil {
			return err
		}
		c.swarm = name
		return nil
	}
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("gossip: nil logger")
		}
		if err := c.once("logger"); err != nil {
			return err
		}
		c.log = l
		return nil
	}
}

// WithClock sets the clock for ticks and freshness checks (default: the
// system clock).
func WithClock(k Clock) Option {
	return func(c *config) error {
		if k == nil {
			return errors.New("gossip: nil clock")
		}
		if err := c.once("clock"); err != nil {
			return err
		}
		c.clock = k
		return nil
	}
}

// WithCapability sets where presence heartbeats get this node's sealed
// capability record. Without it the node sends no presence (it still
// reads others').
func WithCapability(f CapabilityFunc) Option {
	return func(c *config) error {
		if f == nil {
			return errors.New("gossip: nil capability func")
		}
		if err := c.once("capability"); err != nil {
			return err
		}
		c.capability = f
		return nil
	}
}

// WithAttester sets how this node makes evidence. A node with an attester
// stands for coordinator unless WithCandidate(false) says otherwise.
func WithAttester(f AttestFunc) Option {
	return func(c *config) error {
		if f == nil {
			return errors.New("gossip: nil attester")
		}
		if err := c.once("attester"); err != nil {
			return err
		}
		c.attest = f
		return nil
	}
}

// WithVerifier sets how this node checks others' evidence. Required: a
// node that cannot verify must not follow anyone.
func WithVerifier(f VerifyFunc) Option {
	return func(c *config) error {
		if f == nil {
			return errors.New("gossip: nil verifier")
		}
		if err := c.once("verifier"); err != nil {
			return err
		}
		c.verify = f
		return nil
	}
}

// WithCandidate says whether this node stands for coordinator (default:
// whether it has an attester). Standing needs an attester.
func WithCandidate(stand bool) Option {
	return func(c *config) error {
		if err := c.once("candidate"); err != nil {
			return err
		}
		c.candidate = &stand
		return nil
	}
}

// WithAllowSim lets this node follow a coordinator whose evidence is
// INSECURE sim evidence (testnets only). Without it such a coordinator is
// refused even if the verifier's policy let the evidence through.
func WithAllowSim(allow bool) Option {
	return func(c *config) error {
		if err := c.once("allow-sim"); err != nil {
			return err
		}
		c.allowSim = allow
		return nil
	}
}

// WithTiming sets the election and presence timing; zero fields keep
// their defaults.
func WithTiming(t Timing) Option {
	return func(c *config) error {
		if err := c.once("timing"); err != nil {
			return err
		}
		if err := t.fill(); err != nil {
			return err
		}
		c.timing = t
		return nil
	}
}

// WithPubSubOptions appends options for the GossipSub router (for example
// pubsub.WithDirectPeers for bootstrap nodes). The service's own options
// (strict signing, peer scoring) come first; these may add to them.
func WithPubSubOptions(opts ...pubsub.Option) Option {
	return func(c *config) error {
		c.psOpts = append(c.psOpts, opts...)
		return nil
	}
}

// WithStateFile keeps the newest accepted term and its coordinator in
// path, so that after a restart this node never accepts an older term or
// another coordinator for that term (the fencing floor survives).
func WithStateFile(path string) Option {
	return func(c *config) error {
		if path == "" {
			return errors.New("gossip: empty state file path")
		}
		if err := c.once("state-file"); err != nil {
			return err
		}
		c.stateFile = path
		return nil
	}
}

// WithTEE attests with a and verifies with v through TEEAttester and
// TEEVerifier, bound to the swarm and the host's identity key. a may be nil
// (--tee none): the node then verifies, follows and votes but never stands.
// It replaces WithAttester and WithVerifier.
func WithTEE(a tee.Attester, v *tee.Verifier) Option {
	return func(c *config) error {
		if v == nil {
			return errors.New("gossip: WithTEE needs a verifier")
		}
		if err := c.once("tee"); err != nil {
			return err
		}
		c.teeAtt, c.teeVer = a, v
		return nil
	}
}
