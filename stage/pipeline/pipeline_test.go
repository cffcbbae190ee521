package pipeline_test

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/data"
	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/model/train"
	"github.com/holopeer/holopeer/stage/optim"
	"github.com/holopeer/holopeer/stage/pipeline"
	"github.com/holopeer/holopeer/stage/pipeline/pipelinetest"
)

// newSwarm starts a researcher, a coordinator and stageNodes stage nodes
// (real libp2p hosts on loopback sockets), each lending 1 GiB, and stops
// them when the test ends.
func newSwarm(t *testing.T, stageNodes int) *pipelinetest.Loopback {
	t.Helper()
	s, err := pipelinetest.New(stageNodes, pipelinetest.Options{Dir: t.TempDir(), Memory: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
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
	defer m.Stage.Close()
	return trainLocal(t, spec, m.Stage)
}

// trainLocal trains st, the whole model, on the job's data in one
// process.
func trainLocal(t *testing.T, spec job.Spec, st *model.Stage) []float64 {
	t.Helper()
	tr, err := train.New([]*model.Stage{st}, train.Config{Optim: spec.Optim, Schedule: spec.Schedule, ClipNorm: spec.ClipNorm})
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

func runDriver(t *testing.T, s *pipelinetest.Loopback, spec job.Spec, cfg pipeline.DriverConfig, during func(p pipeline.Progress)) []float64 {
	t.Helper()
	var losses []float64
	cfg.Spec = spec
	cfg.NewSource = synthetic(11)
	cfg.Progress = func(p pipeline.Progress) {
		for len(losses) >= p.Step { // a rollback re-runs steps
			losses = losses[:len(losses)-1]
		}
		losses = append(losses, p.Loss)
		if during != nil {
			during(p)
		}
	}
	d, err := s.Researcher().NewDriver(cfg, s.Client())
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
	got := runDriver(t, s, spec, pipeline.DriverConfig{}, nil)
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
	got := runDriver(t, s, spec, pipeline.DriverConfig{}, nil)
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
	perm, _ := pipeline.NewPermutation(spec.Model.Vocab, pipeline.NewSecret())
	var maxResid float64
	got := runDriver(t, s, spec, pipeline.DriverConfig{Pseudonyms: perm}, func(p pipeline.Progress) { maxResid = max(maxResid, p.Residual) })
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
	dir := t.TempDir()
	steplog := filepath.Join(dir, "researcher-steps.jsonl")
	killed := false
	got := runDriver(t, s, spec, pipeline.DriverConfig{StepLog: steplog, Checkpoints: &pipeline.DiskStore{Dir: filepath.Join(dir, "ckpt")}}, func(p pipeline.Progress) {
		if p.Step == 3 && !killed {
			killed = true
			if err := s.Kill(p.Plan.Stages[1].Replicas[0]); err != nil {
				t.Error(err)
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
	events, err := pipeline.ReadStepLog(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	committed, err := pipeline.CheckExactlyOnce(events)
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

// TestExportStreams: the final model streamed from the shard files
// (ExportSources, as holopeer run writes it) holds exactly the tensors the
// whole-model assembly captures: dense, and subspace with pseudonyms (the
// embedding and head rows back in real order, the factors as trained).
func TestExportStreams(t *testing.T) {
	for _, codecName := range []string{"fp32", "subspace"} {
		t.Run(codecName, func(t *testing.T) {
			spec := testSpec(3, 1, codecName)
			spec.Steps, spec.Schedule.Total, spec.CheckpointInterval = 4, 4, 2
			var perm *pipeline.Permutation
			if codecName == "subspace" {
				perm, _ = pipeline.NewPermutation(spec.Model.Vocab, pipeline.NewSecret())
			}
			s := newSwarm(t, 3)
			dir := t.TempDir()
			store := &pipeline.DiskStore{Dir: filepath.Join(dir, "ckpt")}
			var plan *job.Plan
			runDriver(t, s, spec, pipeline.DriverConfig{Checkpoints: store, Pseudonyms: perm}, func(p pipeline.Progress) { plan = p.Plan })
			e, err := pipeline.ExportSources(store, plan, perm)
			if err != nil {
				t.Fatal(err)
			}
			streamed := filepath.Join(dir, "streamed")
			if err := checkpoint.SaveSources(streamed, spec.Model, e.Dense, e.Factors); err != nil {
				t.Fatal(err)
			}
			e.Close()
			stages, _, err := pipeline.AssembleStages(store, plan)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				for _, st := range stages {
					st.Close()
				}
			}()
			snap, err := checkpoint.Capture(stages, nil)
			if err != nil {
				t.Fatal(err)
			}
			ck, err := checkpoint.Open(streamed)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			a, err := ck.LoadStage(ck.Config(), model.Whole(ck.Config()))
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			got := map[string][]float32{}
			for _, x := range a.Tensors() {
				got[x.Name] = x.Data
			}
			if len(got) != len(snap.Dense) {
				t.Fatalf("streamed %d tensors, assembled %d", len(got), len(snap.Dense))
			}
			for _, x := range snap.Dense {
				want := x.Data
				if perm != nil && (x.Name == model.NameEmbed || x.Name == model.NameHead) {
					want = realOrder(perm, x)
				}
				if !slices.Equal(got[x.Name], want) {
					t.Fatalf("%s differs between the streamed and the assembled export", x.Name)
				}
			}
			if perm != nil {
				tc := ck.TrainingConfig()
				if !tc.Subspace.Enabled() {
					t.Fatal("the export lost the subspace config")
				}
				f, err := ck.LoadStage(tc, model.Whole(tc))
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				byName := map[string][]float32{}
				for _, x := range f.Tensors() {
					byName[x.Name] = x.Data
				}
				for _, x := range snap.Factors {
					if !slices.Equal(byName[x.Name], x.Data) {
						t.Fatalf("factor %s differs", x.Name)
					}
				}
			}
		})
	}
}

// realOrder moves the rows of a pseudonym-ordered vocabulary tensor to
// real token order.
func realOrder(perm *pipeline.Permutation, x model.HostTensor) []float32 {
	rows, cols := x.Shape[0], x.Shape[1]
	ids := make([]int32, rows)
	for r := range ids {
		ids[r] = int32(r)
	}
	ps := perm.Apply(ids)
	out := make([]float32, len(x.Data))
	for r := range rows {
		copy(out[r*cols:(r+1)*cols], x.Data[int(ps[r])*cols:(int(ps[r])+1)*cols])
	}
	return out
}

// TestPipelineSubspaceSameSeedSameLosses: two swarm runs of one subspace
// job under the same seed and pseudonym secret give the same losses bit
// for bit. (A new secret renames the rows of the fixed embedding E_fix,
// which the stages index by pseudonym, so it starts another model: runs
// are reproducible for a given seed and secret, the pair holopeer run
// keeps in its output directory.)
func TestPipelineSubspaceSameSeedSameLosses(t *testing.T) {
	spec := testSpec(3, 1, "subspace")
	spec.Steps, spec.Schedule.Total = 3, 3
	secret := pipeline.NewSecret()
	var runs [][]float64
	for range 2 {
		s := newSwarm(t, 3)
		perm, _ := pipeline.NewPermutation(spec.Model.Vocab, secret)
		runs = append(runs, runDriver(t, s, spec, pipeline.DriverConfig{Pseudonyms: perm}, nil))
	}
	if !slices.Equal(runs[0], runs[1]) {
		t.Fatalf("same seed and secret, two runs: losses %v and %v", runs[0], runs[1])
	}
}
