package job

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	lpeer "github.com/libp2p/go-libp2p/core/peer"
)

// MaxPlanBytes bounds an encoded signed plan.
const MaxPlanBytes = 2 << 20

// Plan is the coordinator's placement of one job. Every field a stage
// acts on is covered by the signature. Term is the coordinator's election
// term: the fencing token every peer checks against the newest term it has
// accepted. Epoch counts re-signings of the same job (a re-plan, or a new
// coordinator adopting the job), so a stage can tell the newest plan; Gen
// counts placements only and names the job's links, so links survive a
// change of coordinator.
type Plan struct {
	JobID string `json:"job_id"`
	Epoch uint64 `json:"epoch"`
	Gen   uint64 `json:"gen"` // placement version: changes when a stage moves, and names the job's links
	// StartStep is the first step this placement trains (1, or the step
	// after the checkpoint a recovery resumes from): links refuse frames
	// of earlier steps.
	StartStep   uint64 `json:"start_step"`
	Term        uint64 `json:"term"`
	Coordinator string `json:"coordinator"`
	Researcher  string `json:"researcher"`
	Spec        Spec   `json:"spec"` // what every stage needs to know of the job
	// SignedSpec is Spec as its researcher signed it (SignSpec): the plan
	// opens only if Researcher signed it and Spec is what they signed.
	SignedSpec []byte      `json:"signed_spec"`
	Stages     []StagePlan `json:"stages"`
	Spares     []string    `json:"spares,omitempty"`
	IssuedAt   time.Time   `json:"issued_at"`
}

// Neighbours returns who peer p exchanges activations with in this plan:
// the replicas of the previous stage (the researcher before stage 0) and
// of the next stage (the researcher after the last). ok is false when p
// holds no stage.
func (p *Plan) Neighbours(peer string) (stage int, prev, next []string, ok bool) {
	for i, s := range p.Stages {
		if !slices.Contains(s.Replicas, peer) {
			continue
		}
		prev = []string{p.Researcher}
		if i > 0 {
			prev = p.Stages[i-1].Replicas
		}
		next = []string{p.Researcher}
		if i+1 < len(p.Stages) {
			next = p.Stages[i+1].Replicas
		}
		return i, prev, next, true
	}
	return -1, nil, nil, false
}

// StagePlan is one block-holding stage: blocks [First, Last) on each of
// its replicas.
type StagePlan struct {
	Index    int      `json:"index"`
	First    int      `json:"first"`
	Last     int      `json:"last"`
	Replicas []string `json:"replicas"`
}

// StageOf returns the stage peer holds, or -1.
func (p *Plan) StageOf(peer string) int {
	i, _, _, ok := p.Neighbours(peer)
	if !ok {
		return -1
	}
	return i
}

// Validate checks the plan's shape (not its signature).
func (p *Plan) Validate() error {
	switch {
	case p.JobID == "" || p.Coordinator == "" || p.Researcher == "":
		return errors.New("plan: missing job id, coordinator or researcher")
	case p.Spec.JobID != p.JobID:
		return fmt.Errorf("plan: spec is for job %q, plan for %q", p.Spec.JobID, p.JobID)
	case len(p.Stages) == 0 || len(p.Stages) > 256:
		return fmt.Errorf("plan: %d stages", len(p.Stages))
	}
	seen := map[string]bool{p.Researcher: true}
	next := 0
	for i, s := range p.Stages {
		if s.Index != i || s.First != next || s.Last <= s.First || len(s.Replicas) == 0 || len(s.Replicas) > 16 {
			return fmt.Errorf("plan: stage %d malformed: %+v", i, s)
		}
		next = s.Last
		for _, r := range s.Replicas {
			if seen[r] {
				return fmt.Errorf("plan: peer %s appears twice", r)
			}
			seen[r] = true
		}
	}
	if next != p.Spec.Model.Layers {
		return fmt.Errorf("plan: stages cover %d of %d blocks", next, p.Spec.Model.Layers)
	}
	return nil
}

// SignedPlan is a plan with the coordinator's signature over its bytes.
type SignedPlan struct {
	Plan      []byte `json:"plan"` // JSON of Plan, signed as is
	Signature []byte `json:"sig"`
}

const planDomain = "holopeer-plan-v1:"

// SignPlan encodes and signs p with the coordinator's identity key.
func SignPlan(p *Plan, key crypto.PrivKey) ([]byte, error) {
	id, err := lpeer.IDFromPrivateKey(key)
	if err != nil {
		return nil, err
	}
	if id.String() != p.Coordinator {
		return nil, fmt.Errorf("plan: signing key is %s, plan names coordinator %s", id, p.Coordinator)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if err := p.checkSpec(); err != nil {
		return nil, err
	}
	body, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	sig, err := key.Sign(append([]byte(planDomain), body...))
	if err != nil {
		return nil, fmt.Errorf("plan: sign: %w", err)
	}
	return json.Marshal(SignedPlan{Plan: body, Signature: sig})
}

// ErrPlanSignature is returned for a plan not signed by the coordinator it
// names.
var ErrPlanSignature = errors.New("plan: bad signature")

// OpenPlan checks the signature of an encoded signed plan against the
// coordinator it names, and its signed spec against its researcher, and
// returns the plan. Whether that peer was
// coordinator in the plan's term is the caller's check (the election
// state knows).
func OpenPlan(b []byte) (*Plan, error) {
	if len(b) > MaxPlanBytes {
		return nil, fmt.Errorf("plan: %d bytes exceeds %d", len(b), MaxPlanBytes)
	}
	var sp SignedPlan
	if err := json.Unmarshal(b, &sp); err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	var p Plan
	if err := json.Unmarshal(sp.Plan, &p); err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if err := p.Spec.Validate(); err != nil {
		return nil, err
	}
	if err := p.checkSpec(); err != nil {
		return nil, err
	}
	id, err := lpeer.Decode(p.Coordinator)
	if err != nil {
		return nil, fmt.Errorf("plan: coordinator id: %w", err)
	}
	pub, err := id.ExtractPublicKey()
	if err != nil {
		return nil, fmt.Errorf("plan: coordinator key: %w", err)
	}
	ok, err := pub.Verify(append([]byte(planDomain), sp.Plan...), sp.Signature)
	if err != nil || !ok {
		return nil, fmt.Errorf("%w (coordinator %s)", ErrPlanSignature, short(p.Coordinator))
	}
	return &p, nil
}

func short(id string) string {
	if len(id) > 16 {
		return id[:6] + "…" + id[len(id)-6:]
	}
	return id
}
