package pipeline

import (
	"fmt"

	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/data"
	"github.com/holopeer/holopeer/stage/job"
	"github.com/holopeer/holopeer/stage/manifest"
	"github.com/holopeer/holopeer/stage/tokenizer"
)

// SpecFor turns a researcher's manifest into the job spec every stage
// receives: the resolved model, shapes and optimizer, and nothing about
// the data.
func SpecFor(m *manifest.Manifest, tok tokenizer.Tokenizer) (job.Spec, error) {
	cfg, err := checkpoint.ResolveModel(m, tok)
	if err != nil {
		return job.Spec{}, err
	}
	tc, err := checkpoint.TrainConfig(m)
	if err != nil {
		return job.Spec{}, err
	}
	t := m.Train
	rows := t.BatchTokens / (t.Microbatches * t.SeqLen)
	spec := job.Spec{
		JobID: job.NewJobID(m.Name), Name: m.Name, Kind: job.KindTrain,
		Model: cfg, InitSeed: t.Seed, FromCheckpoint: m.Model.Checkpoint != "",
		Codec: m.Pipeline.Codec, Stages: m.Pipeline.Stages, Replicas: m.Pipeline.ReplicasPerStage,
		Steps: t.Steps, SeqLen: t.SeqLen, Rows: rows, Microbatches: t.Microbatches,
		Optim: tc.Optim, Schedule: tc.Schedule, ClipNorm: tc.ClipNorm,
		CheckpointInterval: m.Checkpoint.Interval,
		RefuseRelayed:      m.Privacy.RefuseRelayedLinks,
		RequireAttested:    m.Privacy.RequireAttested(),
	}
	if err := spec.Validate(); err != nil {
		return job.Spec{}, fmt.Errorf("manifest %s: %w", m.Name, err)
	}
	return spec, nil
}

// SourceFor returns a factory of the manifest's data, each call starting
// from the beginning of the same stream (the driver rewinds by rebuilding).
// A text file is tokenized once.
func SourceFor(m *manifest.Manifest, tok tokenizer.Tokenizer) (func() (data.Source, error), error) {
	if s := m.Data.Synthetic; s != nil {
		cfg := data.DefaultSyntheticConfig()
		cfg.Seed = s.Seed
		if s.Temperature != 0 {
			cfg.Temperature = s.Temperature
		}
		if _, err := data.NewSynthetic(cfg); err != nil {
			return nil, fmt.Errorf("data.synthetic: %w", err)
		}
		return func() (data.Source, error) { return data.NewSynthetic(cfg) }, nil
	}
	path := m.Resolve(m.Data.Text)
	first, err := data.NewTextFile(path, tok, m.Train.Seed)
	if err != nil {
		return nil, fmt.Errorf("data.text: %w", err)
	}
	tokens, vocab := first.Tokens(), first.VocabSize()
	return func() (data.Source, error) { return data.NewTokens(tokens, vocab, m.Train.Seed) }, nil
}
