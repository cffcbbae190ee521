// Package checkpoint reads and writes model checkpoints in the Hugging Face
// layout: a directory holding config.json (transformers' LlamaConfig keys)
// and model.safetensors (the Llama tensor names), so a user's SmolLM2- or
// TinyLlama-style checkpoint loads, and what holopeer trains loads in
// transformers.
//
// A stage reads only its own tensors: Open parses the safetensors headers
// alone, and LoadStage checks every tensor the span needs against them
// (present, right shape, a float dtype) before it allocates anything, then
// reads each tensor's byte range by offset. A sharded checkpoint
// (model.safetensors.index.json naming model-0000k-of-0000n.safetensors)
// loads the same way, each tensor from its shard.
//
// Beside the Hugging Face files a training checkpoint may hold:
//   - subspace.safetensors: the factors Z of a subspace-constrained model
//     (…o_proj.z, …down_proj.z, model.embed_tokens.z), so training resumes
//     in the U·Z form exactly; model.safetensors always holds the dense
//     export W = U·Z, which transformers (or a dense holopeer stage) loads;
//   - optimizer.safetensors: the AdamW moments;
//   - trainer_state.json: the step, tokens seen and the data position.
//
// Save writes a whole directory atomically: into a temporary sibling,
// synced, then swapped in by rename.
package checkpoint

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/safetensors"
)

// File names inside a checkpoint directory.
const (
	ConfigFile    = "config.json"
	ModelFile     = "model.safetensors"
	FactorsFile   = "subspace.safetensors"
	OptimizerFile = "optimizer.safetensors"
	StateFile     = "trainer_state.json"
	TokenizerFile = "tokenizer.json"
	// GenerationFile is transformers' generation_config.json (BOS/EOS).
	GenerationFile = "generation_config.json"
)

// knownFiles are the files Save writes; a directory holding anything else
// is not replaced (it may be a user's directory named by mistake).
var knownFiles = []string{ConfigFile, ModelFile, FactorsFile, OptimizerFile, StateFile, TokenizerFile, GenerationFile}

// MaxConfigBytes bounds config.json and trainer_state.json; real
// LlamaConfig files are about 1 KB.
const MaxConfigBytes = 1 << 20

// Sentinel errors, wrapped with the file, field or tensor at fault.
var (
	// ErrConfig: config.json is missing, malformed or describes a model
	// this package cannot run.
	ErrConfig = errors.New("checkpoint: bad config")
	// ErrUnsupported: config.json asks for a Llama feature holopeer does
	// not implement (rope scaling, biases, another activation).
	ErrUnsupported = errors.New("checkpoint: unsupported model feature")
	// ErrTensor: a tensor the stage needs is missing, mis-shaped, of a
	// non-float dtype, truncated or holds non-finite values. The error
	// also wraps safetensors.ErrMissing or safetensors.ErrShape where
	// those apply.
	ErrTensor = errors.New("checkpoint: bad tensor")
)

// HFConfig is the part of transformers' LlamaConfig (config.json) that
// holopeer reads and writes. Unknown keys are ignored on reading, as
// transformers does. Optional keys are pointers so that an absent key takes
// transformers' default, not Go's zero.
type HFConfig struct {
	Architectures         []string `json:"architectures,omitempty"`
	ModelType             string   `json:"model_type,omitempty"`
	VocabSize             int      `json:"vocab_size"`
	HiddenSize            int      `json:"hidden_size"`
	IntermediateSize      int      `json:"intermediate_size"`
	NumHiddenLayers       int      `json:"num_hidden_layers"`
	NumAttentionHeads     int      `json:"num_attention_heads"`
	NumKeyValueHeads      *int     `json:"num_key_value_heads,omitempty"`     // default: num_attention_heads
	HeadDim               *int     `json:"head_dim,omitempty"`                // must be hidden_size/num_attention_heads
	MaxPositionEmbeddings *int     `json:"max_position_embeddings,omitempty"` // default 2048
	RopeTheta             *float64 `json:"rope_theta,omitempty"`              // default 10000
	RMSNormEps            *float64 `json:"rms_norm_eps,omitempty"`            // default 1e-6
	InitializerRange      *float64 `json:"initializer_range,omitempty"`       // default 0.02
	TieWordEmbeddings     bool     `json:"tie_word_embeddings"`               // default false for Llama
	HiddenAct             string   `json:"hidden_act,omitempty"`              // must be "silu"
	AttentionBias         bool     `json:"attention_bias"`                    // must be false
	MLPBias               bool     `json:"mlp_bias"`                          // must be false
	// RopeScaling is null, or {"rope_type": "llama3", …} as Llama 3.1+
	// checkpoints have; other scaling types are refused.
	RopeScaling json.RawMessage `json:"rope_scaling,omitempty"`
	// RopeParameters is transformers v5's spelling of rope_theta and
	// rope_scaling ({"rope_type": "default", "rope_theta": …}).
	RopeParameters json.RawMessage `json:"rope_parameters,omitempty"`
	TorchDType     string          `json:"torch_dtype,omitempty"`
	// DType is transformers v5's spelling of torch_dtype.
	DType string `json:"dtype,omitempty"`
	// BOS and EOS ids: a number, a list of numbers (Llama 3) or null.
	BOSTokenID json.RawMessage `json:"bos_token_id,omitempty"`
	EOSTokenID json.RawMessage `json:"eos_token_id,omitempty"`

	// Holopeer holds what only holopeer needs, under its own key.
	Holopeer *Extras `json:"holopeer,omitempty"`
}

// Extras are holopeer's own config.json entries.
type Extras struct {
	// Tokenizer is the tokenizer spec the model was trained with ("byte",
	// "gpt2"; "hf" when tokenizer.json sits beside the config).
	Tokenizer string `json:"tokenizer,omitempty"`
	// Subspace is the constraint the model was trained under; set only
	// when FactorsFile holds its factors, so the model can be resumed in
	// U·Z form. model.safetensors holds the equivalent dense model either
	// way.
	Subspace *model.SubspaceConfig `json:"subspace,omitempty"`
}

// dtypeNames maps torch dtype names to safetensors dtypes.
var dtypeNames = map[string]safetensors.DType{
	"float32": safetensors.F32, "bfloat16": safetensors.BF16, "float16": safetensors.F16,
}

func torchName(dt safetensors.DType) string {
	for name, d := range dtypeNames {
		if d == dt {
			return name
		}
	}
	return "float32"
}

// ParseConfig decodes config.json bytes.
func ParseConfig(b []byte) (HFConfig, error) {
	if len(b) > MaxConfigBytes {
		return HFConfig{}, fmt.Errorf("%w: %s is %d bytes, more than %d", ErrConfig, ConfigFile, len(b), MaxConfigBytes)
	}
	var c HFConfig
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&c); err != nil {
		return HFConfig{}, fmt.Errorf("%w: %s: %w", ErrConfig, ConfigFile, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return HFConfig{}, fmt.Errorf("%w: %s: data after the JSON object", ErrConfig, ConfigFile)
	}
	return c, nil
}

// ReadConfig reads dir/config.json.
func ReadConfig(dir string) (HFConfig, error) {
	b, err := readBounded(filepath.Join(dir, ConfigFile), MaxConfigBytes)
	if err != nil {
		return HFConfig{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		return HFConfig{}, fmt.Errorf("%s: %w", dir, err)
	}
	return c, nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return b, nil
}

// Model converts the config to holopeer's model.Config, refusing what
// holopeer cannot compute exactly as transformers would. The result never
// has the subspace constraint set: it is the dense model that
// model.safetensors holds (see Constrained for the factored form).
func (c HFConfig) Model() (model.Config, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrConfig, ConfigFile, fmt.Sprintf(format, a...))
	}
	unsupported := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrUnsupported, ConfigFile, fmt.Sprintf(format, a...))
	}
	isLlama := c.ModelType == "llama" || slices.Contains(c.Architectures, "LlamaForCausalLM")
	if !isLlama {
		return model.Config{}, unsupported("model_type %q, architectures %q: only Llama (LlamaForCausalLM) checkpoints load", c.ModelType, c.Architectures)
	}
	if c.HiddenAct != "" && c.HiddenAct != "silu" {
		return model.Config{}, unsupported("hidden_act %q: the Llama MLP here is SwiGLU with silu", c.HiddenAct)
	}
	if c.AttentionBias || c.MLPBias {
		return model.Config{}, unsupported("attention_bias/mlp_bias: projections with biases are not implemented")
	}
	cfg := model.Config{
		Vocab:         c.VocabSize,
		Dim:           c.HiddenSize,
		Layers:        c.NumHiddenLayers,
		Heads:         c.NumAttentionHeads,
		KVHeads:       c.NumAttentionHeads,
		FFNDim:        c.IntermediateSize,
		MaxSeq:        2048,
		RopeTheta:     10000,
		NormEps:       1e-6,
		InitStd:       0.02,
		TieEmbeddings: c.TieWordEmbeddings,
	}
	if c.NumKeyValueHeads != nil {
		cfg.KVHeads = *c.NumKeyValueHeads
	}
	if c.MaxPositionEmbeddings != nil {
		cfg.MaxSeq = *c.MaxPositionEmbeddings
	}
	if c.RopeTheta != nil {
		cfg.RopeTheta = *c.RopeTheta
	}
	for _, f := range []struct {
		key string
		raw json.RawMessage
	}{{"rope_scaling", c.RopeScaling}, {"rope_parameters", c.RopeParameters}} {
		if len(f.raw) == 0 || isNull(f.raw) {
			continue
		}
		var rp struct {
			RopeType       string   `json:"rope_type"`
			Type           string   `json:"type"` // the older spelling
			RopeTheta      *float64 `json:"rope_theta"`
			Factor         float64  `json:"factor"`
			LowFreqFactor  float64  `json:"low_freq_factor"`
			HighFreqFactor float64  `json:"high_freq_factor"`
			OriginalMax    int      `json:"original_max_position_embeddings"`
		}
		if err := json.Unmarshal(f.raw, &rp); err != nil {
			return model.Config{}, bad("%s: %v", f.key, err)
		}
		if rp.RopeTheta != nil {
			cfg.RopeTheta = *rp.RopeTheta
		}
		switch t := cmp.Or(rp.RopeType, rp.Type); t {
		case "", "default":
		case "llama3":
			cfg.RopeScaling = model.RopeScaling{Type: t, Factor: rp.Factor, LowFreqFactor: rp.LowFreqFactor,
				HighFreqFactor: rp.HighFreqFactor, OriginalMaxPositions: rp.OriginalMax}
		default:
			return model.Config{}, unsupported("%s %s: rope type %q is not implemented (default and llama3 are)", f.key, compact(f.raw), t)
		}
	}
	if c.RMSNormEps != nil {
		cfg.NormEps = *c.RMSNormEps
	}
	if c.InitializerRange != nil {
		cfg.InitStd = *c.InitializerRange
	}
	if !(cfg.RopeTheta > 0) {
		return model.Config{}, bad("rope_theta %g must be positive", cfg.RopeTheta)
	}
	if !(cfg.NormEps > 0) {
		return model.Config{}, bad("rms_norm_eps %g must be positive", cfg.NormEps)
	}
	if !(cfg.InitStd > 0) {
		// Only used to initialise fresh weights; transformers' default.
		cfg.InitStd = 0.02
	}
	if c.HeadDim != nil && (cfg.Heads <= 0 || *c.HeadDim*cfg.Heads != cfg.Dim) {
		return model.Config{}, unsupported("head_dim %d × num_attention_heads %d ≠ hidden_size %d", *c.HeadDim, cfg.Heads, cfg.Dim)
	}
	if err := cfg.Validate(); err != nil {
		return model.Config{}, fmt.Errorf("%w: %s: %w", ErrConfig, ConfigFile, err)
	}
	return cfg, nil
}

// Constrained is Model with the subspace constraint the checkpoint was
// trained under, when it holds the factors (ok false otherwise).
func (c HFConfig) Constrained() (cfg model.Config, ok bool, err error) {
	cfg, err = c.Model()
	if err != nil || c.Holopeer == nil || c.Holopeer.Subspace == nil || !c.Holopeer.Subspace.Enabled() {
		return cfg, false, err
	}
	cfg.Subspace = *c.Holopeer.Subspace
	cfg.TieEmbeddings = false
	if err := cfg.Validate(); err != nil {
		return model.Config{}, false, fmt.Errorf("%w: %s: holopeer.subspace: %w", ErrConfig, ConfigFile, err)
	}
	return cfg, true, nil
}

// TokenIDs decodes bos_token_id or eos_token_id: a number, a list of
// numbers or null/absent (nil).
func TokenIDs(raw json.RawMessage) ([]int, error) {
	if len(raw) == 0 || isNull(raw) {
		return nil, nil
	}
	var one int
	if err := json.Unmarshal(raw, &one); err == nil {
		return []int{one}, nil
	}
	var many []int
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, fmt.Errorf("%w: token id %s is neither a number nor a list of numbers", ErrConfig, compact(raw))
	}
	return many, nil
}

// EOS returns the config's end-of-sequence ids (nil when it names none).
func (c HFConfig) EOS() []int {
	ids, _ := TokenIDs(c.EOSTokenID)
	return ids
}

// NewHFConfig describes cfg (dense or constrained) as config.json does,
// for weights stored as dt. A constrained cfg is described as the dense
// model of its export, with the constraint recorded under "holopeer".
func NewHFConfig(cfg model.Config, dt safetensors.DType) HFConfig {
	kv, maxPos := cfg.KVHeads, cfg.MaxSeq
	theta, eps, std := cfg.RopeTheta, cfg.NormEps, cfg.InitStd
	if theta == 0 {
		theta = model.DefaultRopeTheta
	}
	if eps == 0 {
		eps = model.DefaultNormEps
	}
	if std == 0 {
		std = model.DefaultInitStd
	}
	hd := cfg.HeadDim()
	c := HFConfig{
		Architectures:         []string{"LlamaForCausalLM"},
		ModelType:             "llama",
		VocabSize:             cfg.Vocab,
		HiddenSize:            cfg.Dim,
		IntermediateSize:      cfg.FFNDim,
		NumHiddenLayers:       cfg.Layers,
		NumAttentionHeads:     cfg.Heads,
		NumKeyValueHeads:      &kv,
		HeadDim:               &hd,
		MaxPositionEmbeddings: &maxPos,
		RopeTheta:             &theta,
		RMSNormEps:            &eps,
		InitializerRange:      &std,
		TieWordEmbeddings:     cfg.TieEmbeddings,
		HiddenAct:             "silu",
		RopeScaling:           json.RawMessage("null"),
		TorchDType:            torchName(dt),
	}
	if r := cfg.RopeScaling; r.Type != "" {
		b, _ := json.Marshal(map[string]any{
			"rope_type": r.Type, "factor": r.Factor, "low_freq_factor": r.LowFreqFactor,
			"high_freq_factor": r.HighFreqFactor, "original_max_position_embeddings": r.OriginalMaxPositions,
		})
		c.RopeScaling = b
	}
	if cfg.Subspace.Enabled() {
		s := cfg.Subspace
		c.Holopeer = &Extras{Subspace: &s}
	}
	return c
}

func isNull(raw json.RawMessage) bool {
	return string(bytes.TrimSpace(raw)) == "null"
}

// compact shortens a JSON value for an error message.
func compact(raw json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		b.Reset()
		b.Write(raw)
	}
	s := b.String()
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return s
}
