package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/optim"
	"github.com/holopeer/holopeer/stage/tensor"
	"github.com/holopeer/holopeer/stage/wire"
	"github.com/holopeer/holopeer/stage/wire/codec"
)

// Worker runs one stage of one training job on a stage node. Its state is
// owned by the run goroutine; other goroutines talk to it through
// channels (new links, new plans, link events).
type Worker struct {
	// Static after newWorker.
	rt    *Runtime
	self  string
	jobID string
	log   *slog.Logger
	be    tensor.Backend

	links  chan *wire.Link
	plans  chan *job.Plan
	events chan linkEvent
	done   chan struct{}
	cancel context.CancelFunc

	// Owned by the run goroutine.
	plan    *job.Plan
	codec   codec.Codec
	stage   int
	st      *model.Stage
	opt     *optim.AdamW
	byPeer  map[peer.ID]*wire.Link
	applied uint64
	log2    *stepLog
	err     error
	// Compute accounting for receipts and metrics.
	computeTime time.Duration
	tokens      int64
}

func newWorker(rt *Runtime, p *job.Plan) (*Worker, error) {
	self := rt.host.ID().String()
	stage := p.StageOf(self)
	if stage < 0 {
		return nil, fmt.Errorf("pipeline: plan %s gives this node no stage", p.JobID)
	}
	c, _, err := newCodec(p.Spec)
	if err != nil {
		return nil, err
	}
	sl, err := openStepLog(rt.stepLogPath(p.JobID, "stage"))
	if err != nil {
		return nil, err
	}
	w := &Worker{
		rt: rt, self: self, jobID: p.JobID, be: rt.backend,
		log:    rt.log.With("job", p.JobID, "stage", stage),
		links:  make(chan *wire.Link, 16),
		plans:  make(chan *job.Plan, 4),
		events: make(chan linkEvent, 64),
		done:   make(chan struct{}),
		plan:   p, codec: c, stage: stage,
		byPeer: map[peer.ID]*wire.Link{},
		log2:   sl,
	}
	if err := w.buildStage(); err != nil {
		sl.Close()
		return nil, err
	}
	return w, nil
}

// buildStage (re)creates the model stage from the seed with a fresh
// optimizer.
func (w *Worker) buildStage() error {
	if w.st != nil {
		w.st.Close()
	}
	sp := w.plan.Stages[w.stage]
	st, err := model.NewStage(w.plan.Spec.Model, model.Span{First: sp.First, Last: sp.Last}, model.WithBackend(w.be), model.WithSeed(w.plan.Spec.InitSeed))
	if err != nil {
		return fmt.Errorf("pipeline: build stage %d: %w", w.stage, err)
	}
	opt, err := optim.New(w.be, w.plan.Spec.Optim)
	if err != nil {
		st.Close()
		return err
	}
	w.st, w.opt, w.applied = st, opt, 0
	return nil
}

// run is the worker's owner loop.
func (w *Worker) run(ctx context.Context) {
	defer close(w.done)
	defer w.shutdown()
	w.log.Info("linking", "prev_next_home", w.expectedPeers(), "researcher", short(w.plan.Researcher))
	w.connect(ctx)
	ready := false
	for {
		if !ready && w.linksComplete() {
			ready = true
			w.tell(ctx, Ctl{Op: opReady, Gen: w.plan.Gen, Step: w.applied})
			w.log.Info("stage ready", "blocks", fmt.Sprintf("%d-%d", w.plan.Stages[w.stage].First, w.plan.Stages[w.stage].Last-1), "links", len(w.byPeer))
		}
		select {
		case <-ctx.Done():
			return
		case l := <-w.links:
			w.adopt(ctx, l)
		case p := <-w.plans:
			if err := w.replan(ctx, p); err != nil {
				w.log.Error("cannot follow the new plan", "err", err)
				w.err = err
				return
			}
			ready = false
		case ev := <-w.events:
			if ev.err != nil {
				if w.linkEnded(ctx, ev) {
					return
				}
				continue
			}
			stop, err := w.handle(ctx, ev)
			if err != nil {
				w.log.Error("stage failed", "err", err)
				w.err = err
				w.tell(ctx, Ctl{Op: opError, Err: err.Error()})
				return
			}
			if stop {
				return
			}
		}
	}
}

// connect opens the links this node is the opener of, in the background.
func (w *Worker) connect(ctx context.Context) {
	wj := WireJob(w.plan.JobID, w.plan.Gen)
	for _, remote := range w.expectedPeers() {
		if !opener(w.plan, w.self, remote) {
			continue
		}
		id, err := peer.Decode(remote)
		if err != nil {
			continue
		}
		go func() {
			var l *wire.Link
			var err error
			for attempt := 0; attempt < 30; attempt++ {
				l, err = w.rt.svc.OpenLink(ctx, id, wj)
				if err == nil {
					select {
					case w.links <- l:
					case <-ctx.Done():
						l.Close()
					}
					return
				}
				if ctx.Err() != nil {
					return
				}
				w.log.Debug("open link failed; retrying", "peer", short(remote), "attempt", attempt, "err", err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Duration(min(200*(attempt+1), 2000)) * time.Millisecond):
				}
			}
			w.log.Warn("cannot open link", "peer", short(remote), "err", err)
		}()
	}
}

// expectedPeers lists every peer this stage links with.
func (w *Worker) expectedPeers() []string {
	_, prev, next, _ := w.plan.Neighbours(w.self)
	seen := map[string]bool{}
	var out []string
	for _, group := range [][]string{prev, next, {w.plan.Researcher}} {
		for _, p := range group {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return out
}

func (w *Worker) linksComplete() bool {
	for _, p := range w.expectedPeers() {
		id, _ := peer.Decode(p)
		if w.byPeer[id] == nil {
			return false
		}
	}
	return true
}

// adopt takes a link (opened or accepted) into the worker.
func (w *Worker) adopt(ctx context.Context, l *wire.Link) {
	if l.Job() != WireJob(w.plan.JobID, w.plan.Gen) {
		l.Close() // a link of an older placement
		return
	}
	if old := w.byPeer[l.RemotePeer()]; old != nil {
		old.Close()
	}
	w.byPeer[l.RemotePeer()] = l
	go readLink(ctx, l, w.events, w.blobLimit())
}

func (w *Worker) blobLimit() int64 {
	// A shard holds parameters and two moments; leave room for headers.
	per := w.plan.Spec.LayerBytes(len(w.plan.Stages))
	sp := w.plan.Stages[w.stage]
	return int64(per)*int64(sp.Last-sp.First) + 64<<20
}

// home is the link to the researcher.
func (w *Worker) home() *wire.Link {
	id, _ := peer.Decode(w.plan.Researcher)
	return w.byPeer[id]
}

// tell sends a control message to the researcher, if it is reachable.
func (w *Worker) tell(ctx context.Context, c Ctl) {
	if h := w.home(); h != nil {
		if err := sendCtl(ctx, h, c); err != nil {
			w.log.Debug("cannot reach the researcher", "err", err)
		}
	}
}

// linkEnded handles a link that failed or closed; it returns true when
// the worker should stop (the researcher is gone for good).
func (w *Worker) linkEnded(ctx context.Context, ev linkEvent) bool {
	if w.byPeer[ev.from] != ev.link {
		return false // an old link we already replaced
	}
	delete(w.byPeer, ev.from)
	if ev.from.String() == w.plan.Researcher {
		w.log.Warn("link to the researcher ended; waiting for it to come back", "err", ev.err)
		// The researcher re-opens or re-plans; if it never does, the
		// runtime's idle reaper stops this worker.
		return false
	}
	w.log.Warn("link to a neighbour ended", "peer", ev.from.ShortString(), "err", ev.err)
	w.tell(ctx, Ctl{Op: opLost, Peer: ev.from.String(), Err: ev.err.Error()})
	return false
}

// replan switches to a newer plan of the same job. A new placement (Gen)
// closes the old links; the researcher then restores every stage.
func (w *Worker) replan(ctx context.Context, p *job.Plan) error {
	if p.Epoch <= w.plan.Epoch {
		return nil
	}
	stage := p.StageOf(w.self)
	if stage < 0 {
		return errors.New("pipeline: the new plan drops this node")
	}
	old := w.plan
	w.plan = p
	if p.Gen == old.Gen {
		return nil
	}
	for id, l := range w.byPeer {
		l.Close()
		delete(w.byPeer, id)
	}
	if stage != w.stage || p.Stages[stage].First != old.Stages[w.stage].First || p.Stages[stage].Last != old.Stages[w.stage].Last {
		w.stage = stage
		if err := w.buildStage(); err != nil {
			return err
		}
	}
	w.st.ZeroGrad()
	for _, mb := range w.st.InFlight() {
		w.st.Drop(mb)
	}
	w.connect(ctx)
	return nil
}

// handle runs one frame. It returns stop when the job is over.
func (w *Worker) handle(ctx context.Context, ev linkEvent) (stop bool, err error) {
	f := ev.frame
	switch f.Kind {
	case wire.KindForward:
		return false, w.forward(ctx, f)
	case wire.KindBackward:
		return false, w.backward(ctx, f)
	case wire.KindControl:
		if ev.from.String() != w.plan.Researcher {
			return false, fmt.Errorf("control message from %s, not the researcher", ev.from.ShortString())
		}
		return w.control(ctx, ev)
	}
	return false, nil
}

func (w *Worker) forward(ctx context.Context, f wire.Frame) error {
	sp := w.plan.Spec
	start := time.Now()
	out, err := w.st.Forward(int(f.Micro), model.Input{Batch: sp.Rows, Seq: sp.SeqLen, Hidden: f.Data, Tokens: toInt32(f.IDs)})
	if err != nil {
		return fmt.Errorf("forward step %d microbatch %d: %w", f.Step, f.Micro, err)
	}
	w.computeTime += time.Since(start)
	w.tokens += int64(f.Tokens)
	_, _, next, _ := w.plan.Neighbours(w.self)
	to := next[int(f.Micro)%len(next)]
	return w.send(ctx, to, wire.Frame{Kind: wire.KindForward, Step: f.Step, Micro: f.Micro, Data: out.Hidden, IDs: f.IDs})
}

func (w *Worker) backward(ctx context.Context, f wire.Frame) error {
	start := time.Now()
	g, err := w.st.Backward(int(f.Micro), f.Data)
	if err != nil {
		return fmt.Errorf("backward step %d microbatch %d: %w", f.Step, f.Micro, err)
	}
	w.computeTime += time.Since(start)
	_, prev, _, _ := w.plan.Neighbours(w.self)
	to := prev[int(f.Micro)%len(prev)]
	return w.send(ctx, to, wire.Frame{Kind: wire.KindBackward, Step: f.Step, Micro: f.Micro, Data: g})
}

// send writes a tensor frame to a neighbour. A lost neighbour is reported
// to the researcher, not fatal: the researcher re-plans.
func (w *Worker) send(ctx context.Context, to string, f wire.Frame) error {
	id, _ := peer.Decode(to)
	l := w.byPeer[id]
	if l == nil {
		w.tell(ctx, Ctl{Op: opLost, Peer: to, Err: "no link"})
		return nil
	}
	if err := l.Send(ctx, f); err != nil {
		var we *wire.Error
		if errors.As(err, &we) && !we.Remote && l.Err() == nil {
			return err // refused before sending: our own bug or a broken invariant
		}
		w.log.Warn("send failed", "peer", id.ShortString(), "err", err)
	}
	return nil
}

func (w *Worker) control(ctx context.Context, ev linkEvent) (stop bool, err error) {
	c := *ev.ctl
	home := ev.link
	switch c.Op {
	case opSumSq:
		return false, sendCtl(ctx, home, Ctl{Op: opSumSq, Step: c.Step, SumSq: optim.SumSquares(w.be, w.st.Params())})
	case opStats:
		return false, sendCtl(ctx, home, Ctl{Op: opStats, Step: c.Step, ComputeS: w.computeTime.Seconds(), Tokens: w.tokens})
	case opGrads:
		b, err := encodeGrads(w.st)
		if err != nil {
			return false, err
		}
		return false, sendBlob(ctx, home, Ctl{Name: opGrads, Step: c.Step}, b)
	case opBlob:
		switch c.Name {
		case opGradSum:
			return false, setGrads(ev.blob, w.st)
		case opRestore:
			step, err := decodeShard(ev.blob, w.st, w.opt)
			if err != nil {
				return false, err
			}
			return false, w.restored(ctx, home, step)
		}
		return false, fmt.Errorf("unexpected blob %q", c.Name)
	case opApply:
		return false, w.apply(ctx, home, c)
	case opAbort:
		for _, mb := range w.st.InFlight() {
			w.st.Drop(mb)
		}
		w.st.ZeroGrad()
		return false, nil
	case opShard:
		b, err := encodeShard(w.st, w.opt, w.applied)
		if err != nil {
			return false, err
		}
		return false, sendBlob(ctx, home, Ctl{Name: opShard, Step: w.applied}, b)
	case opRestore:
		// Init: back to the seed (restore to step 0 of a job that started
		// from scratch); otherwise a blob named restore follows.
		if c.Init {
			if err := w.buildStage(); err != nil {
				return false, err
			}
			return false, w.restored(ctx, home, 0)
		}
		return false, nil
	case opDone:
		w.log.Info("job done", "applied", w.applied, "compute", w.computeTime.Round(time.Millisecond), "tokens", w.tokens)
		return true, nil
	}
	return false, fmt.Errorf("unknown control op %q", c.Op)
}

func (w *Worker) restored(ctx context.Context, home *wire.Link, step uint64) error {
	w.st.ZeroGrad()
	for _, mb := range w.st.InFlight() {
		w.st.Drop(mb)
	}
	w.applied = step
	w.log2.Rollback(w.plan.Epoch, step)
	w.log.Info("restored", "step", step)
	return sendCtl(ctx, home, Ctl{Op: opRestored, Step: step})
}

// apply runs the optimizer for step c.Step exactly once.
func (w *Worker) apply(ctx context.Context, home *wire.Link, c Ctl) error {
	switch {
	case c.Step == w.applied+1:
		if err := w.opt.Step(w.st.Params(), c.LR, c.Scale); err != nil {
			return err
		}
		w.st.ZeroGrad()
		w.applied = c.Step
		w.log2.Apply(w.plan.Epoch, c.Step)
	case c.Step <= w.applied:
		w.log.Info("apply repeated; already applied", "step", c.Step)
	default:
		return fmt.Errorf("apply step %d after step %d: a step is missing", c.Step, w.applied)
	}
	return sendCtl(ctx, home, Ctl{Op: opApplied, Step: c.Step})
}

func (w *Worker) shutdown() {
	for id, l := range w.byPeer {
		l.Close()
		delete(w.byPeer, id)
	}
	if w.st != nil {
		w.st.Close()
	}
	w.log2.Close()
}

// Stats reports the worker's compute time and tokens (read after done).
func (w *Worker) Stats() (time.Duration, int64) { return w.computeTime, w.tokens }
