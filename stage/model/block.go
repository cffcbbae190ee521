package model

import (
	"github.com/holopeer/holopeer/stage/tensor"
)

// blockActs are the activations a block's backward needs. Norm outputs
// and the SwiGLU product are not kept: they are cheap to recompute from x,
// hmid, gate and up.
type blockActs struct {
	x, rstd1    tensor.Buffer // block input, its RMSNorm statistics
	q, k, v     tensor.Buffer // projections after RoPE (new tokens only)
	attn, lse   tensor.Buffer // attention output and softmax log-sum-exp
	hmid, rstd2 tensor.Buffer // x + attention branch, its RMSNorm statistics
	gate, up    tensor.Buffer // MLP pre-activations
}

func (a *blockActs) free(be tensor.Backend) {
	for _, b := range []tensor.Buffer{a.x, a.rstd1, a.q, a.k, a.v, a.attn, a.lse, a.hmid, a.rstd2, a.gate, a.up} {
		if b != nil {
			be.Free(b)
		}
	}
	*a = blockActs{}
}

// blockForward runs one decoder layer on n rows:
//
//	hmid = x + o_proj(attn(rope(q_proj(norm1(x))), rope(k_proj(…)), v_proj(…)))
//	out  = hmid + down_proj(silu(gate_proj(norm2(hmid))) ∘ up_proj(norm2(hmid)))
//
// With a cache, the new keys and values are appended at rows past.. and
// attention reads all past+n cached rows. The block keeps x.
func (s *Stage) blockForward(b *block, x, pos tensor.Buffer, sh tensor.AttnShape, n int, cache *Cache, layer int) (tensor.Buffer, *blockActs) {
	c := s.cfg
	be := s.be
	d, kvd, f := c.Dim, c.KVDim(), c.FFNDim
	eps := float32(c.NormEps)
	a := &blockActs{x: x, rstd1: s.alloc(n), rstd2: s.alloc(n)}

	xn := s.alloc(n * d)
	be.RMSNorm(xn, a.rstd1, x, b.attnNorm.Value, d, eps)
	a.q, a.k, a.v = s.alloc(n*d), s.alloc(n*kvd), s.alloc(n*kvd)
	s.linear(a.q, xn, b.q, n, 0)
	s.linear(a.k, xn, b.k, n, 0)
	s.linear(a.v, xn, b.v, n, 0)
	be.RoPE(a.q, pos, s.freq, c.Heads, c.HeadDim(), false)
	be.RoPE(a.k, pos, s.freq, c.KVHeads, c.HeadDim(), false)
	keys, values := a.k, a.v
	if cache != nil {
		past := sh.QOffset
		be.Copy(be.View(cache.k[layer], past*kvd, n*kvd), a.k)
		be.Copy(be.View(cache.v[layer], past*kvd, n*kvd), a.v)
		keys = be.View(cache.k[layer], 0, sh.SeqK*kvd)
		values = be.View(cache.v[layer], 0, sh.SeqK*kvd)
	}
	a.attn, a.lse = s.alloc(n*d), s.alloc(sh.Batch*sh.Heads*sh.SeqQ)
	be.Attention(a.attn, a.lse, a.q, keys, values, sh)

	a.hmid = s.alloc(n * d)
	be.Copy(a.hmid, x)
	s.outProj(a.hmid, a.attn, b.o, n, b.constrained)

	be.RMSNorm(xn, a.rstd2, a.hmid, b.mlpNorm.Value, d, eps)
	a.gate, a.up = s.alloc(n*f), s.alloc(n*f)
	s.linear(a.gate, xn, b.gate, n, 0)
	s.linear(a.up, xn, b.up, n, 0)
	be.Free(xn)
	act := s.alloc(n * f)
	be.SwiGLU(act, a.gate, a.up)
	out := s.alloc(n * d)
	be.Copy(out, a.hmid)
	s.outProj(out, act, b.down, n, b.constrained)
	be.Free(act)
	return out, a
}

// blockBackward turns dh from ∂L/∂out into ∂L/∂x in place, adding the
// block's parameter gradients.
func (s *Stage) blockBackward(b *block, a *blockActs, dh, pos tensor.Buffer, sh tensor.AttnShape, n int) {
	c := s.cfg
	be := s.be
	d, kvd, f := c.Dim, c.KVDim(), c.FFNDim
	eps := float32(c.NormEps)

	// MLP branch: out = hmid + down(act).
	act := s.alloc(n * f)
	be.SwiGLU(act, a.gate, a.up)
	dact := s.alloc(n * f)
	s.outProjBackward(dact, dh, act, b.down, n, b.constrained)
	be.Free(act)
	dgate, dup := s.alloc(n*f), s.alloc(n*f)
	be.SwiGLUBackward(dgate, dup, dact, a.gate, a.up)
	be.Free(dact)
	xn, dxn := s.alloc(n*d), s.alloc(n*d)
	be.RMSNorm(xn, a.rstd2, a.hmid, b.mlpNorm.Value, d, eps)
	s.linearBackward(dxn, dgate, xn, b.gate, n, 0)
	s.linearBackward(dxn, dup, xn, b.up, n, 1)
	be.Free(dgate)
	be.Free(dup)
	be.RMSNormBackward(dh, b.mlpNorm.Grad, dxn, a.hmid, b.mlpNorm.Value, a.rstd2, d) // dh is now ∂L/∂hmid

	// Attention branch: hmid = x + o(attn).
	dattn := s.alloc(n * d)
	s.outProjBackward(dattn, dh, a.attn, b.o, n, b.constrained)
	dq, dk, dv := s.alloc(n*d), s.alloc(n*kvd), s.alloc(n*kvd)
	be.AttentionBackward(dq, dk, dv, dattn, a.q, a.k, a.v, a.attn, a.lse, sh)
	be.Free(dattn)
	be.RoPE(dq, pos, s.freq, c.Heads, c.HeadDim(), true)
	be.RoPE(dk, pos, s.freq, c.KVHeads, c.HeadDim(), true)
	be.RMSNorm(xn, a.rstd1, a.x, b.attnNorm.Value, d, eps)
	s.linearBackward(dxn, dq, xn, b.q, n, 0)
	s.linearBackward(dxn, dk, xn, b.k, n, 1)
	s.linearBackward(dxn, dv, xn, b.v, n, 1)
	for _, t := range []tensor.Buffer{dq, dk, dv, xn} {
		be.Free(t)
	}
	be.RMSNormBackward(dh, b.attnNorm.Grad, dxn, a.x, b.attnNorm.Value, a.rstd1, d) // dh is now ∂L/∂x
	be.Free(dxn)
}

// linear sets y = x·Wᵀ + beta·y for W of shape [out, in] (a Hugging Face
// nn.Linear weight) and n rows of x.
func (s *Stage) linear(y, x tensor.Buffer, w *Param, n int, beta float32) {
	s.be.Gemm(false, true, n, w.Shape[0], w.Shape[1], 1, x, w.Value, beta, y)
}

// linearBackward adds dyᵀ·x to W's gradient and, if dx is not nil, sets
// dx = dy·W + beta·dx.
func (s *Stage) linearBackward(dx, dy, x tensor.Buffer, w *Param, n int, beta float32) {
	out, in := w.Shape[0], w.Shape[1]
	s.be.Gemm(true, false, out, in, n, 1, dy, x, 1, w.Grad)
	if dx != nil {
		s.be.Gemm(false, false, n, in, out, 1, dy, w.Value, beta, dx)
	}
}

// outProj adds an output projection into the residual stream: y += x·Wᵀ,
// where a constrained W is U·Z, computed as (x·Zᵀ)·Uᵀ so that what is
// added lies in span(U) by construction.
func (s *Stage) outProj(y, x tensor.Buffer, w *Param, n int, constrained bool) {
	if !constrained {
		s.linear(y, x, w, n, 1)
		return
	}
	k := w.Shape[0]
	t := s.alloc(n * k)
	s.linear(t, x, w, n, 0)
	s.be.Gemm(false, true, n, s.cfg.Dim, k, 1, t, s.u, 1, y)
	s.be.Free(t)
}

// outProjBackward sets dx = ∂L/∂x and adds ∂L/∂W given dy = ∂L/∂y. For
// W = U·Z: dt = dy·U, ∂L/∂Z = dtᵀ·x, dx = dt·Z.
func (s *Stage) outProjBackward(dx, dy, x tensor.Buffer, w *Param, n int, constrained bool) {
	if !constrained {
		s.linearBackward(dx, dy, x, w, n, 0)
		return
	}
	k := w.Shape[0]
	dt := s.alloc(n * k)
	s.be.Gemm(false, false, n, k, s.cfg.Dim, 1, dy, s.u, 0, dt)
	s.linearBackward(dx, dt, x, w, n, 0)
	s.be.Free(dt)
}
