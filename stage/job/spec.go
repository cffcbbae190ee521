// Package job is what the researcher, the coordinator and the stages share
// about one job: its Spec (the part of the manifest a stage needs, with the
// model configuration resolved) and its signed Plan (who runs which
// blocks). It is pure data with no I/O, imported by both the coordinator
// (gossip/coord) and the pipeline runtime (stage/pipeline).
//
// The Spec deliberately leaves out what a stage does not need and should
// not see: where the data is, the tokenizer, and the secret that
// pseudonymises token ids on the wire.
package job

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"

	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/optim"
	"github.com/holopeer/holopeer/stage/wire/codec"
)

// AssignProtocol is the libp2p protocol on which the coordinator hands a
// node its signed plan; the coordinator and the stage runtime both use
// this one definition.
const AssignProtocol = "/holopeer/assign/1.0.0"

// Kind is what a job does.
type Kind string

const (
	KindTrain Kind = "train"
	KindServe Kind = "serve"
)

// Spec is a job as every stage sees it.
type Spec struct {
	JobID string `json:"job_id"`
	Name  string `json:"name"`
	Kind  Kind   `json:"kind"`
	// Model is the resolved architecture (vocab filled in from the
	// tokenizer, subspace set when the codec is subspace).
	Model model.Config `json:"model"`
	// InitSeed initialises weights a stage creates itself; unused when
	// FromCheckpoint is set and the stage fetches them from the researcher.
	InitSeed       uint64 `json:"init_seed"`
	FromCheckpoint bool   `json:"from_checkpoint"`
	// Codec is the stage-boundary codec: fp32, bf16, int8 or subspace.
	Codec string `json:"codec"`

	// Pipeline shape: Stages block-holding stages of Replicas nodes each.
	Stages   int `json:"stages"`
	Replicas int `json:"replicas"`

	// Training shape: each step is Microbatches microbatches of Rows
	// sequences of SeqLen tokens.
	Steps        int `json:"steps"`
	SeqLen       int `json:"seq_len"`
	Rows         int `json:"rows"`
	Microbatches int `json:"microbatches"`

	Optim              optim.Config   `json:"optim"`
	Schedule           optim.Schedule `json:"schedule"`
	ClipNorm           float64        `json:"clip_norm"`
	CheckpointInterval int            `json:"checkpoint_interval"`

	// Serving limits (Kind serve).
	MaxBatch  int `json:"max_batch,omitempty"`
	MaxTokens int `json:"max_tokens,omitempty"` // prompt + output per request
	// WeightDType is how serving stages hold their matrices: "" (float32)
	// or "bf16", which a bfloat16 checkpoint is served in (2 bytes per
	// parameter, in memory and on the wire).
	WeightDType string `json:"weight_dtype,omitempty"`

	RefuseRelayed   bool `json:"refuse_relayed"`
	RequireAttested bool `json:"require_attested"`
}

var jobIDRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,96}$`)

// NewJobID returns a fresh random job id with a readable prefix.
func NewJobID(name string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	if !jobIDRE.MatchString(name) || len(name) > 48 {
		name = "job"
	}
	return name + "-" + hex.EncodeToString(b[:])
}

// Validate checks a spec received from the network before anything is
// allocated from it.
func (s *Spec) Validate() error {
	switch {
	case !jobIDRE.MatchString(s.JobID):
		return fmt.Errorf("job: id %q is not 1-96 of [A-Za-z0-9._-]", s.JobID)
	case s.Kind != KindTrain && s.Kind != KindServe:
		return fmt.Errorf("job: kind %q is not train or serve", s.Kind)
	}
	if err := s.Model.Validate(); err != nil {
		return fmt.Errorf("job: %w", err)
	}
	if s.Stages <= 0 || s.Stages > 256 || s.Stages > s.Model.Layers || s.Replicas <= 0 || s.Replicas > 16 {
		return fmt.Errorf("job: %d stages × %d replicas for %d layers", s.Stages, s.Replicas, s.Model.Layers)
	}
	id, err := codec.ParseID(s.Codec)
	if err != nil {
		return fmt.Errorf("job: %w", err)
	}
	if id.Subspace() != s.Model.Subspace.Enabled() {
		return errors.New("job: the subspace codec and the model's subspace constraint go together")
	}
	if s.WeightDType != "" && (s.WeightDType != WeightBF16 || s.Kind != KindServe) {
		return fmt.Errorf("job: weight dtype %q (only %q, and only to serve)", s.WeightDType, WeightBF16)
	}
	if s.Kind == KindServe {
		if s.MaxBatch <= 0 || s.MaxBatch > 256 || s.MaxTokens <= 0 || s.MaxTokens > s.Model.MaxSeq {
			return fmt.Errorf("job: serving limits batch %d tokens %d (max_seq %d)", s.MaxBatch, s.MaxTokens, s.Model.MaxSeq)
		}
		return nil
	}
	switch {
	case s.Steps <= 0 || s.Steps > 1e9:
		return fmt.Errorf("job: steps %d", s.Steps)
	case s.SeqLen < 2 || s.SeqLen > s.Model.MaxSeq:
		return fmt.Errorf("job: seq_len %d outside 2..max_seq %d", s.SeqLen, s.Model.MaxSeq)
	case s.Rows <= 0 || s.Microbatches <= 0 || s.Microbatches > 4096 || s.Rows*s.SeqLen > 1<<20:
		return fmt.Errorf("job: %d microbatches of %d rows × %d tokens", s.Microbatches, s.Rows, s.SeqLen)
	case s.CheckpointInterval < 0:
		return fmt.Errorf("job: checkpoint interval %d", s.CheckpointInterval)
	case s.ClipNorm < 0:
		return fmt.Errorf("job: clip norm %g", s.ClipNorm)
	}
	if err := s.Optim.Validate(); err != nil {
		return fmt.Errorf("job: %w", err)
	}
	if err := s.Schedule.Validate(); err != nil {
		return fmt.Errorf("job: %w", err)
	}
	return nil
}

// WeightBF16 is the Spec.WeightDType of a bfloat16 checkpoint.
const WeightBF16 = "bf16"

// MicrobatchTokens is the number of tokens in one microbatch.
func (s *Spec) MicrobatchTokens() int { return s.Rows * s.SeqLen }

// LayerBytes estimates the memory one block needs on a stage of a
// pipeline with the given number of block stages. Training: weights,
// gradients and the two AdamW moments (float32 each), plus the block's
// saved activations for the microbatches in flight (a 1F1B schedule keeps
// at most one per stage downstream). Serving: weights and a KV cache per
// request.
func (s *Spec) LayerBytes(stages int) uint64 {
	c := s.Model
	d, kv, f := uint64(c.Dim), uint64(c.KVDim()), uint64(c.FFNDim)
	// The mean block's scalars: a constrained block holds k×d factors in
	// place of its output projections.
	params := uint64(c.SpanParams(model.Span{First: 0, Last: c.Layers})) / uint64(max(c.Layers, 1))
	if s.Kind == KindServe {
		per := uint64(4)
		if s.WeightDType == WeightBF16 {
			per = 2 // the norm gains stay float32: 2d of ~12d² values
		}
		return per*params + uint64(max(s.MaxBatch, 1))*uint64(s.MaxTokens)*2*kv*4
	}
	n := uint64(max(s.MicrobatchTokens(), 1))
	inflight := uint64(min(max(s.Microbatches, 1), stages+1))
	acts := n * (10*d + 2*kv + 4*f) * 4 * inflight
	// Activations are allocated and freed every microbatch; a node
	// collects at 10% heap growth (holopeer up), so about a tenth more
	// stands (measured: 8-block stages of a d=1024 subspace model).
	return 16*params + acts*11/10
}

// StageBytes is what a stage needs besides its blocks: boundary buffers,
// codec scratch and runtime slack.
func (s *Spec) StageBytes() uint64 {
	n := uint64(max(s.MicrobatchTokens(), 1))
	return 8*n*uint64(s.Model.Dim)*4 + 160<<20 // measured: runtime, GEMM panels, libp2p
}

// WorkItem is one stage node's contribution to a job over a stretch of
// steps: what the researcher reports and the coordinator signs receipts
// for.
type WorkItem struct {
	Peer     string  `json:"peer"`
	ComputeS float64 `json:"compute_s"`
	Tokens   int64   `json:"tokens"`
}
