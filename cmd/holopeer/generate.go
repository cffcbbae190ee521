package main

import (
	crand "crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/serve"
	"github.com/holopeer/holopeer/stage/tensor"
	"github.com/holopeer/holopeer/stage/tokenizer"
)

func init() { register(newGenerateCmd) }

type generateFlags struct {
	checkpoint  string
	prompt      string
	tokens      string
	maxTokens   int
	temperature float64
	topP        float64
	seed        uint64
	asJSON      bool
	tokenizer   string
	device      string
}

func newGenerateCmd() *cobra.Command {
	var f generateFlags
	cmd := &cobra.Command{
		Use:   "generate --checkpoint DIR (--prompt TEXT | --tokens ID,ID,…) --max-tokens N",
		Short: "Generate text from a checkpoint in this one process: the reference swarm serving is compared with",
		Long: `generate loads a checkpoint directory in the Hugging Face layout
(config.json + model.safetensors: F32, BF16 or F16 tensors, tied or untied
LM head; a Llama model as transformers defines it) and continues a prompt,
decoding one token at a time with a KV cache.

The prompt is --prompt TEXT, encoded with the checkpoint's tokenizer
(tokenizer.json beside the weights, or the one holopeer trained it with;
--tokenizer overrides) with the tokenizer's BOS token in front when it has
one, as transformers does; or --tokens, exact ids used as given.

Temperature 0 (the default) is greedy decoding. Above 0 it samples from
softmax(logits/T), restricted with --top-p to the smallest set of tokens
whose probability reaches P; --seed makes sampling repeatable. Generation
stops at the end-of-sequence token, after --max-tokens tokens, or when the
model's context is full.

Output is the generated text, streamed. With --json it prints one object:
  {"tokens": [...], "text": "...", "load_s": …, "first_token_s": …, "tokens_per_s": …}
where tokens are the generated ids only (not the prompt; the EOS id that
stopped generation is included, as transformers returns it), text is
their decoding without the EOS (null when no tokenizer is known), load_s
the time to build the model from the checkpoint, first_token_s the time
from then to the first token (the prompt's forward pass), and tokens_per_s
the decoding rate after it (0 with one token).

A BF16 checkpoint stays in bfloat16 in memory (2 bytes per parameter),
as swarm serving holds it, so the two produce the same tokens.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			seeded := cmd.Flags().Changed("seed")
			return runGenerate(cmd.OutOrStdout(), f, seeded)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.checkpoint, "checkpoint", "", "checkpoint directory (config.json + model.safetensors)")
	fl.StringVar(&f.prompt, "prompt", "", "prompt text")
	fl.StringVar(&f.tokens, "tokens", "", "prompt as comma-separated token ids")
	fl.IntVar(&f.maxTokens, "max-tokens", 0, "most tokens to generate (required)")
	fl.Float64Var(&f.temperature, "temperature", 0, "sampling temperature; 0 is greedy")
	fl.Float64Var(&f.topP, "top-p", 1, "nucleus sampling: keep the most likely tokens up to this probability mass")
	fl.Uint64Var(&f.seed, "seed", 0, "sampling seed (default: random)")
	fl.BoolVar(&f.asJSON, "json", false, `print {"tokens": [...], "text": ...}`)
	fl.StringVar(&f.tokenizer, "tokenizer", "", "tokenizer spec (byte, gpt2, hf:/path/tokenizer.json); default: the checkpoint's")
	fl.StringVar(&f.device, "device", "auto", "tensor backend: auto or one of "+strings.Join(tensor.Backends(), ", "))
	return cmd
}

func runGenerate(stdout io.Writer, f generateFlags, seeded bool) error {
	switch {
	case f.checkpoint == "":
		return errors.New("--checkpoint is required")
	case (f.prompt == "") == (f.tokens == ""):
		return errors.New("give exactly one of --prompt or --tokens")
	case f.maxTokens <= 0:
		return fmt.Errorf("--max-tokens %d: give a positive number", f.maxTokens)
	case !(f.temperature >= 0) || math.IsInf(f.temperature, 0):
		return fmt.Errorf("--temperature %g: use 0 (greedy) or a positive number", f.temperature)
	case !(f.topP > 0 && f.topP <= 1):
		return fmt.Errorf("--top-p %g: use a value in (0, 1]", f.topP)
	}
	ck, err := checkpoint.Open(f.checkpoint)
	if err != nil {
		return err
	}
	defer ck.Close()
	cfg := ck.Config()

	var tok tokenizer.Tokenizer
	spec := f.tokenizer
	if spec == "" {
		spec = ck.Tokenizer()
	}
	if spec != "" {
		if tok, err = tokenizer.New(spec, f.checkpoint); err != nil {
			return fmt.Errorf("tokenizer: %w", err)
		}
		if tok.VocabSize() > cfg.Vocab {
			return fmt.Errorf("tokenizer %s has %d ids, more than the model's vocabulary %d", tok.Name(), tok.VocabSize(), cfg.Vocab)
		}
	}

	var prompt []int32
	if f.tokens != "" {
		if prompt, err = parseTokenList(f.tokens, cfg.Vocab); err != nil {
			return err
		}
	} else {
		if tok == nil {
			return fmt.Errorf("%s names no tokenizer: pass --tokenizer, or give the prompt as --tokens", f.checkpoint)
		}
		if bos := tokenizer.BOS(tok); bos >= 0 {
			prompt = append(prompt, int32(bos))
		}
		for _, id := range tok.Encode(f.prompt) {
			prompt = append(prompt, int32(id))
		}
	}
	if len(prompt) == 0 {
		return errors.New("the prompt encodes to no tokens")
	}
	if len(prompt) >= cfg.MaxSeq {
		return fmt.Errorf("the prompt has %d tokens; the model's context is %d", len(prompt), cfg.MaxSeq)
	}

	be, err := tensor.Open(f.device)
	if err != nil {
		return fmt.Errorf("--device: %w", err)
	}
	loadStart := time.Now()
	var bar *byteProgress
	ck.OnLoad = func(done, total int64) {
		if bar == nil && total >= loadProgressBytes {
			bar = newByteProgress(os.Stderr)
			fmt.Fprintf(os.Stderr, "loading %s\n", f.checkpoint)
		}
		if bar != nil {
			bar.update(done, total)
		}
	}
	st, err := ck.LoadStage(cfg, model.Whole(cfg), model.WithBackend(be), model.WithoutGrad())
	if bar != nil {
		bar.finish()
	}
	if err != nil {
		return err
	}
	defer st.Close()
	loaded := time.Now()
	var firstAt, lastAt time.Time

	g := genConfig{maxTokens: f.maxTokens, sampling: serve.Sampling{Temperature: f.temperature, TopP: f.topP, Seed: f.seed}}
	if !seeded {
		var b [8]byte
		crand.Read(b[:])
		g.sampling.Seed = binary.LittleEndian.Uint64(b[:])
	}
	g.eos = ck.HF.EOS()
	if tok != nil && tok.EOS() >= 0 && !slices.Contains(g.eos, tok.EOS()) {
		g.eos = append(g.eos, tok.EOS())
	}

	// Stream the text as it grows: decode everything generated so far and
	// print what is new, which is right for every tokenizer (SentencePiece
	// decoders treat the first piece of a call differently).
	var printed string
	onToken := func(ids []int) {
		lastAt = time.Now()
		if len(ids) == 1 {
			firstAt = lastAt
		}
		if f.asJSON {
			return
		}
		if tok == nil {
			sep := ","
			if len(ids) == 1 {
				sep = ""
			}
			fmt.Fprintf(stdout, "%s%d", sep, ids[len(ids)-1])
			return
		}
		text := tok.Decode(withoutEOS(ids, g.eos))
		if strings.HasPrefix(text, printed) {
			fmt.Fprint(stdout, text[len(printed):])
			printed = text
		}
	}
	ids, err := generate(st, prompt, g, onToken)
	if err != nil {
		return err
	}
	if !f.asJSON {
		if tok != nil {
			if text := tok.Decode(withoutEOS(ids, g.eos)); text != printed && strings.HasPrefix(text, printed) {
				fmt.Fprint(stdout, text[len(printed):])
			}
		}
		fmt.Fprintln(stdout)
		return nil
	}
	res := struct {
		Tokens      []int   `json:"tokens"`
		Text        *string `json:"text"`
		LoadS       float64 `json:"load_s"`
		FirstTokenS float64 `json:"first_token_s"`
		TokensPerS  float64 `json:"tokens_per_s"`
	}{Tokens: ids, LoadS: loaded.Sub(loadStart).Seconds()}
	if len(ids) > 0 {
		res.FirstTokenS = firstAt.Sub(loaded).Seconds()
	}
	if len(ids) > 1 && lastAt.After(firstAt) {
		res.TokensPerS = float64(len(ids)-1) / lastAt.Sub(firstAt).Seconds()
	}
	if tok != nil {
		text := tok.Decode(withoutEOS(ids, g.eos))
		res.Text = &text
	}
	if res.Tokens == nil {
		res.Tokens = []int{}
	}
	return json.NewEncoder(stdout).Encode(res)
}

func withoutEOS(ids, eos []int) []int {
	if n := len(ids); n > 0 && slices.Contains(eos, ids[n-1]) {
		return ids[:n-1]
	}
	return ids
}

// parseTokenList parses "1,2,3" into ids below vocab.
func parseTokenList(s string, vocab int) ([]int32, error) {
	parts := strings.Split(s, ",")
	ids := make([]int32, 0, len(parts))
	for i, p := range parts {
		id, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil {
			return nil, fmt.Errorf("--tokens: item %d %q is not a token id", i+1, p)
		}
		if id < 0 || id >= vocab {
			return nil, fmt.Errorf("--tokens: id %d outside the model's vocabulary 0..%d", id, vocab-1)
		}
		ids = append(ids, int32(id))
	}
	return ids, nil
}

// loadProgressBytes is the model size above which loading shows progress.
const loadProgressBytes = 256 << 20

// genConfig is how generate picks tokens.
type genConfig struct {
	maxTokens int
	sampling  serve.Sampling // the zero value is greedy
	eos       []int
}

// generate continues prompt on a whole-model stage with a KV cache: one
// forward of the prompt, then one token at a time. onToken, if not nil,
// sees the generated ids after each new one. It returns the generated
// ids, ending with the EOS id when one stopped it.
func generate(st *model.Stage, prompt []int32, g genConfig, onToken func([]int)) ([]int, error) {
	cfg := st.Config()
	cache := st.NewCache()
	defer cache.Free()
	s := serve.NewSampler(g.sampling)
	out, err := st.Infer(cache, model.Input{Batch: 1, Seq: len(prompt), Tokens: prompt})
	if err != nil {
		return nil, err
	}
	v := cfg.Vocab
	logits := out.Logits[(len(prompt)-1)*v:]
	var ids []int
	for {
		next := int(s.Pick(logits))
		ids = append(ids, next)
		if onToken != nil {
			onToken(ids)
		}
		if slices.Contains(g.eos, next) || len(ids) == g.maxTokens || cache.Len() >= cfg.MaxSeq {
			return ids, nil
		}
		out, err := st.Infer(cache, model.Input{Batch: 1, Seq: 1, Tokens: []int32{int32(next)}})
		if err != nil {
			return ids, err
		}
		logits = out.Logits
	}
}
