// Package model is a Llama-style decoder written out by hand, forward and
// backward, on a tensor.Backend, and cut into pipeline stages.
//
// The architecture follows transformers' LlamaForCausalLM so that Hugging
// Face checkpoints give the same numbers: token embedding, per block a
// pre-norm RMSNorm, rotary position embeddings (rotate-half layout),
// grouped-query causal attention (repeat_kv grouping) and a SwiGLU MLP,
// then a final RMSNorm, the LM head and cross-entropy. Parameters carry the
// Hugging Face tensor names and shapes.
//
// A Stage holds a contiguous range of blocks; the first stage also owns the
// embedding, the last the final norm, head and loss. Its API is keyed by
// microbatch so that a 1F1B schedule can interleave forwards and
// backwards: Forward saves what Backward needs, Backward consumes it.
//
// With Config.Subspace set, every block's output projections (attention
// o_proj, MLP down_proj) and the trainable embedding are stored as U·Z with
// the fixed basis U of package subspace, and the fixed random embedding
// E_fix is added to the stream, so h − E_fix[token] stays in span(U) at
// every block boundary and a boundary can be sent as k coefficients per
// token.
package model

import (
	"errors"
	"fmt"
	"math"

	"github.com/holopeer/holopeer/stage/subspace"
)

// Defaults for the optional fields of Config (transformers' LlamaConfig).
const (
	DefaultRopeTheta = 10000
	DefaultNormEps   = 1e-6
	DefaultInitStd   = 0.02
)

// Limits that keep a hostile or mistyped config from asking for absurd
// allocations.
const (
	MaxVocab  = 1 << 24
	MaxDim    = 1 << 16
	MaxLayers = 1 << 10
	MaxFFN    = 1 << 18
	MaxSeqLen = 1 << 20
)

// Config describes a model. Its fields mirror LlamaConfig.
type Config struct {
	Vocab   int `json:"vocab" yaml:"vocab"`       // vocab_size
	Dim     int `json:"dim" yaml:"dim"`           // hidden_size, d_model
	Layers  int `json:"layers" yaml:"layers"`     // num_hidden_layers
	Heads   int `json:"heads" yaml:"heads"`       // num_attention_heads; head dim = Dim/Heads
	KVHeads int `json:"kv_heads" yaml:"kv_heads"` // num_key_value_heads; divides Heads
	FFNDim  int `json:"ffn_dim" yaml:"ffn_dim"`   // intermediate_size
	MaxSeq  int `json:"max_seq" yaml:"max_seq"`   // max_position_embeddings: positions are < MaxSeq

	RopeTheta     float64 `json:"rope_theta,omitempty" yaml:"rope_theta,omitempty"`         // 0 means DefaultRopeTheta
	NormEps       float64 `json:"norm_eps,omitempty" yaml:"norm_eps,omitempty"`             // rms_norm_eps; 0 means DefaultNormEps
	InitStd       float64 `json:"init_std,omitempty" yaml:"init_std,omitempty"`             // initializer_range; 0 means DefaultInitStd
	TieEmbeddings bool    `json:"tie_embeddings,omitempty" yaml:"tie_embeddings,omitempty"` // lm_head shares embed_tokens

	// RopeScaling rescales the rotary frequencies (rope_scaling); the zero
	// value means none.
	RopeScaling RopeScaling `json:"rope_scaling,omitzero" yaml:"rope_scaling,omitempty"`

	Subspace SubspaceConfig `json:"subspace,omitzero" yaml:"subspace,omitempty"`
}

// RopeScaling is transformers' rope_scaling. Only rope_type "llama3" (the
// Llama 3.1+ checkpoints) is implemented.
type RopeScaling struct {
	Type                 string  `json:"rope_type" yaml:"rope_type"` // "llama3", or "" for none
	Factor               float64 `json:"factor" yaml:"factor"`
	LowFreqFactor        float64 `json:"low_freq_factor" yaml:"low_freq_factor"`
	HighFreqFactor       float64 `json:"high_freq_factor" yaml:"high_freq_factor"`
	OriginalMaxPositions int     `json:"original_max_position_embeddings" yaml:"original_max_position_embeddings"`
}

// SubspaceConfig turns on the subspace constraint (Protocol Models).
type SubspaceConfig struct {
	// Rank is k, the number of coefficients per token at a stage boundary;
	// 0 disables the constraint.
	Rank int `json:"rank" yaml:"rank"`
	// Seed derives U and E_fix; every stage of a job uses the same one.
	Seed uint64 `json:"seed" yaml:"seed"`
	// DenseTail leaves the last DenseTail blocks unconstrained (the
	// reference code leaves the blocks of the last stage dense). The
	// invariant then holds only at boundaries before them, so a pipeline
	// must not cut inside the tail.
	DenseTail int `json:"dense_tail,omitempty" yaml:"dense_tail,omitempty"`
}

// Enabled reports whether the constraint is on.
func (s SubspaceConfig) Enabled() bool { return s.Rank > 0 }

// ErrConfig is wrapped by every error Validate returns.
var ErrConfig = errors.New("model: invalid config")

// Validate reports the first bad field, by name.
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, a...))
	}
	switch {
	case c.Vocab <= 0 || c.Vocab > MaxVocab:
		return bad("Vocab %d out of range 1..%d", c.Vocab, MaxVocab)
	case c.Dim <= 0 || c.Dim > MaxDim:
		return bad("Dim %d out of range 1..%d", c.Dim, MaxDim)
	case c.Layers <= 0 || c.Layers > MaxLayers:
		return bad("Layers %d out of range 1..%d", c.Layers, MaxLayers)
	case c.Heads <= 0 || c.Dim%c.Heads != 0:
		return bad("Heads %d must be positive and divide Dim %d", c.Heads, c.Dim)
	case (c.Dim/c.Heads)%2 != 0:
		return bad("head dim Dim/Heads = %d must be even for rotary embeddings", c.Dim/c.Heads)
	case c.KVHeads <= 0 || c.Heads%c.KVHeads != 0:
		return bad("KVHeads %d must be positive and divide Heads %d", c.KVHeads, c.Heads)
	case c.FFNDim <= 0 || c.FFNDim > MaxFFN:
		return bad("FFNDim %d out of range 1..%d", c.FFNDim, MaxFFN)
	case c.MaxSeq <= 0 || c.MaxSeq > MaxSeqLen:
		return bad("MaxSeq %d out of range 1..%d", c.MaxSeq, MaxSeqLen)
	case c.RopeTheta < 0 || c.RopeTheta != c.RopeTheta:
		return bad("RopeTheta %g must be positive (or 0 for %d)", c.RopeTheta, DefaultRopeTheta)
	case c.NormEps < 0 || c.NormEps != c.NormEps:
		return bad("NormEps %g must be positive (or 0 for %g)", c.NormEps, DefaultNormEps)
	case c.InitStd < 0 || c.InitStd != c.InitStd:
		return bad("InitStd %g must be positive (or 0 for %g)", c.InitStd, DefaultInitStd)
	}
	switch r := c.RopeScaling; r.Type {
	case "":
		if r != (RopeScaling{}) {
			return bad("RopeScaling fields set without RopeScaling.Type")
		}
	case "llama3":
		if !(r.Factor > 0) || !(r.LowFreqFactor > 0) || !(r.HighFreqFactor > r.LowFreqFactor) || r.OriginalMaxPositions <= 0 {
			return bad("RopeScaling %+v: llama3 needs Factor > 0, 0 < LowFreqFactor < HighFreqFactor, OriginalMaxPositions > 0", r)
		}
	default:
		return bad("RopeScaling.Type %q not supported (only llama3)", r.Type)
	}
	if s := c.Subspace; s.Rank != 0 {
		switch {
		case s.Rank < 0 || s.Rank > c.Dim || s.Rank > subspace.MaxRank:
			return bad("Subspace.Rank %d out of range 1..min(Dim %d, %d)", s.Rank, c.Dim, subspace.MaxRank)
		case s.DenseTail < 0 || s.DenseTail > c.Layers:
			return bad("Subspace.DenseTail %d out of range 0..Layers %d", s.DenseTail, c.Layers)
		case c.TieEmbeddings:
			return bad("TieEmbeddings cannot be combined with Subspace: the embedding is U·Z + E_fix, not a free matrix the head could share")
		case c.Dim > subspace.MaxDim:
			return bad("Dim %d exceeds the subspace limit %d", c.Dim, subspace.MaxDim)
		}
	} else if s.DenseTail != 0 {
		return bad("Subspace.DenseTail %d set without Subspace.Rank", s.DenseTail)
	}
	return nil
}

// withDefaults fills the optional fields.
func (c Config) withDefaults() Config {
	if c.RopeTheta == 0 {
		c.RopeTheta = DefaultRopeTheta
	}
	if c.NormEps == 0 {
		c.NormEps = DefaultNormEps
	}
	if c.InitStd == 0 {
		c.InitStd = DefaultInitStd
	}
	return c
}

// HeadDim is Dim/Heads.
func (c Config) HeadDim() int { return c.Dim / c.Heads }

// KVDim is the width of the key and value projections.
func (c Config) KVDim() int { return c.KVHeads * c.HeadDim() }

// Constrained reports whether block i's output projections live in span(U).
func (c Config) Constrained(layer int) bool {
	return c.Subspace.Enabled() && layer < c.Layers-c.Subspace.DenseTail
}

// Basis is the subspace configuration a stage and the wire codec derive U
// and E_fix from; ok is false without the constraint.
func (c Config) Basis() (cfg subspace.Config, ok bool) {
	if !c.Subspace.Enabled() {
		return subspace.Config{}, false
	}
	return subspace.Config{Dim: c.Dim, Rank: c.Subspace.Rank, Vocab: c.Vocab, Seed: c.Subspace.Seed}, true
}

// ParamCount is the number of trainable scalars of the whole model (a tied
// matrix counted once; constrained projections counted as their Z).
func (c Config) ParamCount() int64 {
	var total int64
	for _, p := range c.paramSpecs(Span{First: 0, Last: c.Layers, Embed: true, Head: true}) {
		total += int64(p.size())
	}
	return total
}

// SpanParams is the number of scalars the stage of span holds (a tied
// head counted when the span holds it).
func (c Config) SpanParams(span Span) int64 {
	var total int64
	for _, p := range c.paramSpecs(span) {
		total += int64(p.size())
	}
	return total
}

// RopeInvFreq returns the HeadDim/2 rotary inverse frequencies, computed in
// float32 in the order transformers computes them (default and "llama3"
// rope types), so Hugging Face checkpoints rotate by the same angles.
func RopeInvFreq(c Config) []float32 {
	c = c.withDefaults()
	hd := c.HeadDim()
	base := float32(c.RopeTheta)
	f := make([]float32, hd/2)
	for i := range f {
		e := float32(2*i) / float32(hd)
		f[i] = 1 / float32(math.Pow(float64(base), float64(e)))
	}
	if r := c.RopeScaling; r.Type == "llama3" {
		// _compute_llama3_parameters, one float32 operation at a time.
		factor := float32(r.Factor)
		old := float32(r.OriginalMaxPositions)
		lowW := float32(float64(r.OriginalMaxPositions) / r.LowFreqFactor)
		highW := float32(float64(r.OriginalMaxPositions) / r.HighFreqFactor)
		span := float32(r.HighFreqFactor - r.LowFreqFactor)
		for i, inv := range f {
			wavelen := float32(2*math.Pi) / inv
			scaled := inv
			if wavelen > lowW {
				scaled = inv / factor
			}
			if !(wavelen < highW) && !(wavelen > lowW) {
				smooth := (old/wavelen - float32(r.LowFreqFactor)) / span
				scaled = (1-smooth)*scaled/factor + smooth*scaled
			}
			f[i] = scaled
		}
	}
	return f
}
