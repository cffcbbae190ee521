package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/optim"
	"github.com/holopeer/holopeer/stage/wire"
)

// Worker runs one stage of one training job on a stage node. Its state is
// owned by the run goroutine; other goroutines talk to it through
// channels (new links, new plans, link events).
type Worker struct {
	stageNode // the plan, the stage, the links

	// Static after newWorker.
	events chan linkEvent
	done   chan struct{}

	// Owned by the run goroutine.
	st      *model.Stage
	opt     *optim.AdamW
	applied uint64
	log2    *stepLog
	err     error
	// Compute accounting for receipts and metrics.
	computeTime time.Duration
	tokens      int64
}

func newWorker(rt *Runtime, p *job.Plan) (*Worker, error) {
	n, err := newStageNode(rt, p)
	if err != nil {
		return nil, err
	}
	sl, err := openStepLog(rt.stepLogPath(p.JobID, "stage"))
	if err != nil {
		return nil, err
	}
	w := &Worker{
		stageNode: n,
		events:    make(chan linkEvent, 64),
		done:      make(chan struct{}),
		log2:      sl,
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
	w.connect(ctx, connectAttempts)
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

// connectAttempts is how often a training stage tries each link it opens.
const connectAttempts = 30

// adopt takes a link (opened or accepted) into the worker.
func (w *Worker) adopt(ctx context.Context, l *wire.Link) {
	if _, ok := w.take(l); ok {
		go readLink(ctx, l, w.events, w.blobRule())
	}
}

// blobRule spools a restore's shard to a file, refusing more than the
// stage's weights and moments; summed gradients come into memory.
func (w *Worker) blobRule() blobRule {
	shard, grads, spool := shardLimit(w.plan, w.stage), gradsLimit(w.plan, w.stage), w.rt.spoolDir(w.plan.JobID)
	return func(h Ctl) (int64, string) {
		if h.Name == opRestore {
			return shard, spool
		}
		return grads, ""
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
	moved, stage, old, err := w.follow(p)
	if !moved || err != nil {
		return err
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
	w.connect(ctx, connectAttempts)
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
	return w.sendTo(ctx, to, func(l *wire.Link) error { return l.Send(ctx, f) })
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
			if ev.file == "" {
				return false, errors.New("a restore without its shard file")
			}
			step, err := w.restoreFile(ev.file)
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
		e, err := layoutShard(w.st, w.opt, w.applied)
		if err != nil {
			return false, err
		}
		send := func(wr io.Writer) error { _, err := e.WriteTo(wr); return err }
		return false, sendBlobFrom(ctx, home, Ctl{Name: opShard, Step: w.applied}, e.Size(), send)
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

// restoreFile loads a received shard file into the stage and removes it.
func (w *Worker) restoreFile(path string) (uint64, error) {
	defer os.Remove(path)
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return decodeShard(io.NewSectionReader(f, 0, fi.Size()), w.st, w.opt)
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
	w.closeLinks()
	os.RemoveAll(w.rt.spoolDir(w.plan.JobID))
	if w.st != nil {
		w.st.Close()
	}
	w.log2.Close()
}

// Stats reports the worker's compute time and tokens (read after done).
func (w *Worker) Stats() (time.Duration, int64) { return w.computeTime, w.tokens }
