package coord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-msgio"

	"github.com/holopeer/holopeer/stage/job"
)

// JobProtocol is how a researcher talks to the coordinator: one request,
// one reply, each a uvarint-length-prefixed JSON message.
const JobProtocol protocol.ID = "/holopeer/job/1.0.0"

// AssignProtocol is job.AssignProtocol: the coordinator sends each named
// node its signed plan on it.
const AssignProtocol = protocol.ID(job.AssignProtocol)

const maxMessage = 4 << 20

// Request is a researcher's message to the coordinator.
type Request struct {
	Op string `json:"op"` // submit | replan | release | work
	// SignedSpec is the job's spec signed by the researcher (submit,
	// job.SignSpec): the job belongs to that key.
	SignedSpec []byte `json:"signed_spec,omitempty"`
	JobID      string `json:"job_id,omitempty"`
	Epoch      uint64 `json:"epoch,omitempty"`
	Lost       string `json:"lost,omitempty"`
	// Resume is the step the researcher resumes training at (replan).
	Resume uint64 `json:"resume,omitempty"`
	// Work is what each stage node did over steps (From, To] (work).
	From uint64         `json:"from,omitempty"`
	To   uint64         `json:"to,omitempty"`
	Work []job.WorkItem `json:"work,omitempty"`
	// Plan is the researcher's current signed plan (replan): it lets a
	// coordinator elected after the job started take the job over.
	Plan []byte `json:"plan,omitempty"`
}

// ErrBadRequest wraps a request that does not decode or is out of bounds.
var ErrBadRequest = errors.New("bad request")

// DecodeRequest parses a researcher's message and bounds what it carries
// before any of it is opened or acted on.
func DecodeRequest(b []byte) (Request, error) {
	var req Request
	if len(b) > maxMessage {
		return req, fmt.Errorf("%w: %d bytes", ErrBadRequest, len(b))
	}
	if err := json.Unmarshal(b, &req); err != nil {
		return Request{}, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	switch {
	case req.Op != "submit" && req.Op != "replan" && req.Op != "release" && req.Op != "work":
		return Request{}, fmt.Errorf("%w: unknown op %q", ErrBadRequest, req.Op)
	case len(req.SignedSpec) > job.MaxSignedSpecBytes, len(req.Plan) > job.MaxPlanBytes:
		return Request{}, fmt.Errorf("%w: signed spec or plan too large", ErrBadRequest)
	case len(req.Work) > 4096, len(req.JobID) > 96, len(req.Lost) > 128:
		return Request{}, fmt.Errorf("%w: field out of bounds", ErrBadRequest)
	}
	return req, nil
}

// Reply is the coordinator's answer.
type Reply struct {
	Plan []byte `json:"plan,omitempty"`
	Err  string `json:"err,omitempty"`
}

// Errors the coordinator returns.
var (
	ErrNotCoordinator = errors.New("this node is not the coordinator")
	ErrNotResearcher  = errors.New("only the job's researcher may change it")
	// ErrUntrustedPlan refuses a takeover whose plan was not signed by
	// the coordinator of its term, as this node's term history has it:
	// only a plan a coordinator placed may be taken over.
	ErrUntrustedPlan = errors.New("the plan was not placed by its term's coordinator")
	// ErrNodesBusy refuses a takeover whose plan names nodes that hold a
	// stage of another job this coordinator placed or took over.
	ErrNodesBusy = errors.New("the plan names nodes busy with another job")
)

// TermHistory answers who was coordinator in a term, from the terms this
// node's election accepted (peer/ledger.History implements it).
type TermHistory interface {
	CoordinatorOf(term uint64) (peerID string, ok bool)
}

// Config is what the coordinator service needs from its node.
type Config struct {
	Host host.Host
	Key  crypto.PrivKey
	// Term reports whether this node is the coordinator now, and in which
	// term.
	Term func() (uint64, bool)
	// Offers lists the machines on offer: the swarm's verified capability
	// records.
	Offers func() []Offer
	// Alive reports whether a placed node is still in the swarm.
	Alive  func(peer.ID) bool
	Logger *slog.Logger
	// HealthInterval is how often placed nodes are checked; a node not
	// alive for Grace is re-planned away. Defaults 2 s and 8 s.
	HealthInterval, Grace time.Duration
	Clock                 func() time.Time
	// OnWork receives a job's work reports (for contribution receipts);
	// only the job's researcher can send them, and only for nodes a plan
	// of the job named.
	OnWork func(term uint64, jobID string, from, to uint64, work []job.WorkItem)
	// AssignLocal hands a plan to this node's own stage runtime, when the
	// coordinator places a stage on its own node.
	AssignLocal func(ctx context.Context, signed []byte) error
	// Terms is the election's term history. A coordinator takes over a
	// job it did not place only if the plan's signer coordinated the
	// plan's term by it; without one it takes over none.
	Terms TermHistory
}

// Service is the coordinator's job handling: it answers researchers,
// places jobs, signs and sends plans, and re-plans when a node goes
// silent. It runs on every node but acts only while its node is the
// coordinator.
type Service struct {
	cfg    Config
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// mu guards the following.
	mu   sync.Mutex
	jobs map[string]*jobState
}

type jobState struct {
	plan       *job.Plan
	signed     []byte
	silent     map[string]time.Time // placed nodes not alive, since when
	replans    int
	everPlaced []string // every node any plan of the job named (work reports may credit them)
}

func (js *jobState) remember(p *job.Plan) {
	for _, st := range p.Stages {
		for _, r := range st.Replicas {
			if !slices.Contains(js.everPlaced, r) {
				js.everPlaced = append(js.everPlaced, r)
			}
		}
	}
}

// New starts the service.
func New(cfg Config) (*Service, error) {
	if cfg.Host == nil || cfg.Key == nil || cfg.Term == nil || cfg.Offers == nil {
		return nil, errors.New("coord: Host, Key, Term and Offers are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.HealthInterval == 0 {
		cfg.HealthInterval = 2 * time.Second
	}
	if cfg.Grace == 0 {
		cfg.Grace = 8 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Alive == nil {
		cfg.Alive = func(p peer.ID) bool { return cfg.Host.Network().Connectedness(p) == network.Connected }
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{cfg: cfg, log: cfg.Logger.With("component", "coordinator"), ctx: ctx, cancel: cancel, jobs: map[string]*jobState{}}
	cfg.Host.SetStreamHandler(JobProtocol, s.serve)
	s.wg.Add(1)
	go s.health()
	return s, nil
}

// Close stops the service.
func (s *Service) Close() error {
	s.cancel()
	s.cfg.Host.RemoveStreamHandler(JobProtocol)
	s.wg.Wait()
	return nil
}

// Jobs returns the plans the coordinator holds.
func (s *Service) Jobs() []*job.Plan {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*job.Plan
	for _, j := range s.jobs {
		out = append(out, j.plan)
	}
	return out
}

func (s *Service) serve(st network.Stream) {
	_ = st.Scope().SetService("holopeer.coordinator")
	_ = st.SetDeadline(time.Now().Add(2 * time.Minute))
	b, err := msgio.NewVarintReaderSize(st, maxMessage).ReadMsg()
	if err != nil {
		st.Reset()
		return
	}
	req, err := DecodeRequest(b)
	if err != nil {
		writeReply(st, Reply{Err: err.Error()})
		return
	}
	from := st.Conn().RemotePeer()
	var reply Reply
	signed, err := s.handle(s.ctx, from, req)
	if err != nil {
		reply.Err = err.Error()
		s.log.Warn("refused a job request", "op", req.Op, "from", from.ShortString(), "err", err)
	}
	reply.Plan = signed
	writeReply(st, reply)
}

func writeReply(st network.Stream, r Reply) {
	b, _ := json.Marshal(r)
	if err := msgio.NewVarintWriter(st).WriteMsg(b); err != nil {
		st.Reset()
		return
	}
	st.Close()
}

func (s *Service) handle(ctx context.Context, from peer.ID, req Request) ([]byte, error) {
	term, ok := s.cfg.Term()
	if !ok {
		return nil, ErrNotCoordinator
	}
	switch req.Op {
	case "submit":
		if len(req.SignedSpec) == 0 {
			return nil, errors.New("submit without a signed spec")
		}
		spec, researcher, err := job.OpenSpec(req.SignedSpec)
		if err != nil {
			return nil, err
		}
		if researcher != from.String() {
			return nil, fmt.Errorf("%w: spec signed by %s, sent by %s", ErrNotResearcher, short(researcher), from.ShortString())
		}
		return s.submit(ctx, term, researcher, *spec, req.SignedSpec)
	case "replan":
		return s.replan(ctx, term, from.String(), req)
	case "release":
		return nil, s.release(from.String(), req.JobID)
	case "work":
		return nil, s.work(term, from.String(), req)
	}
	return nil, fmt.Errorf("unknown op %q", req.Op)
}

// busy lists nodes placed in any job.
func (s *Service) busy() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, j := range s.jobs {
		for _, st := range j.plan.Stages {
			out = append(out, st.Replicas...)
		}
	}
	return out
}

func (s *Service) request(spec job.Spec, researcher string, exclude []string) PlaceRequest {
	return PlaceRequest{
		JobID: spec.JobID, Researcher: researcher, Stages: spec.Stages, Replicas: spec.Replicas,
		Layers: spec.Model.Layers, LayerBytes: spec.LayerBytes(spec.Stages), StageBytes: spec.StageBytes(),
		RefuseRelayed: spec.RefuseRelayed, Exclude: exclude,
	}
}

func (s *Service) submit(ctx context.Context, term uint64, researcher string, spec job.Spec, signedSpec []byte) ([]byte, error) {
	s.mu.Lock()
	if _, dup := s.jobs[spec.JobID]; dup {
		s.mu.Unlock()
		return nil, fmt.Errorf("job %s exists", spec.JobID)
	}
	s.mu.Unlock()
	exclude := s.busy()
	var tried []string // nodes an earlier attempt placed: told when a later plan drops them
	for attempt := 0; attempt < job.MaxSubmitAttempts; attempt++ {
		stages, spares, err := Place(s.request(spec, researcher, exclude), s.cfg.Offers())
		if err != nil {
			return nil, err
		}
		// Each attempt is a newer plan (epoch and links), so a node that
		// took a stage of an earlier attempt follows this one or drops out.
		e := uint64(attempt + 1)
		p := &job.Plan{
			JobID: spec.JobID, Epoch: e, Gen: e, StartStep: 1, Term: term,
			Coordinator: s.cfg.Host.ID().String(), Researcher: researcher,
			Spec: spec, SignedSpec: signedSpec, Stages: stages, Spares: spares, IssuedAt: s.cfg.Clock().UTC(),
		}
		signed, err := job.SignPlan(p, s.cfg.Key)
		if err != nil {
			return nil, err
		}
		refused := s.assignAll(ctx, p, signed)
		for _, old := range tried {
			if p.StageOf(old) < 0 && !slices.Contains(refused, old) {
				_ = s.assign(ctx, old, signed) // "no stage for you": it drops the job
			}
		}
		for _, st := range p.Stages {
			tried = append(tried, st.Replicas...)
		}
		if len(refused) == 0 {
			s.mu.Lock()
			js := &jobState{plan: p, signed: signed, silent: map[string]time.Time{}}
			js.remember(p)
			s.jobs[spec.JobID] = js
			s.mu.Unlock()
			s.log.Info("placed a job", "job", spec.JobID, "researcher", short(researcher), "stages", len(stages), "term", term)
			return signed, nil
		}
		s.log.Warn("nodes refused their stage; placing again without them", "job", spec.JobID, "refused", refused)
		exclude = append(exclude, refused...)
	}
	return nil, fmt.Errorf("%w: nodes kept refusing job %s", ErrInsufficient, spec.JobID)
}

// assignAll sends the plan to every node it names and returns those that
// refused or could not be reached.
func (s *Service) assignAll(ctx context.Context, p *job.Plan, signed []byte) []string {
	var mu sync.Mutex
	var refused []string
	var wg sync.WaitGroup
	for _, st := range p.Stages {
		for _, r := range st.Replicas {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := s.assign(ctx, r, signed); err != nil {
					s.log.Warn("assign failed", "peer", short(r), "job", p.JobID, "err", err)
					mu.Lock()
					refused = append(refused, r)
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	return refused
}

// assign sends a signed plan to one node and reads its answer. The
// coordinator's own node takes its part directly: libp2p does not dial
// itself.
func (s *Service) assign(ctx context.Context, to string, signed []byte) error {
	id, err := peer.Decode(to)
	if err != nil {
		return err
	}
	if id == s.cfg.Host.ID() {
		if s.cfg.AssignLocal == nil {
			return errors.New("this node cannot take stages")
		}
		return s.cfg.AssignLocal(ctx, signed)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := s.cfg.Host.NewStream(network.WithAllowLimitedConn(ctx, "assign"), id, AssignProtocol)
	if err != nil {
		return err
	}
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(30 * time.Second))
	if err := msgio.NewVarintWriter(st).WriteMsg(signed); err != nil {
		st.Reset()
		return err
	}
	b, err := msgio.NewVarintReaderSize(st, maxMessage).ReadMsg()
	if err != nil {
		st.Reset()
		return err
	}
	var r struct {
		OK  bool   `json:"ok"`
		Err string `json:"err"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return err
	}
	if !r.OK {
		return errors.New(r.Err)
	}
	return nil
}

// replan replaces a lost node. A coordinator that does not know the job
// (elected after it started) takes it over from the researcher's plan.
func (s *Service) replan(ctx context.Context, term uint64, from string, req Request) ([]byte, error) {
	s.mu.Lock()
	js := s.jobs[req.JobID]
	s.mu.Unlock()
	if js == nil {
		var err error
		if js, err = s.takeOver(term, from, req); err != nil {
			return nil, err
		}
	}
	if js.plan.Researcher != from {
		return nil, ErrNotResearcher
	}
	if req.Epoch < js.plan.Epoch && req.Lost == "" && (req.Resume == 0 || req.Resume == js.plan.StartStep) {
		return js.signed, nil // the researcher is behind: hand it the newest
	}
	return s.replace(ctx, term, req.JobID, req.Lost, req.Resume)
}

// takeOver adopts a job this coordinator does not know from the plan its
// researcher sends. The plan must open (coordinator's signature, and the
// researcher's signed spec naming from), and its signer must be the
// coordinator of its term in this node's term history, at or before this
// term: so only a placement some coordinator made is adopted, never one a
// peer signed for itself. A plan that puts nodes on a job this
// coordinator already holds them for is refused: placement gives a node
// one job.
func (s *Service) takeOver(term uint64, from string, req Request) (*jobState, error) {
	if len(req.Plan) == 0 {
		return nil, fmt.Errorf("unknown job %s", req.JobID)
	}
	p, err := job.OpenPlan(req.Plan)
	if err != nil {
		return nil, err
	}
	if p.JobID != req.JobID || p.Researcher != from {
		return nil, ErrNotResearcher
	}
	if p.Term > term {
		return nil, fmt.Errorf("%w: plan of term %d, this coordinator is in term %d", ErrUntrustedPlan, p.Term, term)
	}
	if s.cfg.Terms == nil {
		return nil, fmt.Errorf("%w: this node keeps no term history", ErrUntrustedPlan)
	}
	c, ok := s.cfg.Terms.CoordinatorOf(p.Term)
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: term %d is not in this node's history", ErrUntrustedPlan, p.Term)
	case c != p.Coordinator:
		return nil, fmt.Errorf("%w: term %d was coordinated by %s, the plan is signed by %s", ErrUntrustedPlan, p.Term, short(c), short(p.Coordinator))
	}
	busy := s.busy()
	for _, st := range p.Stages {
		for _, r := range st.Replicas {
			if slices.Contains(busy, r) {
				return nil, fmt.Errorf("%w: %s", ErrNodesBusy, short(r))
			}
		}
	}
	js := &jobState{plan: p, signed: req.Plan, silent: map[string]time.Time{}}
	js.remember(p)
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur := s.jobs[req.JobID]; cur != nil {
		return cur, nil // a concurrent replan took it over first
	}
	s.jobs[req.JobID] = js
	s.log.Info("took over a job from an earlier coordinator", "job", p.JobID, "term", p.Term, "coordinator", short(p.Coordinator))
	return js, nil
}

// replace moves the stage of lost (if any) and re-signs the plan in this
// coordinator's term; with lost empty it only re-signs.
func (s *Service) replace(ctx context.Context, term uint64, jobID, lost string, resume uint64) ([]byte, error) {
	s.mu.Lock()
	js := s.jobs[jobID]
	s.mu.Unlock()
	if js == nil {
		return nil, fmt.Errorf("unknown job %s", jobID)
	}
	old := js.plan
	// gone starts as the lost node; a node that refuses (or cannot be
	// reached with) the new plan joins it and the plan is made again, so
	// two nodes lost at once are both replaced, not retried forever.
	gone := []string{}
	if lost != "" {
		gone = append(gone, lost)
	}
	var p job.Plan
	var signed []byte
	for attempt := 0; ; attempt++ {
		var err error
		if p, err = s.plan(old, term, gone, resume); err != nil {
			return nil, err
		}
		if signed, err = job.SignPlan(&p, s.cfg.Key); err != nil {
			return nil, err
		}
		refused := s.assignAll(ctx, &p, signed)
		if len(refused) == 0 {
			break
		}
		fresh := slices.DeleteFunc(slices.Clone(refused), func(x string) bool { return slices.Contains(gone, x) })
		if len(fresh) == 0 || attempt >= 2 {
			return nil, fmt.Errorf("nodes %v refused the new plan", refused)
		}
		s.log.Warn("nodes refused the new plan; placing around them", "job", jobID, "refused", fresh)
		gone = append(gone, fresh...)
	}
	s.mu.Lock()
	js.plan, js.signed = &p, signed
	js.remember(&p)
	js.replans++
	js.silent = map[string]time.Time{}
	s.mu.Unlock()
	s.log.Info("re-planned a job", "job", jobID, "lost", short(lost), "epoch", p.Epoch, "gen", p.Gen)
	return signed, nil
}

// plan makes the next plan from old in this coordinator's term: every node
// in gone that holds a stage is replaced by a spare, and the stages restart
// from resume when it moves.
func (s *Service) plan(old *job.Plan, term uint64, gone []string, resume uint64) (job.Plan, error) {
	p := *old
	p.Epoch, p.Term, p.Coordinator, p.IssuedAt = old.Epoch+1, term, s.cfg.Host.ID().String(), s.cfg.Clock().UTC()
	offers := s.cfg.Offers()
	busy := s.busy()
	for _, lost := range gone {
		if p.StageOf(lost) < 0 {
			continue
		}
		spares := slices.DeleteFunc(slices.Clone(p.Spares), func(x string) bool { return slices.Contains(gone, x) })
		// Anyone on offer and idle may serve as a spare.
		for _, o := range offers {
			if !slices.Contains(busy, o.PeerID) && !slices.Contains(spares, o.PeerID) && o.PeerID != old.Researcher && !slices.Contains(gone, o.PeerID) {
				spares = append(spares, o.PeerID)
			}
		}
		stages, left, err := Replace(p.Stages, spares, lost, offers, s.request(old.Spec, old.Researcher, nil))
		if err != nil {
			return p, err
		}
		p.Stages, p.Spares, p.Gen = stages, left, old.Gen+1
	}
	if resume != 0 && resume != old.StartStep {
		// The stages restart from a checkpoint: new links, whose step
		// window starts there.
		p.StartStep, p.Gen = resume, max(p.Gen, old.Gen+1)
	}
	return p, nil
}

func (s *Service) work(term uint64, from string, req Request) error {
	s.mu.Lock()
	js := s.jobs[req.JobID]
	s.mu.Unlock()
	if js == nil {
		return fmt.Errorf("unknown job %s", req.JobID)
	}
	if js.plan.Researcher != from {
		return ErrNotResearcher
	}
	if req.To < req.From || len(req.Work) > 4096 {
		return errors.New("malformed work report")
	}
	for _, w := range req.Work {
		if js.plan.StageOf(w.Peer) < 0 && !slices.Contains(js.everPlaced, w.Peer) {
			return fmt.Errorf("work report names %s, which holds no stage of job %s", short(w.Peer), req.JobID)
		}
		if w.ComputeS < 0 || w.Tokens < 0 || w.ComputeS > float64(24*3600) {
			return errors.New("work report out of range")
		}
	}
	if s.cfg.OnWork != nil {
		s.cfg.OnWork(term, req.JobID, req.From, req.To, req.Work)
	}
	return nil
}

func (s *Service) release(from, jobID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	js := s.jobs[jobID]
	if js == nil {
		return nil
	}
	if js.plan.Researcher != from {
		return ErrNotResearcher
	}
	delete(s.jobs, jobID)
	s.log.Info("job released", "job", jobID)
	return nil
}

// health re-plans jobs whose nodes have left the swarm, and pushes the new
// plan to the researcher too.
func (s *Service) health() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		term, ok := s.cfg.Term()
		if !ok {
			continue
		}
		now := s.cfg.Clock()
		type todo struct{ job, lost string }
		var work []todo
		s.mu.Lock()
		for id, js := range s.jobs {
			for _, st := range js.plan.Stages {
				for _, r := range st.Replicas {
					pid, err := peer.Decode(r)
					if err != nil {
						continue
					}
					if s.cfg.Alive(pid) {
						delete(js.silent, r)
						continue
					}
					since, seen := js.silent[r]
					if !seen {
						js.silent[r] = now
						continue
					}
					if now.Sub(since) >= s.cfg.Grace {
						work = append(work, todo{id, r})
					}
				}
			}
		}
		s.mu.Unlock()
		for _, w := range work {
			s.log.Warn("a placed node went silent; re-planning", "job", w.job, "peer", short(w.lost))
			signed, err := s.replace(s.ctx, term, w.job, w.lost, 0)
			if err != nil {
				s.log.Error("re-plan failed", "job", w.job, "err", err)
				continue
			}
			s.mu.Lock()
			researcher := s.jobs[w.job].plan.Researcher
			s.mu.Unlock()
			if err := s.assign(s.ctx, researcher, signed); err != nil {
				s.log.Warn("could not tell the researcher about the new plan", "err", err)
			}
		}
	}
}

// Client is a researcher's handle on the coordinator. Coordinator returns
// the current coordinator's peer id (it may change during a run).
type Client struct {
	Host        host.Host
	Coordinator func(ctx context.Context) (peer.ID, error)
	// Current returns the researcher's newest signed plan of a job, sent
	// along with a replan so a new coordinator can take the job over.
	Current func(jobID string) []byte
}

func (c *Client) call(ctx context.Context, req Request) ([]byte, error) {
	id, err := c.Coordinator(ctx)
	if err != nil {
		return nil, err
	}
	st, err := c.Host.NewStream(network.WithAllowLimitedConn(ctx, "job"), id, JobProtocol)
	if err != nil {
		return nil, fmt.Errorf("reach the coordinator %s: %w", id.ShortString(), err)
	}
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(2 * time.Minute))
	b, _ := json.Marshal(req)
	if err := msgio.NewVarintWriter(st).WriteMsg(b); err != nil {
		st.Reset()
		return nil, err
	}
	rb, err := msgio.NewVarintReaderSize(st, maxMessage).ReadMsg()
	if err != nil {
		st.Reset()
		return nil, err
	}
	var r Reply
	if err := json.Unmarshal(rb, &r); err != nil {
		return nil, err
	}
	if r.Err != "" {
		return nil, fmt.Errorf("coordinator %s: %s", id.ShortString(), r.Err)
	}
	return r.Plan, nil
}

// Submit signs spec with the host's identity key, which makes the job
// this researcher's, and asks the coordinator to place it.
func (c *Client) Submit(ctx context.Context, spec job.Spec) ([]byte, error) {
	key := c.Host.Peerstore().PrivKey(c.Host.ID())
	if key == nil {
		return nil, errors.New("coord: the host's identity key is not in its peerstore")
	}
	signed, err := job.SignSpec(&spec, key)
	if err != nil {
		return nil, err
	}
	return c.call(ctx, Request{Op: "submit", SignedSpec: signed})
}

// Replan asks for a plan without the lost node.
func (c *Client) Replan(ctx context.Context, jobID string, epoch uint64, lost string, resume uint64) ([]byte, error) {
	req := Request{Op: "replan", JobID: jobID, Epoch: epoch, Lost: lost, Resume: resume}
	if c.Current != nil {
		req.Plan = c.Current(jobID)
	}
	return c.call(ctx, req)
}

// Work reports stage nodes' contributions for receipts.
func (c *Client) Work(ctx context.Context, jobID string, from, to uint64, work []job.WorkItem) error {
	_, err := c.call(ctx, Request{Op: "work", JobID: jobID, From: from, To: to, Work: work})
	return err
}

// Release tells the coordinator the job is over.
func (c *Client) Release(ctx context.Context, jobID string) error {
	_, err := c.call(ctx, Request{Op: "release", JobID: jobID})
	return err
}
