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
	"github.com/holopeer/holopeer/stage/tensor"
	"github.com/holopeer/holopeer/stage/wire"
	"github.com/holopeer/holopeer/stage/wire/codec"
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
	// Static after newServeWorker.
	rt        *Runtime
	self      string
	jobID     string
	log       *slog.Logger
	be        tensor.Backend
	keepAlive time.Duration

	links  chan *wire.Link
	plans  chan *job.Plan
	events chan serveEvent
	cancel context.CancelFunc

	// Owned by the run goroutine.
	plan    *job.Plan
	codec   codec.Codec
	stage   int
	st      *model.Stage // nil until the weights arrive
	askedOn *wire.Link   // the home link the weights were asked on
	ready   bool
	caches  map[uint64]*model.Cache
	byPeer  map[peer.ID]*wire.Link
	linkSeq map[*wire.Link]*uint64
	compute time.Duration
	tokens  int64
}

func newServeWorker(rt *Runtime, p *job.Plan) (*serveWorker, error) {
	self := rt.host.ID().String()
	stage := p.StageOf(self)
	if stage < 0 {
		return nil, fmt.Errorf("pipeline: plan %s gives this node no stage", p.JobID)
	}
	c, _, err := newCodec(p.Spec)
	if err != nil {
		return nil, err
	}
	return &serveWorker{
		rt: rt, self: self, jobID: p.JobID, be: rt.backend, keepAlive: serveKeepAlive,
		log:    rt.log.With("job", p.JobID, "stage", stage, "role", "serve"),
		links:  make(chan *wire.Link, 16),
		plans:  make(chan *job.Plan, 4),
		events: make(chan serveEvent, 64),
		plan:   p, codec: c, stage: stage,
		caches:  map[uint64]*model.Cache{},
		byPeer:  map[peer.ID]*wire.Link{},
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
	sp := p.Stages[stage]
	need := p.Spec.LayerBytes(len(p.Stages))*uint64(sp.Last-sp.First) + p.Spec.StageBytes()
	if rt.memory > 0 && need > rt.memory {
		return fmt.Errorf("%w: serving stage %d (blocks %d-%d) needs %d MiB, this node lends %d MiB", ErrRefused, stage, sp.First, sp.Last-1, need>>20, rt.memory>>20)
	}
	if e != nil && e.sworker != nil {
		if p.Epoch <= e.plan.Epoch {
			return nil
		}
		rt.register(p, e.codec, e)
		select {
		case e.sworker.plans <- p:
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	}
	if e != nil {
		return fmt.Errorf("%w: job %s runs here in another role", ErrRefused, p.JobID)
	}
	w, err := newServeWorker(rt, p)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrRefused, err)
	}
	ne := &entry{sworker: w}
	rt.register(p, w.codec, ne)
	wctx, cancel := context.WithCancel(rt.ctx)
	w.cancel = cancel
	rt.wg.Add(1)
	go func() {
		defer rt.wg.Done()
		w.run(wctx)
		rt.forget(p.JobID, ne)
	}()
	rt.log.Info("took a serving stage", "job", p.JobID, "stage", stage, "blocks", fmt.Sprintf("%d-%d", sp.First, sp.Last-1), "term", p.Term, "epoch", p.Epoch)
	return nil
}

func (w *serveWorker) offerLink(ctx context.Context, l *wire.Link) {
	select {
	case w.links <- l:
	case <-ctx.Done():
		l.Close()
	}
}

// run is the worker's owner loop.
func (w *serveWorker) run(ctx context.Context) {
	defer w.shutdown()
	w.connect(ctx)
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

// connect opens the links this node is the opener of, in the background.
func (w *serveWorker) connect(ctx context.Context) {
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
			var err error
			for attempt := 0; attempt < 10; attempt++ {
				var l *wire.Link
				if l, err = w.rt.svc.OpenLink(ctx, id, wj); err == nil {
					w.offerLink(ctx, l)
					return
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Duration(200*(attempt+1)) * time.Millisecond):
				}
			}
			w.log.Warn("cannot open link", "peer", short(remote), "err", err)
		}()
	}
}

func (w *serveWorker) expectedPeers() []string {
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

func (w *serveWorker) linksComplete() bool {
	for _, p := range w.expectedPeers() {
		id, _ := peer.Decode(p)
		if w.byPeer[id] == nil {
			return false
		}
	}
	return true
}

func (w *serveWorker) adopt(ctx context.Context, l *wire.Link) {
	if l.Job() != WireJob(w.plan.JobID, w.plan.Gen) {
		l.Close()
		return
	}
	if old := w.byPeer[l.RemotePeer()]; old != nil {
		old.Close()
		delete(w.linkSeq, old)
	}
	w.byPeer[l.RemotePeer()] = l
	seq := w.plan.StartStep - min(w.plan.StartStep, 1)
	w.linkSeq[l] = &seq
	go readServeLink(ctx, l, w.events, w.blobLimit())
}

// blobLimit bounds the weights blob: the span's parameters and room for
// the safetensors header.
func (w *serveWorker) blobLimit() int64 {
	sp := w.plan.Stages[w.stage]
	return int64(w.plan.Spec.LayerBytes(len(w.plan.Stages)))*int64(sp.Last-sp.First) + 16<<20
}

func (w *serveWorker) home() *wire.Link {
	id, _ := peer.Decode(w.plan.Researcher)
	return w.byPeer[id]
}

func (w *serveWorker) tell(ctx context.Context, c Ctl) {
	if h := w.home(); h != nil {
		if err := sendCtl(ctx, h, c); err != nil {
			w.log.Debug("cannot reach the researcher", "err", err)
		}
	}
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
	w.connect(ctx)
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
		if c.Gen != w.plan.Gen || w.st != nil {
			return false, nil // for a placement or a load we no longer have
		}
		sp := w.plan.Stages[w.stage]
		st, err := decodeWeights(ev.blob, w.plan.Spec.Model, model.Span{First: sp.First, Last: sp.Last}, w.be)
		if err != nil {
			return false, err
		}
		w.st = st
		w.log.Info("weights loaded", "blocks", fmt.Sprintf("%d-%d", sp.First, sp.Last-1), "bytes", len(ev.blob))
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
	id, _ := peer.Decode(to)
	l := w.byPeer[id]
	if l == nil {
		w.tell(ctx, Ctl{Op: opLost, Peer: to, Err: "no link"})
		return nil
	}
	if err := sendServe(ctx, l, w.linkSeq[l], *m, out, ev.frame.IDs); err != nil {
		var we *wire.Error
		if errors.As(err, &we) && !we.Remote && l.Err() == nil {
			return err // refused before sending: a broken invariant
		}
		w.log.Warn("send failed", "peer", id.ShortString(), "err", err)
		return nil // the link's reader reports the loss
	}
	return nil
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
	for id, l := range w.byPeer {
		l.Close()
		delete(w.byPeer, id)
	}
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
