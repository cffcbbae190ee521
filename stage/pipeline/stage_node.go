package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/tensor"
	"github.com/holopeer/holopeer/stage/wire"
	"github.com/holopeer/holopeer/stage/wire/codec"
)

// stageNode is what a stage node's worker for one job holds whether it
// trains (Worker) or serves (serveWorker): the plan and its stage in it,
// the links to the stage's neighbours and home to the researcher, and the
// channels the runtime feeds it through. Each worker embeds one; what it
// does with frames is its own.
type stageNode struct {
	// Static after newStageNode.
	rt     *Runtime
	self   string
	jobID  string
	be     tensor.Backend
	links  chan *wire.Link // opened or accepted, for the run goroutine to adopt
	plans  chan *job.Plan
	cancel context.CancelFunc // set by Runtime.launch before the worker runs

	// Owned by the run goroutine.
	log    *slog.Logger
	plan   *job.Plan
	codec  codec.Codec
	stage  int
	byPeer map[peer.ID]*wire.Link
}

// newStageNode prepares the stage plan p gives this node; logArgs are
// added to the job and stage on every log line.
func newStageNode(rt *Runtime, p *job.Plan, logArgs ...any) (stageNode, error) {
	self := rt.host.ID().String()
	stage := p.StageOf(self)
	if stage < 0 {
		return stageNode{}, fmt.Errorf("pipeline: plan %s gives this node no stage", p.JobID)
	}
	c, _, err := newCodec(p.Spec)
	if err != nil {
		return stageNode{}, err
	}
	return stageNode{
		rt: rt, self: self, jobID: p.JobID, be: rt.backend,
		log:   rt.log.With(append([]any{"job", p.JobID, "stage", stage}, logArgs...)...),
		links: make(chan *wire.Link, 16),
		plans: make(chan *job.Plan, 4),
		plan:  p, codec: c, stage: stage,
		byPeer: map[peer.ID]*wire.Link{},
	}, nil
}

// spanBytes is the memory estimate of the blocks plan p gives
// stage.
func spanBytes(p *job.Plan, stage int) uint64 {
	sp := p.Stages[stage]
	return p.Spec.LayerBytes(len(p.Stages)) * uint64(sp.Last-sp.First)
}

// offerLink hands l to the run goroutine, or closes it if ctx ends first.
func (n *stageNode) offerLink(ctx context.Context, l *wire.Link) {
	select {
	case n.links <- l:
	case <-ctx.Done():
		l.Close()
	}
}

// connect opens the links this node is the opener of, in the background,
// trying each up to attempts times with a pause that grows by 200 ms a
// try, to at most 2 s.
func (n *stageNode) connect(ctx context.Context, attempts int) {
	wj := WireJob(n.plan.JobID, n.plan.Gen)
	log := n.log
	for _, remote := range n.expectedPeers() {
		if !opener(n.plan, n.self, remote) {
			continue
		}
		id, err := peer.Decode(remote)
		if err != nil {
			continue
		}
		go func() {
			var err error
			for attempt := 0; attempt < attempts; attempt++ {
				var l *wire.Link
				if l, err = n.rt.svc.OpenLink(ctx, id, wj); err == nil {
					n.offerLink(ctx, l)
					return
				}
				if ctx.Err() != nil {
					return
				}
				log.Debug("open link failed; retrying", "peer", short(remote), "attempt", attempt, "err", err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Duration(min(200*(attempt+1), 2000)) * time.Millisecond):
				}
			}
			log.Warn("cannot open link", "peer", short(remote), "err", err)
		}()
	}
}

// expectedPeers lists every peer this stage links with.
func (n *stageNode) expectedPeers() []string {
	_, prev, next, _ := n.plan.Neighbours(n.self)
	seen := map[string]bool{}
	var out []string
	for _, group := range [][]string{prev, next, {n.plan.Researcher}} {
		for _, p := range group {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return out
}

func (n *stageNode) linksComplete() bool {
	for _, p := range n.expectedPeers() {
		id, _ := peer.Decode(p)
		if n.byPeer[id] == nil {
			return false
		}
	}
	return true
}

// take puts a link (opened or accepted) in byPeer in place of the one it
// replaces, which it closes and returns. A link of another placement is
// closed and refused (ok false).
func (n *stageNode) take(l *wire.Link) (old *wire.Link, ok bool) {
	if l.Job() != WireJob(n.plan.JobID, n.plan.Gen) {
		l.Close() // a link of an older placement
		return nil, false
	}
	if old = n.byPeer[l.RemotePeer()]; old != nil {
		old.Close()
	}
	n.byPeer[l.RemotePeer()] = l
	return old, true
}

// follow takes p if it is newer than the current plan. It reports moved
// when p is a new placement (Gen): then every link is closed, stage is
// the one p gives this node and old the plan p replaced, and the worker
// re-links. A newer plan that drops this node is an error.
func (n *stageNode) follow(p *job.Plan) (moved bool, stage int, old *job.Plan, err error) {
	if p.Epoch <= n.plan.Epoch {
		return false, 0, nil, nil
	}
	stage = p.StageOf(n.self)
	if stage < 0 {
		return false, 0, nil, errors.New("pipeline: the new plan drops this node")
	}
	old, n.plan = n.plan, p
	if p.Gen == old.Gen {
		return false, 0, nil, nil
	}
	n.closeLinks()
	return true, stage, old, nil
}

// closeLinks closes every link.
func (n *stageNode) closeLinks() {
	for id, l := range n.byPeer {
		l.Close()
		delete(n.byPeer, id)
	}
}

// sendTo writes to the neighbour to with send. A lost neighbour is
// reported to the researcher, not fatal: the researcher re-plans (a link
// that fails, its reader reports). Only a refusal before sending, our own
// bug or a broken invariant, is an error.
func (n *stageNode) sendTo(ctx context.Context, to string, send func(*wire.Link) error) error {
	id, _ := peer.Decode(to)
	l := n.byPeer[id]
	if l == nil {
		n.tell(ctx, Ctl{Op: opLost, Peer: to, Err: "no link"})
		return nil
	}
	if err := send(l); err != nil {
		var we *wire.Error
		if errors.As(err, &we) && !we.Remote && l.Err() == nil {
			return err
		}
		n.log.Warn("send failed", "peer", id.ShortString(), "err", err)
	}
	return nil
}

// home is the link to the researcher.
func (n *stageNode) home() *wire.Link {
	id, _ := peer.Decode(n.plan.Researcher)
	return n.byPeer[id]
}

// tell sends a control message to the researcher, if it is reachable.
func (n *stageNode) tell(ctx context.Context, c Ctl) {
	if h := n.home(); h != nil {
		if err := sendCtl(ctx, h, c); err != nil {
			n.log.Debug("cannot reach the researcher", "err", err)
		}
	}
}
