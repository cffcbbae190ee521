package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/gossip/coord"
	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/model/train"
	"github.com/holopeer/holopeer/stage/pipeline"
	"github.com/holopeer/holopeer/stage/serve"
	"github.com/holopeer/holopeer/stage/tokenizer"
)

// The serve group measures generation through a swarm of three stage
// nodes on loopback in this process (real libp2p hosts, Noise links, the
// int8 codec) against single-process generation of the same checkpoint:
// tokens/s of one sequence, time to the first token, tokens/s of eight
// sequences at once, and the pause a stage node's death causes.
func init() {
	registerBench(benchGroup{Name: "serve", Run: benchServe})
}

func benchServe(ctx context.Context, o benchOptions, emit func(benchRow)) error {
	cfg := train.DemoConfig(tokenizer.Byte().VocabSize())
	promptLen, newTokens, concurrent := 16, 64, 8
	if o.Quick {
		newTokens, concurrent = 24, 4
	}
	dir, err := os.MkdirTemp("", "holopeer-bench-serve-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ck, err := benchCheckpoint(filepath.Join(dir, "ckpt"), cfg)
	if err != nil {
		return err
	}
	defer ck.Close()
	whole, err := ck.LoadStage(cfg, model.Whole(cfg))
	if err != nil {
		return err
	}
	defer whole.Close()
	local, err := serve.NewLocal(whole)
	if err != nil {
		return err
	}

	sw, err := newLoopSwarm(4) // three stages and a spare
	if err != nil {
		return err
	}
	defer sw.Close()
	spec := job.Spec{
		JobID: job.NewJobID("bench-serve"), Name: "bench-serve", Kind: job.KindServe, Model: cfg, FromCheckpoint: true,
		Codec: "int8", Stages: 3, Replicas: 1, MaxBatch: 16, MaxTokens: cfg.MaxSeq,
	}
	srv, err := sw.runtimes[0].NewServer(pipeline.ServeConfig{Spec: spec, Weights: ck, Logger: quietLogger()}, sw.client())
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = srv.Start(sctx)
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Close(cctx)
	}()

	r := rand.New(rand.NewPCG(5, 6))
	prompt := func() []int32 {
		p := make([]int32, promptLen)
		for i := range p {
			p[i] = int32(r.IntN(256))
		}
		return p
	}
	// One sequence: tokens/s and time to first token, best of the runs.
	measure := func(eng serve.Engine) (tps, ttft float64, err error) {
		if _, _, err := timeGeneration(ctx, eng, prompt(), newTokens); err != nil { // warm-up
			return 0, 0, err
		}
		start := time.Now()
		ttft = 1e18
		for runs := 0; runs < 2 || time.Since(start) < o.Time; runs++ {
			d, first, err := timeGeneration(ctx, eng, prompt(), newTokens)
			if err != nil {
				return 0, 0, err
			}
			tps = max(tps, float64(newTokens)/d.Seconds())
			ttft = min(ttft, first.Seconds()*1e3)
		}
		return tps, ttft, nil
	}
	swarmTPS, swarmTTFT, err := measure(srv)
	if err != nil {
		return fmt.Errorf("swarm generation: %w", err)
	}
	localTPS, localTTFT, err := measure(local)
	if err != nil {
		return err
	}
	note := fmt.Sprintf("demo model %.2fM params (d=%d, %d layers) over 3 stage nodes on loopback, int8 codec; %d-token prompt, %d new tokens, greedy; baseline: one process, same checkpoint",
		float64(cfg.ParamCount())/1e6, cfg.Dim, cfg.Layers, promptLen, newTokens)
	row1 := row("serve_tokens_per_s", swarmTPS, "tokens/s", localTPS)
	row1.Note = note
	emit(row1)
	row2 := row("serve_time_to_first_token_ms", swarmTTFT, "ms", localTTFT)
	row2.Note = note
	emit(row2)

	// Several sequences at once: the swarm batches them and keeps every
	// stage busy; one process runs them one after another.
	prompts := make([][]int32, concurrent)
	for i := range prompts {
		prompts[i] = prompt()
	}
	swarmAll, err := timeConcurrent(ctx, srv, prompts, newTokens)
	if err != nil {
		return err
	}
	localAll, err := timeConcurrent(ctx, local, prompts, newTokens)
	if err != nil {
		return err
	}
	row3 := row(fmt.Sprintf("serve_tokens_per_s_%d_concurrent", concurrent), swarmAll, "tokens/s", localAll)
	row3.Note = fmt.Sprintf("%d sequences of %d new tokens at once; baseline: one process generating them in turn", concurrent, newTokens)
	emit(row3)

	// A stage node dies mid-generation: the longest pause between tokens
	// against the median one.
	victim := srv.Stats().Plan.Stages[1].Replicas[0]
	var (
		at     []time.Time
		killed sync.Once
		done   = make(chan struct{})
	)
	err = srv.Generate(ctx, prompt(), newTokens, serve.NewSampler(serve.Sampling{}).Pick, func(int32) bool {
		at = append(at, time.Now())
		if len(at) == newTokens/2 {
			killed.Do(func() { go func() { sw.kill(victim); close(done) }() })
		}
		return false
	})
	if err != nil {
		return fmt.Errorf("generation across a failover: %w", err)
	}
	<-done
	var gaps []float64
	for i := 1; i < len(at); i++ {
		gaps = append(gaps, at[i].Sub(at[i-1]).Seconds()*1e3)
	}
	slices.Sort(gaps)
	row4 := row("serve_failover_pause_ms", gaps[len(gaps)-1], "ms", gaps[len(gaps)/2])
	st := srv.Stats()
	row4.Note = fmt.Sprintf("the middle stage's node killed after %d of %d tokens; a spare loads its blocks (re-plan to ready: %v) and the prefix is replayed; baseline: the median pause between tokens (%d recovery, %d tokens replayed)",
		newTokens/2, newTokens, st.LastRecovery.Round(time.Millisecond), st.Recoveries, st.Replayed)
	emit(row4)
	return nil
}

// timeGeneration generates n tokens greedily and returns the time taken
// and the time to the first token.
func timeGeneration(ctx context.Context, eng serve.Engine, prompt []int32, n int) (total, first time.Duration, err error) {
	start := time.Now()
	got := 0
	err = eng.Generate(ctx, prompt, n, serve.NewSampler(serve.Sampling{}).Pick, func(int32) bool {
		if got == 0 {
			first = time.Since(start)
		}
		got++
		return false
	})
	if err == nil && got != n {
		err = fmt.Errorf("%d of %d tokens generated", got, n)
	}
	return time.Since(start), first, err
}

// timeConcurrent generates for every prompt at once and returns the
// tokens per second of them all.
func timeConcurrent(ctx context.Context, eng serve.Engine, prompts [][]int32, n int) (float64, error) {
	start := time.Now()
	errs := make([]error, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = timeGeneration(ctx, eng, p, n)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return 0, err
		}
	}
	return float64(len(prompts)*n) / time.Since(start).Seconds(), nil
}

// benchCheckpoint saves the demo model, seeded, as a checkpoint and opens
// it.
func benchCheckpoint(dir string, cfg model.Config) (*checkpoint.Checkpoint, error) {
	m, err := model.New(cfg, model.WithSeed(1))
	if err != nil {
		return nil, err
	}
	snap, err := checkpoint.Capture([]*model.Stage{m.Stage}, nil)
	m.Close()
	if err != nil {
		return nil, err
	}
	if err := checkpoint.Save(dir, snap, checkpoint.WithTokenizer(tokenizer.Byte())); err != nil {
		return nil, err
	}
	return checkpoint.Open(dir)
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// loopSwarm is a swarm in one process on loopback: a researcher (hosts
// 0), a coordinator (1) and stage nodes (2…), real libp2p hosts with
// their stage runtimes; the coordinator's term is fixed.
type loopSwarm struct {
	hosts    []host.Host
	runtimes []*pipeline.Runtime // nil for the coordinator
	coord    *coord.Service

	mu   sync.Mutex
	dead map[peer.ID]bool
	work []job.WorkItem // what the researcher reported, for receipts
}

func newLoopSwarm(stageNodes int) (_ *loopSwarm, err error) {
	s := &loopSwarm{dead: map[peer.ID]bool{}}
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
		s.hosts = append(s.hosts, h)
	}
	for _, a := range s.hosts {
		for _, b := range s.hosts {
			if a != b {
				a.Peerstore().AddAddrs(b.ID(), b.Addrs(), time.Hour)
			}
		}
	}
	coordID := s.hosts[1].ID().String()
	check := func(_ context.Context, p *job.Plan) error {
		if p.Coordinator != coordID {
			return fmt.Errorf("plan signed by %s, not the coordinator", p.Coordinator)
		}
		return nil
	}
	log := quietLogger()
	for i, h := range s.hosts {
		if i == 1 {
			s.runtimes = append(s.runtimes, nil)
			continue
		}
		rt, err := pipeline.NewRuntime(pipeline.RuntimeConfig{Host: h, Check: check, Memory: 4 << 30, Logger: log})
		if err != nil {
			return nil, err
		}
		s.runtimes = append(s.runtimes, rt)
	}
	s.coord, err = coord.New(coord.Config{
		Host: s.hosts[1], Key: coordKey, Logger: log,
		Term: func() (uint64, bool) { return 1, true },
		Offers: func() []coord.Offer {
			s.mu.Lock()
			defer s.mu.Unlock()
			var out []coord.Offer
			for _, h := range s.hosts[2:] {
				if !s.dead[h.ID()] {
					out = append(out, coord.Offer{PeerID: h.ID().String(), GFLOPS: 10, MemoryBytes: 4 << 30})
				}
			}
			return out
		},
		Alive: func(p peer.ID) bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return !s.dead[p]
		},
		HealthInterval: time.Second, Grace: time.Hour,
		OnWork: func(_ uint64, _ string, _, _ uint64, work []job.WorkItem) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.work = append(s.work, work...)
		},
	})
	return s, err
}

// reported sums the work the coordinator was told of, by peer.
func (s *loopSwarm) reported() map[string]job.WorkItem {
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

// client is the researcher's handle on the coordinator.
func (s *loopSwarm) client() *coord.Client {
	return &coord.Client{Host: s.hosts[0], Coordinator: func(context.Context) (peer.ID, error) { return s.hosts[1].ID(), nil }}
}

// kill stops a stage node the hard way: its runtime and host go away.
func (s *loopSwarm) kill(id string) {
	for i, h := range s.hosts {
		if h.ID().String() != id || i < 2 {
			continue
		}
		s.mu.Lock()
		already := s.dead[h.ID()]
		s.dead[h.ID()] = true
		s.mu.Unlock()
		if !already {
			s.runtimes[i].Close()
			h.Close()
		}
	}
}

func (s *loopSwarm) Close() {
	if s.coord != nil {
		s.coord.Close()
	}
	for i, rt := range s.runtimes {
		s.mu.Lock()
		dead := s.dead[s.hosts[i].ID()]
		s.mu.Unlock()
		if rt != nil && !dead {
			rt.Close()
		}
	}
	for _, h := range s.hosts {
		h.Close()
	}
}
