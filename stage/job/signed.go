package job

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/libp2p/go-libp2p/core/crypto"
	lpeer "github.com/libp2p/go-libp2p/core/peer"
)

// A job belongs to the key that submitted it: the researcher signs its
// Spec with its libp2p identity key, every plan of the job carries that
// signed spec, and a plan whose researcher is not the spec's signer does
// not open. No coordinator can then hand a job to another "researcher".

// MaxSignedSpecBytes bounds an encoded signed spec.
const MaxSignedSpecBytes = 64 << 10

// SignedSpec is a spec with its researcher's signature over its bytes.
type SignedSpec struct {
	Spec       []byte `json:"spec"`       // JSON of Spec, signed as is
	Researcher string `json:"researcher"` // peer id of the signing key
	Signature  []byte `json:"sig"`
}

const specDomain = "holopeer-spec-v1:"

// Errors a signed spec fails with.
var (
	ErrSpecSignature = errors.New("job: bad spec signature")
	// ErrSpecMismatch is returned for a plan whose spec or researcher
	// differs from the signed spec it carries.
	ErrSpecMismatch = errors.New("job: plan does not match its signed spec")
)

// SignSpec encodes s and signs it with the researcher's identity key.
func SignSpec(s *Spec, key crypto.PrivKey) ([]byte, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	id, err := lpeer.IDFromPrivateKey(key)
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	sig, err := key.Sign(append([]byte(specDomain), body...))
	if err != nil {
		return nil, fmt.Errorf("job: sign spec: %w", err)
	}
	return json.Marshal(SignedSpec{Spec: body, Researcher: id.String(), Signature: sig})
}

// OpenSpec checks an encoded signed spec against the researcher it names
// and returns the spec and that researcher.
func OpenSpec(b []byte) (*Spec, string, error) {
	if len(b) > MaxSignedSpecBytes {
		return nil, "", fmt.Errorf("job: signed spec of %d bytes exceeds %d", len(b), MaxSignedSpecBytes)
	}
	var ss SignedSpec
	if err := json.Unmarshal(b, &ss); err != nil {
		return nil, "", fmt.Errorf("job: signed spec: %w", err)
	}
	id, err := lpeer.Decode(ss.Researcher)
	if err != nil {
		return nil, "", fmt.Errorf("job: researcher id: %w", err)
	}
	pub, err := id.ExtractPublicKey()
	if err != nil {
		return nil, "", fmt.Errorf("job: researcher key: %w", err)
	}
	if ok, err := pub.Verify(append([]byte(specDomain), ss.Spec...), ss.Signature); err != nil || !ok {
		return nil, "", fmt.Errorf("%w (researcher %s)", ErrSpecSignature, short(ss.Researcher))
	}
	var s Spec
	if err := json.Unmarshal(ss.Spec, &s); err != nil {
		return nil, "", fmt.Errorf("job: spec: %w", err)
	}
	if err := s.Validate(); err != nil {
		return nil, "", err
	}
	return &s, ss.Researcher, nil
}

// checkSpec verifies that p carries its researcher's signed spec and
// that the spec it states is that one.
func (p *Plan) checkSpec() error {
	if len(p.SignedSpec) == 0 {
		return fmt.Errorf("%w: the plan carries no signed spec", ErrSpecMismatch)
	}
	s, researcher, err := OpenSpec(p.SignedSpec)
	if err != nil {
		return err
	}
	if researcher != p.Researcher {
		return fmt.Errorf("%w: spec signed by %s, plan names researcher %s", ErrSpecMismatch, short(researcher), short(p.Researcher))
	}
	want, err := json.Marshal(s)
	if err != nil {
		return err
	}
	got, err := json.Marshal(&p.Spec)
	if err != nil {
		return err
	}
	if !bytes.Equal(want, got) {
		return fmt.Errorf("%w: the spec differs from the one its researcher signed", ErrSpecMismatch)
	}
	return nil
}

// MaxSubmitAttempts is how many placements a coordinator tries for one
// submit; attempt i is signed at epoch and gen i.
const MaxSubmitAttempts = 4

// ErrJobChanged is returned by SameJob.
var ErrJobChanged = errors.New("job: the new plan changes the job")

// SameJob checks that next is a plan of the same job as cur: the same
// researcher, the same signed spec and the same block spans. A re-plan may
// move stages between nodes and re-sign in a new term; it may not hand
// the job (its weights, its optimizer state) to anyone else or reshape it.
//
// One kind of plan may reshape the spans: the coordinator's own retries
// of a submit (same coordinator and term, training from step 1, epoch
// equal to gen and at most MaxSubmitAttempts), which place again around
// nodes that refused and split the blocks anew before any step ran.
func SameJob(cur, next *Plan) error {
	switch {
	case cur.JobID != next.JobID:
		return fmt.Errorf("%w: job %s, not %s", ErrJobChanged, next.JobID, cur.JobID)
	case cur.Researcher != next.Researcher:
		return fmt.Errorf("%w: researcher %s, not %s", ErrJobChanged, short(next.Researcher), short(cur.Researcher))
	case !bytes.Equal(cur.SignedSpec, next.SignedSpec):
		return fmt.Errorf("%w: another spec", ErrJobChanged)
	case cur.Coordinator == next.Coordinator && cur.Term == next.Term && cur.StartStep <= 1 && next.StartStep <= 1 &&
		cur.Epoch == cur.Gen && next.Epoch == next.Gen && next.Epoch <= MaxSubmitAttempts:
		return nil // a submit's placement retry
	case len(cur.Stages) != len(next.Stages):
		return fmt.Errorf("%w: %d stages, not %d", ErrJobChanged, len(next.Stages), len(cur.Stages))
	}
	for i := range cur.Stages {
		a, b := cur.Stages[i], next.Stages[i]
		if a.First != b.First || a.Last != b.Last {
			return fmt.Errorf("%w: stage %d holds blocks %d-%d, not %d-%d", ErrJobChanged, i, b.First, b.Last-1, a.First, a.Last-1)
		}
	}
	return nil
}
