package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	lpeer "github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/gossip"
	"github.com/holopeer/holopeer/gossip/coord"
	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/pipeline"
	"github.com/holopeer/holopeer/tee"
)

// startServices brings up what runs on top of the host: gossip with the
// coordinator election, the coordinator's job service, and the stage
// runtime.
func (n *Node) startServices(ctx context.Context) error {
	cfg := n.cfg
	h := n.host.Libp2p()
	mode, err := tee.ParseMode(cfg.TEE)
	if err != nil {
		return fmt.Errorf("--tee: %w", err)
	}
	if mode == tee.ModeSim && !cfg.AllowSim {
		return errors.New("--tee sim makes INSECURE evidence that only a swarm started with --allow-sim accepts; add --allow-sim (testnets only) or pick another --tee")
	}
	att, err := tee.NewAttester(ctx, mode, tee.WithSimKey(tee.SimTestnetKey(cfg.Swarm)))
	if err != nil {
		return fmt.Errorf("--tee %s: %w", mode, err)
	}
	policy := tee.Policy{AllowSim: cfg.AllowSim}
	if cfg.TEEPolicy != "" {
		b, err := os.ReadFile(cfg.TEEPolicy)
		if err != nil {
			return fmt.Errorf("--tee-policy: %w", err)
		}
		if err := json.Unmarshal(b, &policy); err != nil {
			return fmt.Errorf("--tee-policy %s: %w", cfg.TEEPolicy, err)
		}
		policy.AllowSim = policy.AllowSim && cfg.AllowSim
	}
	ver, err := tee.NewVerifier(policy)
	if err != nil {
		return fmt.Errorf("tee policy: %w", err)
	}
	n.teeLabel = string(mode)
	if att == nil {
		n.teeLabel = "none"
	} else {
		n.teeLabel = att.Provider()
	}
	gopts := []gossip.Option{
		gossip.WithSwarm(cfg.Swarm),
		gossip.WithLogger(cfg.Logger),
		gossip.WithTEE(att, ver),
		gossip.WithAllowSim(cfg.AllowSim),
		gossip.WithCapability(func() ([]byte, error) { _, b := n.host.Capability(); return b, nil }),
		gossip.WithStateFile(filepath.Join(cfg.DataDir, "election.json")),
	}
	if cfg.GossipTiming != nil {
		gopts = append(gopts, gossip.WithTiming(*cfg.GossipTiming))
	}
	if n.gossip, err = gossip.New(ctx, h, gopts...); err != nil {
		return err
	}
	n.coord, err = coord.New(coord.Config{
		Host: h, Key: n.host.PrivateKey(), Logger: cfg.Logger,
		AssignLocal: func(ctx context.Context, signed []byte) error {
			if n.runtime == nil {
				return errors.New("stage runtime not started")
			}
			return n.runtime.Assign(ctx, signed, "")
		},
		Terms:  n.ledger.History(),
		Term:   n.coordinatorTerm,
		Offers: n.offers,
		Alive:  n.alive,
		OnWork: n.onWork,
	})
	if err != nil {
		return err
	}
	n.runtime, err = pipeline.NewRuntime(pipeline.RuntimeConfig{
		Host: h, Backend: cfg.Backend, DataDir: cfg.DataDir, Memory: cfg.Offer.MemoryBytes,
		Check: n.checkPlan, Logger: cfg.Logger,
	})
	return err
}

// coordinatorTerm says whether this node is the coordinator, and in which
// term.
func (n *Node) coordinatorTerm() (uint64, bool) {
	c := n.gossip.Coordinator()
	if c == nil || !c.Self {
		return 0, false
	}
	return c.Term, true
}

// offers lists the machines on offer: every present member's verified
// capability record, this node's own included.
func (n *Node) offers() []coord.Offer {
	var out []coord.Offer
	add := func(id string, c capabilityView) {
		out = append(out, coord.Offer{PeerID: id, GFLOPS: c.GFLOPS, MemoryBytes: c.MemoryBytes, Relayed: c.Relayed, Backend: c.Backend})
	}
	self, _ := n.host.Capability()
	add(self.PeerID, capabilityView{GFLOPS: self.GFLOPS, MemoryBytes: self.MemoryBytes, Relayed: self.Relayed, Backend: self.Backend})
	for id, p := range n.gossip.Presence() {
		c := p.Capability
		if c.Swarm != n.cfg.Swarm || id == n.host.ID() {
			continue
		}
		add(id.String(), capabilityView{GFLOPS: c.GFLOPS, MemoryBytes: c.MemoryBytes, Relayed: c.Relayed, Backend: c.Backend})
	}
	return out
}

type capabilityView struct {
	GFLOPS      float64
	MemoryBytes uint64
	Relayed     bool
	Backend     string
}

// alive says whether a placed node is still in the swarm: connected, or
// heard from on the presence topic recently.
func (n *Node) alive(p lpeer.ID) bool {
	if p == n.host.ID() || n.host.ConnTypeTo(p) != "" {
		return true
	}
	_, ok := n.gossip.Presence()[p]
	return ok
}

// checkPlan accepts a plan only from the coordinator this node follows in
// the plan's term, and never from a term older than the newest it has
// accepted (the fencing token). A plan may arrive a moment before the
// election's news: wait briefly for it.
func (n *Node) checkPlan(ctx context.Context, p *job.Plan) error {
	if err := n.gossip.AcceptTerm(p.Term); err != nil {
		return err
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		c := n.gossip.Coordinator()
		if c != nil && c.Term == p.Term && c.PeerID.String() == p.Coordinator {
			return nil
		}
		if time.Now().After(deadline) {
			if c == nil {
				return fmt.Errorf("plan signed in term %d by %s, and this node follows no coordinator", p.Term, p.Coordinator)
			}
			return fmt.Errorf("plan signed in term %d by %s, but this node follows %s in term %d", p.Term, p.Coordinator, c.PeerID, c.Term)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WaitCoordinator blocks until this node follows a coordinator.
func (n *Node) WaitCoordinator(ctx context.Context) (*gossip.CoordinatorInfo, error) {
	for {
		if c := n.gossip.Coordinator(); c != nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			if why := n.Diagnose(); why != nil {
				return nil, fmt.Errorf("no coordinator: %w (%w)", why, ctx.Err())
			}
			return nil, fmt.Errorf("no coordinator elected yet (%s): %w", n.CoordinatorProgress(), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// CoordinatorClient is a researcher's handle on whoever coordinates now.
func (n *Node) CoordinatorClient(current func(string) []byte) *coord.Client {
	return &coord.Client{
		Host:    n.host.Libp2p(),
		Current: current,
		Coordinator: func(ctx context.Context) (lpeer.ID, error) {
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			c, err := n.WaitCoordinator(ctx)
			if err != nil {
				return "", err
			}
			return c.PeerID, nil
		},
	}
}

// Runtime is the node's stage runtime.
func (n *Node) Runtime() *pipeline.Runtime { return n.runtime }

// Gossip is the node's gossip service.
func (n *Node) Gossip() *gossip.Service { return n.gossip }
