// Package tensortest checks a tensor.Backend: every op against plain
// float64 reference code, every backward against central finite
// differences of that reference, and (for GPU backends) every op against
// the cpu backend on the same random inputs.
//
// The float64 references are exported so that model tests can build a
// whole reference transformer from them.
package tensortest

import (
	"math"

	"github.com/holopeer/holopeer/stage/tensor"
)

// RefGemm returns alpha·op(A)·op(B) + beta·C.
func RefGemm(transA, transB bool, m, n, k int, alpha float64, a, b []float64, beta float64, c []float64) []float64 {
	out := make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for p := 0; p < k; p++ {
				av := a[i*k+p]
				if transA {
					av = a[p*m+i]
				}
				bv := b[p*n+j]
				if transB {
					bv = b[j*k+p]
				}
				s += av * bv
			}
			out[i*n+j] = alpha*s + beta*c[i*n+j]
		}
	}
	return out
}

// RefRMSNorm returns w∘x/sqrt(mean(x²)+eps) per row, and the rstd of each row.
func RefRMSNorm(x, w []float64, dim int, eps float64) (out, rstd []float64) {
	rows := len(x) / dim
	out = make([]float64, len(x))
	rstd = make([]float64, rows)
	for r := 0; r < rows; r++ {
		var ss float64
		for _, v := range x[r*dim : (r+1)*dim] {
			ss += v * v
		}
		rstd[r] = 1 / math.Sqrt(ss/float64(dim)+eps)
		for i := 0; i < dim; i++ {
			out[r*dim+i] = w[i] * x[r*dim+i] * rstd[r]
		}
	}
	return out, rstd
}

// RefRoPE rotates rows [heads·headDim] by pos·invFreq[i] in the
// rotate-half layout of transformers' Llama (negative angle if inverse).
func RefRoPE(x []float64, pos []int32, invFreq []float64, heads, headDim int, inverse bool) []float64 {
	out := append([]float64(nil), x...)
	half := headDim / 2
	width := heads * headDim
	for r, p := range pos {
		for h := 0; h < heads; h++ {
			v := out[r*width+h*headDim : r*width+(h+1)*headDim]
			for i := 0; i < half; i++ {
				ang := float64(p) * invFreq[i]
				if inverse {
					ang = -ang
				}
				c, s := math.Cos(ang), math.Sin(ang)
				a, b := v[i], v[i+half]
				v[i] = a*c - b*s
				v[i+half] = b*c + a*s
			}
		}
	}
	return out
}

// RefInvFreq is theta^(−2i/headDim) for i < headDim/2, the unscaled rotary
// frequencies.
func RefInvFreq(theta float64, headDim int) []float64 {
	f := make([]float64, headDim/2)
	for i := range f {
		f[i] = math.Pow(theta, -float64(2*i)/float64(headDim))
	}
	return f
}

// RefSwiGLU returns silu(gate)∘up.
func RefSwiGLU(gate, up []float64) []float64 {
	out := make([]float64, len(gate))
	for i, g := range gate {
		out[i] = g / (1 + math.Exp(-g)) * up[i]
	}
	return out
}

// RefAttention returns causal grouped-query attention and the per-row
// log-sum-exp, laid out as tensor.AttnShape says.
func RefAttention(q, k, v []float64, s tensor.AttnShape) (out, lse []float64) {
	hd := s.HeadDim
	qs, kvs := s.Heads*hd, s.KVHeads*hd
	group := s.Heads / s.KVHeads
	out = make([]float64, len(q))
	lse = make([]float64, s.Batch*s.Heads*s.SeqQ)
	sc := make([]float64, s.SeqK)
	for b := 0; b < s.Batch; b++ {
		for h := 0; h < s.Heads; h++ {
			g := h / group
			for i := 0; i < s.SeqQ; i++ {
				lim := s.QOffset + i + 1
				qi := q[(b*s.SeqQ+i)*qs+h*hd:][:hd]
				m := math.Inf(-1)
				for j := 0; j < lim; j++ {
					kj := k[(b*s.SeqK+j)*kvs+g*hd:][:hd]
					var dot float64
					for c := range qi {
						dot += qi[c] * kj[c]
					}
					sc[j] = dot * float64(s.Scale)
					m = math.Max(m, sc[j])
				}
				var z float64
				for j := 0; j < lim; j++ {
					z += math.Exp(sc[j] - m)
				}
				l := m + math.Log(z)
				lse[(b*s.Heads+h)*s.SeqQ+i] = l
				oi := out[(b*s.SeqQ+i)*qs+h*hd:][:hd]
				for j := 0; j < lim; j++ {
					p := math.Exp(sc[j] - l)
					vj := v[(b*s.SeqK+j)*kvs+g*hd:][:hd]
					for c := range oi {
						oi[c] += p * vj[c]
					}
				}
			}
		}
	}
	return out, lse
}

// RefCrossEntropy returns Σ over non-ignored rows of −log softmax(x)[t].
func RefCrossEntropy(logits []float64, targets []int32, vocab int) float64 {
	var total float64
	for r, t := range targets {
		if t < 0 {
			continue
		}
		row := logits[r*vocab : (r+1)*vocab]
		m := math.Inf(-1)
		for _, v := range row {
			m = math.Max(m, v)
		}
		var z float64
		for _, v := range row {
			z += math.Exp(v - m)
		}
		total += m + math.Log(z) - row[t]
	}
	return total
}

// RefSoftmax returns the row-wise softmax.
func RefSoftmax(x []float64, cols int) []float64 {
	out := make([]float64, len(x))
	for r := 0; r < len(x)/cols; r++ {
		row := x[r*cols : (r+1)*cols]
		m := math.Inf(-1)
		for _, v := range row {
			m = math.Max(m, v)
		}
		var z float64
		for _, v := range row {
			z += math.Exp(v - m)
		}
		for i, v := range row {
			out[r*cols+i] = math.Exp(v-m) / z
		}
	}
	return out
}

// RefAdamW applies one AdamW step in float64 and returns p, m, v.
func RefAdamW(p, g, m, v []float64, h tensor.AdamWStep) (np, nm, nv []float64) {
	np, nm, nv = make([]float64, len(p)), make([]float64, len(p)), make([]float64, len(p))
	b1, b2 := float64(h.Beta1), float64(h.Beta2)
	bc1 := 1 - math.Pow(b1, float64(h.Step))
	bc2 := 1 - math.Pow(b2, float64(h.Step))
	lr := float64(h.LR)
	for i := range p {
		gi := g[i] * float64(h.GradScale)
		pi := p[i] * (1 - lr*float64(h.WeightDecay))
		nm[i] = b1*m[i] + (1-b1)*gi
		nv[i] = b2*v[i] + (1-b2)*gi*gi
		np[i] = pi - lr/bc1*nm[i]/(math.Sqrt(nv[i]/bc2)+float64(h.Eps))
	}
	return np, nm, nv
}

// NumGrad returns the central-difference gradient of f at x with step h.
// f may read x but must not keep it.
func NumGrad(f func(x []float64) float64, x []float64, h float64) []float64 {
	g := make([]float64, len(x))
	xx := append([]float64(nil), x...)
	for i := range xx {
		orig := xx[i]
		xx[i] = orig + h
		fp := f(xx)
		xx[i] = orig - h
		fm := f(xx)
		xx[i] = orig
		g[i] = (fp - fm) / (2 * h)
	}
	return g
}

// Dot returns Σ a·b.
func Dot(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// RelErr returns max|got−want| / max|want| (or the absolute error when want
// is all zero); NaN or Inf in got give +Inf.
func RelErr(got []float32, want []float64) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var e, m float64
	for i, g := range got {
		gv := float64(g)
		if math.IsNaN(gv) || math.IsInf(gv, 0) {
			return math.Inf(1)
		}
		e = math.Max(e, math.Abs(gv-want[i]))
		m = math.Max(m, math.Abs(want[i]))
	}
	if m == 0 {
		return e
	}
	return e / m
}

// F64 widens a float32 slice.
func F64(x []float32) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v)
	}
	return out
}
