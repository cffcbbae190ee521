package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-msgio"

	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/tensor"
	"github.com/holopeer/holopeer/stage/wire"
	"github.com/holopeer/holopeer/stage/wire/codec"
)

// AssignProtocol carries a signed plan from the coordinator to a node it
// names. Request: one uvarint-length-prefixed signed plan. Response: one
// uvarint-length-prefixed JSON AssignReply.
const AssignProtocol = protocol.ID(job.AssignProtocol)

// AssignReply says whether a node takes its part of a plan.
type AssignReply struct {
	OK  bool   `json:"ok"`
	Err string `json:"err,omitempty"`
}

// PlanCheck verifies what a signature cannot: that the plan's signer was
// coordinator in the plan's term, and that the term is not older than the
// newest this node has accepted (the fencing token).
type PlanCheck func(ctx context.Context, p *job.Plan) error

// Runtime runs the stage work of one node: it serves the stage protocol,
// authorises links from the plans it holds, takes plans from the
// coordinator, and runs a Worker per job it holds a stage of (and, on a
// researcher's node, hands links to the Driver).
type Runtime struct {
	// Static after NewRuntime.
	host    host.Host
	svc     *wire.Service
	log     *slog.Logger
	backend tensor.Backend
	dir     string
	memory  uint64
	check   PlanCheck
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	// mu guards the following.
	mu      sync.Mutex
	byWire  map[wire.JobID]*entry
	byJob   map[string]*entry
	changed chan struct{} // closed and replaced whenever a plan is registered
}

type entry struct {
	plan   *job.Plan
	codec  codec.Codec
	worker *Worker
	driver *Driver
	// Serving jobs (serve_*.go): a stage node's worker, the researcher's
	// server.
	sworker *serveWorker
	server  *Server
}

// RuntimeConfig configures a Runtime.
type RuntimeConfig struct {
	Host    host.Host
	Backend tensor.Backend
	DataDir string    // step logs live under DataDir/jobs
	Memory  uint64    // bytes this node lends; plans asking more are refused
	Check   PlanCheck // required: the election's view of coordinators and terms
	Logger  *slog.Logger
	Wire    []wire.Option
}

// NewRuntime starts serving the stage and assign protocols.
func NewRuntime(cfg RuntimeConfig) (*Runtime, error) {
	if cfg.Host == nil || cfg.Check == nil {
		return nil, errors.New("pipeline: a runtime needs a host and a plan check")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Backend == nil {
		be, err := tensor.Open("cpu")
		if err != nil {
			return nil, err
		}
		cfg.Backend = be
	}
	ctx, cancel := context.WithCancel(context.Background())
	rt := &Runtime{
		host: cfg.Host, log: cfg.Logger.With("component", "pipeline"), backend: cfg.Backend,
		dir: cfg.DataDir, memory: cfg.Memory, check: cfg.Check, ctx: ctx, cancel: cancel,
		byWire: map[wire.JobID]*entry{}, byJob: map[string]*entry{}, changed: make(chan struct{}),
	}
	svc, err := wire.NewService(cfg.Host, wire.AuthorizerFunc(rt.authorize), append([]wire.Option{wire.WithLogger(cfg.Logger)}, cfg.Wire...)...)
	if err != nil {
		cancel()
		return nil, err
	}
	rt.svc = svc
	cfg.Host.SetStreamHandler(AssignProtocol, rt.serveAssign)
	rt.wg.Add(1)
	go rt.dispatch()
	return rt, nil
}

// planWait is how long a link for a job this node has not heard of yet
// waits for its plan: the coordinator sends a plan to every node at once,
// so a neighbour may dial before the plan has reached this node.
const planWait = 10 * time.Second

// authorize implements wire.Authorizer from the plans this node holds.
func (rt *Runtime) authorize(ctx context.Context, wj wire.JobID, remote peer.ID) (wire.LinkSpec, error) {
	deadline := time.NewTimer(planWait)
	defer deadline.Stop()
	for {
		rt.mu.Lock()
		e, changed := rt.byWire[wj], rt.changed
		rt.mu.Unlock()
		if e != nil {
			return linkSpec(e.plan, e.codec, rt.host.ID().String(), remote.String())
		}
		select {
		case <-changed:
		case <-deadline.C:
			return wire.LinkSpec{}, fmt.Errorf("%w: no job %s here", wire.ErrNotAuthorized, wj)
		case <-ctx.Done():
			return wire.LinkSpec{}, ctx.Err()
		case <-rt.ctx.Done():
			return wire.LinkSpec{}, wire.ErrClosed
		}
	}
}

// dispatch hands accepted links to the job they belong to.
func (rt *Runtime) dispatch() {
	defer rt.wg.Done()
	for {
		l, err := rt.svc.Accept(rt.ctx)
		if err != nil {
			return
		}
		rt.mu.Lock()
		e := rt.byWire[l.Job()]
		rt.mu.Unlock()
		switch {
		case e == nil:
			l.Close()
		case e.worker != nil:
			e.worker.offerLink(rt.ctx, l)
		case e.driver != nil:
			e.driver.offerLink(l)
		case e.sworker != nil:
			e.sworker.offerLink(rt.ctx, l)
		case e.server != nil:
			e.server.offerLink(l)
		default:
			l.Close()
		}
	}
}

// serveAssign takes a plan from the coordinator.
func (rt *Runtime) serveAssign(s network.Stream) {
	_ = s.Scope().SetService("holopeer.assign")
	_ = s.SetDeadline(time.Now().Add(30 * time.Second))
	b, err := msgio.NewVarintReaderSize(s, job.MaxPlanBytes).ReadMsg()
	if err != nil {
		s.Reset()
		return
	}
	reply := AssignReply{OK: true}
	if err := rt.Assign(rt.ctx, b, s.Conn().RemotePeer()); err != nil {
		reply = AssignReply{Err: err.Error()}
		rt.log.Warn("refused a plan", "from", s.Conn().RemotePeer().ShortString(), "err", err)
	}
	rb, _ := json.Marshal(reply)
	if err := msgio.NewVarintWriter(s).WriteMsg(rb); err != nil {
		s.Reset()
		return
	}
	s.Close()
}

// ErrRefused wraps a node's refusal of a plan.
var ErrRefused = errors.New("plan refused")

// Assign takes a signed plan: it checks the signature, the coordinator and
// its term, that this node holds a stage in it and that the stage fits in
// the memory it lends, then starts (or updates) the job's worker.
func (rt *Runtime) Assign(ctx context.Context, signed []byte, from peer.ID) error {
	p, err := job.OpenPlan(signed)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrRefused, err)
	}
	if from != "" && from.String() != p.Coordinator {
		return fmt.Errorf("%w: plan signed by %s came from %s", ErrRefused, short(p.Coordinator), from.ShortString())
	}
	if err := rt.check(ctx, p); err != nil {
		return fmt.Errorf("%w: %v", ErrRefused, err)
	}
	self := rt.host.ID().String()
	rt.mu.Lock()
	e := rt.byJob[p.JobID]
	var cur *job.Plan
	if e != nil {
		cur = e.plan
	}
	rt.mu.Unlock()
	// A newer plan may move stages and re-sign; it may not hand the job
	// to another researcher (who would be sent its weights and optimizer
	// state, and could restore poisoned ones), nor change its spec or the
	// blocks this node holds.
	if cur != nil && p.Epoch > cur.Epoch {
		if err := job.SameJob(cur, p); err != nil {
			return fmt.Errorf("%w: %v", ErrRefused, err)
		}
	}
	if p.Spec.Kind == job.KindServe {
		return rt.assignServe(ctx, p, e) // serve_worker.go
	}
	if e != nil && e.driver != nil {
		e.driver.offerPlan(p)
		return nil
	}
	stage := p.StageOf(self)
	if stage < 0 {
		if e != nil && e.worker != nil {
			e.worker.cancel()
			return nil
		}
		return fmt.Errorf("%w: the plan gives this node no stage", ErrRefused)
	}
	if err := rt.fits(p, stage, "stage"); err != nil {
		return err
	}
	if e != nil && e.worker != nil {
		return rt.update(ctx, e, &e.worker.stageNode, p)
	}
	w, err := newWorker(rt, p)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrRefused, err)
	}
	rt.launch(p, &entry{worker: w}, &w.stageNode, w.run)
	sp := p.Stages[stage]
	rt.log.Info("took a stage", "job", p.JobID, "stage", stage, "blocks", fmt.Sprintf("%d-%d", sp.First, sp.Last-1), "term", p.Term, "epoch", p.Epoch)
	return nil
}

// fits refuses the stage plan p gives this node when its blocks and the
// per-stage state need more memory than the node lends; what names the
// stage in the refusal.
func (rt *Runtime) fits(p *job.Plan, stage int, what string) error {
	if rt.memory == 0 {
		return nil
	}
	sp := p.Stages[stage]
	need := stageNeed(p, stage)
	self := rt.host.ID().String()
	var held uint64
	jobs := 0
	rt.mu.Lock()
	for id, e := range rt.byJob {
		if id == p.JobID || e.plan == nil || e.driver != nil || e.server != nil {
			continue
		}
		if i := e.plan.StageOf(self); i >= 0 {
			held += stageNeed(e.plan, i)
			jobs++
		}
	}
	rt.mu.Unlock()
	if need+held > rt.memory {
		return fmt.Errorf("%w: %s %d (blocks %d-%d) needs %d MiB on top of %d MiB for %d running jobs; this node lends %d MiB",
			ErrRefused, what, stage, sp.First, sp.Last-1, need>>20, held>>20, jobs, rt.memory>>20)
	}
	return nil
}

// stageNeed is the memory estimate of stage of plan p: its blocks and the
// stage's buffers.
func stageNeed(p *job.Plan, stage int) uint64 { return spanBytes(p, stage) + p.Spec.StageBytes() }

// update hands a newer plan of e's job to its running stage worker n;
// a plan no newer than the one it runs is ignored.
func (rt *Runtime) update(ctx context.Context, e *entry, n *stageNode, p *job.Plan) error {
	if p.Epoch <= e.plan.Epoch {
		return nil
	}
	rt.register(p, e.codec, e)
	select {
	case n.plans <- p:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// launch registers ne, which holds the new stage worker n, for plan p and
// runs the worker's owner loop until its job ends or the runtime closes;
// then the job is forgotten.
func (rt *Runtime) launch(p *job.Plan, ne *entry, n *stageNode, run func(context.Context)) {
	rt.register(p, n.codec, ne)
	wctx, cancel := context.WithCancel(rt.ctx)
	n.cancel = cancel
	rt.wg.Add(1)
	go func() {
		defer rt.wg.Done()
		run(wctx)
		rt.forget(p.JobID, ne)
	}()
}

// register makes plan p the current plan of e, reachable by job id and by
// the wire id of its placement.
func (rt *Runtime) register(p *job.Plan, c codec.Codec, e *entry) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if e.plan != nil && e.plan.Gen != p.Gen {
		// Links of the old placement may still drain; keep accepting
		// them for a moment is not needed: they are closed on replan.
		delete(rt.byWire, WireJob(e.plan.JobID, e.plan.Gen))
	}
	e.plan, e.codec = p, c
	rt.byWire[WireJob(p.JobID, p.Gen)] = e
	rt.byJob[p.JobID] = e
	close(rt.changed)
	rt.changed = make(chan struct{})
}

func (rt *Runtime) forget(jobID string, e *entry) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.byJob[jobID] == e {
		delete(rt.byJob, jobID)
		delete(rt.byWire, WireJob(e.plan.JobID, e.plan.Gen))
	}
}

// Jobs lists the ids of the jobs this node takes part in.
func (rt *Runtime) Jobs() []string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var out []string
	for id := range rt.byJob {
		out = append(out, id)
	}
	return out
}

// WorkerStats reports, per job this node holds a stage of, the compute
// time and tokens processed so far (for receipts).
type WorkerStats struct {
	JobID    string
	ComputeS float64
	Tokens   int64
}

func (rt *Runtime) stepLogPath(jobID, role string) string {
	if rt.dir == "" {
		return ""
	}
	return filepath.Join(rt.dir, "jobs", jobID, role+"-steps.jsonl")
}

// Service is the node's stage-protocol service.
func (rt *Runtime) Service() *wire.Service { return rt.svc }

// Close stops every worker and the stage protocol.
func (rt *Runtime) Close() error {
	rt.cancel()
	rt.host.RemoveStreamHandler(AssignProtocol)
	err := rt.svc.Close()
	rt.wg.Wait()
	return err
}
