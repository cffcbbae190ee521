package job

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	lpeer "github.com/libp2p/go-libp2p/core/peer"
)

// TestPlanBoundToSignedSpec: a coordinator (honest or not) cannot name
// another researcher than the key that signed the spec, nor change the
// spec it signed, and a forged spec signature does not open.
func TestPlanBoundToSignedSpec(t *testing.T) {
	p, key := testPlan(t)
	if _, err := SignPlan(p, key); err != nil {
		t.Fatal(err)
	}

	// The hijack: the same signed spec, another researcher.
	thief, _, _ := crypto.GenerateEd25519Key(nil)
	tid, _ := lpeer.IDFromPrivateKey(thief)
	q := *p
	q.Researcher = tid.String()
	if _, err := SignPlan(&q, key); !errors.Is(err, ErrSpecMismatch) {
		t.Fatalf("plan naming another researcher: %v", err)
	}
	// The thief signs the genuine spec bytes' body itself: it then owns a
	// different job (its own signature), so the plan still names it; but
	// a plan claiming the victim's spec with the thief's signature fails.
	var ss SignedSpec
	_ = json.Unmarshal(p.SignedSpec, &ss)
	ss.Researcher = tid.String()
	q = *p
	q.Researcher = tid.String()
	q.SignedSpec, _ = json.Marshal(ss)
	if _, err := SignPlan(&q, key); !errors.Is(err, ErrSpecSignature) {
		t.Fatalf("victim's signature under the thief's name: %v", err)
	}

	// A changed spec: more steps than the researcher signed.
	q = *p
	q.Spec.Steps++
	if _, err := SignPlan(&q, key); !errors.Is(err, ErrSpecMismatch) {
		t.Fatalf("changed spec: %v", err)
	}
	// And OpenPlan checks the same, on a plan signed without SignPlan.
	body, _ := json.Marshal(&q)
	sig, _ := key.Sign(append([]byte(planDomain), body...))
	b, _ := json.Marshal(SignedPlan{Plan: body, Signature: sig})
	if _, err := OpenPlan(b); !errors.Is(err, ErrSpecMismatch) {
		t.Fatalf("open a plan with a changed spec: %v", err)
	}
	q = *p
	q.SignedSpec = nil
	body, _ = json.Marshal(&q)
	sig, _ = key.Sign(append([]byte(planDomain), body...))
	b, _ = json.Marshal(SignedPlan{Plan: body, Signature: sig})
	if _, err := OpenPlan(b); !errors.Is(err, ErrSpecMismatch) {
		t.Fatalf("open a plan with no signed spec: %v", err)
	}
}

func TestSameJob(t *testing.T) {
	p, _ := testPlan(t)
	p.Gen = p.Epoch
	q := *p
	q.Epoch, q.Gen = 2, 2
	q.Stages = []StagePlan{p.Stages[0], {Index: 1, First: 2, Last: 4, Replicas: []string{"D"}}}
	if err := SameJob(p, &q); err != nil {
		t.Fatalf("a stage moved to another node: %v", err)
	}
	q.Stages = []StagePlan{{Index: 0, First: 0, Last: 1, Replicas: []string{"A"}}, {Index: 1, First: 1, Last: 4, Replicas: []string{"B"}}}
	if err := SameJob(p, &q); err != nil {
		t.Fatalf("the coordinator's own placement retry: %v", err)
	}
	q.Term++ // a later coordinator (or term) reshaping the job
	if err := SameJob(p, &q); !errors.Is(err, ErrJobChanged) {
		t.Fatalf("moved block span: %v", err)
	}
	q.Term, q.Gen = p.Term, 1 // the same coordinator, re-signing later
	if err := SameJob(p, &q); !errors.Is(err, ErrJobChanged) {
		t.Fatalf("moved block span in a re-plan: %v", err)
	}
	q.Gen, q.StartStep = 2, 7 // the same coordinator, after a recovery
	if err := SameJob(p, &q); !errors.Is(err, ErrJobChanged) {
		t.Fatalf("moved block span after training began: %v", err)
	}
	other, _ := testPlan(t) // same spec, signed by another researcher
	q = *p
	q.Researcher, q.SignedSpec = other.Researcher, other.SignedSpec
	if err := SameJob(p, &q); !errors.Is(err, ErrJobChanged) {
		t.Fatalf("changed researcher: %v", err)
	}
}

func FuzzOpenSpec(f *testing.F) {
	b, _ := signedSpec(f, testSpec(2))
	f.Add(b)
	f.Add([]byte(`{"spec":"e30=","researcher":"x","sig":""}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, r, err := OpenSpec(b)
		if err != nil {
			return
		}
		if s.Validate() != nil || r == "" {
			t.Fatal("opened an invalid spec")
		}
	})
}
