package pipeline

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/stage/data"
	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/optim"
	"github.com/holopeer/holopeer/stage/wire"
	"github.com/holopeer/holopeer/stage/wire/codec"
)

// Coordinator is what the driver asks of the swarm's coordinator: a plan
// for the job, and a new one when a stage node is lost. Both return a
// signed plan.
type Coordinator interface {
	Submit(ctx context.Context, spec job.Spec) ([]byte, error)
	// Replan asks for a plan without the lost node (lost may be empty when
	// the coordinator already moved a stage) that resumes at step resume.
	Replan(ctx context.Context, jobID string, epoch uint64, lost string, resume uint64) ([]byte, error)
	Release(ctx context.Context, jobID string) error
	// Work reports what each stage node did over steps (from, to], for
	// the coordinator's contribution receipts.
	Work(ctx context.Context, jobID string, from, to uint64, work []job.WorkItem) error
}

// DriverConfig is the researcher's side of a job.
type DriverConfig struct {
	Spec job.Spec
	// NewSource returns the job's data from its start; the driver draws
	// Microbatches batches of Rows×SeqLen per step and, to roll back,
	// builds a fresh source and skips what the restored steps used.
	NewSource func() (data.Source, error)
	// Pseudonyms maps token ids before they enter the model and leave this
	// node (subspace jobs send ids to every stage); nil sends real ids.
	Pseudonyms *Permutation
	// Checkpoints is where shards are received and kept, on disk; nil
	// uses a temporary directory removed when the run ends.
	Checkpoints *DiskStore
	// Weights are the job's initial weights when Spec.FromCheckpoint (a
	// pretrained checkpoint to fine-tune): each stage node receives only
	// its own blocks, streamed tensor by tensor, and the researcher loads
	// its embedding and head from it. Required then; ignored otherwise.
	Weights WeightSource
	// Progress is called after every step (on the driver's goroutine).
	Progress func(Progress)
	// StepLog is where the driver logs applied steps and rollbacks.
	StepLog string
	Logger  *slog.Logger
	// ReadyTimeout bounds the wait for every stage to connect and load
	// (default: 2 minutes, and more with the bytes of a checkpoint to send).
	ReadyTimeout time.Duration
}

// Progress is the state of a run after a step.
type Progress struct {
	Step, Steps int
	Loss        float64
	GradNorm    float64
	LR          float64
	TokensPerS  float64
	BytesSent   int64 // on stage links, both directions
	PayloadSent int64 // codec payload only
	// BoundaryBytesPerToken is what one token costs at one stage boundary,
	// forward and backward together, on the socket: the tensor frames'
	// records with their lengths, headers and tags (measured on the
	// researcher's two boundaries).
	BoundaryBytesPerToken float64
	Tokens                int64 // tokens trained so far (committed steps)
	Residual              float64
	Recoveries            int
	Plan                  *job.Plan
	Elapsed               time.Duration
	LastCheckpoint        int
}

// Driver runs a training job from the researcher's node.
type Driver struct {
	rt    *Runtime
	cfg   DriverConfig
	log   *slog.Logger
	coord Coordinator
	self  string

	linkCh chan *wire.Link
	planCh chan *job.Plan
	events chan linkEvent

	// signed is the newest signed plan, for a coordinator elected later to
	// take the job over (see SignedPlan); mu guards it.
	mu     sync.Mutex
	signed []byte

	// Owned by Run's goroutine.
	plan       *job.Plan
	codec      codec.Codec
	first      *model.Stage
	last       *model.Stage
	optFirst   *optim.AdamW
	optLast    *optim.AdamW
	links      map[peer.ID]*wire.Link
	ready      map[peer.ID]bool
	src        data.Source
	step       int // last committed step
	ckptStep   int
	recoveries int
	steplog    *stepLog
	tokens     int64
	start      time.Time
	bytesBase  int64 // bytes of links already closed
	payBase    int64
	// Work reported to the coordinator so far, per stage node.
	workSeen map[string]job.WorkItem
	workStep int
	// Tensor payload that crossed the researcher's boundaries, and the
	// tokens it carried (both boundaries, both directions).
	// Stream bytes and tokens of the tensor frames of links already
	// closed (the boundary cost on the sockets).
	tensorBase    int64
	tensorTokBase uint64
	scratch       string // a temporary checkpoint directory to remove at the end
}

// stageFailure is a lost stage node.
type stageFailure struct {
	peer string
	err  error
}

func (e *stageFailure) Error() string {
	return fmt.Sprintf("stage node %s lost: %v", short(e.peer), e.err)
}

// NewDriver prepares the researcher's stages; Run submits the job.
func (rt *Runtime) NewDriver(cfg DriverConfig, coord Coordinator) (*Driver, error) {
	if err := cfg.Spec.Validate(); err != nil {
		return nil, err
	}
	if cfg.NewSource == nil || coord == nil {
		return nil, errors.New("pipeline: a driver needs a data source and a coordinator")
	}
	if cfg.Logger == nil {
		cfg.Logger = rt.log
	}
	if cfg.Spec.FromCheckpoint && cfg.Weights == nil {
		return nil, errors.New("pipeline: a job that starts from a checkpoint needs its weights")
	}
	var scratch string
	if cfg.Checkpoints == nil {
		dir, err := os.MkdirTemp("", "holopeer-checkpoints-")
		if err != nil {
			return nil, err
		}
		scratch, cfg.Checkpoints = dir, &DiskStore{Dir: dir}
	}
	d := &Driver{
		rt: rt, cfg: cfg, coord: coord, self: rt.host.ID().String(),
		log:     cfg.Logger.With("job", cfg.Spec.JobID),
		linkCh:  make(chan *wire.Link, 64),
		planCh:  make(chan *job.Plan, 4),
		events:  make(chan linkEvent, 256),
		links:   map[peer.ID]*wire.Link{},
		ready:   map[peer.ID]bool{},
		scratch: scratch,
	}
	c, _, err := newCodec(cfg.Spec)
	if err != nil {
		return nil, err
	}
	d.codec = c
	if err := d.buildStages(); err != nil {
		return nil, err
	}
	sl, err := openStepLog(cfg.StepLog)
	if err != nil {
		return nil, err
	}
	d.steplog = sl
	return d, nil
}

// buildStages creates the researcher's embedding and head stages at the
// job's initial weights: the checkpoint's, or the seed's.
func (d *Driver) buildStages() error {
	spec := d.cfg.Spec
	L := spec.Model.Layers
	build := func(sp model.Span) (*model.Stage, error) {
		if spec.FromCheckpoint {
			return d.cfg.Weights.LoadStage(spec.Model, sp, model.WithBackend(d.rt.backend))
		}
		return model.NewStage(spec.Model, sp, model.WithBackend(d.rt.backend), model.WithSeed(spec.InitSeed))
	}
	first, err := build(model.Span{First: 0, Last: 0, Embed: true})
	if err != nil {
		return err
	}
	last, err := build(model.Span{First: L, Last: L, Head: true})
	if err != nil {
		first.Close()
		return err
	}
	o1, err := optim.New(d.rt.backend, spec.Optim)
	if err != nil {
		return err
	}
	o2, _ := optim.New(d.rt.backend, spec.Optim)
	if d.first != nil {
		d.first.Close()
		d.last.Close()
	}
	d.first, d.last, d.optFirst, d.optLast = first, last, o1, o2
	return nil
}

func (d *Driver) offerLink(l *wire.Link) {
	select {
	case d.linkCh <- l:
	default:
		l.Close()
	}
}

func (d *Driver) offerPlan(p *job.Plan) {
	select {
	case d.planCh <- p:
	default:
	}
}

// Run submits the job, trains it to the end and returns the last step's
// loss. ctx cancels the run (the stages are told to stop).
func (d *Driver) Run(ctx context.Context) (err error) {
	defer d.close()
	signed, err := d.coord.Submit(ctx, d.cfg.Spec)
	if err != nil {
		return fmt.Errorf("submit job: %w", err)
	}
	if err := d.adoptPlan(signed); err != nil {
		return err
	}
	d.start = time.Now()
	if err := d.connect(ctx); err != nil {
		return err
	}
	if d.cfg.Spec.FromCheckpoint {
		// Stage nodes build their blocks from the seed; checkpoint 0 of
		// a fine-tune is the pretrained weights, sent to each.
		if err := d.restoreStages(ctx, 0); err != nil {
			var sf *stageFailure
			if !errors.As(err, &sf) {
				return err
			}
			if err := d.recover(ctx, sf.peer); err != nil {
				return fmt.Errorf("recovery after losing %s: %w", short(sf.peer), err)
			}
		}
	}
	if err := d.resetSource(0); err != nil {
		return err
	}
	// Checkpoint 0 is the initial weights: the seed's (a stage restored to
	// it re-initialises) or the pretrained checkpoint's.
	for d.step < d.cfg.Spec.Steps {
		res, err := d.runStep(ctx, d.step+1)
		if err != nil {
			var sf *stageFailure
			if !errors.As(err, &sf) || ctx.Err() != nil {
				return err
			}
			d.log.Warn("a stage node was lost; recovering from the last checkpoint", "peer", short(sf.peer), "err", sf.err, "checkpoint", d.ckptStep)
			if err := d.recover(ctx, sf.peer); err != nil {
				return fmt.Errorf("recovery after losing %s: %w", short(sf.peer), err)
			}
			continue
		}
		d.step++
		d.tokens += int64(d.cfg.Spec.Microbatches * d.cfg.Spec.MicrobatchTokens())
		if iv := d.cfg.Spec.CheckpointInterval; iv > 0 && d.step%iv == 0 || d.step == d.cfg.Spec.Steps {
			if err := d.checkpoint(ctx); err != nil {
				var sf *stageFailure
				if errors.As(err, &sf) {
					if err := d.recover(ctx, sf.peer); err != nil {
						return err
					}
					continue
				}
				return err
			}
		}
		d.report(res)
	}
	for _, l := range d.links {
		_ = sendCtl(ctx, l, Ctl{Op: opDone})
	}
	if err := d.coord.Release(ctx, d.cfg.Spec.JobID); err != nil {
		d.log.Warn("could not release the job at the coordinator", "err", err)
	}
	return nil
}

// stepResult is what one step measured.
type stepResult struct {
	loss, gradNorm, lr, residual float64
}

func (d *Driver) report(r stepResult) {
	if d.cfg.Progress == nil {
		return
	}
	el := time.Since(d.start)
	bytes, pay := d.bytesBase, d.payBase
	tb, tt := d.tensorBase, d.tensorTokBase
	for _, l := range d.links {
		st := l.Stats()
		bytes += st.BytesSent + st.BytesRecv
		pay += st.PayloadSent + st.PayloadRecv
		tb += st.TensorBytesSent + st.TensorBytesRecv
		tt += st.TensorTokensSent + st.TensorTokensRecv
	}
	var perToken float64
	if tt > 0 {
		// Each token crosses a boundary once per direction.
		perToken = 2 * float64(tb) / float64(tt)
	}
	d.cfg.Progress(Progress{
		Step: d.step, Steps: d.cfg.Spec.Steps, Loss: r.loss, GradNorm: r.gradNorm, LR: r.lr,
		TokensPerS: float64(d.tokens) / el.Seconds(), BytesSent: bytes, PayloadSent: pay,
		Tokens: d.tokens, Residual: r.residual, Recoveries: d.recoveries, Plan: d.plan,
		BoundaryBytesPerToken: perToken,
		Elapsed:               el, LastCheckpoint: d.ckptStep,
	})
}

// adoptPlan verifies and registers a signed plan for this driver.
func (d *Driver) adoptPlan(signed []byte) error {
	p, err := job.OpenPlan(signed)
	if err != nil {
		return err
	}
	if err := d.rt.check(context.Background(), p); err != nil {
		return err
	}
	if p.JobID != d.cfg.Spec.JobID || p.Researcher != d.self {
		return fmt.Errorf("pipeline: plan for job %s with researcher %s is not ours", p.JobID, short(p.Researcher))
	}
	d.setPlan(p)
	d.mu.Lock()
	d.signed = signed
	d.mu.Unlock()
	return nil
}

// SignedPlan returns the newest signed plan of job jobID when this driver
// runs it: a coordinator elected after the job started takes the job over
// from it (coord.Client.Current).
func (d *Driver) SignedPlan(jobID string) []byte {
	if jobID != d.cfg.Spec.JobID {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.signed
}

func (d *Driver) setPlan(p *job.Plan) {
	d.plan = p
	d.rt.mu.Lock()
	e := d.rt.byJob[p.JobID]
	d.rt.mu.Unlock()
	if e == nil {
		e = &entry{driver: d}
	}
	d.rt.register(p, d.codec, e)
}

// stagePeers lists every stage node of the plan.
func (d *Driver) stagePeers() []peer.ID {
	var out []peer.ID
	for _, s := range d.plan.Stages {
		for _, r := range s.Replicas {
			id, err := peer.Decode(r)
			if err == nil {
				out = append(out, id)
			}
		}
	}
	return out
}

// connect opens the links to stage 0 and waits until every stage node has
// linked and reported ready.
func (d *Driver) connect(ctx context.Context) error {
	wj := WireJob(d.plan.JobID, d.plan.Gen)
	for _, r := range d.plan.Stages[0].Replicas {
		id, err := peer.Decode(r)
		if err != nil {
			return err
		}
		go func() {
			for attempt := 0; attempt < 20; attempt++ {
				l, err := d.rt.svc.OpenLink(ctx, id, wj)
				if err == nil {
					d.offerLink(l)
					return
				}
				if ctx.Err() != nil {
					return
				}
				d.log.Debug("open link to stage 0", "peer", id.ShortString(), "err", err)
				time.Sleep(time.Duration(200*(attempt+1)) * time.Millisecond)
			}
		}()
	}
	timeout := readyTimeout(d.cfg.ReadyTimeout, d.plan, d.cfg.Spec.FromCheckpoint)
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		all := true
		for _, id := range d.stagePeers() {
			if !d.ready[id] {
				all = false
			}
		}
		if all {
			d.log.Info("every stage is ready", "stages", len(d.plan.Stages), "gen", d.plan.Gen)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			var missing []string
			for _, id := range d.stagePeers() {
				if !d.ready[id] {
					missing = append(missing, id.ShortString())
				}
			}
			return &stageFailure{peer: missing[0], err: fmt.Errorf("stages %v not ready within %v", missing, timeout)}
		case l := <-d.linkCh:
			d.adoptLink(ctx, l)
		case p := <-d.planCh:
			d.log.Info("plan update while connecting", "epoch", p.Epoch)
		case ev := <-d.events:
			if ev.err != nil {
				if d.links[ev.from] == ev.link {
					return &stageFailure{peer: ev.from.String(), err: ev.err}
				}
				continue
			}
			if ev.ctl != nil && ev.ctl.Op == opReady && ev.ctl.Gen == d.plan.Gen {
				d.ready[ev.from] = true
			} else if ev.ctl != nil && ev.ctl.Op == opError {
				return &stageFailure{peer: ev.from.String(), err: errors.New(ev.ctl.Err)}
			}
		}
	}
}

func (d *Driver) adoptLink(ctx context.Context, l *wire.Link) {
	if l.Job() != WireJob(d.plan.JobID, d.plan.Gen) {
		l.Close()
		return
	}
	if old := d.links[l.RemotePeer()]; old != nil {
		d.retire(old)
	}
	d.links[l.RemotePeer()] = l
	go readLink(ctx, l, d.events, d.blobRule(l.RemotePeer()))
}

// blobRule takes a stage node's shard into a file of the checkpoint store,
// refusing one larger than its stage's share of the plan; gradients come
// into memory.
func (d *Driver) blobRule(from peer.ID) blobRule {
	i := d.plan.StageOf(from.String())
	if i < 0 {
		return inMemory(0)
	}
	shard, grads, incoming := shardLimit(d.plan, i), gradsLimit(d.plan, i), d.cfg.Checkpoints.Incoming()
	return func(h Ctl) (int64, string) {
		if h.Name == opShard {
			return shard, incoming
		}
		return grads, ""
	}
}

// retire closes a link and keeps its byte counts for the totals.
func (d *Driver) retire(l *wire.Link) {
	st := l.Stats()
	d.bytesBase += st.BytesSent + st.BytesRecv
	d.payBase += st.PayloadSent + st.PayloadRecv
	d.tensorBase += st.TensorBytesSent + st.TensorBytesRecv
	d.tensorTokBase += st.TensorTokensSent + st.TensorTokensRecv
	l.Close()
}

func (d *Driver) linkTo(p string) (*wire.Link, error) {
	id, _ := peer.Decode(p)
	l := d.links[id]
	if l == nil {
		return nil, &stageFailure{peer: p, err: errLinkLost}
	}
	return l, nil
}

// next waits for the next event from a current link, turning a link
// failure, a lost neighbour or a stage error into a stageFailure.
func (d *Driver) next(ctx context.Context) (linkEvent, error) {
	for {
		select {
		case <-ctx.Done():
			return linkEvent{}, ctx.Err()
		case l := <-d.linkCh:
			d.adoptLink(ctx, l)
		case p := <-d.planCh:
			if p.Epoch > d.plan.Epoch && p.Gen == d.plan.Gen {
				d.setPlan(p) // a new coordinator adopted the job; links stay
			} else if p.Gen != d.plan.Gen {
				d.log.Info("the coordinator moved a stage; recovering", "gen", p.Gen)
				return linkEvent{}, &stageFailure{peer: "", err: errors.New("placement changed")}
			}
		case ev := <-d.events:
			if d.links[ev.from] != ev.link {
				continue // an old link
			}
			if ev.err != nil {
				return ev, &stageFailure{peer: ev.from.String(), err: ev.err}
			}
			if c := ev.ctl; c != nil {
				switch c.Op {
				case opLost:
					return ev, &stageFailure{peer: c.Peer, err: fmt.Errorf("%s lost its link: %s", ev.from.ShortString(), c.Err)}
				case opError:
					return ev, &stageFailure{peer: ev.from.String(), err: errors.New(c.Err)}
				case opReady:
					d.ready[ev.from] = true
					continue
				}
			}
			return ev, nil
		}
	}
}

// runStep trains step k (1-based) and applies it everywhere.
func (d *Driver) runStep(ctx context.Context, k int) (stepResult, error) {
	var res stepResult
	spec := d.cfg.Spec
	M := spec.Microbatches
	batches := make([]model.Input, M)
	total := 0
	for i := range batches {
		in, tg, err := d.src.Next(spec.Rows, spec.SeqLen)
		if err != nil {
			return res, fmt.Errorf("data: %w", err)
		}
		if d.cfg.Pseudonyms != nil {
			in, tg = d.cfg.Pseudonyms.Apply(in), d.cfg.Pseudonyms.Apply(tg)
		}
		batches[i] = model.Input{Batch: spec.Rows, Seq: spec.SeqLen, Tokens: in, Targets: tg}
		for _, t := range tg {
			if t >= 0 {
				total++
			}
		}
	}
	committed := false
	defer func() {
		if !committed { // aborted: nothing of this step may linger
			for _, s := range []*model.Stage{d.first, d.last} {
				for _, mb := range s.InFlight() {
					s.Drop(mb)
				}
				s.ZeroGrad()
			}
		}
	}()
	window := min(M, len(d.plan.Stages)+1)
	sent, done := 0, 0
	stage0 := d.plan.Stages[0].Replicas
	lastStage := d.plan.Stages[len(d.plan.Stages)-1].Replicas
	sendForward := func(mb int) error {
		in := batches[mb]
		out, err := d.first.Forward(mb, model.Input{Batch: in.Batch, Seq: in.Seq, Tokens: in.Tokens})
		if err != nil {
			return err
		}
		l, err := d.linkTo(stage0[mb%len(stage0)])
		if err != nil {
			return err
		}
		return d.send(ctx, l, wire.Frame{Kind: wire.KindForward, Step: uint64(k), Micro: uint32(mb), Data: out.Hidden, IDs: toInt(batches[mb].Tokens)})
	}
	for ; sent < window; sent++ {
		if err := sendForward(sent); err != nil {
			return res, err
		}
	}
	var loss float64
	for done < M {
		ev, err := d.next(ctx)
		if err != nil {
			return res, err
		}
		f := ev.frame
		if uint64(k) != f.Step || int(f.Micro) >= M {
			return res, fmt.Errorf("frame for step %d microbatch %d during step %d", f.Step, f.Micro, k)
		}
		mb := int(f.Micro)
		switch f.Kind {
		case wire.KindForward: // from the last stage: the head computes the loss
			out, err := d.last.Forward(mb, model.Input{Batch: spec.Rows, Seq: spec.SeqLen, Hidden: f.Data, Targets: batches[mb].Targets, LossTokens: total})
			if err != nil {
				return res, err
			}
			loss += out.Loss
			g, err := d.last.Backward(mb, nil)
			if err != nil {
				return res, err
			}
			l, err := d.linkTo(lastStage[mb%len(lastStage)])
			if err != nil {
				return res, err
			}
			if err := d.send(ctx, l, wire.Frame{Kind: wire.KindBackward, Step: uint64(k), Micro: uint32(mb), Data: g}); err != nil {
				return res, err
			}
		case wire.KindBackward: // from stage 0: the embedding's gradient
			if _, err := d.first.Backward(mb, f.Data); err != nil {
				return res, err
			}
			done++
			if sent < M {
				if err := sendForward(sent); err != nil {
					return res, err
				}
				sent++
			}
		default:
			return res, fmt.Errorf("unexpected %s frame from %s during step %d", f.Kind, ev.from.ShortString(), k)
		}
	}
	if err := d.averageReplicas(ctx, k); err != nil {
		return res, err
	}
	sumSq, err := d.gatherSumSq(ctx, k)
	if err != nil {
		return res, err
	}
	if err := model.TieGrads(d.first, d.last); err != nil {
		return res, err
	}
	sumSq += optim.SumSquares(d.rt.backend, d.first.Params()) + optim.SumSquares(d.rt.backend, d.last.Params())
	norm := math.Sqrt(sumSq)
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		return res, fmt.Errorf("step %d: gradient norm %g", k, norm)
	}
	scale := optim.ClipScale(sumSq, spec.ClipNorm)
	lr := spec.Schedule.LR(k - 1)
	if err := d.applyEverywhere(ctx, k, lr, scale); err != nil {
		return res, err
	}
	for _, p := range []struct {
		st  *model.Stage
		opt *optim.AdamW
	}{{d.first, d.optFirst}, {d.last, d.optLast}} {
		if err := p.opt.Step(p.st.Params(), lr, scale); err != nil {
			return res, err
		}
		p.st.ZeroGrad()
	}
	d.steplog.ApplyLoss(d.plan.Epoch, uint64(k), loss)
	committed = true
	res = stepResult{loss: loss, gradNorm: norm, lr: lr}
	for _, l := range d.links {
		res.residual = max(res.residual, l.Stats().LastResidual)
	}
	return res, nil
}

// boundaryBytes is the codec payload per token per boundary, forward and
// backward together.
func (d *Driver) send(ctx context.Context, l *wire.Link, f wire.Frame) error {
	if err := l.Send(ctx, f); err != nil {
		return &stageFailure{peer: l.RemotePeer().String(), err: err}
	}
	return nil
}

// await sends req to every peer in peers and waits for one reply with op
// from each; a tensor frame meanwhile is a protocol error.
func (d *Driver) await(ctx context.Context, peers []string, req Ctl, op string, onReply func(from peer.ID, ev linkEvent) error) error {
	pending := map[peer.ID]bool{}
	for _, p := range peers {
		l, err := d.linkTo(p)
		if err != nil {
			return err
		}
		if req.Op != "" {
			if err := sendCtl(ctx, l, req); err != nil {
				return &stageFailure{peer: p, err: err}
			}
		}
		pending[l.RemotePeer()] = true
	}
	for len(pending) > 0 {
		ev, err := d.next(ctx)
		if err != nil {
			return err
		}
		c := ev.ctl
		if c == nil {
			return fmt.Errorf("unexpected %s frame from %s while waiting for %s", ev.frame.Kind, ev.from.ShortString(), op)
		}
		got := c.Op
		if c.Op == opBlob {
			got = c.Name
		}
		if got != op || !pending[ev.from] {
			return fmt.Errorf("unexpected %s from %s while waiting for %s", got, ev.from.ShortString(), op)
		}
		delete(pending, ev.from)
		if onReply != nil {
			if err := onReply(ev.from, ev); err != nil {
				return err
			}
		}
	}
	return nil
}

// averageReplicas sums the gradients of each replicated stage and hands
// every replica the sum.
func (d *Driver) averageReplicas(ctx context.Context, k int) error {
	for _, s := range d.plan.Stages {
		if len(s.Replicas) < 2 {
			continue
		}
		blobs := map[peer.ID][]byte{}
		err := d.await(ctx, s.Replicas, Ctl{Op: opGrads, Step: uint64(k)}, opGrads, func(from peer.ID, ev linkEvent) error {
			blobs[from] = ev.blob
			return nil
		})
		if err != nil {
			return err
		}
		ordered := make([][]byte, 0, len(s.Replicas))
		for _, r := range s.Replicas {
			id, _ := peer.Decode(r)
			ordered = append(ordered, blobs[id])
		}
		sum, err := sumGrads(ordered)
		if err != nil {
			return err
		}
		for _, r := range s.Replicas {
			l, err := d.linkTo(r)
			if err != nil {
				return err
			}
			if err := sendBlob(ctx, l, Ctl{Name: opGradSum, Step: uint64(k)}, sum); err != nil {
				return &stageFailure{peer: r, err: err}
			}
		}
	}
	return nil
}

// gatherSumSq adds Σg² over the stages (one replica each: after averaging
// they hold the same gradients), in stage order.
func (d *Driver) gatherSumSq(ctx context.Context, k int) (float64, error) {
	var reps []string
	for _, s := range d.plan.Stages {
		reps = append(reps, s.Replicas[0])
	}
	got := map[peer.ID]float64{}
	err := d.await(ctx, reps, Ctl{Op: opSumSq, Step: uint64(k)}, opSumSq, func(from peer.ID, ev linkEvent) error {
		if v := ev.ctl.SumSq; math.IsNaN(v) || v < 0 {
			return fmt.Errorf("stage node %s reports Σg² = %g", from.ShortString(), v)
		}
		got[from] = ev.ctl.SumSq
		return nil
	})
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, r := range reps {
		id, _ := peer.Decode(r)
		sum += got[id]
	}
	return sum, nil
}

func (d *Driver) allStagePeers() []string {
	var out []string
	for _, s := range d.plan.Stages {
		out = append(out, s.Replicas...)
	}
	return out
}

func (d *Driver) applyEverywhere(ctx context.Context, k int, lr, scale float64) error {
	return d.await(ctx, d.allStagePeers(), Ctl{Op: opApply, Step: uint64(k), LR: lr, Scale: scale}, opApplied, func(from peer.ID, ev linkEvent) error {
		if ev.ctl.Step != uint64(k) {
			return fmt.Errorf("stage node %s applied step %d, asked %d", from.ShortString(), ev.ctl.Step, k)
		}
		return nil
	})
}

// checkpoint collects every stage's shard at the current step.
func (d *Driver) checkpoint(ctx context.Context) (err error) {
	shards := make([]string, len(d.plan.Stages))
	defer func() {
		if err != nil {
			for _, f := range shards {
				if f != "" {
					os.Remove(f)
				}
			}
		}
	}()
	for i, s := range d.plan.Stages {
		err := d.await(ctx, s.Replicas[:1], Ctl{Op: opShard, Step: uint64(d.step)}, opShard, func(from peer.ID, ev linkEvent) error {
			if ev.file == "" {
				return fmt.Errorf("stage node %s sent its shard without a blob", from.ShortString())
			}
			shards[i] = ev.file
			if ev.ctl.Step != uint64(d.step) {
				return fmt.Errorf("stage node %s sent its shard of step %d, not %d", from.ShortString(), ev.ctl.Step, d.step)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	own, err := d.encodeOwn()
	if err != nil {
		return err
	}
	if err := d.cfg.Checkpoints.Save(d.step, d.plan, shards, own); err != nil {
		return fmt.Errorf("checkpoint step %d: %w", d.step, err)
	}
	d.ckptStep = d.step
	d.log.Info("checkpoint", "step", d.step)
	return d.reportWork(ctx)
}

// reportWork tells the coordinator what each stage node computed since
// the last report, so it can sign their contribution receipts.
func (d *Driver) reportWork(ctx context.Context) error {
	if d.workSeen == nil {
		d.workSeen = map[string]job.WorkItem{}
	}
	var items []job.WorkItem
	err := d.await(ctx, d.allStagePeers(), Ctl{Op: opStats, Step: uint64(d.step)}, opStats, func(from peer.ID, ev linkEvent) error {
		c := ev.ctl
		if c.ComputeS < 0 || c.Tokens < 0 {
			return fmt.Errorf("stage node %s reports negative work", from.ShortString())
		}
		prev := d.workSeen[from.String()]
		// A restarted worker's counters start again from zero.
		if c.ComputeS < prev.ComputeS || c.Tokens < prev.Tokens {
			prev = job.WorkItem{}
		}
		items = append(items, job.WorkItem{Peer: from.String(), ComputeS: c.ComputeS - prev.ComputeS, Tokens: c.Tokens - prev.Tokens})
		d.workSeen[from.String()] = job.WorkItem{Peer: from.String(), ComputeS: c.ComputeS, Tokens: c.Tokens}
		return nil
	})
	if err != nil {
		return err
	}
	if err := d.coord.Work(ctx, d.plan.JobID, uint64(d.workStep), uint64(d.step), items); err != nil {
		d.log.Warn("could not report work to the coordinator", "err", err)
	}
	d.workStep = d.step
	return nil
}

// encodeOwn serialises the researcher's embedding and head stages.
func (d *Driver) encodeOwn() ([2][]byte, error) {
	a, err := encodeShard(d.first, d.optFirst, uint64(d.step))
	if err != nil {
		return [2][]byte{}, err
	}
	b, err := encodeShard(d.last, d.optLast, uint64(d.step))
	return [2][]byte{a, b}, err
}

// recover replaces a lost stage node and rolls every stage back to the
// last checkpoint.
func (d *Driver) recover(ctx context.Context, lost string) error {
	d.recoveries++
	for _, p := range d.allStagePeers() {
		if l, err := d.linkTo(p); err == nil && p != lost {
			_ = sendCtl(ctx, l, Ctl{Op: opAbort})
		}
	}
	var signed []byte
	var err error
	for attempt := 0; ; attempt++ {
		signed, err = d.coord.Replan(ctx, d.plan.JobID, d.plan.Epoch, lost, uint64(d.ckptStep+1))
		if err == nil || attempt == 5 || ctx.Err() != nil {
			break
		}
		d.log.Warn("re-plan failed; retrying", "err", err)
		time.Sleep(time.Duration(attempt+1) * time.Second)
	}
	if err != nil {
		return fmt.Errorf("re-plan: %w", err)
	}
	p, err := job.OpenPlan(signed)
	if err != nil {
		return err
	}
	if err := d.rt.check(ctx, p); err != nil {
		return err
	}
	if p.JobID != d.cfg.Spec.JobID || p.Researcher != d.self {
		return fmt.Errorf("pipeline: re-plan for job %s with researcher %s is not ours", p.JobID, short(p.Researcher))
	}
	d.mu.Lock()
	d.signed = signed
	d.mu.Unlock()
	for id, l := range d.links {
		d.retire(l)
		delete(d.links, id)
	}
	d.ready = map[peer.ID]bool{}
	d.setPlan(p)
	if err := d.connect(ctx); err != nil {
		return err
	}
	c := d.ckptStep
	if err := d.restoreStages(ctx, c); err != nil {
		return err
	}
	d.tokens -= int64(d.step-c) * int64(d.cfg.Spec.Microbatches*d.cfg.Spec.MicrobatchTokens())
	d.step = c
	if err := d.resetSource(c); err != nil {
		return err
	}
	d.steplog.Rollback(d.plan.Epoch, uint64(c))
	d.log.Info("recovered", "step", c, "gen", d.plan.Gen, "stages", stagesSummary(d.plan))
	return nil
}

// restoreStages resets every stage node and the researcher's own stages
// to checkpoint c. Checkpoint 0 is the job's initial weights: a job from
// the seed has its stages re-initialise; a fine-tune streams each stage
// its blocks from the pretrained checkpoint. A later one streams each
// stage its shard file.
func (d *Driver) restoreStages(ctx context.Context, c int) error {
	var ck *Checkpoint
	if c > 0 {
		var err error
		if ck, err = d.cfg.Checkpoints.Open(c); err != nil {
			return err
		}
		if n := ck.Stages(); n != len(d.plan.Stages) {
			return fmt.Errorf("pipeline: checkpoint %d holds %d stage shards, the plan has %d stages", c, n, len(d.plan.Stages))
		}
	}
	for i, s := range d.plan.Stages {
		for _, r := range s.Replicas {
			l, err := d.linkTo(r)
			if err != nil {
				return err
			}
			if err := d.restoreStage(ctx, l, ck, c, i); err != nil {
				var sf *stageFailure
				if errors.As(err, &sf) {
					return err
				}
				return &stageFailure{peer: r, err: err}
			}
		}
	}
	if err := d.await(ctx, d.allStagePeers(), Ctl{}, opRestored, nil); err != nil {
		return err
	}
	if c == 0 {
		return d.buildStages()
	}
	own, err := ck.Own()
	if err != nil {
		return err
	}
	if _, err := decodeShard(bytesReader(own[0]), d.first, d.optFirst); err != nil {
		return err
	}
	_, err = decodeShard(bytesReader(own[1]), d.last, d.optLast)
	return err
}

// restoreStage sends one stage node the restore of stage i to checkpoint
// c (ck, nil for checkpoint 0).
func (d *Driver) restoreStage(ctx context.Context, l *wire.Link, ck *Checkpoint, c, i int) error {
	hdr := Ctl{Name: opRestore, Step: uint64(c)}
	switch {
	case c == 0 && !d.cfg.Spec.FromCheckpoint:
		return sendCtl(ctx, l, Ctl{Op: opRestore, Step: 0, Init: true})
	case c == 0:
		sp := d.plan.Stages[i]
		e, err := layoutSpan(d.cfg.Weights, d.cfg.Spec.Model, model.Span{First: sp.First, Last: sp.Last}, map[string]string{metaStep: "0", metaAdamSteps: "0"})
		if err != nil {
			return err
		}
		if err := sendCtl(ctx, l, Ctl{Op: opRestore, Step: 0}); err != nil {
			return err
		}
		return sendBlobFrom(ctx, l, hdr, e.Size(), func(w io.Writer) error { _, err := e.WriteTo(w); return err })
	default:
		f, size, err := ck.Shard(i)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := sendCtl(ctx, l, Ctl{Op: opRestore, Step: uint64(c)}); err != nil {
			return err
		}
		return sendBlobFrom(ctx, l, hdr, size, func(w io.Writer) error {
			_, err := io.Copy(w, bufio.NewReaderSize(f, 1<<20))
			return err
		})
	}
}

// resetSource rebuilds the data source positioned after step.
func (d *Driver) resetSource(step int) error {
	src, err := d.cfg.NewSource()
	if err != nil {
		return err
	}
	for i := 0; i < step*d.cfg.Spec.Microbatches; i++ {
		if _, _, err := src.Next(d.cfg.Spec.Rows, d.cfg.Spec.SeqLen); err != nil {
			return err
		}
	}
	d.src = src
	return nil
}

func stagesSummary(p *job.Plan) string {
	var parts []string
	for _, s := range p.Stages {
		var rs []string
		for _, r := range s.Replicas {
			rs = append(rs, short(r))
		}
		parts = append(parts, fmt.Sprintf("%d-%d@%v", s.First, s.Last-1, rs))
	}
	return fmt.Sprint(parts)
}

// Plan is the driver's current plan.
func (d *Driver) Plan() *job.Plan { return d.plan }

// Stages are the researcher's own embedding and head stages (for the final
// checkpoint).
func (d *Driver) Stages() (first, last *model.Stage) { return d.first, d.last }

func (d *Driver) close() {
	for id, l := range d.links {
		d.retire(l)
		delete(d.links, id)
	}
	d.steplog.Close()
	if d.scratch != "" {
		os.RemoveAll(d.scratch)
	}
	if d.plan != nil {
		d.rt.mu.Lock()
		if e := d.rt.byJob[d.plan.JobID]; e != nil && e.driver == d {
			delete(d.rt.byJob, d.plan.JobID)
			delete(d.rt.byWire, WireJob(d.plan.JobID, d.plan.Gen))
		}
		d.rt.mu.Unlock()
	}
}
