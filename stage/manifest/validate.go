package manifest

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
)

// ApplyDefaults fills fields the researcher left out with values that make
// a small demo work. Validate runs after it.
func (m *Manifest) ApplyDefaults() {
	if m.Name == "" {
		m.Name = "job"
	}
	if m.Tokenizer == "" {
		m.Tokenizer = "byte"
	}
	t := &m.Train
	if t.Steps == 0 {
		t.Steps = 100
	}
	if t.SeqLen == 0 {
		t.SeqLen = 64
	}
	if t.Microbatches == 0 {
		t.Microbatches = 4
	}
	if t.BatchTokens == 0 {
		t.BatchTokens = t.Microbatches * 4 * t.SeqLen
	}
	if t.Seed == 0 {
		t.Seed = 1
	}
	o := &t.Optimizer
	if o.LR == 0 {
		o.LR = 3e-3
	}
	if o.MinLR == 0 {
		o.MinLR = o.LR / 10
	}
	if o.WarmupSteps == 0 {
		o.WarmupSteps = max(1, t.Steps/10)
	}
	if o.Beta1 == 0 {
		o.Beta1 = 0.9
	}
	if o.Beta2 == 0 {
		o.Beta2 = 0.95
	}
	if o.Eps == 0 {
		o.Eps = 1e-8
	}
	md := &m.Model
	if md.Checkpoint == "" {
		if md.Dim == 0 {
			md.Dim = 128
		}
		if md.Layers == 0 {
			md.Layers = 4
		}
		if md.Heads == 0 {
			md.Heads = 4
		}
		if md.KVHeads == 0 {
			md.KVHeads = md.Heads
		}
		if md.FFNDim == 0 {
			// Llama's SwiGLU width: about 8/3·dim, rounded up to a multiple of 8.
			md.FFNDim = (8*md.Dim/3 + 7) / 8 * 8
		}
		if md.MaxSeq == 0 {
			md.MaxSeq = t.SeqLen
		}
		if md.RopeTheta == 0 {
			md.RopeTheta = 10000
		}
		if md.NormEps == 0 {
			md.NormEps = 1e-5
		}
	}
	if m.Data.Text == "" && m.Data.Synthetic == nil {
		m.Data.Synthetic = &Synthetic{Seed: 1}
	}
	p := &m.Pipeline
	if p.Stages == 0 {
		p.Stages = 3
	}
	if p.ReplicasPerStage == 0 {
		p.ReplicasPerStage = 1
	}
	if p.Codec == "" {
		p.Codec = "subspace"
	}
	if p.Codec == "subspace" {
		if p.Rank == 0 && md.Dim > 0 {
			p.Rank = max(8, md.Dim/8)
		}
		if p.SubspaceSeed == 0 {
			p.SubspaceSeed = t.Seed
		}
	}
	if m.Checkpoint.Dir == "" {
		m.Checkpoint.Dir = "holopeer-out/" + m.Name
	}
	if s := m.Serve; s != nil {
		if s.MaxPromptTokens == 0 {
			s.MaxPromptTokens = 512
		}
		if s.MaxOutputTokens == 0 {
			s.MaxOutputTokens = 256
		}
		if s.MaxQueue == 0 {
			s.MaxQueue = 64
		}
		if s.MaxBatch == 0 {
			s.MaxBatch = 8
		}
	}
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Validate checks every field and returns all problems at once, each
// naming its field.
func (m *Manifest) Validate() error {
	var v validator
	v.check(nameRE.MatchString(m.Name), "name", "%q: use 1 to 64 letters, digits, '.', '_' or '-'", m.Name)
	switch tok := m.Tokenizer; {
	case tok == "byte", tok == "gpt2", tok == "hf":
	case strings.HasPrefix(tok, "hf:") && len(tok) > 3:
	default:
		v.fail("tokenizer", "%q: use byte, gpt2, hf (tokenizer.json beside model.checkpoint) or hf:/path/to/tokenizer.json", tok)
	}
	if tok := m.Tokenizer; tok == "hf" && m.Model.Checkpoint == "" {
		v.fail("tokenizer", "hf needs model.checkpoint (the directory holding tokenizer.json), or name the file with hf:/path")
	}

	md := m.Model
	if md.Checkpoint != "" {
		v.check(md.Dim == 0 && md.Layers == 0 && md.Heads == 0 && md.FFNDim == 0, "model",
			"give either checkpoint (its config.json sets the architecture) or dim/layers/heads/ffn_dim, not both")
	} else {
		v.check(md.Dim > 0 && md.Dim <= 16384, "model.dim", "%d: use 1 to 16384", md.Dim)
		v.check(md.Layers > 0 && md.Layers <= 1024, "model.layers", "%d: use 1 to 1024", md.Layers)
		v.check(md.Heads > 0 && md.Heads <= 1024, "model.heads", "%d: use 1 to 1024", md.Heads)
		if md.Heads > 0 && md.Dim > 0 {
			if md.Dim%md.Heads != 0 {
				v.fail("model.heads", "%d does not divide model.dim %d", md.Heads, md.Dim)
			} else if (md.Dim/md.Heads)%2 != 0 {
				v.fail("model.heads", "head size %d (dim/heads) must be even for rotary embeddings", md.Dim/md.Heads)
			}
		}
		v.check(md.KVHeads > 0 && md.Heads%max(md.KVHeads, 1) == 0, "model.kv_heads", "%d must divide model.heads %d (grouped-query attention)", md.KVHeads, md.Heads)
		v.check(md.FFNDim > 0 && md.FFNDim <= 1<<17, "model.ffn_dim", "%d: use 1 to %d", md.FFNDim, 1<<17)
		v.check(md.MaxSeq >= m.Train.SeqLen && md.MaxSeq <= 1<<17, "model.max_seq", "%d must be at least train.seq_len %d (and at most %d)", md.MaxSeq, m.Train.SeqLen, 1<<17)
		v.check(md.Vocab >= 0 && md.Vocab <= 1<<24, "model.vocab", "%d: use 0 (the tokenizer's size) or up to %d", md.Vocab, 1<<24)
		v.check(md.RopeTheta > 0, "model.rope_theta", "%g must be positive", md.RopeTheta)
		v.check(md.NormEps > 0 && md.NormEps < 1, "model.norm_eps", "%g: use a small positive number such as 1e-5", md.NormEps)
	}

	d := m.Data
	v.check((d.Text == "") != (d.Synthetic == nil), "data", "give exactly one of text (a file) or synthetic")
	if s := d.Synthetic; s != nil {
		v.check(s.Temperature >= 0 && s.Temperature <= 10, "data.synthetic.temperature", "%g: use 0 (default) or a value in (0, 10]", s.Temperature)
	}

	t := m.Train
	v.check(t.Steps > 0 && t.Steps <= 1e9, "train.steps", "%d: use 1 to 1e9", t.Steps)
	v.check(t.SeqLen >= 2 && t.SeqLen <= 1<<17, "train.seq_len", "%d: use 2 to %d", t.SeqLen, 1<<17)
	v.check(t.Microbatches > 0 && t.Microbatches <= 4096, "train.microbatches", "%d: use 1 to 4096", t.Microbatches)
	if t.Microbatches > 0 && t.SeqLen > 0 {
		per := t.Microbatches * t.SeqLen
		v.check(t.BatchTokens > 0 && t.BatchTokens%per == 0, "train.batch_tokens",
			"%d must be a positive multiple of train.microbatches × train.seq_len = %d (each microbatch holds whole sequences)", t.BatchTokens, per)
		v.check(t.BatchTokens <= 1<<24, "train.batch_tokens", "%d: at most %d", t.BatchTokens, 1<<24)
	}
	o := t.Optimizer
	v.check(o.LR > 0 && o.LR <= 10, "train.optimizer.lr", "%g: use a value in (0, 10]", o.LR)
	v.check(o.MinLR >= 0 && o.MinLR <= o.LR, "train.optimizer.min_lr", "%g must lie in [0, lr %g]", o.MinLR, o.LR)
	v.check(o.WarmupSteps >= 0 && o.WarmupSteps <= t.Steps, "train.optimizer.warmup_steps", "%d must lie in [0, train.steps %d]", o.WarmupSteps, t.Steps)
	v.check(o.WeightDecay >= 0 && o.WeightDecay < 1, "train.optimizer.weight_decay", "%g: use a value in [0, 1)", o.WeightDecay)
	v.check(o.Beta1 >= 0 && o.Beta1 < 1, "train.optimizer.beta1", "%g: use a value in [0, 1)", o.Beta1)
	v.check(o.Beta2 >= 0 && o.Beta2 < 1, "train.optimizer.beta2", "%g: use a value in [0, 1)", o.Beta2)
	v.check(o.Eps > 0 && o.Eps < 1, "train.optimizer.eps", "%g: use a small positive number such as 1e-8", o.Eps)
	v.check(o.GradClip >= 0, "train.optimizer.grad_clip", "%g: use 0 (off) or a positive norm", o.GradClip)

	p := m.Pipeline
	v.check(p.Stages > 0 && p.Stages <= 256, "pipeline.stages", "%d: use 1 to 256", p.Stages)
	if md.Checkpoint == "" && md.Layers > 0 && p.Stages > md.Layers {
		v.fail("pipeline.stages", "%d is more than model.layers %d: each stage needs at least one block", p.Stages, md.Layers)
	}
	v.check(p.ReplicasPerStage > 0 && p.ReplicasPerStage <= 16, "pipeline.replicas_per_stage", "%d: use 1 to 16", p.ReplicasPerStage)
	v.check(slices.Contains(Codecs, p.Codec), "pipeline.codec", "%q: use one of %s", p.Codec, strings.Join(Codecs, ", "))
	if p.Codec == "subspace" {
		v.check(p.Rank > 0 && p.Rank <= 1024, "pipeline.rank", "%d: use 1 to 1024", p.Rank)
		if md.Dim > 0 && p.Rank > md.Dim {
			v.fail("pipeline.rank", "%d is larger than model.dim %d", p.Rank, md.Dim)
		}
	} else if p.Rank != 0 {
		v.fail("pipeline.rank", "is only used by the subspace codec; remove it or set codec: subspace")
	}

	v.check(m.Checkpoint.Interval >= 0, "checkpoint.interval", "%d: use 0 (only at the end) or a positive number of steps", m.Checkpoint.Interval)
	if s := m.Serve; s != nil {
		v.check(s.MaxPromptTokens > 0 && s.MaxPromptTokens <= 1<<17, "serve.max_prompt_tokens", "%d: use 1 to %d", s.MaxPromptTokens, 1<<17)
		v.check(s.MaxOutputTokens > 0 && s.MaxOutputTokens <= 1<<17, "serve.max_output_tokens", "%d: use 1 to %d", s.MaxOutputTokens, 1<<17)
		v.check(s.MaxQueue > 0 && s.MaxQueue <= 1<<16, "serve.max_queue", "%d: use 1 to %d", s.MaxQueue, 1<<16)
		v.check(s.MaxBatch > 0 && s.MaxBatch <= 256, "serve.max_batch", "%d: use 1 to 256", s.MaxBatch)
	}
	return v.err()
}

// FieldError is one invalid field.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

type validator struct{ errs []error }

func (v *validator) check(ok bool, field, format string, args ...any) {
	if !ok {
		v.fail(field, format, args...)
	}
}

func (v *validator) fail(field, format string, args ...any) {
	v.errs = append(v.errs, &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
}

// err joins the problems into one error whose text is one line.
func (v *validator) err() error {
	if len(v.errs) == 0 {
		return nil
	}
	msgs := make([]string, len(v.errs))
	for i, e := range v.errs {
		msgs[i] = e.Error()
	}
	return &ValidationError{Errs: v.errs, text: strings.Join(msgs, "; ")}
}

// ValidationError holds every invalid field of a manifest.
type ValidationError struct {
	Errs []error
	text string
}

func (e *ValidationError) Error() string   { return e.text }
func (e *ValidationError) Unwrap() []error { return e.Errs }

// HasField reports whether err names field.
func HasField(err error, field string) bool {
	var ve *ValidationError
	if !errors.As(err, &ve) {
		return false
	}
	for _, e := range ve.Errs {
		var fe *FieldError
		if errors.As(e, &fe) && fe.Field == field {
			return true
		}
	}
	return false
}

// sections maps the Go type of each manifest section to its YAML path.
var sections = map[string]reflect.Type{
	"Manifest":   reflect.TypeOf(Manifest{}),
	"Model":      reflect.TypeOf(Model{}),
	"Data":       reflect.TypeOf(Data{}),
	"Synthetic":  reflect.TypeOf(Synthetic{}),
	"Train":      reflect.TypeOf(Train{}),
	"Optimizer":  reflect.TypeOf(Optimizer{}),
	"Pipeline":   reflect.TypeOf(Pipeline{}),
	"Checkpoint": reflect.TypeOf(Checkpoint{}),
	"Privacy":    reflect.TypeOf(Privacy{}),
	"Serve":      reflect.TypeOf(Serve{}),
}

var sectionPaths = map[string]string{
	"Manifest": "the manifest", "Model": "model", "Data": "data", "Synthetic": "data.synthetic",
	"Train": "train", "Optimizer": "train.optimizer", "Pipeline": "pipeline",
	"Checkpoint": "checkpoint", "Privacy": "privacy", "Serve": "serve",
}

func sectionName(goType string) string {
	if p, ok := sectionPaths[goType]; ok {
		return p
	}
	return goType
}

func allowedFields(goType string) []string {
	t, ok := sections[goType]
	if !ok {
		return nil
	}
	var out []string
	for i := 0; i < t.NumField(); i++ {
		tag := strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0]
		if tag != "" && tag != "-" {
			out = append(out, tag)
		}
	}
	return out
}
