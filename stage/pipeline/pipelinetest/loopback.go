// Package pipelinetest runs a swarm inside one process for tests and
// benchmarks: a researcher, a coordinator and stage nodes, each a real
// libp2p host on a loopback socket with its own stage runtime, and a
// coordinator service that places jobs on the stage nodes. Nothing is
// mocked but the election: the coordinator is fixed in term 1.
package pipelinetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/gossip/coord"
	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/pipeline"
)

// Loopback is an in-process swarm. Hosts[0] is the researcher, Hosts[1]
// the coordinator, Hosts[2:] the stage nodes.
type Loopback struct {
	Hosts    []host.Host
	Runtimes []*pipeline.Runtime // nil for the coordinator
	Coord    *coord.Service

	mu   sync.Mutex
	dead map[peer.ID]bool
	work []job.WorkItem
}

// Options tune a Loopback.
type Options struct {
	Dir    string        // per-node data dirs (step logs) go under it; "" keeps none
	Memory uint64        // bytes each stage node lends (default 4 GiB)
	Logger *slog.Logger  // default: discard
	Grace  time.Duration // a silent node is re-planned after this (default: never)
	// HealthInterval is how often the coordinator checks on a job's
	// nodes (default 200 ms).
	HealthInterval time.Duration
}

// New starts a researcher, a coordinator and stageNodes stage nodes.
func New(stageNodes int, o Options) (_ *Loopback, err error) {
	if o.Memory == 0 {
		o.Memory = 4 << 30
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.Grace == 0 {
		o.Grace = time.Hour
	}
	if o.HealthInterval == 0 {
		o.HealthInterval = 200 * time.Millisecond
	}
	s := &Loopback{dead: map[peer.ID]bool{}}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	var coordKey crypto.PrivKey
	for i := 0; i < stageNodes+2; i++ {
		key, _, err := crypto.GenerateEd25519Key(nil)
		if err != nil {
			return nil, err
		}
		if i == 1 {
			coordKey = key
		}
		h, err := libp2p.New(libp2p.Identity(key), libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableMetrics())
		if err != nil {
			return nil, err
		}
		s.Hosts = append(s.Hosts, h)
	}
	for _, a := range s.Hosts {
		for _, b := range s.Hosts {
			if a != b {
				a.Peerstore().AddAddrs(b.ID(), b.Addrs(), time.Hour)
			}
		}
	}
	coordID := s.Hosts[1].ID().String()
	check := func(_ context.Context, p *job.Plan) error {
		if p.Coordinator != coordID {
			return fmt.Errorf("plan signed by %s, not the coordinator", p.Coordinator)
		}
		return nil
	}
	for i, h := range s.Hosts {
		if i == 1 {
			s.Runtimes = append(s.Runtimes, nil)
			continue
		}
		dir := ""
		if o.Dir != "" {
			dir = filepath.Join(o.Dir, fmt.Sprintf("node%d", i))
		}
		rt, err := pipeline.NewRuntime(pipeline.RuntimeConfig{Host: h, Check: check, DataDir: dir, Memory: o.Memory, Logger: o.Logger})
		if err != nil {
			return nil, err
		}
		s.Runtimes = append(s.Runtimes, rt)
	}
	s.Coord, err = coord.New(coord.Config{
		Host: s.Hosts[1], Key: coordKey, Logger: o.Logger,
		Term: func() (uint64, bool) { return 1, true },
		Offers: func() []coord.Offer {
			s.mu.Lock()
			defer s.mu.Unlock()
			var out []coord.Offer
			for _, h := range s.Hosts[2:] {
				if !s.dead[h.ID()] {
					out = append(out, coord.Offer{PeerID: h.ID().String(), GFLOPS: 10, MemoryBytes: o.Memory})
				}
			}
			return out
		},
		Alive: func(p peer.ID) bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return !s.dead[p]
		},
		HealthInterval: o.HealthInterval, Grace: o.Grace,
		OnWork: func(_ uint64, _ string, _, _ uint64, work []job.WorkItem) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.work = append(s.work, work...)
		},
	})
	return s, err
}

// Researcher is the researcher's runtime.
func (s *Loopback) Researcher() *pipeline.Runtime { return s.Runtimes[0] }

// Client is the researcher's handle on the coordinator.
func (s *Loopback) Client() *coord.Client {
	return &coord.Client{Host: s.Hosts[0], Coordinator: func(context.Context) (peer.ID, error) { return s.Hosts[1].ID(), nil }}
}

// Reported sums the work the researcher reported to the coordinator, by
// peer.
func (s *Loopback) Reported() map[string]job.WorkItem {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]job.WorkItem{}
	for _, w := range s.work {
		t := out[w.Peer]
		t.Peer, t.ComputeS, t.Tokens = w.Peer, t.ComputeS+w.ComputeS, t.Tokens+w.Tokens
		out[w.Peer] = t
	}
	return out
}

// ErrNotStageNode is returned by Kill for a peer that is not a stage node.
var ErrNotStageNode = errors.New("pipelinetest: not a stage node")

// Kill stops a stage node the hard way: its runtime and host go away, and
// the coordinator no longer offers it.
func (s *Loopback) Kill(id string) error {
	for i, h := range s.Hosts {
		if h.ID().String() != id || i < 2 {
			continue
		}
		s.mu.Lock()
		already := s.dead[h.ID()]
		s.dead[h.ID()] = true
		s.mu.Unlock()
		if !already {
			s.Runtimes[i].Close()
			h.Close()
		}
		return nil
	}
	return fmt.Errorf("%w: %s", ErrNotStageNode, id)
}

// Close stops everything.
func (s *Loopback) Close() {
	if s.Coord != nil {
		s.Coord.Close()
	}
	for i, rt := range s.Runtimes {
		s.mu.Lock()
		dead := i < len(s.Hosts) && s.dead[s.Hosts[i].ID()]
		s.mu.Unlock()
		if rt != nil && !dead {
			rt.Close()
		}
	}
	for _, h := range s.Hosts {
		h.Close()
	}
}
