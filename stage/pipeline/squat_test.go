package pipeline_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/pipeline"
)

// TestStageRefusesSquatAndHijack performs, against one stage node's real
// runtime, the stage side of issue 16 findings 1 and 9b: plans signed by
// the current term's coordinator that stack four jobs on a node lending
// 512 MiB, and a later plan of a running job that names another
// researcher (its own signed spec of the same job id) or moves its block
// spans. The node must take jobs only while they fit its lend together,
// and refuse the changed job, keeping the genuine one.
func TestStageRefusesSquatAndHijack(t *testing.T) {
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableMetrics())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	coordKey, _, _ := crypto.GenerateEd25519Key(nil)
	coordID, _ := peer.IDFromPrivateKey(coordKey)
	check := func(_ context.Context, p *job.Plan) error {
		if p.Coordinator != coordID.String() {
			return errors.New("not the coordinator")
		}
		return nil
	}
	const lend = 512 << 20
	rt, err := pipeline.NewRuntime(pipeline.RuntimeConfig{Host: h, Check: check, Memory: lend, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	other, _, _ := crypto.GenerateEd25519Key(nil) // the next stage's node
	otherID, _ := peer.IDFromPrivateKey(other)
	plan := func(spec job.Spec, researcher crypto.PrivKey, epoch uint64, stages []job.StagePlan) (*job.Plan, []byte) {
		t.Helper()
		rid, _ := peer.IDFromPrivateKey(researcher)
		ss, err := job.SignSpec(&spec, researcher)
		if err != nil {
			t.Fatal(err)
		}
		p := &job.Plan{JobID: spec.JobID, Epoch: epoch, Gen: 1, StartStep: 1, Term: 1, Coordinator: coordID.String(),
			Researcher: rid.String(), Spec: spec, SignedSpec: ss, Stages: stages}
		b, err := job.SignPlan(p, coordKey)
		if err != nil {
			t.Fatal(err)
		}
		return p, b
	}
	spans := func(cut int) []job.StagePlan {
		return []job.StagePlan{
			{Index: 0, First: 0, Last: cut, Replicas: []string{h.ID().String()}},
			{Index: 1, First: cut, Last: 4, Replicas: []string{otherID.String()}},
		}
	}

	var used uint64
	var took []*job.Plan
	for i := range 4 {
		key, _, _ := crypto.GenerateEd25519Key(nil)
		p, b := plan(smallSpec("squat", 4, 32, 1000), key, 1, spans(2))
		need := p.Spec.LayerBytes(2)*2 + p.Spec.StageBytes()
		err := rt.Assign(ctx, b, "")
		switch fits := used+need <= lend; {
		case fits && err != nil:
			t.Fatalf("job %d (%d MiB on top of %d) refused: %v", i, need>>20, used>>20, err)
		case !fits && !errors.Is(err, pipeline.ErrRefused):
			t.Fatalf("job %d took the node to %d MiB of a %d MiB lend: %v", i, (used+need)>>20, lend>>20, err)
		case fits:
			used += need
			took = append(took, p)
		}
	}
	if len(took) == 0 || len(took) == 4 {
		t.Fatalf("the node took %d of 4 jobs; the test wants some to fit and some not", len(took))
	}
	if n := len(rt.Jobs()); n != len(took) {
		t.Fatalf("the node runs %d jobs, took %d", n, len(took))
	}

	// The hijack of a running job: same id, a spec the thief signed.
	victim := took[0]
	thief, _, _ := crypto.GenerateEd25519Key(nil)
	_, b := plan(victim.Spec, thief, 101, victim.Stages)
	if err := rt.Assign(ctx, b, ""); !errors.Is(err, pipeline.ErrRefused) || !strings.Contains(err.Error(), job.ErrJobChanged.Error()) {
		t.Fatalf("a plan handing the job to another researcher: %v", err)
	}
	// The same researcher's spec, but the blocks moved, in a later term.
	p := *victim
	p.Epoch, p.Term, p.Stages = 102, 2, spans(1)
	b, err = job.SignPlan(&p, coordKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Assign(ctx, b, ""); !errors.Is(err, pipeline.ErrRefused) || !strings.Contains(err.Error(), job.ErrJobChanged.Error()) {
		t.Fatalf("a plan moving the blocks: %v", err)
	}
	if n := len(rt.Jobs()); n != len(took) {
		t.Fatalf("the node runs %d jobs after the refusals, want %d", n, len(took))
	}
}
