package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/safetensors"
	"github.com/holopeer/holopeer/stage/tensor"
	"github.com/holopeer/holopeer/stage/wire"
	"github.com/holopeer/holopeer/stage/wire/codec"
)

// WeightSource reads the weights of the model from the researcher's
// checkpoint (*checkpoint.Checkpoint reads only what is asked, by
// offset): whole stages for the researcher's own embedding and head, one
// tensor at a time for the blocks it streams to a stage node.
type WeightSource interface {
	LoadStage(cfg model.Config, span model.Span, opts ...model.Option) (*model.Stage, error)
	// Check verifies from the headers that every tensor of span is there.
	Check(cfg model.Config, span model.Span) error
	ReadTensor(ref checkpoint.TensorRef, dst []float32) error
	// WeightDType is how a serving stage of span stores its matrices:
	// bfloat16 for a bfloat16 checkpoint, whose weights then also travel
	// at 2 bytes per parameter.
	WeightDType(cfg model.Config, span model.Span) tensor.DType
}

// layoutSpan lays out span's tensors, each read from src only when the
// encoder reaches it: a stage's weights stream from the checkpoint file to
// its socket, one tensor on the researcher's host at a time.
func layoutSpan(src WeightSource, cfg model.Config, span model.Span, meta map[string]string, opts ...safetensors.WriteOption) (*safetensors.Encoded, error) {
	if err := src.Check(cfg, span); err != nil {
		return nil, err
	}
	var ts []safetensors.Source
	for _, ref := range checkpoint.StageTensors(cfg, span) {
		ts = append(ts, safetensors.Source{Name: ref.Name, Shape: ref.Shape, Read: func(dst []float32) error { return src.ReadTensor(ref, dst) }})
	}
	return safetensors.Layout(ts, meta, opts...)
}

// ServeConfig is the researcher's side of a serving job.
type ServeConfig struct {
	// Spec is the job (Kind serve): the model as the stages build it
	// (dense, or constrained for the subspace codec), the codec, the
	// pipeline's shape, MaxBatch sequences at once of at most MaxTokens
	// tokens each (prompt and output).
	Spec job.Spec
	// Weights gives the embedding and head this node keeps and the blocks
	// each stage node fetches from it. Required.
	Weights WeightSource
	// Pseudonyms maps token ids before they enter the model and leave this
	// node (the subspace codec sends ids to every stage); it must be the
	// permutation the checkpoint was trained under. nil sends real ids.
	Pseudonyms *Permutation
	Logger     *slog.Logger
	// ReadyTimeout bounds the wait for every stage to connect and load
	// its weights (default: a minute plus the weights' bytes at 4 MiB/s).
	ReadyTimeout time.Duration
	// KeepAlive is how often idle links carry a ping (default 1 minute).
	KeepAlive time.Duration
	// WorkInterval is how often the stage nodes' compute time and tokens
	// are collected and reported to the coordinator, which signs their
	// contribution receipts (default 1 minute; also once at Close).
	WorkInterval time.Duration
}

// ErrServerClosed is returned by Generate once the server has stopped.
var ErrServerClosed = errors.New("pipeline: server closed")

// Server serves a model from the researcher's node: it keeps the
// embedding and head, sends each sequence's tokens through the stage
// nodes (which keep its KV caches), and samples from the logits that come
// back. Sequences are batched: every frame carries the new tokens of
// several sequences, and several frames are in flight so that every stage
// has work. When a stage node is lost it asks the coordinator for a new
// placement and replays each live sequence's tokens (prompt and output so
// far) through it; callers see only a pause.
type Server struct {
	// Static after NewServer.
	rt    *Runtime
	cfg   ServeConfig
	log   *slog.Logger
	coord Coordinator
	self  string

	linkCh    chan *wire.Link
	planCh    chan *job.Plan
	events    chan serveEvent
	reqs      chan *sequence
	wake      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	once      sync.Once
	started   atomic.Bool
	cancelRun context.CancelFunc
	reports   sync.WaitGroup // work reports on their way to the coordinator

	mu     sync.Mutex // guards signed and stats
	signed []byte
	stats  ServeStats

	// Owned by the run goroutine (by Start before it).
	plan     *job.Plan
	codec    codec.Codec
	first    *model.Stage
	last     *model.Stage
	realToPs []int32 // pseudonym of each real id (nil: identity)
	links    map[peer.ID]*wire.Link
	linkSeq  map[*wire.Link]*uint64
	ready    map[peer.ID]bool
	seqs     map[uint64]*sequence // live: at most MaxBatch
	backlog  []*sequence          // admitted, waiting for a live slot
	inflight map[uint64]*flight
	frames   uint64
	stale    uint64 // batches up to this one were voided by a recovery
	nextID   uint64
	lanes    int
	// perCall: each batch holds one Infer call of one sequence. The
	// subspace codec rebuilds a frame's rows with one GEMM, whose results
	// for a row depend on how many rows it has; one call per frame keeps
	// every token's bits independent of batching, and a replay re-sends
	// the very frames it replaces. Row-wise codecs batch freely.
	perCall bool
	weights map[int][]byte // weight blobs by stage while connecting
	// Work accounting: the round asked for, the replies so far, and each
	// node's counters at the last report.
	workRound   uint64
	workLast    uint64
	workReplies map[string]job.WorkItem
	workSeen    map[string]job.WorkItem
}

// ServeStats counts what a server did.
type ServeStats struct {
	Sequences    int64         // finished
	Tokens       int64         // generated
	Frames       int64         // batches sent
	Recoveries   int           // placements replaced after a loss
	LastRecovery time.Duration // from the loss to serving again
	Replayed     int64         // tokens replayed into new placements
	Plan         *job.Plan
}

// sequence is one generation. prompt and output are real token ids.
type sequence struct {
	id        uint64
	lane      int
	tokens    []int32 // prompt, then what was generated
	promptLen int
	maxNew    int
	pick      func(logits []float32) int32
	emit      func(token int32) (stop bool)
	done      chan error

	mu        sync.Mutex // guards cancelled against emit
	cancelled bool

	// Owned by the run goroutine.
	fed      int // tokens the stages' caches hold
	inFlight bool
}

// flight is a batch on its way round the pipeline: a part per sequence.
type flight struct {
	parts []part
}

// part is one sequence's tokens in a batch; last says the sequence's next
// token is sampled from its logits (a replay sent as several batches
// samples only after the last).
type part struct {
	q    *sequence
	e    seqEntry
	last bool
}

// NewServer prepares the researcher's side of a serving job: it loads the
// embedding and head from cfg.Weights. Start places the job.
func (rt *Runtime) NewServer(cfg ServeConfig, coord Coordinator) (*Server, error) {
	spec := cfg.Spec
	if spec.Kind != job.KindServe {
		return nil, fmt.Errorf("pipeline: a server runs serving jobs, not %q", spec.Kind)
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if cfg.Weights == nil || coord == nil {
		return nil, errors.New("pipeline: a server needs weights and a coordinator")
	}
	if cfg.Logger == nil {
		cfg.Logger = rt.log
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = serveKeepAlive
	}
	if cfg.WorkInterval == 0 {
		cfg.WorkInterval = time.Minute
	}
	c, _, err := newCodec(spec)
	if err != nil {
		return nil, err
	}
	if n := spec.MaxBatch * spec.MaxTokens; c.PayloadSize(codec.Forward, n) > wire.MaxFramePayload {
		return nil, fmt.Errorf("pipeline: %d sequences × %d tokens at d_model %d exceed a frame; lower the batch or the sequence length", spec.MaxBatch, spec.MaxTokens, spec.Model.Dim)
	}
	s := &Server{
		rt: rt, cfg: cfg, coord: coord, self: rt.host.ID().String(), codec: c, perCall: c.ID().Subspace(),
		log:      cfg.Logger.With("job", spec.JobID, "role", "serve"),
		linkCh:   make(chan *wire.Link, 64),
		planCh:   make(chan *job.Plan, 4),
		events:   make(chan serveEvent, 256),
		reqs:     make(chan *sequence, 64),
		wake:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		links:    map[peer.ID]*wire.Link{},
		linkSeq:  map[*wire.Link]*uint64{},
		ready:    map[peer.ID]bool{},
		seqs:     map[uint64]*sequence{},
		inflight: map[uint64]*flight{},
	}
	L := spec.Model.Layers
	opts := []model.Option{model.WithBackend(rt.backend), model.WithoutGrad()}
	if s.first, err = cfg.Weights.LoadStage(spec.Model, model.Span{First: 0, Last: 0, Embed: true}, opts...); err != nil {
		return nil, fmt.Errorf("pipeline: load the embedding: %w", err)
	}
	if s.last, err = cfg.Weights.LoadStage(spec.Model, model.Span{First: L, Last: L, Head: true}, opts...); err != nil {
		s.first.Close()
		return nil, fmt.Errorf("pipeline: load the head: %w", err)
	}
	if cfg.Pseudonyms != nil {
		ids := make([]int32, spec.Model.Vocab)
		for i := range ids {
			ids[i] = int32(i)
		}
		s.realToPs = cfg.Pseudonyms.Apply(ids)
	}
	return s, nil
}

func (s *Server) offerLink(l *wire.Link) {
	select {
	case s.linkCh <- l:
	default:
		l.Close()
	}
}

func (s *Server) offerPlan(p *job.Plan) {
	select {
	case s.planCh <- p:
	default:
	}
}

// Start submits the job, waits until every stage has loaded its blocks,
// and starts serving. ctx bounds the start only.
func (s *Server) Start(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("pipeline: server started twice")
	}
	// The run goroutine owns everything from here; it stops on Close, and
	// the links' readers with it once shutdown is done with them.
	runCtx, cancel := context.WithCancel(context.Background())
	s.cancelRun = cancel
	fail := func(err error) error {
		s.shutdown(runCtx, err)
		if s.plan != nil {
			rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
			_ = s.coord.Release(rctx, s.cfg.Spec.JobID)
			rcancel()
		}
		return err
	}
	signed, err := s.coord.Submit(ctx, s.cfg.Spec)
	if err != nil {
		return fail(fmt.Errorf("submit serving job: %w", err))
	}
	if err := s.adopt(ctx, signed); err != nil {
		return fail(err)
	}
	for err := s.connect(ctx, runCtx); err != nil; {
		var sf *serveFailure
		if !errors.As(err, &sf) {
			return fail(err)
		}
		s.log.Warn("a stage failed while the job started; re-placing it", "peer", short(sf.peer), "err", sf.err)
		err = s.recover(ctx, runCtx, sf.peer, sf.plan)
	}
	go s.run(runCtx)
	return nil
}

// adopt opens and checks a signed plan and makes it the server's.
func (s *Server) adopt(ctx context.Context, signed []byte) error {
	p, err := job.OpenPlan(signed)
	if err != nil {
		return err
	}
	if err := s.rt.check(ctx, p); err != nil {
		return err
	}
	if p.JobID != s.cfg.Spec.JobID || p.Researcher != s.self || p.Spec.Kind != job.KindServe {
		return fmt.Errorf("pipeline: plan for job %s with researcher %s is not ours", p.JobID, short(p.Researcher))
	}
	s.mu.Lock()
	s.signed = signed
	s.stats.Plan = p
	s.mu.Unlock()
	s.setPlan(p)
	return nil
}

func (s *Server) setPlan(p *job.Plan) {
	s.plan = p
	s.rt.mu.Lock()
	e := s.rt.byJob[p.JobID]
	s.rt.mu.Unlock()
	if e == nil || e.server != s {
		e = &entry{server: s}
	}
	s.rt.register(p, s.codec, e)
	s.lanes = 1
	for _, st := range p.Stages {
		s.lanes = max(s.lanes, len(st.Replicas))
	}
}

// SignedPlan returns the newest signed plan of job jobID when this server
// runs it (coord.Client.Current: a new coordinator takes the job over from
// it).
func (s *Server) SignedPlan(jobID string) []byte {
	if jobID != s.cfg.Spec.JobID {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.signed
}

// Stats returns what the server has done so far.
func (s *Server) Stats() ServeStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Spec is the serving job.
func (s *Server) Spec() job.Spec { return s.cfg.Spec }

func (s *Server) stagePeers() []peer.ID {
	var out []peer.ID
	for _, st := range s.plan.Stages {
		for _, r := range st.Replicas {
			if id, err := peer.Decode(r); err == nil {
				out = append(out, id)
			}
		}
	}
	return out
}

// connect opens the links to stage 0, answers each stage's request for
// weights, and waits until every stage node is ready. ctx bounds the
// wait; runCtx is the links' lifetime.
func (s *Server) connect(ctx, runCtx context.Context) error {
	wj := WireJob(s.plan.JobID, s.plan.Gen)
	s.weights = map[int][]byte{}
	defer func() { s.weights = nil }()
	for _, r := range s.plan.Stages[0].Replicas {
		id, err := peer.Decode(r)
		if err != nil {
			return err
		}
		go func() {
			for attempt := 0; attempt < 20; attempt++ {
				l, err := s.rt.svc.OpenLink(runCtx, id, wj)
				if err == nil {
					s.offerLink(l)
					return
				}
				s.log.Debug("open link to stage 0", "peer", id.ShortString(), "err", err)
				select {
				case <-runCtx.Done():
					return
				case <-time.After(time.Duration(200*(attempt+1)) * time.Millisecond):
				}
			}
		}()
	}
	start, timeout := time.Now(), readyTimeout(s.cfg.ReadyTimeout, s.plan, true)
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	progress := time.NewTicker(10 * time.Second)
	defer progress.Stop()
	for {
		all := true
		for _, id := range s.stagePeers() {
			all = all && s.ready[id]
		}
		if all {
			s.log.Info("every serving stage is ready", "stages", len(s.plan.Stages), "gen", s.plan.Gen, "lanes", s.lanes)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stop:
			return ErrServerClosed
		case <-deadline.C:
			var missing []string
			for _, id := range s.stagePeers() {
				if !s.ready[id] {
					missing = append(missing, id.String())
				}
			}
			return &serveFailure{peer: missing[0], err: fmt.Errorf("%d stage nodes not ready within %v", len(missing), timeout)}
		case <-progress.C:
			n := 0
			for _, id := range s.stagePeers() {
				if s.ready[id] {
					n++
				}
			}
			s.log.Info("waiting for the stages to load their weights", "ready", n, "of", len(s.stagePeers()), "waited", time.Since(start).Round(time.Second), "deadline", timeout)
		case l := <-s.linkCh:
			s.adoptLink(runCtx, l)
		case p := <-s.planCh:
			switch {
			case p.Epoch <= s.plan.Epoch:
			case p.Gen == s.plan.Gen:
				s.setPlan(p)
			default:
				return &serveFailure{err: errors.New("the coordinator moved a stage"), plan: p}
			}
		case ev := <-s.events:
			if s.links[ev.from] != ev.link {
				continue
			}
			if ev.err != nil {
				return &serveFailure{peer: ev.from.String(), err: ev.err}
			}
			c := ev.ctl
			if c == nil {
				continue // a batch sent before a recovery, now stale
			}
			switch c.Op {
			case opReady:
				if c.Gen == s.plan.Gen {
					s.ready[ev.from] = true
				}
			case opLoad:
				if c.Gen == s.plan.Gen {
					if err := s.sendWeights(runCtx, ev.link); err != nil {
						return err
					}
				}
			case opError, opLost:
				lost := ev.from.String()
				if c.Op == opLost {
					lost = c.Peer
				}
				return &serveFailure{peer: lost, err: errors.New(c.Err)}
			}
		}
	}
}

// sendWeights sends a stage node the weights of its blocks, read from the
// checkpoint (only that span's tensors).
func (s *Server) sendWeights(ctx context.Context, l *wire.Link) error {
	i := s.plan.StageOf(l.RemotePeer().String())
	if i < 0 {
		return fmt.Errorf("pipeline: %s asked for weights but holds no stage", l.RemotePeer().ShortString())
	}
	sp := s.plan.Stages[i]
	span := model.Span{First: sp.First, Last: sp.Last}
	var wopts []safetensors.WriteOption
	if s.cfg.Weights.WeightDType(s.cfg.Spec.Model, span) == tensor.BFloat16 {
		wopts = append(wopts, safetensors.WithDType(safetensors.BF16)) // exact: the checkpoint is bfloat16
	}
	e, err := layoutSpan(s.cfg.Weights, s.cfg.Spec.Model, span, nil, wopts...)
	if err != nil {
		return fmt.Errorf("pipeline: read blocks %d-%d: %w", sp.First, sp.Last-1, err)
	}
	send := func(w io.Writer) error { _, err := e.WriteTo(w); return err }
	if err := sendBlobFrom(ctx, l, Ctl{Name: opWeights, Gen: s.plan.Gen}, e.Size(), send); err != nil {
		return &serveFailure{peer: l.RemotePeer().String(), err: err}
	}
	return nil
}

func (s *Server) adoptLink(ctx context.Context, l *wire.Link) {
	if l.Job() != WireJob(s.plan.JobID, s.plan.Gen) {
		l.Close()
		return
	}
	if old := s.links[l.RemotePeer()]; old != nil {
		old.Close()
		delete(s.linkSeq, old)
	}
	s.links[l.RemotePeer()] = l
	seq := s.plan.StartStep - min(s.plan.StartStep, 1)
	s.linkSeq[l] = &seq
	go readServeLink(ctx, l, s.events, inMemory(1<<20))
}

// Generate runs one sequence: prompt (real token ids) continued by up to
// maxNew tokens. pick chooses each next token from the logits of the
// model's vocabulary (in real-id order); emit receives it and returns
// true to stop (an end-of-sequence token, a stop string, a client gone).
// Both are called on the server's goroutine and must not block. Generate
// returns when the sequence ends; when ctx ends first it returns at once
// and emit is not called again.
func (s *Server) Generate(ctx context.Context, prompt []int32, maxNew int, pick func(logits []float32) int32, emit func(token int32) (stop bool)) error {
	spec := s.cfg.Spec
	switch {
	case len(prompt) == 0:
		return errors.New("pipeline: empty prompt")
	case maxNew < 1:
		return fmt.Errorf("pipeline: %d new tokens asked", maxNew)
	case len(prompt)+maxNew > spec.MaxTokens:
		return fmt.Errorf("pipeline: %d prompt + %d new tokens exceed the job's %d per sequence", len(prompt), maxNew, spec.MaxTokens)
	case pick == nil || emit == nil:
		return errors.New("pipeline: Generate needs pick and emit")
	}
	for i, t := range prompt {
		if t < 0 || int(t) >= spec.Model.Vocab {
			return fmt.Errorf("pipeline: prompt token %d at %d outside the vocabulary of %d", t, i, spec.Model.Vocab)
		}
	}
	q := &sequence{
		tokens: slices.Clone(prompt), promptLen: len(prompt), maxNew: maxNew,
		pick: pick, emit: emit, done: make(chan error, 1),
	}
	select {
	case s.reqs <- q:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.done:
		return ErrServerClosed
	}
	select {
	case err := <-q.done:
		return err
	case <-ctx.Done():
		q.mu.Lock()
		q.cancelled = true
		q.mu.Unlock()
		s.poke()
		return ctx.Err()
	case <-s.done:
		return ErrServerClosed
	}
}

func (s *Server) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// deliver passes a token to the caller unless it has gone.
func (q *sequence) deliver(tok int32) (stop bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.cancelled {
		return true
	}
	return q.emit(tok)
}

func (q *sequence) gone() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.cancelled
}

// run is the server's owner loop.
func (s *Server) run(ctx context.Context) {
	tick := time.NewTicker(s.cfg.KeepAlive)
	defer tick.Stop()
	work := time.NewTicker(s.cfg.WorkInterval)
	defer work.Stop()
	var err error
	defer func() { s.shutdown(ctx, err) }()
	for {
		if err = s.schedule(ctx); err != nil {
			if err = s.failover(ctx, err); err != nil {
				return
			}
			continue
		}
		select {
		case <-s.stop:
			err = ErrServerClosed
			return
		case q := <-s.reqs:
			s.admit(q)
		case <-s.wake:
			s.reap(ctx)
		case l := <-s.linkCh:
			s.adoptLink(ctx, l)
		case p := <-s.planCh:
			switch {
			case p.Epoch <= s.plan.Epoch:
			case p.Gen == s.plan.Gen:
				s.setPlan(p) // a new coordinator adopted the job; links stay
			default:
				err = s.failover(ctx, &serveFailure{err: errors.New("the coordinator moved a stage"), plan: p})
			}
		case <-tick.C:
			for _, l := range s.links {
				_ = sendCtl(ctx, l, Ctl{Op: opPing})
			}
		case <-work.C:
			s.askWork(ctx)
		case ev := <-s.events:
			err = s.handle(ctx, ev)
		}
		if err != nil {
			if err = s.failover(ctx, err); err != nil {
				return
			}
		}
	}
}

// failover recovers from a stage failure; other errors end the server.
func (s *Server) failover(ctx context.Context, err error) error {
	var sf *serveFailure
	if !errors.As(err, &sf) {
		s.log.Error("serving stopped", "err", err)
		return err
	}
	for {
		s.log.Warn("a serving stage failed; re-placing it and replaying live sequences", "peer", short(sf.peer), "err", sf.err, "sequences", len(s.seqs))
		err := s.recover(ctx, ctx, sf.peer, sf.plan)
		if err == nil {
			return nil
		}
		if !errors.As(err, &sf) {
			s.log.Error("serving stopped: recovery failed", "err", err)
			return err
		}
	}
}

// recover replaces a lost stage node (or adopts the coordinator's new
// plan) and sets every live sequence to be replayed from its start.
func (s *Server) recover(ctx, runCtx context.Context, lost string, p *job.Plan) error {
	began := time.Now()
	for _, q := range s.seqs {
		q.fed, q.inFlight = 0, false
	}
	// Batches still on their way are void: the replay supersedes them.
	s.inflight = map[uint64]*flight{}
	s.stale = s.frames
	oldGen := s.plan.Gen
	if p == nil {
		var signed []byte
		var err error
		for attempt := 0; ; attempt++ {
			signed, err = s.coord.Replan(ctx, s.plan.JobID, s.plan.Epoch, lost, 0)
			if err == nil {
				break
			}
			s.log.Warn("re-plan failed; retrying", "err", err)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-s.stop:
				return ErrServerClosed
			case <-time.After(time.Duration(min(attempt+1, 10)) * 500 * time.Millisecond):
			}
		}
		if err := s.adopt(ctx, signed); err != nil {
			return err
		}
	} else {
		if err := s.rt.check(ctx, p); err != nil {
			return err
		}
		s.setPlan(p)
	}
	if s.plan.Gen != oldGen {
		// A new placement: new links, every stage says ready again.
		for _, l := range s.links {
			_ = l.Close()
		}
		s.links, s.linkSeq, s.ready = map[peer.ID]*wire.Link{}, map[*wire.Link]*uint64{}, map[peer.ID]bool{}
	}
	if err := s.connect(ctx, runCtx); err != nil {
		return err
	}
	took := time.Since(began)
	s.mu.Lock()
	s.stats.Recoveries++
	s.stats.LastRecovery = took
	s.stats.Plan = s.plan
	s.mu.Unlock()
	s.log.Info("serving recovered", "gen", s.plan.Gen, "stages", stagesSummary(s.plan), "took", took.Round(time.Millisecond), "replaying", len(s.seqs))
	return nil
}

// admit takes a new sequence; beyond MaxBatch live ones (what the
// stages keep caches for) it waits in the backlog, in order.
func (s *Server) admit(q *sequence) {
	s.backlog = append(s.backlog, q)
	s.promote()
}

// promote makes backlogged sequences live while there is room.
func (s *Server) promote() {
	for len(s.backlog) > 0 && len(s.seqs) < s.cfg.Spec.MaxBatch {
		q := s.backlog[0]
		s.backlog = s.backlog[1:]
		if q.gone() {
			q.done <- context.Canceled
			continue
		}
		s.nextID++
		q.id = s.nextID
		q.lane = int(q.id % uint64(s.lanes))
		s.seqs[q.id] = q
	}
}

// reap ends sequences whose callers have gone and that have no batch in
// flight.
func (s *Server) reap(ctx context.Context) {
	for _, q := range s.seqs {
		if !q.inFlight && q.gone() {
			s.finish(ctx, q, context.Canceled)
		}
	}
	s.backlog = slices.DeleteFunc(s.backlog, func(q *sequence) bool {
		if q.gone() {
			q.done <- context.Canceled
			return true
		}
		return false
	})
}

// finish ends a sequence and frees its caches on its lane's stages.
func (s *Server) finish(ctx context.Context, q *sequence, err error) {
	delete(s.seqs, q.id)
	q.done <- err
	defer s.promote()
	if q.fed == 0 {
		return
	}
	if l := s.stage0(q.lane); l != nil {
		m := serveMsg{Kind: serveDrop, Frame: 0, Lane: uint32(q.lane), Seqs: []seqEntry{{ID: q.id}}}
		if err := sendServe(ctx, l, s.linkSeq[l], m, nil, nil); err != nil {
			s.log.Debug("cannot drop a sequence's caches", "err", err)
		}
	}
}

// stage0 is the link to the replica of stage 0 serving lane.
func (s *Server) stage0(lane int) *wire.Link {
	reps := s.plan.Stages[0].Replicas
	id, _ := peer.Decode(reps[lane%len(reps)])
	return s.links[id]
}

// schedule sends batches of the sequences that wait for their next
// tokens to be run, as long as the pipeline has room.
func (s *Server) schedule(ctx context.Context) error {
	s.reap(ctx)
	depth := len(s.plan.Stages)
	maxFlight := max(2, 2*depth)
	for len(s.inflight) < maxFlight {
		var waiting []*sequence
		for _, q := range s.seqs {
			if !q.inFlight {
				waiting = append(waiting, q)
			}
		}
		if len(waiting) == 0 {
			return nil
		}
		slices.SortFunc(waiting, func(a, b *sequence) int { return int(a.id) - int(b.id) })
		if s.perCall {
			q := waiting[0]
			for _, p := range s.parts(q) {
				if err := s.send(ctx, q.lane, []part{p}); err != nil {
					return err
				}
			}
			continue
		}
		// A batch of about 1/depth of the live sequences keeps every stage
		// busy; the oldest waiting sequence's lane goes first.
		target := min(maxSeqsPerFrame, max(1, (len(s.seqs)+depth-1)/depth))
		lane := waiting[0].lane
		budget := s.cfg.Spec.MaxBatch * s.cfg.Spec.MaxTokens
		var batch []part
		for _, q := range waiting {
			if q.lane != lane || len(batch) == target {
				continue
			}
			n := len(q.tokens) - q.fed
			if n > budget {
				break
			}
			budget -= n
			e := seqEntry{ID: q.id, Pos: q.fed, N: n, First: 1}
			if q.fed == 0 {
				e.First = q.promptLen // the prefill, as one process runs it
			}
			batch = append(batch, part{q: q, e: e, last: true})
		}
		if err := s.send(ctx, lane, batch); err != nil {
			return err
		}
	}
	return nil
}

// parts splits a sequence's unsent tokens into one part per Infer call
// (perCall): the prompt, then each token after it.
func (s *Server) parts(q *sequence) []part {
	var out []part
	pos := q.fed
	for pos < len(q.tokens) {
		k := 1
		if pos == 0 {
			k = q.promptLen
		}
		out = append(out, part{q: q, e: seqEntry{ID: q.id, Pos: pos, N: k, First: k}})
		pos += k
	}
	out[len(out)-1].last = true
	return out
}

// send embeds a batch's new tokens and sends it to stage 0.
func (s *Server) send(ctx context.Context, lane int, batch []part) error {
	l := s.stage0(lane)
	if l == nil {
		reps := s.plan.Stages[0].Replicas
		return &serveFailure{peer: reps[lane%len(reps)], err: errLinkLost}
	}
	s.frames++
	fl := &flight{}
	m := serveMsg{Kind: serveBatch, Frame: s.frames, Lane: uint32(lane)}
	var hidden []float32
	var ids []int
	for _, p := range batch {
		q, e := p.q, p.e
		if _, live := s.seqs[q.id]; !live {
			continue
		}
		toks := s.pseudonyms(q.tokens[e.Pos : e.Pos+e.N])
		h, err := s.embed(e, toks)
		if err != nil {
			s.finish(ctx, q, fmt.Errorf("pipeline: embed sequence %d: %w", q.id, err))
			continue
		}
		hidden = append(hidden, h...)
		if s.codec.NeedsIDs(codec.Forward) {
			for _, t := range toks {
				ids = append(ids, int(t))
			}
		}
		if e.Pos == 0 && len(q.tokens) > q.promptLen {
			s.mu.Lock()
			s.stats.Replayed += int64(len(q.tokens))
			s.mu.Unlock()
		}
		q.inFlight = true
		m.Seqs = append(m.Seqs, e)
		fl.parts = append(fl.parts, p)
	}
	if len(m.Seqs) == 0 {
		return nil
	}
	s.inflight[m.Frame] = fl
	if err := sendServe(ctx, l, s.linkSeq[l], m, hidden, ids); err != nil {
		return &serveFailure{peer: l.RemotePeer().String(), err: err}
	}
	s.mu.Lock()
	s.stats.Frames++
	s.mu.Unlock()
	return nil
}

// embed runs an entry's tokens through the embedding in the calls the
// stages will run them as (one process embeds each call on its own).
func (s *Server) embed(e seqEntry, toks []int32) ([]float32, error) {
	var hidden []float32
	off := 0
	for _, k := range e.calls() {
		out, err := s.first.Forward(0, model.Input{Batch: 1, Seq: k, Tokens: toks[off : off+k], NoGrad: true})
		if err != nil {
			return nil, err
		}
		hidden = append(hidden, out.Hidden...)
		off += k
	}
	return hidden, nil
}

func (s *Server) pseudonyms(ids []int32) []int32 {
	if s.realToPs == nil {
		return ids
	}
	out := make([]int32, len(ids))
	for i, t := range ids {
		out[i] = s.realToPs[t]
	}
	return out
}

// handle takes one event from a link.
func (s *Server) handle(ctx context.Context, ev serveEvent) error {
	if s.links[ev.from] != ev.link {
		return nil // an old link
	}
	if ev.err != nil {
		return &serveFailure{peer: ev.from.String(), err: ev.err}
	}
	if c := ev.ctl; c != nil {
		switch c.Op {
		case opPing:
		case opLost:
			return &serveFailure{peer: c.Peer, err: fmt.Errorf("%s lost its link: %s", ev.from.ShortString(), c.Err)}
		case opError:
			return &serveFailure{peer: ev.from.String(), err: errors.New(c.Err)}
		case opReady:
			s.ready[ev.from] = true
		case opStats:
			s.tookWork(ctx, ev.from.String(), c)
		case opLoad:
			// A stage reconnected within the placement (its home link
			// broke and came back) and lost nothing but the link.
			return &serveFailure{peer: ev.from.String(), err: errors.New("a stage asked for its weights again")}
		default:
			return fmt.Errorf("pipeline: unexpected %q from stage node %s", c.Op, ev.from.ShortString())
		}
		return nil
	}
	m := ev.msg
	if m.Kind == serveDrop {
		return nil // a drop came round: every stage of its lane freed it
	}
	fl := s.inflight[m.Frame]
	if fl == nil && m.Frame <= s.stale {
		return nil // voided by a recovery
	}
	last := s.plan.Stages[len(s.plan.Stages)-1].Replicas
	if fl == nil || !slices.Contains(last, ev.from.String()) || len(fl.parts) != len(m.Seqs) {
		return fmt.Errorf("pipeline: stage node %s returned batch %d, which is not in flight", ev.from.ShortString(), m.Frame)
	}
	for i, e := range m.Seqs {
		if e != fl.parts[i].e {
			return fmt.Errorf("pipeline: batch %d came back changed", m.Frame)
		}
	}
	delete(s.inflight, m.Frame)
	d, v := s.cfg.Spec.Model.Dim, s.cfg.Spec.Model.Vocab
	hidden := ev.frame.Data
	off := 0
	for i, e := range m.Seqs {
		q := fl.parts[i].q
		rows := e.lastCall()
		from := off + e.N - rows
		off += e.N
		if _, live := s.seqs[q.id]; !live {
			continue // ended while this part of a replay was out
		}
		q.fed = e.Pos + e.N
		if !fl.parts[i].last {
			continue // a replay's earlier call: only the cache mattered
		}
		q.inFlight = false
		if q.gone() {
			s.finish(ctx, q, context.Canceled)
			continue
		}
		out, err := s.last.Forward(0, model.Input{Batch: 1, Seq: rows, Hidden: hidden[from*d : (from+rows)*d], NoGrad: true})
		if err != nil {
			s.finish(ctx, q, fmt.Errorf("pipeline: head of sequence %d: %w", q.id, err))
			continue
		}
		logits := out.Logits[(rows-1)*v:]
		if s.realToPs != nil {
			real := make([]float32, v)
			for id := range real {
				real[id] = logits[s.realToPs[id]]
			}
			logits = real
		}
		tok := q.pick(logits)
		if tok < 0 || int(tok) >= v {
			s.finish(ctx, q, fmt.Errorf("pipeline: picked token %d outside the vocabulary", tok))
			continue
		}
		q.tokens = append(q.tokens, tok)
		s.mu.Lock()
		s.stats.Tokens++
		s.mu.Unlock()
		stop := q.deliver(tok)
		if stop || len(q.tokens)-q.promptLen >= q.maxNew || q.fed >= s.cfg.Spec.MaxTokens {
			s.mu.Lock()
			s.stats.Sequences++
			s.mu.Unlock()
			s.finish(ctx, q, nil)
		}
	}
	return nil
}

// Close stops serving: live sequences end with ErrServerClosed, the stage
// nodes are told the job is over and the coordinator releases it.
func (s *Server) Close(ctx context.Context) error {
	s.once.Do(func() { close(s.stop) })
	if !s.started.Load() {
		s.first.Close()
		s.last.Close()
		return nil
	}
	<-s.done
	s.reports.Wait()
	if err := s.coord.Release(ctx, s.cfg.Spec.JobID); err != nil {
		s.log.Warn("could not release the serving job at the coordinator", "err", err)
		return err
	}
	return nil
}

// askWork asks every stage node for its compute time and tokens so far;
// the replies come back as events (tookWork).
func (s *Server) askWork(ctx context.Context) {
	s.workRound++
	s.workReplies = map[string]job.WorkItem{}
	for _, l := range s.links {
		_ = sendCtl(ctx, l, Ctl{Op: opStats, Step: s.workRound})
	}
}

// tookWork takes one node's counters; once every stage node of the plan
// has answered, what each did since the last report goes to the
// coordinator.
func (s *Server) tookWork(ctx context.Context, from string, c *Ctl) {
	if c.Step != s.workRound || s.workReplies == nil || c.ComputeS < 0 || c.Tokens < 0 {
		return
	}
	s.workReplies[from] = job.WorkItem{Peer: from, ComputeS: c.ComputeS, Tokens: c.Tokens}
	for _, id := range s.stagePeers() {
		if _, ok := s.workReplies[id.String()]; !ok {
			return
		}
	}
	if s.workSeen == nil {
		s.workSeen = map[string]job.WorkItem{}
	}
	var items []job.WorkItem
	for peer, now := range s.workReplies {
		prev := s.workSeen[peer]
		if now.ComputeS < prev.ComputeS || now.Tokens < prev.Tokens {
			prev = job.WorkItem{} // a restarted worker counts from zero
		}
		if d := (job.WorkItem{Peer: peer, ComputeS: now.ComputeS - prev.ComputeS, Tokens: now.Tokens - prev.Tokens}); d.Tokens > 0 || d.ComputeS > 0 {
			items = append(items, d)
		}
		s.workSeen[peer] = now
	}
	slices.SortFunc(items, func(a, b job.WorkItem) int { return strings.Compare(a.Peer, b.Peer) })
	from0, to := s.workLast, s.workRound
	s.workLast, s.workReplies = s.workRound, nil
	if len(items) == 0 {
		return
	}
	// Off the loop: the coordinator is a network round trip away.
	s.reports.Add(1)
	go func() {
		defer s.reports.Done()
		wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.coord.Work(wctx, s.cfg.Spec.JobID, from0, to, items); err != nil {
			s.log.Warn("could not report serving work to the coordinator", "err", err)
		}
	}()
}

// finalWork collects and reports the work since the last report, briefly,
// as the server stops.
func (s *Server) finalWork(ctx context.Context) {
	if len(s.links) == 0 || s.plan == nil {
		return
	}
	s.askWork(ctx)
	deadline := time.After(2 * time.Second)
	for s.workReplies != nil {
		select {
		case ev := <-s.events:
			if s.links[ev.from] == ev.link && ev.ctl != nil && ev.ctl.Op == opStats {
				s.tookWork(ctx, ev.from.String(), ev.ctl)
			}
		case <-deadline:
			return
		}
	}
}

// shutdown ends every sequence and link; the run goroutine calls it last
// (or Start, on failure).
func (s *Server) shutdown(ctx context.Context, err error) {
	if err == nil {
		err = ErrServerClosed
	}
	for _, q := range s.seqs {
		q.done <- err
	}
	for _, q := range s.backlog {
		q.done <- err
	}
	s.seqs, s.backlog = nil, nil
	fctx, fcancel := context.WithTimeout(context.Background(), 2*time.Second)
	s.finalWork(fctx)
	fcancel()
	// Tell every stage the job is over, briefly.
	dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	for _, l := range s.links {
		_ = sendCtl(dctx, l, Ctl{Op: opDone})
		l.Close()
	}
	cancel()
	s.once.Do(func() { close(s.stop) })
	if s.plan != nil {
		s.rt.mu.Lock()
		if e := s.rt.byJob[s.cfg.Spec.JobID]; e != nil && e.server == s {
			delete(s.rt.byJob, s.cfg.Spec.JobID)
			delete(s.rt.byWire, WireJob(s.plan.JobID, s.plan.Gen))
		}
		s.rt.mu.Unlock()
	}
	s.first.Close()
	s.last.Close()
	s.cancelRun()
	close(s.done)
}

// serveFailure is a lost stage node (peer, when known) or a placement
// the coordinator changed (plan).
type serveFailure struct {
	peer string
	err  error
	plan *job.Plan
}

func (e *serveFailure) Error() string {
	if e.peer == "" {
		return fmt.Sprintf("serving placement changed: %v", e.err)
	}
	return fmt.Sprintf("serving stage node %s lost: %v", short(e.peer), e.err)
}
