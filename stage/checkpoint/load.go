package checkpoint

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/safetensors"
	"github.com/holopeer/holopeer/stage/tensor"
)

// Checkpoint is an open checkpoint: its parsed config and the headers of
// its safetensors files. Tensor data is read only when a stage is loaded,
// and only the stage's own tensors. It is safe for concurrent use.
type Checkpoint struct {
	// Dir is the directory it was opened from ("" for OpenFiles).
	Dir string
	// HF is config.json as parsed.
	HF HFConfig

	// OnLoad, when set, is told after each tensor LoadStage reads how many
	// bytes of the span's tensors (as stored) are read and how many there
	// are: a large model's load can show progress.
	OnLoad func(done, total int64)

	model   tensorFile        // model.safetensors, or the shards its index names
	factors *safetensors.File // nil when the checkpoint holds no factors
}

// tensorFile is where tensors are read from: one safetensors file, or the
// shards of a sharded checkpoint.
type tensorFile interface {
	Info(name string) (safetensors.TensorInfo, bool)
	ReadFloat32(name string, shape []int, dst []float32) error
	ReadFloat32At(name string, shape []int, off int64, dst []float32) error
	Close() error
}

// Open reads dir's config.json and the headers of its model.safetensors
// (or of every shard model.safetensors.index.json names) and of
// subspace.safetensors, when present. Nothing else is read.
func Open(dir string) (*Checkpoint, error) {
	hf, err := ReadConfig(dir)
	if err != nil {
		return nil, err
	}
	if _, err := hf.Model(); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", dir, err)
	}
	var mf tensorFile
	if single := filepath.Join(dir, ModelFile); fileExists(single) || !fileExists(filepath.Join(dir, ModelIndexFile)) {
		f, err := safetensors.Open(single)
		if err != nil {
			return nil, fmt.Errorf("checkpoint %s: %w", dir, err)
		}
		mf = f
	} else if mf, err = openShards(dir); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", dir, err)
	}
	var ff *safetensors.File
	if p := filepath.Join(dir, FactorsFile); fileExists(p) {
		if ff, err = safetensors.Open(p); err != nil {
			mf.Close()
			return nil, fmt.Errorf("checkpoint %s: %w", dir, err)
		}
	}
	return &Checkpoint{Dir: dir, HF: hf, model: mf, factors: ff}, nil
}

// OpenFiles assembles a checkpoint from a parsed config and opened
// safetensors files, which may sit behind any io.ReaderAt
// (safetensors.OpenReader): a stage node fetching its weights from the
// researcher reads through a stream. factors may be nil.
func OpenFiles(hf HFConfig, modelFile, factors *safetensors.File) (*Checkpoint, error) {
	if modelFile == nil {
		return nil, errors.New("checkpoint: no model file")
	}
	if _, err := hf.Model(); err != nil {
		return nil, err
	}
	return &Checkpoint{HF: hf, model: modelFile, factors: factors}, nil
}

// Close closes the files Open opened.
func (c *Checkpoint) Close() error {
	err := c.model.Close()
	if c.factors != nil {
		err = errors.Join(err, c.factors.Close())
	}
	return err
}

// Config is the dense model that model.safetensors holds: what generation,
// serving and fine-tuning without the constraint load.
func (c *Checkpoint) Config() model.Config {
	cfg, _ := c.HF.Model() // checked by OpenFiles
	return cfg
}

// TrainingConfig is the model as it was trained: with the subspace
// constraint when the checkpoint holds its factors, so training resumes
// in U·Z form; otherwise the dense Config.
func (c *Checkpoint) TrainingConfig() model.Config {
	cfg, ok, err := c.HF.Constrained()
	if err != nil || !ok || c.factors == nil {
		return c.Config()
	}
	return cfg
}

// Tokenizer is the tokenizer spec recorded by holopeer ("byte", "gpt2"),
// "hf" when Dir holds a tokenizer.json, or "" when neither is known.
func (c *Checkpoint) Tokenizer() string {
	if c.Dir != "" && fileExists(filepath.Join(c.Dir, TokenizerFile)) {
		return "hf"
	}
	if c.HF.Holopeer != nil {
		return c.HF.Holopeer.Tokenizer
	}
	return ""
}

// TensorRef is one tensor a stage needs: its name and shape, and the file
// of the checkpoint directory that holds it.
type TensorRef struct {
	Name  string
	Shape []int
	File  string // ModelFile or FactorsFile
}

// StageTensors lists the tensors the stage of cfg covering span reads
// from a checkpoint, in the order model.Stage.Params lists its
// parameters. Subspace factors (names ending in ".z") live in FactorsFile,
// everything else under its Hugging Face name in ModelFile.
func StageTensors(cfg model.Config, span model.Span) []TensorRef {
	d, kv, f, v := cfg.Dim, cfg.KVDim(), cfg.FFNDim, cfg.Vocab
	k := cfg.Subspace.Rank
	var refs []TensorRef
	add := func(name string, shape ...int) {
		file := ModelFile
		if strings.HasSuffix(name, ".z") {
			file = FactorsFile
		}
		refs = append(refs, TensorRef{Name: name, Shape: shape, File: file})
	}
	if span.Embed {
		if cfg.Subspace.Enabled() {
			add(model.NameEmbedZ, v, k)
		} else {
			add(model.NameEmbed, v, d)
		}
	}
	for i := span.First; i < span.Last; i++ {
		ln := func(s string) string { return model.LayerName(i, s) }
		add(ln("input_layernorm.weight"), d)
		add(ln("self_attn.q_proj.weight"), d, d)
		add(ln("self_attn.k_proj.weight"), kv, d)
		add(ln("self_attn.v_proj.weight"), kv, d)
		if cfg.Constrained(i) {
			add(ln("self_attn.o_proj.z"), k, d)
		} else {
			add(ln("self_attn.o_proj.weight"), d, d)
		}
		add(ln("post_attention_layernorm.weight"), d)
		add(ln("mlp.gate_proj.weight"), f, d)
		add(ln("mlp.up_proj.weight"), f, d)
		if cfg.Constrained(i) {
			add(ln("mlp.down_proj.z"), k, f)
		} else {
			add(ln("mlp.down_proj.weight"), d, f)
		}
	}
	if span.Head {
		add(model.NameFinalNorm, d)
		switch {
		case !cfg.TieEmbeddings:
			add(model.NameHead, v, d)
		case !span.Embed:
			// The tied head of a last stage is its own copy of the embedding.
			add(model.NameEmbed, v, d)
		}
	}
	return refs
}

// checkSpan mirrors model's span rules, so that StageTensors is only asked
// about spans NewStage accepts.
func checkSpan(cfg model.Config, span model.Span) error {
	switch {
	case span.First < 0 || span.Last < span.First || span.Last > cfg.Layers:
		return fmt.Errorf("%w: span blocks [%d,%d) outside 0..%d", ErrConfig, span.First, span.Last, cfg.Layers)
	case span.Embed && span.First != 0, span.Head && span.Last != cfg.Layers:
		return fmt.Errorf("%w: span %+v: the embedding starts at block 0 and the head ends at block %d", ErrConfig, span, cfg.Layers)
	}
	return nil
}

// file returns the open file that holds ref.
func (c *Checkpoint) file(ref TensorRef) (tensorFile, error) {
	if ref.File == FactorsFile {
		if c.factors == nil {
			return nil, fmt.Errorf("%w: %q: the checkpoint has no %s (it holds a dense model; load it without the subspace constraint)",
				ErrTensor, ref.Name, FactorsFile)
		}
		return c.factors, nil
	}
	return c.model, nil
}

// Check verifies, from the headers alone, that every tensor the stage of
// cfg covering span needs is present with the right shape and a float
// dtype. LoadStage calls it before allocating anything, so a config that
// asks for more than the files hold fails here, cheaply.
func (c *Checkpoint) Check(cfg model.Config, span model.Span) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := checkSpan(cfg, span); err != nil {
		return err
	}
	for _, ref := range StageTensors(cfg, span) {
		f, err := c.file(ref)
		if err != nil {
			return err
		}
		info, ok := f.Info(ref.Name)
		if !ok {
			return fmt.Errorf("%w: %w: %q (shape %v) is not in %s", ErrTensor, safetensors.ErrMissing, ref.Name, ref.Shape, ref.File)
		}
		if !slices.Equal(info.Shape, ref.Shape) {
			return fmt.Errorf("%w: %w: %q in %s has shape %v, the config needs %v", ErrTensor, safetensors.ErrShape, ref.Name, ref.File, info.Shape, ref.Shape)
		}
		if !info.DType.Float() {
			return fmt.Errorf("%w: %w: %q in %s is %s", ErrTensor, safetensors.ErrDType, ref.Name, ref.File, info.DType)
		}
	}
	return nil
}

// LoadStage builds the stage of cfg covering span with its weights read
// from the checkpoint: only that span's tensors, each by its byte range.
// A stage built WithoutGrad from a bfloat16 checkpoint keeps its matrices
// in bfloat16 (see WeightDType); callers do not pass WithWeightDType.
// cfg is normally Config() (dense) or TrainingConfig() (as trained);
// opts are passed to model.NewStage (backend; the seed is irrelevant since
// every parameter is overwritten).
func (c *Checkpoint) LoadStage(cfg model.Config, span model.Span, opts ...model.Option) (*model.Stage, error) {
	if err := c.Check(cfg, span); err != nil {
		return nil, err
	}
	refs := map[string]TensorRef{}
	sizes := map[string]int64{}
	var done, total int64
	for _, ref := range StageTensors(cfg, span) {
		refs[ref.Name] = ref
		if f, err := c.file(ref); err == nil {
			if info, ok := f.Info(ref.Name); ok {
				sizes[ref.Name] = info.NumElements() * info.DType.Size()
				total += sizes[ref.Name]
			}
		}
	}
	load := func(name string, shape []int, off int, dst []float32) error {
		ref, ok := refs[name]
		if !ok || !slices.Equal(ref.Shape, shape) {
			return fmt.Errorf("checkpoint: the stage asks for %s%v, which the loader does not list (model and checkpoint packages disagree)", name, shape)
		}
		f, err := c.file(ref)
		if err != nil {
			return err
		}
		if err := f.ReadFloat32At(ref.Name, ref.Shape, int64(off), dst); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrTensor, ref.File, err)
		}
		if err := finiteFrom(ref.Name, off, dst); err != nil {
			return err
		}
		if c.OnLoad != nil {
			done += sizes[name] * int64(len(dst)) / max(numel(ref.Shape), 1)
			c.OnLoad(done, total)
		}
		return nil
	}
	opts = append(slices.Clone(opts), model.WithValues(load))
	if c.WeightDType(cfg, span) == tensor.BFloat16 {
		opts = append(opts, model.WithWeightDType(tensor.BFloat16))
	}
	st, err := model.NewStage(cfg, span, opts...)
	if err != nil {
		return nil, err
	}
	if n := len(st.Params()); n != len(refs) {
		st.Close()
		return nil, fmt.Errorf("checkpoint: the stage has %d parameters, the loader expected %d (model and checkpoint packages disagree)", n, len(refs))
	}
	return st, nil
}

// WeightDType is how a serving stage of span stores its matrices:
// tensor.BFloat16 when the checkpoint holds every 2-D tensor of the span
// in BF16, so memory stays at 2 bytes per parameter and the values are
// exact, else tensor.Float32. F16 widens to float32: it does not fit
// bfloat16's grid.
func (c *Checkpoint) WeightDType(cfg model.Config, span model.Span) tensor.DType {
	matrices := 0
	for _, ref := range StageTensors(cfg, span) {
		if len(ref.Shape) != 2 {
			continue
		}
		f, err := c.file(ref)
		if err != nil {
			return tensor.Float32
		}
		if info, ok := f.Info(ref.Name); !ok || info.DType != safetensors.BF16 {
			return tensor.Float32
		}
		matrices++
	}
	if matrices == 0 {
		return tensor.Float32
	}
	return tensor.BFloat16
}

// ReadTensor reads one tensor a stage needs into dst (len = its elements),
// widening bf16/f16 to float32, and checks that every value is finite.
func (c *Checkpoint) ReadTensor(ref TensorRef, dst []float32) error {
	f, err := c.file(ref)
	if err != nil {
		return err
	}
	if err := f.ReadFloat32(ref.Name, ref.Shape, dst); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrTensor, ref.File, err)
	}
	return finite(ref.Name, dst)
}

// LoadStages loads one stage per span (model.EvenSpans, model.SpansAt).
func (c *Checkpoint) LoadStages(cfg model.Config, spans []model.Span, opts ...model.Option) ([]*model.Stage, error) {
	stages := make([]*model.Stage, 0, len(spans))
	for i, sp := range spans {
		s, err := c.LoadStage(cfg, sp, opts...)
		if err != nil {
			for _, prev := range stages {
				prev.Close()
			}
			return nil, fmt.Errorf("stage %d: %w", i, err)
		}
		stages = append(stages, s)
	}
	return stages, nil
}

func finite(name string, data []float32) error { return finiteFrom(name, 0, data) }

// finiteFrom checks a slice of a tensor that starts at element off.
func finiteFrom(name string, off int, data []float32) error {
	for i, v := range data {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("%w: %q holds a non-finite value (%v) at element %d", ErrTensor, name, v, off+i)
		}
	}
	return nil
}

// LoadStage opens the checkpoint in dir and loads the stage of cfg
// covering span (see Checkpoint.LoadStage).
func LoadStage(dir string, cfg model.Config, span model.Span, opts ...model.Option) (*model.Stage, error) {
	c, err := Open(dir)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	s, err := c.LoadStage(cfg, span, opts...)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", dir, err)
	}
	return s, nil
}

// LoadModel loads the whole dense model in dir (generation, serving).
func LoadModel(dir string, opts ...model.Option) (*model.Model, error) {
	c, err := Open(dir)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	cfg := c.Config()
	s, err := c.LoadStage(cfg, model.Whole(cfg), opts...)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", dir, err)
	}
	return &model.Model{Stage: s}, nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
