package job

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	lpeer "github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/optim"
)

// signedSpec signs s with a fresh researcher key and returns the signed
// spec and the researcher's id.
func signedSpec(t testing.TB, s Spec) ([]byte, string) {
	key, _, _ := crypto.GenerateEd25519Key(nil)
	id, _ := lpeer.IDFromPrivateKey(key)
	b, err := SignSpec(&s, key)
	if err != nil {
		t.Fatal(err)
	}
	return b, id.String()
}

func testPlan(t *testing.T) (*Plan, crypto.PrivKey) {
	key, _, _ := crypto.GenerateEd25519Key(nil)
	id, _ := lpeer.IDFromPrivateKey(key)
	ss, r := signedSpec(t, testSpec(4))
	return &Plan{
		JobID: "j1", Epoch: 1, Term: 3, Coordinator: id.String(), Researcher: r,
		Spec: testSpec(4), SignedSpec: ss,
		Stages: []StagePlan{
			{Index: 0, First: 0, Last: 2, Replicas: []string{"A"}},
			{Index: 1, First: 2, Last: 4, Replicas: []string{"B", "C"}},
		},
		IssuedAt: time.Unix(1, 0),
	}, key
}

func TestSignOpenPlan(t *testing.T) {
	p, key := testPlan(t)
	b, err := SignPlan(p, key)
	if err != nil {
		t.Fatal(err)
	}
	got, err := OpenPlan(b)
	if err != nil || got.Term != 3 || got.Stages[1].Replicas[1] != "C" {
		t.Fatalf("open: %v %+v", err, got)
	}
	// Tamper with the plan: move a stage to another peer.
	var sp SignedPlan
	json.Unmarshal(b, &sp)
	var q Plan
	json.Unmarshal(sp.Plan, &q)
	q.Stages[0].Replicas = []string{"EVIL"}
	sp.Plan, _ = json.Marshal(q)
	bad, _ := json.Marshal(sp)
	if _, err := OpenPlan(bad); !errors.Is(err, ErrPlanSignature) {
		t.Fatalf("tampered plan: %v", err)
	}
	// A plan signed by a key other than the coordinator it names.
	other, _, _ := crypto.GenerateEd25519Key(nil)
	if _, err := SignPlan(p, other); err == nil {
		t.Fatal("signed a plan naming another coordinator")
	}
}

func TestNeighbours(t *testing.T) {
	p, _ := testPlan(t)
	s, prev, next, ok := p.Neighbours("A")
	if !ok || s != 0 || prev[0] != p.Researcher || len(next) != 2 {
		t.Fatalf("A: %d %v %v %v", s, prev, next, ok)
	}
	s, prev, next, ok = p.Neighbours("C")
	if !ok || s != 1 || prev[0] != "A" || next[0] != p.Researcher {
		t.Fatalf("C: %d %v %v %v", s, prev, next, ok)
	}
	if _, _, _, ok := p.Neighbours("Z"); ok {
		t.Fatal("Z holds no stage")
	}
}

func TestPlanValidate(t *testing.T) {
	p, _ := testPlan(t)
	p.Stages[1].Replicas = []string{"A"}
	if p.Validate() == nil {
		t.Fatal("peer in two stages accepted")
	}
	p, _ = testPlan(t)
	p.Stages[1].First = 3
	if p.Validate() == nil {
		t.Fatal("gap between stages accepted")
	}
}

func FuzzOpenPlan(f *testing.F) {
	p, key := &Plan{}, crypto.PrivKey(nil)
	{
		k, _, _ := crypto.GenerateEd25519Key(nil)
		id, _ := lpeer.IDFromPrivateKey(k)
		ss, r := signedSpec(f, testSpec(1))
		p = &Plan{JobID: "j1", Coordinator: id.String(), Researcher: r, Spec: testSpec(1), SignedSpec: ss, Stages: []StagePlan{{Index: 0, First: 0, Last: 1, Replicas: []string{"A"}}}}
		key = k
	}
	b, _ := SignPlan(p, key)
	f.Add(b)
	f.Add([]byte(`{"plan":"e30=","sig":""}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := OpenPlan(b)
		if err == nil && got.Validate() != nil {
			t.Fatal("accepted an invalid plan")
		}
	})
}

func testSpec(layers int) Spec {
	return Spec{JobID: "j1", Name: "t", Kind: KindTrain,
		Model: model.Config{Vocab: 16, Dim: 8, Layers: layers, Heads: 2, KVHeads: 1, FFNDim: 16, MaxSeq: 8},
		Codec: "fp32", Stages: 1, Replicas: 1, Steps: 1, SeqLen: 4, Rows: 1, Microbatches: 1,
		Optim: optim.DefaultConfig(), Schedule: optim.Schedule{Peak: 1e-3, Total: 1}}
}

func TestSpecValidate(t *testing.T) {
	s := testSpec(2)
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	s.Codec = "subspace"
	if s.Validate() == nil {
		t.Fatal("subspace codec without the model constraint accepted")
	}
	s = testSpec(2)
	s.SeqLen = 9
	if s.Validate() == nil {
		t.Fatal("seq_len past max_seq accepted")
	}
	s = testSpec(2)
	s.JobID = "../etc"
	if s.Validate() == nil {
		t.Fatal("path-like job id accepted")
	}
}
