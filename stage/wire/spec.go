package wire

import (
	"context"
	"fmt"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/holopeer/holopeer/stage/wire/codec"
)

// Defaults of a LinkSpec's zero fields.
const (
	DefaultMaxTokens   = 8192
	DefaultStepsAhead  = 1
	DefaultMaxResidual = 1e-4

	maxTokensLimit = 1 << 20 // keeps every size computation far from overflow
)

// LinkSpec is what the placement says about one link: the codec and the
// shapes, kinds and steps this node accepts from one remote peer in one
// job. Every incoming frame is checked against it before its payload is
// read.
type LinkSpec struct {
	// Codec is the job's codec; both ends must hold codecs with equal
	// fingerprints (checked in the handshake). Required.
	Codec codec.Codec
	// Accept lists the tensor kinds this node takes from the remote:
	// KindForward from an upstream stage, KindBackward from a downstream
	// one, both where one node is a pipeline's first and last stage.
	// Control and error frames are always accepted. Required.
	Accept KindSet
	// Tokens is the exact number of tokens per microbatch; 0 accepts any
	// count from 1 to MaxTokens.
	Tokens int
	// MaxTokens bounds tokens per frame when Tokens is 0. 0 means
	// DefaultMaxTokens.
	MaxTokens int
	// Microbatches is the number of microbatches per step; frames with a
	// microbatch index at or past it are refused. 0 means no bound.
	Microbatches uint32
	// FirstStep is the earliest step accepted.
	FirstStep uint64
	// StepsAhead is how far a frame's step may run ahead of the newest
	// step seen so far for its kind; steps never go back. 0 means
	// DefaultStepsAhead.
	StepsAhead uint64
	// MaxResidual is the largest subspace invariant residual Send lets
	// through: a larger one means the sender's model has left span(U) and
	// the receiver would rebuild wrong activations. 0 means
	// DefaultMaxResidual; negative disables the check.
	MaxResidual float64
}

// withDefaults fills zero fields and checks the rest.
func (s LinkSpec) withDefaults() (LinkSpec, error) {
	if s.Codec == nil {
		return s, fmt.Errorf("wire: link spec has no codec")
	}
	if s.Accept&^Kinds(KindForward, KindBackward) != 0 {
		return s, fmt.Errorf("wire: link spec accepts kinds %08b; only forward and backward are tensor kinds", s.Accept)
	}
	switch {
	case s.Tokens < 0 || s.MaxTokens < 0 || s.Tokens > maxTokensLimit || s.MaxTokens > maxTokensLimit:
		return s, fmt.Errorf("wire: link spec tokens %d, max tokens %d: out of range 0..%d", s.Tokens, s.MaxTokens, maxTokensLimit)
	case s.Tokens > 0:
		s.MaxTokens = s.Tokens
	case s.MaxTokens == 0:
		s.MaxTokens = DefaultMaxTokens
	}
	for _, dir := range []codec.Direction{codec.Forward, codec.Backward} {
		if p := s.Codec.PayloadSize(dir, s.MaxTokens); p > MaxFramePayload || p < 0 {
			return s, fmt.Errorf("wire: %d tokens of %s at d_model %d need %d-byte frames, over the %d-byte limit",
				s.MaxTokens, s.Codec.ID(), s.Codec.Dim(), p, MaxFramePayload)
		}
	}
	if s.StepsAhead == 0 {
		s.StepsAhead = DefaultStepsAhead
	}
	if s.MaxResidual == 0 {
		s.MaxResidual = DefaultMaxResidual
	}
	return s, nil
}

// Authorizer decides who may open or accept a link. The Jobs layer
// implements it from the signed placement plan: Authorize returns the spec
// of the link between this node and remote in job, or an error (wrapping
// ErrNotAuthorized when remote has no place next to this node).
//
// Authorize is called for every incoming stream before any key exchange,
// and for every OpenLink before dialing; it may be called concurrently.
type Authorizer interface {
	Authorize(ctx context.Context, job JobID, remote peer.ID) (LinkSpec, error)
}

// AuthorizerFunc adapts a function to Authorizer.
type AuthorizerFunc func(ctx context.Context, job JobID, remote peer.ID) (LinkSpec, error)

func (f AuthorizerFunc) Authorize(ctx context.Context, job JobID, remote peer.ID) (LinkSpec, error) {
	return f(ctx, job, remote)
}

// StaticAuthorizer is an Authorizer backed by a table, for benchmarks,
// tools and until a job's placement is wired in.
type StaticAuthorizer struct {
	mu    sync.RWMutex
	links map[JobID]map[peer.ID]LinkSpec
}

// NewStaticAuthorizer returns an empty table.
func NewStaticAuthorizer() *StaticAuthorizer {
	return &StaticAuthorizer{links: map[JobID]map[peer.ID]LinkSpec{}}
}

// Allow lets remote link with this node in job under spec.
func (a *StaticAuthorizer) Allow(job JobID, remote peer.ID, spec LinkSpec) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.links[job] == nil {
		a.links[job] = map[peer.ID]LinkSpec{}
	}
	a.links[job][remote] = spec
}

// Revoke removes remote from job.
func (a *StaticAuthorizer) Revoke(job JobID, remote peer.ID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.links[job], remote)
}

func (a *StaticAuthorizer) Authorize(_ context.Context, job JobID, remote peer.ID) (LinkSpec, error) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	s, ok := a.links[job][remote]
	if !ok {
		return LinkSpec{}, fmt.Errorf("%w: %s has no link with this node in job %s", ErrNotAuthorized, remote.ShortString(), job)
	}
	return s, nil
}

// stepWindow tracks the newest step seen per kind. It is owned by the
// link's receive path.
type stepWindow struct {
	last [KindBackward + 1]uint64
}

// checkHeader validates a tensor or control header against the spec; the
// generic rules (version, known kind, limits) were applied by decodeHeader.
func (s *LinkSpec) checkHeader(h *header, job JobID, w *stepWindow) error {
	if h.Job != job {
		return errorf(CodeMalformed, "frame for job %s on a link of job %s", h.Job, job)
	}
	if h.Kind == KindControl || h.Kind == KindError {
		return nil
	}
	if !s.Accept.Has(h.Kind) {
		return errorf(CodeUnexpectedKind, "%s frames are not accepted from this peer", h.Kind)
	}
	c := s.Codec
	if h.Codec != c.ID() {
		return errorf(CodeShape, "codec %s, the job uses %s", h.Codec, c.ID())
	}
	dir := h.Kind.direction()
	switch {
	case s.Tokens > 0 && int(h.Rows) != s.Tokens:
		return errorf(CodeShape, "%d tokens, the placement says %d per microbatch", h.Rows, s.Tokens)
	case int(h.Rows) > s.MaxTokens:
		return errorf(CodeShape, "%d tokens, at most %d per microbatch", h.Rows, s.MaxTokens)
	case int(h.Cols) != c.Cols(dir):
		return errorf(CodeShape, "%d values per token, %s %s carries %d", h.Cols, c.ID(), dir, c.Cols(dir))
	case h.Length != uint64(c.PayloadSize(dir, int(h.Rows))):
		return errorf(CodeShape, "payload of %d bytes, %d tokens of %s %s take %d", h.Length, h.Rows, c.ID(), dir, c.PayloadSize(dir, int(h.Rows)))
	}
	if s.Microbatches > 0 && h.Micro >= s.Microbatches {
		return errorf(CodeStep, "microbatch %d, the step has %d", h.Micro, s.Microbatches)
	}
	last := max(w.last[h.Kind], s.FirstStep)
	if h.Step < last || h.Step-last > s.StepsAhead {
		return errorf(CodeStep, "%s step %d outside the window %d..%d", h.Kind, h.Step, last, last+s.StepsAhead)
	}
	w.last[h.Kind] = h.Step
	return nil
}
