package cpu

import (
	"math"

	"github.com/holopeer/holopeer/stage/safetensors"
	"github.com/holopeer/holopeer/stage/tensor"
)

// Fill implements tensor.Backend.
func (be *Backend) Fill(x tensor.Buffer, v float32) {
	xf := f32(x)
	be.parallel(len(xf), grainElems, func(lo, hi int) {
		s := xf[lo:hi]
		for i := range s {
			s[i] = v
		}
	})
}

// Copy implements tensor.Backend.
func (be *Backend) Copy(dst, src tensor.Buffer) {
	d, s := f32(dst), f32(src)
	mustLen("Copy", len(s), len(d))
	be.parallel(len(d), grainElems, func(lo, hi int) { copy(d[lo:hi], s[lo:hi]) })
}

// Add implements tensor.Backend.
func (be *Backend) Add(dst, a, b tensor.Buffer) {
	d, af, bf := f32(dst), f32(a), f32(b)
	mustLen("Add", len(af), len(d))
	mustLen("Add", len(bf), len(d))
	be.parallel(len(d), grainElems, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			d[i] = af[i] + bf[i]
		}
	})
}

// Axpy implements tensor.Backend.
func (be *Backend) Axpy(alpha float32, x, y tensor.Buffer) {
	xf, yf := f32(x), f32(y)
	mustLen("Axpy", len(xf), len(yf))
	be.parallel(len(yf), grainElems, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			yf[i] += alpha * xf[i]
		}
	})
}

// Scale implements tensor.Backend.
func (be *Backend) Scale(x tensor.Buffer, alpha float32) {
	xf := f32(x)
	be.parallel(len(xf), grainElems, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			xf[i] *= alpha
		}
	})
}

// SumSquares implements tensor.Backend. Chunks have a fixed size so the
// sum is the same for any number of workers.
func (be *Backend) SumSquares(x tensor.Buffer) float64 {
	xf := f32(x)
	chunks := (len(xf) + sumChunk - 1) / sumChunk
	part := make([]float64, chunks)
	be.parallel(chunks, grainElems/sumChunk, func(lo, hi int) {
		for c := lo; c < hi; c++ {
			var s float64
			for _, v := range xf[c*sumChunk : min((c+1)*sumChunk, len(xf))] {
				s += float64(v) * float64(v)
			}
			part[c] = s
		}
	})
	var s float64
	for _, p := range part {
		s += p
	}
	return s
}

// Softmax implements tensor.Backend.
func (be *Backend) Softmax(dst, x tensor.Buffer, cols int) {
	d, xf := f32(dst), f32(x)
	mustLen("Softmax", len(xf), len(d))
	rows := mustRows("Softmax", len(d), cols)
	be.parallel(rows, rowGrain(cols), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			softmaxRow(d[r*cols:(r+1)*cols], xf[r*cols:(r+1)*cols])
		}
	})
}

// softmaxRow writes softmax(x) to d (which may alias x) and returns the
// log-sum-exp of x.
func softmaxRow(d, x []float32) float64 {
	m := float32(math.Inf(-1))
	for _, v := range x {
		m = max(m, v)
	}
	// One exp per element: d holds exp(x−m) until it is normalised.
	var s float64
	for i, v := range x {
		e := exp32(v - m)
		d[i] = e
		s += float64(e)
	}
	inv := 1 / s
	for i, e := range d {
		d[i] = float32(float64(e) * inv)
	}
	return float64(m) + math.Log(s)
}

// Gather implements tensor.Backend.
// A bfloat16 table's rows are widened as they are copied.
func (be *Backend) Gather(dst, table, ids tensor.Buffer, dim int) {
	d, id := f32(dst), i32(ids)
	mustLen("Gather", len(d), len(id)*dim)
	vocab := mustRows("Gather", table.Len(), dim)
	row := func(r, tok int) { copy(d[r*dim:(r+1)*dim], f32(table)[tok*dim:(tok+1)*dim]) }
	if table.DType() == tensor.BFloat16 {
		t := bf16(table)
		row = func(r, tok int) {
			for j, h := range t[tok*dim : (tok+1)*dim] {
				d[r*dim+j] = safetensors.BF16ToFloat32(h)
			}
		}
	}
	be.parallel(len(id), rowGrain(dim), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			tok := int(id[r])
			if tok < 0 || tok >= vocab {
				panic("cpu: Gather: id out of range")
			}
			row(r, tok)
		}
	})
}

// ScatterAdd implements tensor.Backend. Work is split by columns, so each
// table element is accumulated by one goroutine in row order whatever the
// ids repeat.
func (be *Backend) ScatterAdd(table, ids, src tensor.Buffer, dim int) {
	t, id, s := f32(table), i32(ids), f32(src)
	mustLen("ScatterAdd", len(s), len(id)*dim)
	vocab := mustRows("ScatterAdd", len(t), dim)
	for _, tok := range id {
		if tok < 0 || int(tok) >= vocab {
			panic("cpu: ScatterAdd: id out of range")
		}
	}
	be.parallel(dim, max(1, grainRowEl/max(len(id), 1)), func(c0, c1 int) {
		for r, tok := range id {
			dr := t[int(tok)*dim+c0 : int(tok)*dim+c1]
			for j, v := range s[r*dim+c0 : r*dim+c1] {
				dr[j] += v
			}
		}
	})
}

// SwiGLU implements tensor.Backend: act = silu(gate) rounded to float32,
// then times up, as transformers' LlamaMLP does in float32.
func (be *Backend) SwiGLU(out, gate, up tensor.Buffer) {
	o, g, u := f32(out), f32(gate), f32(up)
	mustLen("SwiGLU", len(g), len(o))
	mustLen("SwiGLU", len(u), len(o))
	be.parallel(len(o), grainElems/8, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			o[i] = silu(g[i]) * u[i]
		}
	})
}

// SwiGLUBackward implements tensor.Backend.
func (be *Backend) SwiGLUBackward(dgate, dup, dout, gate, up tensor.Buffer) {
	dg, du, do, g, u := f32(dgate), f32(dup), f32(dout), f32(gate), f32(up)
	n := len(do)
	for _, l := range []int{len(dg), len(du), len(g), len(u)} {
		mustLen("SwiGLUBackward", l, n)
	}
	be.parallel(n, grainElems/8, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x := g[i]
			s := 1 / (1 + exp32(-x))
			dg[i] = do[i] * u[i] * (s * (1 + x*(1-s)))
			du[i] = do[i] * (x * s)
		}
	})
}

// silu is x·sigmoid(x), computed as SwiGLUBackward's x·s so the two agree.
func silu(x float32) float32 {
	return x * (1 / (1 + exp32(-x)))
}

// SoftmaxCrossEntropy implements tensor.Backend.
func (be *Backend) SoftmaxCrossEntropy(dlogits, logits, targets tensor.Buffer, vocab int, scale float32) float64 {
	d, x, tg := f32(dlogits), f32(logits), i32(targets)
	mustLen("SoftmaxCrossEntropy", len(x), len(d))
	rows := mustRows("SoftmaxCrossEntropy", len(x), vocab)
	mustLen("SoftmaxCrossEntropy targets", len(tg), rows)
	losses := make([]float64, rows)
	be.parallel(rows, rowGrain(vocab), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			dr, xr := d[r*vocab:(r+1)*vocab], x[r*vocab:(r+1)*vocab]
			t := int(tg[r])
			if t < 0 {
				clear(dr)
				continue
			}
			if t >= vocab {
				panic("cpu: SoftmaxCrossEntropy: target out of range")
			}
			xt := float64(xr[t])
			lse := softmaxRow(dr, xr)
			losses[r] = lse - xt
			for i := range dr {
				dr[i] *= scale
			}
			dr[t] -= scale
		}
	})
	var s float64
	for _, l := range losses {
		s += l
	}
	return s
}

// AdamW implements tensor.Backend with PyTorch's arithmetic order.
func (be *Backend) AdamW(p, g, m, v tensor.Buffer, h tensor.AdamWStep) {
	pf, gf, mf, vf := f32(p), f32(g), f32(m), f32(v)
	for _, l := range []int{len(gf), len(mf), len(vf)} {
		mustLen("AdamW", l, len(pf))
	}
	if h.Step < 1 {
		panic("cpu: AdamW step counts from 1")
	}
	bc1 := 1 - math.Pow(float64(h.Beta1), float64(h.Step))
	bc2 := 1 - math.Pow(float64(h.Beta2), float64(h.Step))
	stepSize := float32(float64(h.LR) / bc1)
	bc2Sqrt := float32(math.Sqrt(bc2))
	decay := 1 - h.LR*h.WeightDecay
	b1, b2 := h.Beta1, h.Beta2
	be.parallel(len(pf), grainElems/4, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			gi := gf[i] * h.GradScale
			pf[i] *= decay
			mf[i] = b1*mf[i] + (1-b1)*gi
			vf[i] = b2*vf[i] + (1-b2)*gi*gi
			denom := float32(math.Sqrt(float64(vf[i])))/bc2Sqrt + h.Eps
			pf[i] -= stepSize * (mf[i] / denom)
		}
	})
}
