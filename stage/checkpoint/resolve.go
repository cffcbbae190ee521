package checkpoint

import (
	"fmt"

	"github.com/holopeer/holopeer/stage/manifest"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/model/train"
	"github.com/holopeer/holopeer/stage/optim"
	"github.com/holopeer/holopeer/stage/tokenizer"
)

// ResolveModel turns a manifest's model section into the model every
// participant builds: the local trainer, the swarm's researcher node and
// its stages must agree on it exactly.
//
//   - model.vocab 0 means the tokenizer's vocabulary size; a smaller
//     vocab than the tokenizer's is refused (ids would fall outside the
//     embedding).
//   - model.checkpoint takes the architecture from that directory's
//     config.json instead of the size fields.
//   - pipeline.codec subspace sets the constraint {Rank: pipeline.rank,
//     Seed: pipeline.subspace_seed}, so a local run trains the same
//     constrained model the swarm would. A checkpoint to start from must
//     then hold factors trained under that same constraint.
func ResolveModel(m *manifest.Manifest, tok tokenizer.Tokenizer) (model.Config, error) {
	var sub model.SubspaceConfig
	if m.Pipeline.Codec == "subspace" {
		sub = model.SubspaceConfig{Rank: m.Pipeline.Rank, Seed: m.Pipeline.SubspaceSeed}
	}
	md := m.Model
	var cfg model.Config
	if md.Checkpoint != "" {
		dir := m.Resolve(md.Checkpoint)
		hf, err := ReadConfig(dir)
		if err != nil {
			return model.Config{}, fmt.Errorf("model.checkpoint: %w", err)
		}
		if cfg, err = hf.Model(); err != nil {
			return model.Config{}, fmt.Errorf("model.checkpoint %s: %w", dir, err)
		}
		if sub.Enabled() {
			trained, ok, err := hf.Constrained()
			if err != nil {
				return model.Config{}, fmt.Errorf("model.checkpoint %s: %w", dir, err)
			}
			if !ok || trained.Subspace.Rank != sub.Rank || trained.Subspace.Seed != sub.Seed {
				return model.Config{}, fmt.Errorf("%w: model.checkpoint %s holds a dense model (or one trained under another subspace), "+
					"but pipeline.codec subspace trains the constrained U·Z form with rank %d, seed %d; "+
					"fine-tune it with codec fp32, bf16 or int8", ErrConfig, dir, sub.Rank, sub.Seed)
			}
			cfg = trained
		}
	} else {
		cfg = model.Config{
			Vocab:         md.Vocab,
			Dim:           md.Dim,
			Layers:        md.Layers,
			Heads:         md.Heads,
			KVHeads:       md.KVHeads,
			FFNDim:        md.FFNDim,
			MaxSeq:        md.MaxSeq,
			RopeTheta:     md.RopeTheta,
			NormEps:       md.NormEps,
			TieEmbeddings: md.TieEmbeddings,
			Subspace:      sub,
		}
		if cfg.Vocab == 0 {
			cfg.Vocab = tok.VocabSize()
		}
		if cfg.KVHeads == 0 {
			cfg.KVHeads = cfg.Heads
		}
	}
	if tok != nil && tok.VocabSize() > cfg.Vocab {
		return model.Config{}, fmt.Errorf("%w: the tokenizer %s has %d ids but the model's vocabulary is %d", ErrConfig, tok.Name(), tok.VocabSize(), cfg.Vocab)
	}
	if cfg.MaxSeq < m.Train.SeqLen {
		return model.Config{}, fmt.Errorf("%w: the model's context %d is shorter than train.seq_len %d", ErrConfig, cfg.MaxSeq, m.Train.SeqLen)
	}
	if err := cfg.Validate(); err != nil {
		return model.Config{}, fmt.Errorf("manifest %s: %w", m.Name, err)
	}
	return cfg, nil
}

// TrainConfig maps the manifest's train section to the optimisation of a
// run: AdamW from train.optimizer, the warmup + cosine schedule over
// train.steps (lr → min_lr after warmup_steps), and grad_clip as the
// global-norm bound.
func TrainConfig(m *manifest.Manifest) (train.Config, error) {
	o := m.Train.Optimizer
	tc := train.Config{
		Optim:    optim.Config{Beta1: o.Beta1, Beta2: o.Beta2, Eps: o.Eps, WeightDecay: o.WeightDecay},
		Schedule: optim.Schedule{Peak: o.LR, Min: o.MinLR, Warmup: o.WarmupSteps, Total: m.Train.Steps},
		ClipNorm: o.GradClip,
	}
	if err := tc.Optim.Validate(); err != nil {
		return train.Config{}, fmt.Errorf("train.optimizer: %w", err)
	}
	if err := tc.Schedule.Validate(); err != nil {
		return train.Config{}, fmt.Errorf("train.optimizer: %w", err)
	}
	return tc, nil
}
