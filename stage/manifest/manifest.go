// Package manifest is the job manifest a researcher writes: the model, its
// tokenizer and data, the training settings, how the model is cut into a
// pipeline, and the privacy terms the swarm must meet. It is parsed from
// YAML and validated before anything runs; every error names the field and
// says what is allowed.
//
// The same manifest drives `holopeer train --local` (the single-process
// reference), `holopeer run` (the swarm) and, with a serving section,
// `holopeer serve`.
package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"
)

// MaxBytes bounds a manifest file.
const MaxBytes = 1 << 20

// Codecs are the stage-boundary codecs a job may ask for.
var Codecs = []string{"fp32", "bf16", "int8", "subspace"}

// Manifest is one job.
type Manifest struct {
	Name       string     `yaml:"name"`
	Model      Model      `yaml:"model"`
	Tokenizer  string     `yaml:"tokenizer"`
	Data       Data       `yaml:"data"`
	Train      Train      `yaml:"train"`
	Pipeline   Pipeline   `yaml:"pipeline"`
	Checkpoint Checkpoint `yaml:"checkpoint"`
	Privacy    Privacy    `yaml:"privacy"`
	Serve      *Serve     `yaml:"serve,omitempty"`

	// dir is the manifest's directory; relative paths resolve against it.
	dir string
}

// Model is the architecture (Llama-style) or a checkpoint to start from.
// When Checkpoint is set, the architecture comes from its config.json and
// the size fields must be left zero.
type Model struct {
	Checkpoint    string  `yaml:"checkpoint"`
	Vocab         int     `yaml:"vocab"` // 0: the tokenizer's vocabulary size
	Dim           int     `yaml:"dim"`
	Layers        int     `yaml:"layers"`
	Heads         int     `yaml:"heads"`
	KVHeads       int     `yaml:"kv_heads"` // 0: same as heads
	FFNDim        int     `yaml:"ffn_dim"`
	MaxSeq        int     `yaml:"max_seq"`
	RopeTheta     float64 `yaml:"rope_theta"`
	NormEps       float64 `yaml:"norm_eps"`
	TieEmbeddings bool    `yaml:"tie_embeddings"`
}

// Data is where training tokens come from: a text file or the synthetic
// corpus with a known entropy rate.
type Data struct {
	Text      string     `yaml:"text"`
	Synthetic *Synthetic `yaml:"synthetic"`
}

// Synthetic configures the generated corpus.
type Synthetic struct {
	Seed uint64 `yaml:"seed"`
	// Temperature sharpens (<1) or flattens (>1) the source's transition
	// rows; it sets the corpus's entropy rate. 0 means the default.
	Temperature float64 `yaml:"temperature"`
}

// Train is the optimisation.
type Train struct {
	Steps        int       `yaml:"steps"`
	SeqLen       int       `yaml:"seq_len"`
	BatchTokens  int       `yaml:"batch_tokens"` // global batch per optimizer step, in tokens
	Microbatches int       `yaml:"microbatches"` // a step's batch is cut into this many pipeline microbatches
	Seed         uint64    `yaml:"seed"`
	Optimizer    Optimizer `yaml:"optimizer"`
}

// Optimizer is AdamW with a warmup + cosine schedule and global-norm
// clipping.
type Optimizer struct {
	LR          float64 `yaml:"lr"`
	MinLR       float64 `yaml:"min_lr"`
	WarmupSteps int     `yaml:"warmup_steps"`
	WeightDecay float64 `yaml:"weight_decay"`
	Beta1       float64 `yaml:"beta1"`
	Beta2       float64 `yaml:"beta2"`
	Eps         float64 `yaml:"eps"`
	GradClip    float64 `yaml:"grad_clip"` // 0 disables clipping
}

// Pipeline says how the model is cut across the swarm. The researcher's
// node always keeps the embedding (first stage) and the final norm, head
// and loss (last stage); Stages counts the block-holding stages on compute
// nodes between them.
type Pipeline struct {
	Stages           int    `yaml:"stages"`
	ReplicasPerStage int    `yaml:"replicas_per_stage"`
	Codec            string `yaml:"codec"`
	Rank             int    `yaml:"rank"`          // subspace rank k (codec subspace)
	SubspaceSeed     uint64 `yaml:"subspace_seed"` // seed of U and E_fix (codec subspace)
	// MemoryPerStage overrides the planner's estimate of what a stage needs
	// (bytes; 0 = estimate from the model).
	MemoryPerStage uint64 `yaml:"memory_per_stage"`
}

// Checkpoint says where and how often shards come home.
type Checkpoint struct {
	Interval int    `yaml:"interval"` // steps between checkpoints; 0 = only at the end
	Dir      string `yaml:"dir"`
}

// Privacy is what the researcher requires of the swarm.
type Privacy struct {
	// RequireAttestedCoordinator (default true) refuses a coordinator
	// without verified TEE evidence. nil means unset.
	RequireAttestedCoordinator *bool `yaml:"require_attested_coordinator"`
	RefuseRelayedLinks         bool  `yaml:"refuse_relayed_links"`
}

// Serve configures `holopeer serve`.
type Serve struct {
	MaxPromptTokens int `yaml:"max_prompt_tokens"`
	MaxOutputTokens int `yaml:"max_output_tokens"`
	MaxQueue        int `yaml:"max_queue"`
	MaxBatch        int `yaml:"max_batch"`
}

// Load reads, parses and validates a manifest file.
func Load(path string) (*Manifest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", path, err)
	}
	if len(b) > MaxBytes {
		return nil, fmt.Errorf("manifest %s: larger than %d bytes", path, MaxBytes)
	}
	m, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", path, err)
	}
	abs, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	m.dir = abs
	return m, nil
}

// Parse decodes and validates manifest bytes. Unknown fields are errors: a
// misspelt key must not silently fall back to a default.
func Parse(b []byte) (*Manifest, error) {
	if len(b) > MaxBytes {
		return nil, fmt.Errorf("larger than %d bytes", MaxBytes)
	}
	m := &Manifest{}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(m); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty manifest")
		}
		return nil, fmt.Errorf("invalid YAML: %s", cleanYAMLError(err))
	}
	m.ApplyDefaults()
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

var fieldNotFound = regexp.MustCompile(`field (\S+) not found in type manifest\.(\w+)`)

// cleanYAMLError rewrites the decoder's Go type names into manifest terms.
func cleanYAMLError(err error) string {
	s := err.Error()
	s = strings.TrimPrefix(s, "yaml: ")
	s = fieldNotFound.ReplaceAllStringFunc(s, func(m string) string {
		sub := fieldNotFound.FindStringSubmatch(m)
		return fmt.Sprintf("unknown field %q in %s (allowed: %s)", sub[1], sectionName(sub[2]), strings.Join(allowedFields(sub[2]), ", "))
	})
	return strings.Join(strings.Fields(s), " ")
}

// Dir is the directory the manifest was loaded from ("" when parsed from
// bytes).
func (m *Manifest) Dir() string { return m.dir }

// Resolve makes a manifest-relative path absolute.
func (m *Manifest) Resolve(p string) string {
	if p == "" || filepath.IsAbs(p) || m.dir == "" {
		return p
	}
	return filepath.Join(m.dir, p)
}

// SetDir sets the directory relative paths resolve against.
func (m *Manifest) SetDir(dir string) { m.dir = dir }

// RequireAttested reports whether the job needs an attested coordinator
// (true unless the manifest says false).
func (p Privacy) RequireAttested() bool {
	return p.RequireAttestedCoordinator == nil || *p.RequireAttestedCoordinator
}
