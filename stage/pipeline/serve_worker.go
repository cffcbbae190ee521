package pipeline

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/wire"
)

// serveKeepAlive is how often serving links carry a ping when idle: well
// inside the wire's idle timeout (10 minutes by default), which would
// otherwise end a link that no request used for a while.
const serveKeepAlive = time.Minute

// serveWorker runs one stage of a serving job on a stage node: forward
// only, a KV cache per sequence. It fetches its blocks' weights from the
// researcher over its home link, then runs whatever batches arrive, in
// arrival order, and passes their hidden states on. Its state is owned by
// the run goroutine.
type serveWorker struct {
	stageNode // the plan, the stage, the links

	// Static after newServeWorker.
	keepAlive time.Duration
	events    chan serveEvent

	// Owned by the run goroutine.
	st      *model.Stage // nil until the weights arrive
	askedOn *wire.Link   // the home link the weights were asked on
	ready   bool
	caches  map[uint64]*model.Cache
	linkSeq map[*wire.Link]*uint64
	compute time.Duration
	tokens  int64
}

func newServeWorker(rt *Runtime, p *job.Plan) (*serveWorker, error) {
	n, err := newStageNode(rt, p, "role", "serve")
	if err != nil {
		return nil, err
	}
	return &serveWorker{
		stageNode: n, keepAlive: serveKeepAlive,
		events:  make(chan serveEvent, 64),
		caches:  map[uint64]*model.Cache{},
		linkSeq: map[*wire.Link]*uint64{},
	}, nil
}

// assignServe is Assign for a serving plan: the researcher's server takes
// plan updates; a stage node starts, updates or leaves its worker.
func (rt *Runtime) assignServe(ctx context.Context, p *job.Plan, e *entry) error {
	if e != nil && e.server != nil {
		e.server.offerPlan(p)
		return nil
	}
	self := rt.host.ID().String()
	stage := p.StageOf(self)
	if stage < 0 {
		if e != nil && e.sworker != nil {
			e.sworker.cancel()
			return nil
		}
		return fmt.Errorf("%w: the plan gives this node no stage", ErrRefused)
	}
	if err := rt.fits(p, stage, "serving stage"); err != nil {
		return err
	}
	if e != nil && e.sworker != nil {
		return rt.update(ctx, e, &e.sworker.stageNode, p)
	}
	if e != nil {
		return fmt.Errorf("%w: job %s runs here in another role", ErrRefused, p.JobID)
	}
	w, err := newServeWorker(rt, p)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrRefused, err)
	}
	rt.launch(p, &entry{sworker: w}, &w.stageNode, w.run)
	sp := p.Stages[stage]
	rt.log.Info("took a serving stage", "job", p.JobID, "stage", stage, "blocks", fmt.Sprintf("%d-%d", sp.First, sp.Last-1), "term", p.Term, "epoch", p.Epoch)
	return nil
}

// run is the worker's owner loop.
func (w *serveWorker) run(ctx context.Context) {
	defer w.shutdown()
	w.connect(ctx, serveConnectAttempts)
	tick := time.NewTicker(w.keepAlive)
	defer tick.Stop()
	for {
		w.progress(ctx)
		select {
		case <-ctx.Done():
			return
		case l := <-w.links:
			w.adopt(ctx, l)
		case p := <-w.plans:
			if err := w.replan(ctx, p); err != nil {
				w.log.Error("cannot follow the new plan", "err", err)
				return
			}
		case <-tick.C:
			// Every link, both ways: each end's reader must hear from
			// the other within the idle timeout.
			for _, l := range w.byPeer {
				_ = sendCtl(ctx, l, Ctl{Op: opPing})
			}
		case ev := <-w.events:
			if w.byPeer[ev.from] != ev.link {
				continue // a link we already replaced
			}
			if ev.err != nil {
				w.linkEnded(ctx, ev)
				continue
			}
			stop, err := w.handle(ctx, ev)
			if err != nil {
				// A bad batch is the researcher's to resolve (it re-plans
				// or replays); this node keeps serving.
				w.log.Error("serving failed", "err", err)
				w.tell(ctx, Ctl{Op: opError, Err: trimErr(err)})
			}
			if stop {
				return
			}
		}
	}
}

// progress asks for the weights once the home link is up and says ready
// once they are loaded and every link is open.
func (w *serveWorker) progress(ctx context.Context) {
	h := w.home()
	if w.st == nil && h != nil && w.askedOn != h {
		w.askedOn = h
		if err := sendCtl(ctx, h, Ctl{Op: opLoad, Gen: w.plan.Gen}); err != nil {
			w.log.Warn("cannot ask the researcher for weights", "err", err)
		}
	}
	if !w.ready && w.st != nil && w.linksComplete() {
		w.ready = true
		w.tell(ctx, Ctl{Op: opReady, Gen: w.plan.Gen})
		sp := w.plan.Stages[w.stage]
		w.log.Info("serving stage ready", "blocks", fmt.Sprintf("%d-%d", sp.First, sp.Last-1), "links", len(w.byPeer))
	}
}

// serveConnectAttempts is how often a serving stage tries each link it
// opens.
const serveConnectAttempts = 10

func (w *serveWorker) adopt(ctx context.Context, l *wire.Link) {
	old, ok := w.take(l)
	if !ok {
		return
	}
	if old != nil {
		delete(w.linkSeq, old)
	}
	seq := w.plan.StartStep - min(w.plan.StartStep, 1)
	w.linkSeq[l] = &seq
	go readServeLink(ctx, l, w.events, w.blobRule())
}

// blobRule spools the weights to a file, refusing more than the span's
// parameters and a header.
func (w *serveWorker) blobRule() blobRule {
	limit, spool := weightsLimit(w.plan, w.stage), w.rt.spoolDir(w.plan.JobID)
	return func(Ctl) (int64, string) { return limit, spool }
}

func (w *serveWorker) linkEnded(ctx context.Context, ev serveEvent) {
	delete(w.byPeer, ev.from)
	delete(w.linkSeq, ev.link)
	w.ready = false
	if ev.from.String() == w.plan.Researcher {
		// The researcher re-opens or re-plans; until then nothing arrives.
		w.log.Warn("link to the researcher ended; waiting for it to come back", "err", ev.err)
		return
	}
	w.log.Warn("link to a neighbour ended", "peer", ev.from.ShortString(), "err", ev.err)
	w.tell(ctx, Ctl{Op: opLost, Peer: ev.from.String(), Err: trimErr(ev.err)})
}

// replan follows a newer plan. A new placement (Gen) closes every link
// and drops every cache (the researcher replays its sequences), and
// reloads the weights if this node's blocks changed.
func (w *serveWorker) replan(ctx context.Context, p *job.Plan) error {
	moved, stage, old, err := w.follow(p)
	if !moved || err != nil {
		return err
	}
	w.linkSeq = map[*wire.Link]*uint64{}
	w.dropAll()
	w.ready, w.askedOn = false, nil
	osp, nsp := old.Stages[w.stage], p.Stages[stage]
	if osp.First != nsp.First || osp.Last != nsp.Last {
		if w.st != nil {
			w.st.Close()
			w.st = nil
		}
	}
	w.stage = stage
	w.log = w.rt.log.With("job", p.JobID, "stage", stage, "role", "serve")
	w.connect(ctx, serveConnectAttempts)
	return nil
}

// handle runs one event. It returns stop when the job is over.
func (w *serveWorker) handle(ctx context.Context, ev serveEvent) (stop bool, err error) {
	fromHome := ev.from.String() == w.plan.Researcher
	if ev.msg != nil {
		return false, w.serveMsg(ctx, ev)
	}
	c := ev.ctl
	if c.Op == opPing {
		return false, nil
	}
	if !fromHome {
		return false, fmt.Errorf("control message %q from %s, not the researcher", c.Op, ev.from.ShortString())
	}
	switch c.Op {
	case opBlob:
		if c.Name != opWeights {
			return false, fmt.Errorf("unexpected blob %q", c.Name)
		}
		defer os.Remove(ev.file)
		if c.Gen != w.plan.Gen || w.st != nil {
			return false, nil // for a placement or a load we no longer have
		}
		sp := w.plan.Stages[w.stage]
		st, err := loadWeightsFile(ev.file, w.plan.Spec.Model, model.Span{First: sp.First, Last: sp.Last}, w.be)
		if err != nil {
			return false, err
		}
		w.st = st
		w.log.Info("weights loaded", "blocks", fmt.Sprintf("%d-%d", sp.First, sp.Last-1), "bytes", c.Size)
		return false, nil
	case opStats:
		return false, sendCtl(ctx, ev.link, Ctl{Op: opStats, Step: c.Step, ComputeS: w.compute.Seconds(), Tokens: w.tokens})
	case opDone:
		w.log.Info("serving job done", "compute", w.compute.Round(time.Millisecond), "tokens", w.tokens)
		return true, nil
	}
	return false, fmt.Errorf("unknown control op %q", c.Op)
}

// serveMsg runs a batch through the stage and passes it on, or drops
// caches; either way the message goes on along its lane.
func (w *serveWorker) serveMsg(ctx context.Context, ev serveEvent) error {
	m := ev.msg
	var out []float32
	if m.Kind == serveBatch {
		if w.st == nil {
			return fmt.Errorf("batch %d before the weights arrived", m.Frame)
		}
		var err error
		if out, err = w.runBatch(m, ev.frame); err != nil {
			return fmt.Errorf("batch %d: %w", m.Frame, err)
		}
	} else {
		for _, e := range m.Seqs {
			if c := w.caches[e.ID]; c != nil {
				c.Free()
				delete(w.caches, e.ID)
			}
		}
	}
	_, _, next, _ := w.plan.Neighbours(w.self)
	to := next[int(m.Lane)%len(next)]
	return w.sendTo(ctx, to, func(l *wire.Link) error { return sendServe(ctx, l, w.linkSeq[l], *m, out, ev.frame.IDs) })
}

// runBatch runs a batch's sequences through the stage, each with its own
// cache, and returns the hidden states of all their tokens.
func (w *serveWorker) runBatch(m *serveMsg, f wire.Frame) ([]float32, error) {
	spec := w.plan.Spec
	d := spec.Model.Dim
	// Check every entry against its cache before computing anything.
	fresh := 0
	for _, e := range m.Seqs {
		if e.Pos+e.N > spec.MaxTokens {
			return nil, fmt.Errorf("sequence %d: %d+%d tokens exceed the job's %d per sequence", e.ID, e.Pos, e.N, spec.MaxTokens)
		}
		c := w.caches[e.ID]
		switch {
		case e.Pos == 0 && c == nil:
			fresh++
		case e.Pos > 0 && c == nil:
			return nil, fmt.Errorf("sequence %d at position %d: no cache here", e.ID, e.Pos)
		case e.Pos > 0 && c.Len() != e.Pos:
			return nil, fmt.Errorf("sequence %d at position %d: the cache holds %d tokens", e.ID, e.Pos, c.Len())
		}
	}
	// Lanes merging from several upstream replicas may briefly hold a
	// sequence past its drop; twice the batch bounds that slack.
	if len(w.caches)+fresh > 2*spec.MaxBatch {
		return nil, fmt.Errorf("%d live sequences, the job allows %d", len(w.caches)+fresh, spec.MaxBatch)
	}
	start := time.Now()
	out := make([]float32, 0, len(f.Data))
	off := 0
	for _, e := range m.Seqs {
		c := w.caches[e.ID]
		if e.Pos == 0 {
			if c == nil {
				c = w.st.NewCache()
				w.caches[e.ID] = c
			}
			c.Reset()
		}
		for _, k := range e.calls() {
			o, err := w.st.Infer(c, model.Input{Batch: 1, Seq: k, Hidden: f.Data[off*d : (off+k)*d]})
			if err != nil {
				// The cache may hold part of the entry: forget it, so a
				// replay starts clean.
				c.Free()
				delete(w.caches, e.ID)
				return nil, fmt.Errorf("sequence %d: %w", e.ID, err)
			}
			out = append(out, o.Hidden...)
			off += k
		}
	}
	w.compute += time.Since(start)
	w.tokens += int64(off)
	return out, nil
}

func (w *serveWorker) dropAll() {
	for id, c := range w.caches {
		c.Free()
		delete(w.caches, id)
	}
}

func (w *serveWorker) shutdown() {
	w.closeLinks()
	w.dropAll()
	if w.st != nil {
		w.st.Close()
	}
}

// trimErr keeps an error's text within a control message's bound.
func trimErr(err error) string {
	s := err.Error()
	if len(s) > 1000 {
		s = s[:1000]
	}
	return s
}
