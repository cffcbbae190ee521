package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/gossip/coord"
	"github.com/holopeer/holopeer/stage/data"
	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/model/train"
	"github.com/holopeer/holopeer/stage/optim"
)

// swarm is a researcher, a coordinator and stage nodes: real libp2p hosts
// on loopback sockets.
type swarm struct {
	t        *testing.T
	hosts    []host.Host // 0: researcher, 1: coordinator, 2…: stage nodes
	runtimes []*Runtime
	coordSvc *coord.Service
	coordKey crypto.PrivKey
	dir      string
	mu       sync.Mutex
	dead     map[peer.ID]bool
}

func newSwarm(t *testing.T, stageNodes int) *swarm {
	t.Helper()
	s := &swarm{t: t, dir: t.TempDir(), dead: map[peer.ID]bool{}}
	for i := 0; i < stageNodes+2; i++ {
		key, _, _ := crypto.GenerateEd25519Key(nil)
		if i == 1 {
			s.coordKey = key
		}
		h, err := libp2p.New(libp2p.Identity(key), libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableMetrics())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
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
	for i, h := range s.hosts {
		if i == 1 {
			s.runtimes = append(s.runtimes, nil)
			continue
		}
		rt, err := NewRuntime(RuntimeConfig{Host: h, Check: check, DataDir: filepath.Join(s.dir, fmt.Sprint(i)), Memory: 1 << 30})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rt.Close() })
		s.runtimes = append(s.runtimes, rt)
	}
	svc, err := coord.New(coord.Config{
		Host: s.hosts[1], Key: s.coordKey,
		Term:   func() (uint64, bool) { return 1, true },
		Offers: s.offers,
		Alive: func(p peer.ID) bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return !s.dead[p]
		},
		HealthInterval: 200 * time.Millisecond, Grace: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	s.coordSvc = svc
	return s
}

func (s *swarm) offers() []coord.Offer {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []coord.Offer
	for _, h := range s.hosts[2:] {
		if s.dead[h.ID()] {
			continue
		}
		out = append(out, coord.Offer{PeerID: h.ID().String(), GFLOPS: 10, MemoryBytes: 1 << 30})
	}
	return out
}

// kill stops a stage node the hard way: its runtime and host go away.
func (s *swarm) kill(i int) {
	s.mu.Lock()
	s.dead[s.hosts[i].ID()] = true
	s.mu.Unlock()
	s.runtimes[i].Close()
	s.hosts[i].Close()
}

func (s *swarm) client() *coord.Client {
	return &coord.Client{Host: s.hosts[0], Coordinator: func(context.Context) (peer.ID, error) { return s.hosts[1].ID(), nil }}
}

func testSpec(stages, replicas int, codecName string) job.Spec {
	cfg := model.Config{Vocab: 257, Dim: 32, Layers: 4, Heads: 4, KVHeads: 2, FFNDim: 64, MaxSeq: 16}
	if codecName == "subspace" {
		cfg.Subspace = model.SubspaceConfig{Rank: 8, Seed: 5}
	}
	return job.Spec{
		JobID: job.NewJobID("t"), Name: "t", Kind: job.KindTrain, Model: cfg, InitSeed: 3,
		Codec: codecName, Stages: stages, Replicas: replicas,
		Steps: 6, SeqLen: 16, Rows: 2, Microbatches: 4,
		Optim:    optim.DefaultConfig(),
		Schedule: optim.Schedule{Peak: 3e-3, Min: 3e-4, Warmup: 2, Total: 6},
		ClipNorm: 1, CheckpointInterval: 2,
	}
}

func synthetic(seed uint64) func() (data.Source, error) {
	return func() (data.Source, error) {
		cfg := data.DefaultSyntheticConfig()
		cfg.Seed = seed
		return data.NewSynthetic(cfg)
	}
}

// localLosses trains the same job in one process: the reference.
func localLosses(t *testing.T, spec job.Spec) []float64 {
	m, err := model.New(spec.Model, model.WithSeed(spec.InitSeed))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := train.New([]*model.Stage{m.Stage}, train.Config{Optim: spec.Optim, Schedule: spec.Schedule, ClipNorm: spec.ClipNorm})
	if err != nil {
		t.Fatal(err)
	}
	src, _ := synthetic(11)()
	var out []float64
	for k := 0; k < spec.Steps; k++ {
		mbs := make([]model.Input, spec.Microbatches)
		for i := range mbs {
			in, tg, _ := src.Next(spec.Rows, spec.SeqLen)
			mbs[i] = model.Input{Batch: spec.Rows, Seq: spec.SeqLen, Tokens: in, Targets: tg}
		}
		res, err := tr.Step(context.Background(), mbs)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, res.Loss)
	}
	return out
}

func runDriver(t *testing.T, s *swarm, spec job.Spec, cfg DriverConfig, during func(p Progress)) []float64 {
	t.Helper()
	var losses []float64
	cfg.Spec = spec
	cfg.NewSource = synthetic(11)
	cfg.Progress = func(p Progress) {
		for len(losses) >= p.Step { // a rollback re-runs steps
			losses = losses[:len(losses)-1]
		}
		losses = append(losses, p.Loss)
		if during != nil {
			during(p)
		}
	}
	d, err := s.runtimes[0].NewDriver(cfg, s.client())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := d.Run(ctx); err != nil {
		t.Fatal(err)
	}
	return losses
}

// TestPipelineMatchesLocal: four stage nodes, dense fp32 codec, one
// replica each: the loss curve equals the single-process trainer's.
func TestPipelineMatchesLocal(t *testing.T) {
	spec := testSpec(4, 1, "fp32")
	want := localLosses(t, spec)
	s := newSwarm(t, 4)
	got := runDriver(t, s, spec, DriverConfig{}, nil)
	if len(got) != len(want) {
		t.Fatalf("%d steps, want %d", len(got), len(want))
	}
	for i := range want {
		if rel := math.Abs(got[i]-want[i]) / want[i]; rel > 1e-5 {
			t.Fatalf("step %d: pipeline loss %.7f, local %.7f (rel %.2g)", i+1, got[i], want[i], rel)
		}
	}
	t.Logf("losses %v", got)
}

// TestPipelineReplicas: two stages of two replicas each average their
// gradients and still follow the local trainer.
func TestPipelineReplicas(t *testing.T) {
	spec := testSpec(2, 2, "fp32")
	want := localLosses(t, spec)
	s := newSwarm(t, 4)
	got := runDriver(t, s, spec, DriverConfig{}, nil)
	for i := range want {
		if rel := math.Abs(got[i]-want[i]) / want[i]; rel > 1e-4 {
			t.Fatalf("step %d: pipeline loss %.7f, local %.7f", i+1, got[i], want[i])
		}
	}
}

// TestPipelineSubspace: the subspace codec with pseudonymised ids trains.
func TestPipelineSubspace(t *testing.T) {
	spec := testSpec(3, 1, "subspace")
	spec.Steps, spec.Schedule.Total = 10, 10
	s := newSwarm(t, 3)
	perm, _ := NewPermutation(spec.Model.Vocab, NewSecret())
	var maxResid float64
	got := runDriver(t, s, spec, DriverConfig{Pseudonyms: perm}, func(p Progress) { maxResid = max(maxResid, p.Residual) })
	if got[len(got)-1] >= got[0] {
		t.Fatalf("loss did not fall: %v", got)
	}
	if maxResid > 1e-4 {
		t.Fatalf("subspace residual %g", maxResid)
	}
	t.Logf("losses %v, max residual %.2g", got, maxResid)
}

// TestPipelineSurvivesStageLoss: a stage node dies mid-run; the spare
// takes its stage from the last checkpoint, and every step is committed
// exactly once.
func TestPipelineSurvivesStageLoss(t *testing.T) {
	spec := testSpec(3, 1, "fp32")
	want := localLosses(t, spec)
	s := newSwarm(t, 4) // three stages and a spare
	steplog := filepath.Join(s.dir, "researcher-steps.jsonl")
	killed := false
	got := runDriver(t, s, spec, DriverConfig{StepLog: steplog, Checkpoints: &DiskStore{Dir: filepath.Join(s.dir, "ckpt")}}, func(p Progress) {
		if p.Step == 3 && !killed {
			killed = true
			victim := p.Plan.Stages[1].Replicas[0]
			for i, h := range s.hosts {
				if h.ID().String() == victim {
					s.kill(i)
				}
			}
		}
	})
	if !killed {
		t.Fatal("no node was killed")
	}
	for i := range want {
		if rel := math.Abs(got[i]-want[i]) / want[i]; rel > 1e-5 {
			t.Fatalf("step %d: loss %.7f after recovery, local %.7f", i+1, got[i], want[i])
		}
	}
	b, err := os.ReadFile(steplog)
	if err != nil {
		t.Fatal(err)
	}
	events, err := ReadStepLog(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	committed, err := CheckExactlyOnce(events)
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if len(committed) != spec.Steps {
		t.Fatalf("committed %d steps, want %d", len(committed), spec.Steps)
	}
	rollbacks := 0
	for _, e := range events {
		if e.Event == "rollback" {
			rollbacks++
		}
	}
	if rollbacks != 1 {
		t.Fatalf("%d rollbacks in the step log", rollbacks)
	}
}
