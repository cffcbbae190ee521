package gossip

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	lpeer "github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/gossip/election"
	hpeer "github.com/holopeer/holopeer/peer"
)

// ErrInsecureNotAllowed: the evidence verified, but it is sim (INSECURE)
// evidence and this node was not started with WithAllowSim(true).
var ErrInsecureNotAllowed = errors.New("gossip: insecure (sim) evidence not allowed on this swarm")

// errVerifyInterrupted marks a verification cut short by our own deadline
// or shutdown.
var errVerifyInterrupted = errors.New("gossip: verification interrupted")

// ErrClosed is returned by calls on a closed Service.
var ErrClosed = errors.New("gossip: service closed")

// Topic names of a swarm.
func PresenceTopic(swarm string) string { return "/holopeer/" + swarm + "/presence/1" }
func ElectionTopic(swarm string) string { return "/holopeer/" + swarm + "/election/1" }
func JobsTopic(swarm string) string     { return "/holopeer/" + swarm + "/jobs/1" }

// CoordinatorInfo describes the coordinator this node follows.
type CoordinatorInfo struct {
	PeerID       lpeer.ID
	Term         uint64
	TEE          string // provider of its evidence: snp, tdx, sim
	Insecure     bool   // sim evidence: proves nothing; show "INSECURE" wherever it is shown
	LeaseExpires time.Time
	Self         bool // this node is the coordinator
}

// Label is the TEE as a status line should print it.
func (c *CoordinatorInfo) Label() string {
	if c.Insecure {
		return c.TEE + " (INSECURE)"
	}
	return c.TEE
}

// PresenceInfo is the latest verified capability of a peer.
type PresenceInfo struct {
	Capability hpeer.Capability
	Sealed     []byte    // the signed record, for hpeer.Host.AddMember
	IssuedAt   time.Time // when the peer sent it (its clock)
	LastSeen   time.Time // when we received it (our clock)
}

// Job is a message on the jobs topic.
type Job struct {
	From     lpeer.ID
	Term     uint64 // the sender's newest accepted term when it sent this
	IssuedAt time.Time
	Payload  []byte
	// FromCoordinator says the sender is the coordinator this node
	// accepted for Term. Anything a coordinator sends must also pass
	// AcceptTerm(Term) when it is acted on.
	FromCoordinator bool
}

// Stats counts what the service refused, by reason.
type Stats struct {
	Rejections  map[string]uint64
	JobsDropped uint64 // job messages a slow subscriber missed
}

// Service runs a swarm's gossip: presence, the coordinator election and
// the jobs topic, over GossipSub with a validator on every topic.
type Service struct {
	// Static after New.
	h       host.Host
	cfg     config
	self    lpeer.ID
	log     *slog.Logger
	ps      *pubsub.PubSub
	topics  map[string]*pubsub.Topic
	subs    []*pubsub.Subscription
	names   struct{ presence, election, jobs string }
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	rejects *rejectLog
	fence   election.Fence

	// Wholly owned by the run goroutine.
	node     *election.Node
	maxJump  uint64 // node's MaxTermJump, for the validators (read-only after New)
	lastTerm uint64

	// Written by run, read by anyone.
	coord     atomic.Pointer[CoordinatorInfo]
	followers atomic.Pointer[[]lpeer.ID]

	// Channels into run.
	electionIn chan election.Message
	attested   chan attestResult

	// vmu guards the verification cache.
	vmu    sync.Mutex
	vcache map[[32]byte]verifyResult

	// mu guards all following fields.
	mu          sync.Mutex
	presence    map[lpeer.ID]*PresenceInfo
	watchers    map[chan *CoordinatorInfo]struct{}
	jobSubs     map[chan Job]struct{}
	jobsDropped uint64
	closed      bool
}

type attestResult struct {
	term     uint64
	evidence []byte
	err      error
}

type verifyResult struct {
	att election.Attestation
	err error
}

const verifyCacheSize = 512

// New joins the swarm's topics on h and starts the service. It runs until
// Close is called or ctx ends; call Close either way to wait for it.
func New(ctx context.Context, h host.Host, opts ...Option) (*Service, error) {
	cfg := config{set: map[string]bool{}}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.swarm == "" {
		return nil, errors.New("gossip: a swarm name is required (WithSwarm)")
	}
	if cfg.teeVer != nil {
		if cfg.verify != nil || cfg.attest != nil {
			return nil, errors.New("gossip: WithTEE replaces WithAttester and WithVerifier; give one or the other")
		}
		var err error
		if cfg.verify, err = TEEVerifier(cfg.teeVer, cfg.swarm); err != nil {
			return nil, err
		}
		if cfg.teeAtt != nil {
			pub := h.Peerstore().PubKey(h.ID())
			if pub == nil {
				return nil, errors.New("gossip: host has no public key for its own ID")
			}
			if cfg.attest, err = TEEAttester(cfg.teeAtt, cfg.swarm, pub); err != nil {
				return nil, err
			}
		}
	}
	if cfg.verify == nil {
		return nil, errors.New("gossip: a verifier is required (WithVerifier)")
	}
	if cfg.log == nil {
		cfg.log = slog.Default()
	}
	if cfg.clock == nil {
		cfg.clock = SystemClock{}
	}
	if !cfg.set["timing"] {
		if err := cfg.timing.fill(); err != nil {
			return nil, err
		}
	}
	stand := cfg.attest != nil
	if cfg.candidate != nil {
		stand = *cfg.candidate
	}
	if stand && cfg.attest == nil {
		return nil, errors.New("gossip: a candidate needs an attester (WithAttester)")
	}

	s := &Service{
		h: h, cfg: cfg, self: h.ID(), log: cfg.log.With("component", "gossip"),
		topics:     map[string]*pubsub.Topic{},
		electionIn: make(chan election.Message, 256),
		attested:   make(chan attestResult, 1),
		vcache:     map[[32]byte]verifyResult{},
		presence:   map[lpeer.ID]*PresenceInfo{},
		watchers:   map[chan *CoordinatorInfo]struct{}{},
		jobSubs:    map[chan Job]struct{}{},
	}
	s.names.presence, s.names.election, s.names.jobs = PresenceTopic(cfg.swarm), ElectionTopic(cfg.swarm), JobsTopic(cfg.swarm)
	s.rejects = newRejectLog(s.log, cfg.clock, 10*time.Second)

	restoreTerm, restoreCoord, err := loadState(cfg.stateFile, cfg.swarm)
	if err != nil {
		return nil, err
	}
	t := &cfg.timing
	node, err := election.New(election.Config{
		ID: s.self.String(), Swarm: cfg.swarm, CanStand: stand, Verify: s.verifyForNode,
		HeartbeatTicks: t.ticks(t.Heartbeat), LeaseTicks: t.ticks(t.Lease),
		BackoffTicks: t.ticks(t.BackoffStep), MaxBackoffTicks: t.ticks(t.MaxBackoff),
		AttestTimeoutTicks: t.ticks(t.AttestTimeout),
		RestoreTerm:        restoreTerm, RestoreCoordinator: restoreCoord,
	})
	if err != nil {
		return nil, fmt.Errorf("gossip: %w", err)
	}
	s.node, s.lastTerm, s.maxJump = node, restoreTerm, node.Config().MaxTermJump
	s.fence.Advance(restoreTerm)

	s.ctx, s.cancel = context.WithCancel(ctx)
	if err := s.start(); err != nil {
		s.cancel()
		s.teardown()
		return nil, err
	}
	s.log.Info("gossip: joined", "swarm", cfg.swarm, "candidate", stand, "allow_sim", cfg.allowSim, "term", restoreTerm)
	return s, nil
}

func (s *Service) start() error {
	psOpts := []pubsub.Option{
		pubsub.WithMessageSignaturePolicy(pubsub.StrictSign),
		pubsub.WithPeerScore(scoreParams([]string{s.names.presence, s.names.election, s.names.jobs}), &scoreThresholds),
		// Older than the freshness window means ignored anyway; keep the
		// seen-cache longer than the window so no replay slips between.
		pubsub.WithSeenMessagesTTL(2 * (s.cfg.timing.Freshness + s.cfg.timing.MaxSkew)),
		pubsub.WithLogger(s.log.With("component", "pubsub")),
	}
	ps, err := pubsub.NewGossipSub(s.ctx, s.h, append(psOpts, s.cfg.psOpts...)...)
	if err != nil {
		return fmt.Errorf("gossip: start gossipsub: %w", err)
	}
	s.ps = ps
	validators := map[string]any{
		s.names.presence: pubsub.ValidatorEx(s.validatePresence),
		s.names.election: pubsub.ValidatorEx(s.validateElection),
		s.names.jobs:     pubsub.ValidatorEx(s.validateJob),
	}
	readers := map[string]func(*pubsub.Message){
		s.names.presence: s.readPresence,
		s.names.election: s.readElection,
		s.names.jobs:     s.readJob,
	}
	for _, name := range []string{s.names.presence, s.names.election, s.names.jobs} {
		if err := ps.RegisterTopicValidator(name, validators[name], pubsub.WithValidatorTimeout(s.cfg.timing.AttestTimeout)); err != nil {
			return fmt.Errorf("gossip: validator for %s: %w", name, err)
		}
		t, err := ps.Join(name)
		if err != nil {
			return fmt.Errorf("gossip: join %s: %w", name, err)
		}
		s.topics[name] = t
		sub, err := t.Subscribe()
		if err != nil {
			return fmt.Errorf("gossip: subscribe %s: %w", name, err)
		}
		s.subs = append(s.subs, sub)
		read := readers[name]
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for {
				m, err := sub.Next(s.ctx)
				if err != nil {
					return // closed or cancelled
				}
				read(m)
			}
		}()
	}
	s.wg.Add(1)
	go s.run()
	return nil
}

// Close stops the service and waits for its goroutines.
func (s *Service) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	s.teardown()
	s.mu.Lock()
	for ch := range s.watchers {
		close(ch)
	}
	clear(s.watchers)
	for ch := range s.jobSubs {
		close(ch)
	}
	clear(s.jobSubs)
	s.mu.Unlock()
	return nil
}

// teardown releases what start acquired, in reverse order.
func (s *Service) teardown() {
	for _, sub := range s.subs {
		sub.Cancel()
	}
	var errs []error
	for name, t := range s.topics {
		if s.ps != nil {
			_ = s.ps.UnregisterTopicValidator(name)
		}
		errs = append(errs, t.Close())
	}
	if s.ps != nil {
		// pubsub stops with its context but leaves its stream handlers.
		for _, p := range pubsub.GossipSubDefaultProtocols {
			s.h.RemoveStreamHandler(p)
		}
	}
	if err := errors.Join(errs...); err != nil {
		s.log.Debug("gossip: close topics", "err", err)
	}
}

// Coordinator returns the coordinator this node follows now, or nil.
func (s *Service) Coordinator() *CoordinatorInfo {
	c := s.coord.Load()
	if c == nil {
		return nil
	}
	cp := *c
	return &cp
}

// WatchCoordinator returns a channel that holds the latest coordinator
// (nil: none) and receives every change, coalesced: a slow reader sees the
// newest value, not every step. It is closed when ctx ends or the service
// closes.
func (s *Service) WatchCoordinator(ctx context.Context) <-chan *CoordinatorInfo {
	ch := make(chan *CoordinatorInfo, 1)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		close(ch)
		return ch
	}
	s.watchers[ch] = struct{}{}
	ch <- s.Coordinator()
	s.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
		case <-s.ctx.Done():
		}
		s.mu.Lock()
		if _, ok := s.watchers[ch]; ok {
			delete(s.watchers, ch)
			close(ch)
		}
		s.mu.Unlock()
	}()
	return ch
}

func (s *Service) notifyWatchers(c *CoordinatorInfo) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.watchers {
		select {
		case <-ch: // drop the stale value
		default:
		}
		ch <- c
	}
}

// AcceptTerm is the fencing check for anything a coordinator sent: nil when
// term is not older than the newest term this node has accepted.
func (s *Service) AcceptTerm(term uint64) error { return s.fence.AcceptTerm(term) }

// Term is the newest term this node has accepted.
func (s *Service) Term() uint64 { return s.fence.Newest() }

// Followers returns the peers that voted for this node, while it is the
// coordinator (nil otherwise): the peers that will accept its commands.
func (s *Service) Followers() []lpeer.ID {
	if f := s.followers.Load(); f != nil {
		return slices.Clone(*f)
	}
	return nil
}

// Presence returns the latest verified capability of every peer heard
// within the presence TTL, this node included.
func (s *Service) Presence() map[lpeer.ID]PresenceInfo {
	now := s.cfg.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[lpeer.ID]PresenceInfo, len(s.presence))
	for id, p := range s.presence {
		if now.Sub(p.LastSeen) <= s.cfg.timing.PresenceTTL {
			out[id] = *p
		}
	}
	return out
}

// Stats returns rejection counts by reason.
func (s *Service) Stats() Stats {
	s.mu.Lock()
	dropped := s.jobsDropped
	s.mu.Unlock()
	return Stats{Rejections: s.rejects.snapshot(), JobsDropped: dropped}
}

// Topics returns the topic names, for tools and tests.
func (s *Service) Topics() (presence, election, jobs string) {
	return s.names.presence, s.names.election, s.names.jobs
}

// PublishJob sends payload on the jobs topic with this node's newest
// accepted term.
func (s *Service) PublishJob(ctx context.Context, payload []byte) error {
	if s.ctx.Err() != nil {
		return ErrClosed
	}
	b, err := (&JobMsg{Term: s.fence.Newest(), IssuedAt: s.cfg.clock.Now(), Payload: payload}).Marshal()
	if err != nil {
		return err
	}
	if err := s.topics[s.names.jobs].Publish(ctx, b); err != nil {
		return fmt.Errorf("gossip: publish job: %w", err)
	}
	return nil
}

// SubscribeJobs returns a channel of job messages (this node's own
// included), closed when ctx ends or the service closes. A subscriber that
// falls more than 64 messages behind misses messages (counted in Stats).
func (s *Service) SubscribeJobs(ctx context.Context) <-chan Job {
	ch := make(chan Job, 64)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		close(ch)
		return ch
	}
	s.jobSubs[ch] = struct{}{}
	s.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
		case <-s.ctx.Done():
		}
		s.mu.Lock()
		if _, ok := s.jobSubs[ch]; ok {
			delete(s.jobSubs, ch)
			close(ch)
		}
		s.mu.Unlock()
	}()
	return ch
}

// --- verification -----------------------------------------------------

// verify checks evidence once per distinct (author, term, nonce, evidence)
// and remembers the answer: heartbeats repeat the same proof every second.
func (s *Service) verify(ctx context.Context, author lpeer.ID, term uint64, nonce, evidence []byte) (election.Attestation, error) {
	h := sha256.New()
	h.Write([]byte(author))
	binary.Write(h, binary.BigEndian, term)
	h.Write(nonce)
	h.Write(evidence)
	var key [32]byte
	h.Sum(key[:0])
	s.vmu.Lock()
	r, ok := s.vcache[key]
	s.vmu.Unlock()
	if ok {
		return r.att, r.err
	}
	vctx, cancel := context.WithTimeout(ctx, s.cfg.timing.AttestTimeout)
	att, err := s.cfg.verify(vctx, author, term, nonce, evidence)
	interrupted := vctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
	cancel()
	if err != nil && interrupted {
		// Our deadline or shutdown, not the sender's fault: neither
		// remember it nor hold it against the sender.
		return att, fmt.Errorf("%w: %w", errVerifyInterrupted, err)
	}
	if err == nil && att.Insecure && !s.cfg.allowSim {
		err = fmt.Errorf("%w: %s", ErrInsecureNotAllowed, att.TEE)
	}
	s.vmu.Lock()
	if len(s.vcache) >= verifyCacheSize {
		for k := range s.vcache { // evict an arbitrary entry
			delete(s.vcache, k)
			break
		}
	}
	s.vcache[key] = verifyResult{att, err}
	s.vmu.Unlock()
	return att, err
}

// verifyForNode adapts verify to the election's VerifyFunc.
func (s *Service) verifyForNode(author string, term uint64, nonce, evidence []byte) (election.Attestation, error) {
	id, err := lpeer.Decode(author)
	if err != nil {
		return election.Attestation{}, fmt.Errorf("gossip: author %q: %w", author, err)
	}
	return s.verify(s.ctx, id, term, nonce, evidence)
}
