package checkpoint_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/checkpoint/checkpointtest"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/safetensors"
)

// FuzzParseConfig feeds config.json bytes through parsing and the model
// conversion: never a panic, and an accepted config is a valid model.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"model_type":"llama","vocab_size":61,"hidden_size":32,"intermediate_size":48,"num_hidden_layers":3,"num_attention_heads":4,"num_key_value_heads":2,"rope_scaling":null,"tie_word_embeddings":true}`))
	f.Add([]byte(`{"architectures":["LlamaForCausalLM"],"vocab_size":1e9,"hidden_size":-1}`))
	f.Add([]byte(`{"model_type":"llama","rope_parameters":{"rope_type":"yarn"},"eos_token_id":[1,2]}`))
	f.Add([]byte(`{"model_type":"llama","head_dim":0,"num_attention_heads":0}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		hf, err := checkpoint.ParseConfig(b)
		if err != nil {
			return
		}
		hf.EOS()
		cfg, err := hf.Model()
		if err != nil {
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("accepted an invalid model: %v", err)
		}
		if c, ok, err := hf.Constrained(); err == nil && ok {
			if err := c.Validate(); err != nil {
				t.Fatalf("accepted an invalid constrained model: %v", err)
			}
		}
	})
}

// FuzzLoadStage loads a small model's stages from arbitrary
// model.safetensors bytes (a hostile or truncated file): never a panic,
// and every refusal is one of the package's errors.
func FuzzLoadStage(f *testing.F) {
	cfg := model.Config{Vocab: 7, Dim: 4, Layers: 2, Heads: 2, KVHeads: 1, FFNDim: 6, MaxSeq: 8, TieEmbeddings: true}
	m, err := model.New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	dir := checkpointtest.Save(f, filepath.Join(f.TempDir(), "ck"), []*model.Stage{m.Stage}, checkpoint.WithDType(safetensors.BF16))
	good, err := os.ReadFile(filepath.Join(dir, checkpoint.ModelFile))
	if err != nil {
		f.Fatal(err)
	}
	hf, err := checkpoint.ReadConfig(dir)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)/2])
	huge := bytes.Clone(good)
	binary.LittleEndian.PutUint64(huge, 1<<40)
	f.Add(huge)
	f.Add([]byte(`{}`))
	spans := []model.Span{model.Whole(cfg), {First: 0, Last: 1, Embed: true}, {First: 1, Last: 2, Head: true}}
	f.Fuzz(func(t *testing.T, b []byte) {
		sf, err := safetensors.OpenReader(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			if !errors.Is(err, safetensors.ErrHeader) && !errors.Is(err, safetensors.ErrDType) {
				t.Fatalf("open: unexpected error %v", err)
			}
			return
		}
		ck, err := checkpoint.OpenFiles(hf, sf, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, sp := range spans {
			st, err := ck.LoadStage(cfg, sp)
			if err != nil {
				if !errors.Is(err, checkpoint.ErrTensor) {
					t.Fatalf("span %+v: unexpected error %v", sp, err)
				}
				continue
			}
			st.Close()
		}
	})
}
