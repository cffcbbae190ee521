package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/optim"
	"github.com/holopeer/holopeer/stage/safetensors"
	"github.com/holopeer/holopeer/stage/tokenizer"
)

// TrainState is trainer_state.json: where a training run stands, so that
// it can resume with the step count, schedule and data it would have had.
type TrainState struct {
	// Step is the number of optimizer steps taken (every stage's AdamW
	// has taken this many).
	Step int `json:"step"`
	// Tokens is the number of training tokens consumed.
	Tokens int64 `json:"tokens"`
	// Data is the data source's position, in the source's own JSON.
	Data json.RawMessage `json:"data,omitempty"`
	// Loss is the last step's training loss (informational).
	Loss float64 `json:"loss,omitempty"`
}

// Snapshot is everything a checkpoint directory holds, in host memory: a
// single process captures it from its stages; a pipeline assembles it
// from the shards its stages send home.
type Snapshot struct {
	// Config is the model as trained (with the subspace constraint, if any).
	Config model.Config
	// Dense are the Hugging Face tensors (model.Stage.ExportDense).
	Dense []model.HostTensor
	// Factors are a constrained model's stored factors (names ending in
	// ".z", from model.Stage.Tensors); empty for a dense model.
	Factors []model.HostTensor
	// Optimizer are the AdamW moments (optim.AdamW.StateTensors);
	// optional.
	Optimizer []model.HostTensor
	// State is the run's position; optional.
	State *TrainState
}

// Capture downloads a snapshot of stages, which must cover one model in
// order (model.NewStages, or a single model.Model's stage). optimizers,
// when given, are the stages' AdamWs in the same order. A weight two
// stages hold (a tied embedding and head) is stored once.
func Capture(stages []*model.Stage, optimizers []*optim.AdamW) (Snapshot, error) {
	if len(stages) == 0 {
		return Snapshot{}, errors.New("checkpoint: no stages to capture")
	}
	if optimizers != nil && len(optimizers) != len(stages) {
		return Snapshot{}, fmt.Errorf("checkpoint: %d optimizers for %d stages", len(optimizers), len(stages))
	}
	cfg := stages[0].Config()
	for i, s := range stages {
		sp := s.Span()
		wantFirst := 0
		if i > 0 {
			wantFirst = stages[i-1].Span().Last
		}
		if sp.First != wantFirst || sp.Embed != (i == 0) || sp.Head != (i == len(stages)-1) {
			return Snapshot{}, fmt.Errorf("checkpoint: stage %d holds %+v, which does not continue the model", i, sp)
		}
	}
	if last := stages[len(stages)-1].Span().Last; last != cfg.Layers {
		return Snapshot{}, fmt.Errorf("checkpoint: the stages end at block %d of %d", last, cfg.Layers)
	}
	snap := Snapshot{Config: cfg}
	seen := map[string]bool{}
	seenF := map[string]bool{}
	seenO := map[string]bool{}
	for i, s := range stages {
		for _, t := range s.ExportDense() {
			if !seen[t.Name] {
				seen[t.Name] = true
				snap.Dense = append(snap.Dense, t)
			}
		}
		if cfg.Subspace.Enabled() {
			for _, t := range s.Tensors() {
				if strings.HasSuffix(t.Name, ".z") && !seenF[t.Name] {
					seenF[t.Name] = true
					snap.Factors = append(snap.Factors, t)
				}
			}
		}
		if optimizers != nil {
			for _, t := range optimizers[i].StateTensors(s.Params()) {
				if !seenO[t.Name] {
					seenO[t.Name] = true
					snap.Optimizer = append(snap.Optimizer, t)
				}
			}
		}
	}
	return snap, nil
}

// SaveOption configures Save.
type SaveOption func(*saveConfig) error

type saveConfig struct {
	dtype      safetensors.DType
	tok        tokenizer.Tokenizer
	tokFile    string
	shardBytes int64
	progress   func(done, total int64)
	set        map[string]bool
}

// DefaultShardBytes is where the weights of a large model are cut into
// shards listed by model.safetensors.index.json, as transformers does.
const DefaultShardBytes = 2 << 30

// WithShardBytes cuts the weights into shards of at most n bytes (a
// tensor larger than n gets a shard of its own).
func WithShardBytes(n int64) SaveOption {
	return func(c *saveConfig) error {
		if n <= 0 {
			return errors.New("checkpoint: shard size must be positive")
		}
		c.shardBytes = n
		return saveOnce(c, "WithShardBytes")
	}
}

// WithProgress is called after each tensor is written with the bytes of
// weights written so far and in all.
func WithProgress(f func(done, total int64)) SaveOption {
	return func(c *saveConfig) error {
		c.progress = f
		return saveOnce(c, "WithProgress")
	}
}

func saveOnce(c *saveConfig, name string) error {
	if c.set[name] {
		return fmt.Errorf("checkpoint: option %s given twice", name)
	}
	c.set[name] = true
	return nil
}

// WithDType stores model.safetensors as dt (F32, the default, BF16 or
// F16): BF16 halves an export for serving. Factors and optimizer state
// are always F32, so training resumes exactly.
func WithDType(dt safetensors.DType) SaveOption {
	return func(c *saveConfig) error {
		if dt != safetensors.F32 && dt != safetensors.BF16 && dt != safetensors.F16 {
			return fmt.Errorf("checkpoint: cannot store weights as %q (F32, BF16 or F16)", dt)
		}
		c.dtype = dt
		return saveOnce(c, "WithDType")
	}
}

// WithTokenizer records the tokenizer in config.json (holopeer.tokenizer,
// bos_token_id, eos_token_id) and, for a Hugging Face tokenizer.json
// ("hf:<path>"), copies that file beside the weights so the checkpoint
// is self-contained.
func WithTokenizer(tok tokenizer.Tokenizer) SaveOption {
	return func(c *saveConfig) error {
		if tok == nil {
			return errors.New("checkpoint: nil tokenizer")
		}
		c.tok = tok
		if path, ok := strings.CutPrefix(tok.Name(), "hf:"); ok {
			c.tokFile = path
		}
		return saveOnce(c, "WithTokenizer")
	}
}

// Save writes snap to dir in the Hugging Face layout, atomically: the
// files go into a temporary directory beside dir, are synced, and the
// directory is swapped in by rename, so a crash leaves the old checkpoint
// or the new one, never a mix. An existing dir is replaced only if it
// holds nothing but checkpoint files.
func Save(dir string, snap Snapshot, opts ...SaveOption) error {
	sc, err := newSaveConfig(opts)
	if err != nil {
		return err
	}
	if err := snap.check(); err != nil {
		return err
	}
	return sc.install(dir, func(tmp string) error { return sc.writeFiles(tmp, snap) })
}

// SaveSources writes a dense model of cfg to dir in the Hugging Face
// layout as Save does, each tensor read from dense only when it is
// written: a model larger than memory (a random initialisation, shards
// streamed from the stage nodes' checkpoint files) never sits whole on
// the host. dense must hold every tensor of the dense model.
//
// For a model trained with the subspace constraint (cfg.Subspace set),
// factors are its stored factors (the ….z tensors), written to FactorsFile
// and named in config.json so that training or subspace serving can start
// from the export; dense is then the densified model.
func SaveSources(dir string, cfg model.Config, dense, factors []safetensors.Source, opts ...SaveOption) error {
	sc, err := newSaveConfig(opts)
	if err != nil {
		return err
	}
	trained := cfg
	if trained.Subspace.Enabled() != (len(factors) > 0) {
		return errors.New("checkpoint: factors go with a subspace config, and only with one")
	}
	cfg.Subspace = model.SubspaceConfig{}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	have := map[string][]int{}
	for _, t := range dense {
		have[t.Name] = t.Shape
	}
	for _, ref := range StageTensors(cfg, model.Whole(cfg)) {
		if shape, ok := have[ref.Name]; !ok || !slices.Equal(shape, ref.Shape) {
			return fmt.Errorf("checkpoint: the sources lack dense tensor %s%v (have %v)", ref.Name, ref.Shape, shape)
		}
	}
	return sc.install(dir, func(tmp string) error {
		if err := sc.writeConfig(tmp, trained); err != nil {
			return err
		}
		if err := sc.writeModel(tmp, cfg, dense); err != nil {
			return err
		}
		if len(factors) == 0 {
			return nil
		}
		if err := safetensors.WriteSources(filepath.Join(tmp, FactorsFile), factors, nil); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
		return nil
	})
}

func newSaveConfig(opts []SaveOption) (saveConfig, error) {
	sc := saveConfig{dtype: safetensors.F32, shardBytes: DefaultShardBytes, set: map[string]bool{}}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&sc); err != nil {
			return sc, err
		}
	}
	return sc, nil
}

// install fills a temporary directory beside dir and swaps it in.
func (sc *saveConfig) install(dir string, fill func(tmp string) error) error {
	if err := replaceable(dir); err != nil {
		return err
	}
	parent := filepath.Dir(filepath.Clean(dir))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	defer os.RemoveAll(tmp) // after a successful swap it holds the old checkpoint, or nothing
	if err := fill(tmp); err != nil {
		return err
	}
	if err := syncDir(tmp); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := swapIn(tmp, dir); err != nil {
		return fmt.Errorf("checkpoint: installing %s: %w", dir, err)
	}
	if err := syncDir(parent); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// check refuses a snapshot that would not load back: every tensor of the
// dense model (and, when constrained, every factor) must be there.
func (s Snapshot) check() error {
	if err := s.Config.Validate(); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	have := func(ts []model.HostTensor) map[string][]int {
		m := map[string][]int{}
		for _, t := range ts {
			m[t.Name] = t.Shape
		}
		return m
	}
	dense, factors := have(s.Dense), have(s.Factors)
	dcfg := s.Config
	dcfg.Subspace = model.SubspaceConfig{}
	for _, ref := range StageTensors(dcfg, model.Whole(dcfg)) {
		if shape, ok := dense[ref.Name]; !ok || !slices.Equal(shape, ref.Shape) {
			return fmt.Errorf("checkpoint: snapshot lacks dense tensor %s%v (has %v)", ref.Name, ref.Shape, shape)
		}
	}
	if s.Config.Subspace.Enabled() {
		for _, ref := range StageTensors(s.Config, model.Whole(s.Config)) {
			if ref.File != FactorsFile {
				continue
			}
			if shape, ok := factors[ref.Name]; !ok || !slices.Equal(shape, ref.Shape) {
				return fmt.Errorf("checkpoint: snapshot lacks factor %s%v (has %v)", ref.Name, ref.Shape, shape)
			}
		}
	}
	return nil
}

func (sc *saveConfig) writeFiles(dir string, snap Snapshot) error {
	if err := sc.writeConfig(dir, snap.Config); err != nil {
		return err
	}
	dense := make([]safetensors.Source, len(snap.Dense))
	for i, t := range snap.Dense {
		dense[i] = safetensors.Source{Name: t.Name, Shape: t.Shape, Data: t.Data}
	}
	dcfg := snap.Config
	dcfg.Subspace = model.SubspaceConfig{}
	if err := sc.writeModel(dir, dcfg, dense); err != nil {
		return err
	}
	if len(snap.Factors) > 0 {
		if err := safetensors.Write(filepath.Join(dir, FactorsFile), hostTensors(snap.Factors), nil); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
	}
	if len(snap.Optimizer) > 0 {
		if err := safetensors.Write(filepath.Join(dir, OptimizerFile), hostTensors(snap.Optimizer), nil); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
	}
	if snap.State != nil {
		if err := writeJSON(filepath.Join(dir, StateFile), snap.State); err != nil {
			return err
		}
	}
	return nil
}

// writeModel writes the dense weights in model order: one
// model.safetensors, or shards of at most shardBytes and their index.
func (sc *saveConfig) writeModel(dir string, cfg model.Config, dense []safetensors.Source) error {
	byName := map[string]safetensors.Source{}
	for _, t := range dense {
		byName[t.Name] = t
	}
	var ordered []safetensors.Source
	var total int64
	seen := map[string]bool{}
	for _, ref := range StageTensors(cfg, model.Whole(cfg)) {
		if seen[ref.Name] {
			continue // a tied head is the embedding
		}
		seen[ref.Name] = true
		ordered = append(ordered, byName[ref.Name])
		total += numel(ref.Shape) * sc.dtype.Size()
	}
	var shards [][]safetensors.Source
	var cur int64
	for _, t := range ordered {
		n := numel(t.Shape) * sc.dtype.Size()
		if len(shards) == 0 || cur > 0 && cur+n > sc.shardBytes {
			shards, cur = append(shards, nil), 0
		}
		shards[len(shards)-1] = append(shards[len(shards)-1], t)
		cur += n
	}
	var done int64
	report := func(srcs []safetensors.Source) []safetensors.Source {
		if sc.progress == nil {
			return srcs
		}
		out := make([]safetensors.Source, len(srcs))
		for i, t := range srcs {
			n := numel(t.Shape) * sc.dtype.Size()
			read, data := t.Read, t.Data
			t.Data, t.Read = nil, func(dst []float32) error {
				if data != nil {
					copy(dst, data)
				} else if err := read(dst); err != nil {
					return err
				}
				done += n
				sc.progress(done, total)
				return nil
			}
			out[i] = t
		}
		return out
	}
	meta := map[string]string{"format": "pt"} // what transformers' save_pretrained writes
	if len(shards) == 1 {
		if err := safetensors.WriteSources(filepath.Join(dir, ModelFile), report(shards[0]), meta, safetensors.WithDType(sc.dtype)); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
		return nil
	}
	weightMap := map[string]string{}
	for i, srcs := range shards {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(shards))
		if err := safetensors.WriteSources(filepath.Join(dir, name), report(srcs), meta, safetensors.WithDType(sc.dtype)); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
		for _, t := range srcs {
			weightMap[t.Name] = name
		}
	}
	return writeJSON(filepath.Join(dir, ModelIndexFile), map[string]any{
		"metadata":   map[string]any{"total_size": total},
		"weight_map": weightMap,
	})
}

func numel(shape []int) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= int64(d)
	}
	return n
}

// writeConfig writes config.json, generation_config.json and the
// tokenizer for a model of cfg.
func (sc *saveConfig) writeConfig(dir string, cfg model.Config) error {
	hf := NewHFConfig(cfg, sc.dtype)
	if !cfg.Subspace.Enabled() {
		hf.Holopeer = nil
	}
	var gen map[string]any
	if sc.tok != nil {
		if hf.Holopeer == nil {
			hf.Holopeer = &Extras{}
		}
		hf.Holopeer.Tokenizer = sc.tok.Name()
		if sc.tokFile != "" {
			hf.Holopeer.Tokenizer = "hf"
		}
		gen = map[string]any{"_from_model_config": true}
		if eos := sc.tok.EOS(); eos >= 0 {
			hf.EOSTokenID = json.RawMessage(fmt.Sprint(eos))
			gen["eos_token_id"] = eos
		}
		if bos := tokenizer.BOS(sc.tok); bos >= 0 {
			hf.BOSTokenID = json.RawMessage(fmt.Sprint(bos))
			gen["bos_token_id"] = bos
		}
	}
	if err := writeJSON(filepath.Join(dir, ConfigFile), hf); err != nil {
		return err
	}
	if gen != nil {
		if err := writeJSON(filepath.Join(dir, GenerationFile), gen); err != nil {
			return err
		}
	}
	if sc.tokFile != "" {
		b, err := readBounded(sc.tokFile, 256<<20)
		if err != nil {
			return fmt.Errorf("checkpoint: copying the tokenizer: %w", err)
		}
		if err := writeFileSync(filepath.Join(dir, TokenizerFile), b); err != nil {
			return err
		}
	}
	return nil
}

func hostTensors(ts []model.HostTensor) []safetensors.Tensor {
	out := make([]safetensors.Tensor, len(ts))
	for i, t := range ts {
		out[i] = safetensors.Tensor{Name: t.Name, Shape: t.Shape, Data: t.Data}
	}
	return out
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("checkpoint: %s: %w", filepath.Base(path), err)
	}
	return writeFileSync(path, append(b, '\n'))
}

func writeFileSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// replaceable refuses to swap out a directory that holds anything Save
// does not write: it is not a checkpoint, and the swap would delete it.
func replaceable(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	for _, e := range entries {
		if !slices.Contains(knownFiles, e.Name()) || e.IsDir() {
			return fmt.Errorf("checkpoint: %s holds %q, which is not a checkpoint file; refusing to replace it (choose an empty or new directory)", dir, e.Name())
		}
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	// Not every platform can sync a directory; the files are synced.
	_ = d.Sync()
	return nil
}

// LoadOptimizer restores a stage's AdamW from the checkpoint's
// optimizer.safetensors: the moments of the stage's own parameters only,
// read by offset, and the step count from trainer_state.json.
func (c *Checkpoint) LoadOptimizer(st *model.Stage, opt *optim.AdamW) error {
	if c.Dir == "" {
		return errors.New("checkpoint: optimizer state needs a checkpoint directory")
	}
	state, err := ReadState(c.Dir)
	if err != nil {
		return err
	}
	f, err := safetensors.Open(filepath.Join(c.Dir, OptimizerFile))
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", c.Dir, err)
	}
	defer f.Close()
	var tensors []model.HostTensor
	for _, p := range st.Params() {
		for _, prefix := range []string{"optim.adamw.m.", "optim.adamw.v."} {
			name := prefix + p.Name
			buf := make([]float32, p.Len())
			if err := f.ReadFloat32(name, p.Shape, buf); err != nil {
				return fmt.Errorf("%w: %s: %w", ErrTensor, OptimizerFile, err)
			}
			if err := finite(name, buf); err != nil {
				return err
			}
			tensors = append(tensors, model.HostTensor{Name: name, Shape: slices.Clone(p.Shape), Data: buf})
		}
	}
	if err := opt.LoadState(state.Step, st.Params(), tensors); err != nil {
		return fmt.Errorf("checkpoint %s: %w", c.Dir, err)
	}
	return nil
}

// ReadState reads dir/trainer_state.json.
func ReadState(dir string) (TrainState, error) {
	b, err := readBounded(filepath.Join(dir, StateFile), MaxConfigBytes)
	if err != nil {
		return TrainState{}, fmt.Errorf("checkpoint: %w", err)
	}
	var s TrainState
	if err := json.Unmarshal(b, &s); err != nil {
		return TrainState{}, fmt.Errorf("checkpoint: %s: %w", StateFile, err)
	}
	if s.Step < 0 || s.Tokens < 0 {
		return TrainState{}, fmt.Errorf("checkpoint: %s: negative step %d or tokens %d", StateFile, s.Step, s.Tokens)
	}
	return s, nil
}
