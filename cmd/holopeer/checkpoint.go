package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/safetensors"
	"github.com/holopeer/holopeer/stage/tokenizer"
)

func init() { register(newCheckpointCmd) }

// shapes are named Llama shapes anyone can try without a model hub.
var shapes = map[string]model.Config{
	// TinyLlama-1.1B: 1.10B parameters.
	"tinyllama-1.1b": {Vocab: 32000, Dim: 2048, Layers: 22, Heads: 32, KVHeads: 4, FFNDim: 5632, MaxSeq: 2048, RopeTheta: 10000, NormEps: 1e-5},
	// A ~300M model to train across three stage nodes.
	"llama-300m": {Vocab: 32000, Dim: 1024, Layers: 24, Heads: 16, KVHeads: 16, FFNDim: 2816, MaxSeq: 2048, RopeTheta: 10000, NormEps: 1e-5},
	// The demo's shape (testnet/demo.yaml), byte vocabulary.
	"demo": {Vocab: 257, Dim: 128, Layers: 6, Heads: 4, KVHeads: 2, FFNDim: 344, MaxSeq: 512},
}

func shapeNames() string {
	var names []string
	for n := range shapes {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

func newCheckpointCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "checkpoint",
		Short: "Work with Hugging Face-layout checkpoints",
	}
	cmd.AddCommand(newCheckpointInitCmd())
	return cmd
}

func newCheckpointInitCmd() *cobra.Command {
	var (
		shape, dtype string
		seed         uint64
		cfg          model.Config
	)
	cmd := &cobra.Command{
		Use:   "init DIR",
		Short: "Write a random-initialised Llama checkpoint of a named or given shape",
		Long: `init writes a Hugging Face-layout Llama checkpoint (config.json and
model.safetensors, or shards with model.safetensors.index.json above 2 GiB)
whose weights are drawn from --seed, so real sizes can be tried without a
model hub:

  holopeer checkpoint init --shape tinyllama-1.1b --dtype bf16 DIR

Named shapes: ` + shapeNames() + `. --dim, --layers, --heads, --kv-heads,
--ffn, --vocab and --max-seq override the shape's fields (or give one from
scratch without --shape). The weights are written one tensor at a time: the
model never sits whole in memory. The tokenizer recorded is "byte"; its ids
are the first 257 of the vocabulary.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := checkpointShape(shape, cfg)
			if err != nil {
				return err
			}
			dt := safetensors.DType(strings.ToUpper(dtype))
			tok, err := tokenizer.New("byte", "")
			if err != nil {
				return err
			}
			if c.Vocab < tok.VocabSize() {
				return fmt.Errorf("--vocab %d is smaller than the byte tokenizer's %d ids", c.Vocab, tok.VocabSize())
			}
			var srcs []safetensors.Source
			for _, t := range c.InitialTensors(model.Whole(c), seed) {
				read := t.Read
				srcs = append(srcs, safetensors.Source{Name: t.Name, Shape: t.Shape, Read: func(dst []float32) error { read(dst); return nil }})
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "writing %s: %s parameters (d=%d, %d blocks, %d heads, %d KV heads, FFN %d, vocab %d) as %s\n",
				args[0], si(float64(c.ParamCount())), c.Dim, c.Layers, c.Heads, c.KVHeads, c.FFNDim, c.Vocab, dt)
			start := time.Now()
			bar := newByteProgress(cmd.ErrOrStderr())
			if err := checkpoint.SaveSources(args[0], c, srcs, nil, checkpoint.WithDType(dt), checkpoint.WithTokenizer(tok), checkpoint.WithProgress(bar.update)); err != nil {
				return err
			}
			bar.finish()
			fmt.Fprintf(out, "wrote %s in %s\n", args[0], time.Since(start).Round(100*time.Millisecond))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&shape, "shape", "", "a named shape: "+shapeNames())
	f.StringVar(&dtype, "dtype", "bf16", "weight dtype on disk: f32, bf16 or f16")
	f.Uint64Var(&seed, "seed", 1, "initialisation seed")
	f.IntVar(&cfg.Dim, "dim", 0, "model width (d_model)")
	f.IntVar(&cfg.Layers, "layers", 0, "number of blocks")
	f.IntVar(&cfg.Heads, "heads", 0, "attention heads")
	f.IntVar(&cfg.KVHeads, "kv-heads", 0, "key/value heads (grouped-query attention)")
	f.IntVar(&cfg.FFNDim, "ffn", 0, "feed-forward width")
	f.IntVar(&cfg.Vocab, "vocab", 0, "vocabulary size")
	f.IntVar(&cfg.MaxSeq, "max-seq", 0, "context length")
	return cmd
}

// checkpointShape is the named shape with the given non-zero fields over
// it.
func checkpointShape(name string, over model.Config) (model.Config, error) {
	var c model.Config
	if name != "" {
		s, ok := shapes[name]
		if !ok {
			return c, fmt.Errorf("unknown --shape %q (known: %s)", name, shapeNames())
		}
		c = s
	}
	for _, f := range []struct {
		dst *int
		v   int
	}{
		{&c.Dim, over.Dim}, {&c.Layers, over.Layers}, {&c.Heads, over.Heads}, {&c.KVHeads, over.KVHeads},
		{&c.FFNDim, over.FFNDim}, {&c.Vocab, over.Vocab}, {&c.MaxSeq, over.MaxSeq},
	} {
		if f.v != 0 {
			*f.dst = f.v
		}
	}
	if c.Dim == 0 {
		return c, errors.New("give --shape or the model's fields (--dim, --layers, --heads, --ffn, --vocab, --max-seq)")
	}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.MaxSeq == 0 {
		c.MaxSeq = 2048
	}
	return c, c.Validate()
}

// byteProgress draws a progress line for a long write or load: on a
// terminal it redraws in place, elsewhere it prints every tenth.
type byteProgress struct {
	w     io.Writer
	start time.Time
	next  int64 // tenth to print next (non-terminal)
	tty   bool
	last  time.Time
}

func newByteProgress(w io.Writer) *byteProgress {
	return &byteProgress{w: w, start: time.Now(), tty: isTerminal(w)}
}

func (p *byteProgress) update(done, total int64) {
	if total <= 0 {
		return
	}
	line := fmt.Sprintf("%3d%%  %s of %s  %s/s", done*100/total, humanize.IBytes(uint64(done)), humanize.IBytes(uint64(total)),
		humanize.IBytes(uint64(float64(done)/max(time.Since(p.start).Seconds(), 1e-3))))
	if p.tty {
		if time.Since(p.last) > 100*time.Millisecond || done == total {
			fmt.Fprintf(p.w, "\r%s ", line)
			p.last = time.Now()
		}
		return
	}
	if done*10/total >= p.next {
		fmt.Fprintln(p.w, line)
		p.next = done*10/total + 1
	}
}

func (p *byteProgress) finish() {
	if p.tty {
		fmt.Fprintln(p.w)
	}
}
