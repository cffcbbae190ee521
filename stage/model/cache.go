package model

import (
	"errors"
	"fmt"

	"github.com/holopeer/holopeer/stage/tensor"
)

// Cache is one sequence's keys and values for the blocks of one stage, for
// generation: a prefill of the prompt, then one (or a few) tokens at a
// time. Each stage of a pipeline keeps its own Cache for the sequence. It
// grows on demand up to MaxSeq rows.
type Cache struct {
	s    *Stage
	k, v []tensor.Buffer // per block of the stage: rows × KVDim
	rows int             // capacity
	n    int             // tokens cached
}

// NewCache returns an empty cache for one sequence on this stage.
func (s *Stage) NewCache() *Cache { return &Cache{s: s} }

// Len is the number of tokens cached: the position of the next token.
func (c *Cache) Len() int { return c.n }

// Reset forgets the sequence but keeps the memory.
func (c *Cache) Reset() { c.n = 0 }

// Free releases the cache's memory.
func (c *Cache) Free() {
	for i := range c.k {
		c.s.be.Free(c.k[i])
		c.s.be.Free(c.v[i])
	}
	c.k, c.v, c.rows, c.n = nil, nil, 0, 0
}

// reserve grows the cache to hold at least rows tokens, keeping its
// contents.
func (c *Cache) reserve(rows int) {
	if rows <= c.rows {
		return
	}
	be := c.s.be
	kvd := c.s.cfg.KVDim()
	newRows := max(64, c.rows)
	for newRows < rows {
		newRows *= 2
	}
	newRows = min(newRows, c.s.cfg.MaxSeq)
	for i := range c.s.blocks {
		nk, nv := be.Alloc(tensor.Float32, newRows*kvd), be.Alloc(tensor.Float32, newRows*kvd)
		if c.n > 0 {
			be.Copy(be.View(nk, 0, c.n*kvd), be.View(c.k[i], 0, c.n*kvd))
			be.Copy(be.View(nv, 0, c.n*kvd), be.View(c.v[i], 0, c.n*kvd))
		}
		if i < len(c.k) {
			be.Free(c.k[i])
			be.Free(c.v[i])
			c.k[i], c.v[i] = nk, nv
		} else {
			c.k, c.v = append(c.k, nk), append(c.v, nv)
		}
	}
	c.rows = newRows
}

// Infer runs in.Seq new tokens of the cache's sequence (in.Batch must be
// 1) through the stage, at positions cache.Len()…, appends their keys and
// values, and returns the hidden states or, on the head stage, the logits
// of every new token. Positions, if given, must be exactly those.
func (s *Stage) Infer(c *Cache, in Input) (Output, error) {
	if c == nil || c.s != s {
		return Output{}, errors.New("model: Infer needs a cache made by this stage's NewCache")
	}
	if in.Batch != 1 {
		return Output{}, fmt.Errorf("%w: Infer runs one sequence, got batch %d", ErrInput, in.Batch)
	}
	if err := s.check(in, modeInfer); err != nil {
		return Output{}, err
	}
	t, past := in.Seq, c.n
	if past+t > s.cfg.MaxSeq {
		return Output{}, fmt.Errorf("%w: %d cached + %d new tokens exceed MaxSeq %d", ErrContextFull, past, t, s.cfg.MaxSeq)
	}
	pos := make([]int32, t)
	for i := range pos {
		pos[i] = int32(past + i)
	}
	if len(in.Positions) != 0 {
		if len(in.Positions) != t {
			return Output{}, fmt.Errorf("%w: %d positions for %d tokens", ErrInput, len(in.Positions), t)
		}
		for i, p := range in.Positions {
			if p != pos[i] {
				return Output{}, fmt.Errorf("%w: position %d at %d, the cache expects %d", ErrInput, p, i, pos[i])
			}
		}
	}
	c.reserve(past + t)
	run := &microbatch{n: t, shape: s.attnShape(1, t, past+t, past)}
	run.pos = s.be.Alloc(tensor.Int32, t)
	s.be.UploadInt32(run.pos, pos)
	h := s.stageInput(run, in)
	for i, b := range s.blocks {
		out, acts := s.blockForward(b, h, run.pos, run.shape, t, c, i)
		acts.free(s.be)
		h = out
	}
	out := Output{SubspaceResidual: -1}
	if s.span.Head {
		s.headForward(run, h, in, modeInfer, &out)
	} else {
		out.Hidden = make([]float32, t*s.cfg.Dim)
		s.be.Download(out.Hidden, h)
		s.be.Free(h)
		out.SubspaceResidual = s.residual(out.Hidden, in.Tokens)
	}
	run.free(s.be)
	if err := s.be.Sync(); err != nil {
		return Output{}, fmt.Errorf("model: inference on %s: %w", s.be.Name(), err)
	}
	c.n += t
	return out, nil
}
