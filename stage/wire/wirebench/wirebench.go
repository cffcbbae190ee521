// Package wirebench measures the stage data path for `holopeer bench` and
// the Go benchmarks: bytes per token per boundary for every codec, and the
// codecs' cost next to a real stage's compute. (Stream goodput against raw
// TCP is wire.MeasureGoodput; the emulated home link is package netem.)
package wirebench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/subspace"
	"github.com/holopeer/holopeer/stage/wire"
	"github.com/holopeer/holopeer/stage/wire/codec"
)

// Vocab is the vocabulary the byte-count table assumes (GPT-2's), which
// makes subspace token ids 2 bytes.
const Vocab = 50257

// TableRank is the subspace rank used at each d_model of the table: the
// anchors of research/compression.md (d 256: k 16, the suggested CPU test
// model; d 1024: k 160, ProtocolNanoGPT; d 4096: k 40, node0's 8B run).
var TableRank = map[int]int{256: 16, 1024: 160, 4096: 40}

// Codecs lists the codecs the table covers.
var Codecs = []codec.ID{codec.FP32, codec.BF16, codec.Int8Block, codec.SubspaceBF16, codec.SubspaceFP32}

// BytesRow is one codec at one d_model: bytes per token crossing one
// boundary, on the stream (header, records and tags included, for frames
// of Tokens tokens) and in the codec payload alone.
type BytesRow struct {
	Codec                     codec.ID
	Dim, Rank, Tokens         int
	Forward, Backward         float64 // on the stream
	PayloadFwd, PayloadBwd    float64
	BF16Forward, BF16Backward float64 // the bf16 figures at the same d, the baseline
}

// BytesPerToken computes the table for frames of tokens tokens. The byte
// counts are those the link writes (wire.FrameWireBytes is checked
// against real links in the wire tests).
func BytesPerToken(tokens int) ([]BytesRow, error) {
	var rows []BytesRow
	for _, d := range []int{256, 1024, 4096} {
		b, err := subspace.New(subspace.Config{Dim: d, Rank: TableRank[d], Vocab: Vocab, Seed: 1})
		if err != nil {
			return nil, err
		}
		bf, err := codec.New(codec.BF16, codec.Params{Dim: d})
		if err != nil {
			return nil, err
		}
		perTok := func(c codec.Codec, dir codec.Direction) (wireB, payload float64) {
			p := c.PayloadSize(dir, tokens)
			return float64(wire.FrameWireBytes(p)) / float64(tokens), float64(p) / float64(tokens)
		}
		bfF, _ := perTok(bf, codec.Forward)
		bfB, _ := perTok(bf, codec.Backward)
		for _, id := range Codecs {
			c, err := codec.New(id, codec.Params{Dim: d, Basis: b, EFixCacheBytes: -1})
			if err != nil {
				return nil, err
			}
			r := BytesRow{Codec: id, Dim: d, Tokens: tokens, BF16Forward: bfF, BF16Backward: bfB}
			if id.Subspace() {
				r.Rank = b.Rank()
			}
			r.Forward, r.PayloadFwd = perTok(c, codec.Forward)
			r.Backward, r.PayloadBwd = perTok(c, codec.Backward)
			rows = append(rows, r)
		}
	}
	return rows, nil
}

// Demo is the model of testnet/demo.yaml (the job `holopeer testnet`
// runs): d_model 128, 6 blocks over 3 stages, byte tokenizer, subspace
// rank 32 with seed 7, microbatches of 8 sequences × 64 tokens.
var Demo = struct {
	Model              model.Config
	Stages, Batch, Seq int
}{
	Model: model.Config{Vocab: 256, Dim: 128, Layers: 6, Heads: 4, KVHeads: 2, FFNDim: 344, MaxSeq: 64,
		Subspace: model.SubspaceConfig{Rank: 32, Seed: 7}},
	Stages: 3, Batch: 8, Seq: 64,
}

// OverheadRow is one codec's encode+decode time per token, forward and
// backward together (what one boundary costs its two stages), next to the
// compute per token of the demo's middle stage (forward and backward).
type OverheadRow struct {
	Codec           codec.ID
	CodecNsPerToken float64
	StageNsPerToken float64
	Fraction        float64 // CodecNsPerToken / StageNsPerToken
}

// CodecOverhead times the demo's middle stage and every codec on the same
// microbatch, for at least minTime each.
func CodecOverhead(ctx context.Context, minTime time.Duration) ([]OverheadRow, error) {
	cfg := Demo.Model
	spans, err := model.EvenSpans(cfg.Layers, Demo.Stages)
	if err != nil {
		return nil, err
	}
	st, err := model.NewStage(cfg, spans[1])
	if err != nil {
		return nil, err
	}
	defer st.Close()
	basis := st.Basis()
	if basis == nil {
		return nil, fmt.Errorf("wirebench: the demo stage has no subspace basis")
	}
	d, k, n := cfg.Dim, cfg.Subspace.Rank, Demo.Batch*Demo.Seq
	r := rand.New(rand.NewPCG(1, 2))
	ids := make([]int, n)
	toks := make([]int32, n)
	for i := range ids {
		ids[i] = r.IntN(cfg.Vocab)
		toks[i] = int32(ids[i])
	}
	coef := make([]float32, n*k)
	for i := range coef {
		coef[i] = float32(r.NormFloat64())
	}
	h := make([]float32, n*d) // what a constrained upstream stage hands on
	basis.Decode(coef, ids, h)
	grad := make([]float32, n*d)
	for i := range grad {
		grad[i] = float32(r.NormFloat64()) * 1e-3
	}
	stageNs, err := timePerToken(ctx, minTime, n, func() error {
		if _, err := st.Forward(0, model.Input{Batch: Demo.Batch, Seq: Demo.Seq, Hidden: h, Tokens: toks}); err != nil {
			return err
		}
		_, err := st.Backward(0, grad)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("wirebench: demo stage: %w", err)
	}
	var rows []OverheadRow
	for _, id := range Codecs {
		c, err := codec.New(id, codec.Params{Dim: d, Basis: basis})
		if err != nil {
			return nil, err
		}
		var p []byte
		out := make([]float32, n*d)
		gotIDs := make([]int, n)
		ns, err := timePerToken(ctx, minTime, n, func() error {
			for _, dir := range []codec.Direction{codec.Forward, codec.Backward} {
				x := h
				if dir == codec.Backward {
					x = grad
				}
				var err error
				if p, _, err = c.Encode(p[:0], dir, x, ids); err != nil {
					return err
				}
				if err := c.Decode(p, dir, n, out, gotIDs); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("wirebench: codec %s: %w", id, err)
		}
		rows = append(rows, OverheadRow{Codec: id, CodecNsPerToken: ns, StageNsPerToken: stageNs, Fraction: ns / stageNs})
	}
	return rows, nil
}

// timePerToken runs f (one microbatch of n tokens) until minTime has
// passed, at least twice, and returns the best ns per token of a run.
func timePerToken(ctx context.Context, minTime time.Duration, n int, f func() error) (float64, error) {
	if err := f(); err != nil { // warm caches and buffers
		return 0, err
	}
	best := 0.0
	start := time.Now()
	for runs := 0; runs < 2 || time.Since(start) < minTime; runs++ {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		t := time.Now()
		if err := f(); err != nil {
			return 0, err
		}
		ns := float64(time.Since(t).Nanoseconds()) / float64(n)
		if best == 0 || ns < best {
			best = ns
		}
	}
	return best, nil
}
