package pipeline_test

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/checkpoint/checkpointtest"
	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/pipeline"
)

// pretrained writes a checkpoint of spec's model from another seed than
// the job's, so a run that ignored it would start elsewhere.
func pretrained(t *testing.T, spec job.Spec) *checkpoint.Checkpoint {
	t.Helper()
	m, err := model.New(spec.Model, model.WithSeed(spec.InitSeed+1000))
	if err != nil {
		t.Fatal(err)
	}
	dir := checkpointtest.Save(t, filepath.Join(t.TempDir(), "pretrained"), []*model.Stage{m.Stage})
	m.Stage.Close()
	ck, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	return ck
}

// localFineTune trains spec in one process from ck: the reference.
func localFineTune(t *testing.T, spec job.Spec, ck *checkpoint.Checkpoint) []float64 {
	t.Helper()
	st, err := ck.LoadStage(spec.Model, model.Span{First: 0, Last: spec.Model.Layers, Embed: true, Head: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	return trainLocal(t, spec, st)
}

func sameLosses(t *testing.T, got, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d steps, want %d", len(got), len(want))
	}
	for i := range want {
		if rel := math.Abs(got[i]-want[i]) / want[i]; rel > tol {
			t.Fatalf("step %d: swarm loss %.7f, local %.7f (rel %.2g)", i+1, got[i], want[i], rel)
		}
	}
}

// TestFineTuneStartsFromCheckpoint: a swarm job with model.checkpoint
// starts every stage from that checkpoint's tensors, each stage node
// receiving only its own blocks, and its losses, the first included,
// equal the single-process trainer's from the same checkpoint.
func TestFineTuneStartsFromCheckpoint(t *testing.T) {
	spec := testSpec(3, 1, "fp32")
	spec.FromCheckpoint = true
	ck := pretrained(t, spec)
	want := localFineTune(t, spec, ck)
	if seed := localLosses(t, spec); math.Abs(seed[0]-want[0]) < 1e-3 {
		t.Fatalf("the checkpoint starts where the seed does (%.5f): the test could not tell them apart", want[0])
	}
	s := newSwarm(t, 3)
	got := runDriver(t, s, spec, pipeline.DriverConfig{Weights: ck}, nil)
	sameLosses(t, got, want, 1e-5)
	t.Logf("first loss %.6f (swarm) = %.6f (local)", got[0], want[0])
}

// TestStageLostBeforeFirstCheckpoint: a stage node dies before the first
// checkpoint; the spare restarts from the job's initial weights (the
// seed's, or the pretrained checkpoint's) and the run goes on to the
// same losses as a run without the fault.
func TestStageLostBeforeFirstCheckpoint(t *testing.T) {
	for _, fromCheckpoint := range []bool{false, true} {
		name := map[bool]string{false: "seed", true: "checkpoint"}[fromCheckpoint]
		t.Run(name, func(t *testing.T) {
			spec := testSpec(3, 1, "fp32")
			spec.CheckpointInterval = 4
			var cfg pipeline.DriverConfig
			var want []float64
			if fromCheckpoint {
				spec.FromCheckpoint = true
				cfg.Weights = pretrained(t, spec)
				want = localFineTune(t, spec, cfg.Weights.(*checkpoint.Checkpoint))
			} else {
				want = localLosses(t, spec)
			}
			s := newSwarm(t, 4)
			killed := false
			got := runDriver(t, s, spec, cfg, func(p pipeline.Progress) {
				if p.Step == 1 && !killed {
					killed = true
					if err := s.Kill(p.Plan.Stages[1].Replicas[0]); err != nil {
						t.Error(err)
					}
				}
			})
			if !killed {
				t.Fatal("no node was killed")
			}
			sameLosses(t, got, want, 1e-5)
		})
	}
}
