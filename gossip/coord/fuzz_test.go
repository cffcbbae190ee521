package coord_test

import (
	"encoding/json"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	lpeer "github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/gossip/coord"
	"github.com/holopeer/holopeer/stage/job"
)

// FuzzDecodeRequest feeds the coordinator's request decoder, and the
// signed spec and plan openers a submit and a replan go through, arbitrary
// bytes: nothing may panic, and what decodes must be within bounds and
// what opens must be bound to its signer.
func FuzzDecodeRequest(f *testing.F) {
	key, _, _ := crypto.GenerateEd25519Key(nil)
	id, _ := lpeer.IDFromPrivateKey(key)
	spec := testSpec()
	ss, err := job.SignSpec(&spec, key)
	if err != nil {
		f.Fatal(err)
	}
	p := &job.Plan{JobID: spec.JobID, Epoch: 1, Gen: 1, StartStep: 1, Term: 1, Coordinator: id.String(), Researcher: id.String(),
		Spec: spec, SignedSpec: ss, Stages: []job.StagePlan{{Index: 0, First: 0, Last: 1, Replicas: []string{"A"}}, {Index: 1, First: 1, Last: 2, Replicas: []string{"B"}}}}
	plan, err := job.SignPlan(p, key)
	if err != nil {
		f.Fatal(err)
	}
	for _, r := range []coord.Request{
		{Op: "submit", SignedSpec: ss},
		{Op: "replan", JobID: spec.JobID, Epoch: 100, Plan: plan},
		{Op: "work", JobID: spec.JobID, From: 1, To: 2, Work: []job.WorkItem{{Peer: "A", ComputeS: 1, Tokens: 2}}},
		{Op: "release", JobID: spec.JobID},
	} {
		b, _ := json.Marshal(r)
		f.Add(b)
	}
	f.Add([]byte(`{"op":"replan","plan":"bnVsbA=="}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := coord.DecodeRequest(b)
		if err != nil {
			return
		}
		if len(req.Work) > 4096 || len(req.Plan) > job.MaxPlanBytes || len(req.SignedSpec) > job.MaxSignedSpecBytes {
			t.Fatalf("decoded an out-of-bounds request")
		}
		if s, r, err := job.OpenSpec(req.SignedSpec); err == nil && (s.Validate() != nil || r == "") {
			t.Fatal("opened an invalid signed spec")
		}
		if q, err := job.OpenPlan(req.Plan); err == nil {
			if q.Validate() != nil || job.SameJob(q, q) != nil {
				t.Fatal("opened an invalid plan")
			}
			if _, r, err := job.OpenSpec(q.SignedSpec); err != nil || r != q.Researcher {
				t.Fatal("opened a plan not bound to its researcher's spec")
			}
		}
	})
}
