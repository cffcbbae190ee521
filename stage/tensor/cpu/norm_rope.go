package cpu

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/holopeer/holopeer/stage/tensor"
)

// RMSNorm implements tensor.Backend. Like transformers' LlamaRMSNorm it
// rounds x·rstd to float32 before multiplying by the weight.
func (be *Backend) RMSNorm(out, rstd, x, w tensor.Buffer, dim int, eps float32) {
	o, rs, xf, wf := f32(out), f32(rstd), f32(x), f32(w)
	mustLen("RMSNorm", len(o), len(xf))
	mustLen("RMSNorm weight", len(wf), dim)
	rows := mustRows("RMSNorm", len(xf), dim)
	mustLen("RMSNorm rstd", len(rs), rows)
	be.parallel(rows, rowGrain(dim), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xr, or := xf[r*dim:(r+1)*dim], o[r*dim:(r+1)*dim]
			var ss float64
			for _, v := range xr {
				ss += float64(v) * float64(v)
			}
			mean := float32(ss / float64(dim))
			inv := float32(1 / math.Sqrt(float64(mean+eps)))
			rs[r] = inv
			for i, v := range xr {
				or[i] = wf[i] * (v * inv)
			}
		}
	})
}

// RMSNormBackward implements tensor.Backend. dx is computed row-parallel;
// dw column-parallel, so each of its elements is summed by one goroutine
// over the rows in order.
func (be *Backend) RMSNormBackward(dx, dw, dy, x, w, rstd tensor.Buffer, dim int) {
	dxf, dwf, dyf, xf, wf, rs := f32(dx), f32(dw), f32(dy), f32(x), f32(w), f32(rstd)
	mustLen("RMSNormBackward dx", len(dxf), len(xf))
	mustLen("RMSNormBackward dy", len(dyf), len(xf))
	mustLen("RMSNormBackward w", len(wf), dim)
	mustLen("RMSNormBackward dw", len(dwf), dim)
	rows := mustRows("RMSNormBackward", len(xf), dim)
	mustLen("RMSNormBackward rstd", len(rs), rows)
	be.parallel(rows, rowGrain(dim), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xr, dyr, dxr := xf[r*dim:(r+1)*dim], dyf[r*dim:(r+1)*dim], dxf[r*dim:(r+1)*dim]
			inv := float64(rs[r])
			var dot float64
			for i, v := range xr {
				dot += float64(wf[i]) * float64(dyr[i]) * float64(v)
			}
			c := inv * inv * inv * dot / float64(dim)
			for i, v := range xr {
				dxr[i] += float32(inv*float64(wf[i])*float64(dyr[i]) - c*float64(v))
			}
		}
	})
	be.parallel(dim, max(1, grainRowEl/max(rows, 1)), func(c0, c1 int) {
		acc := make([]float64, c1-c0)
		for r := 0; r < rows; r++ {
			inv := rs[r]
			xr, dyr := xf[r*dim+c0:r*dim+c1], dyf[r*dim+c0:r*dim+c1]
			for j, v := range xr {
				acc[j] += float64(dyr[j]) * float64(v*inv)
			}
		}
		for j, a := range acc {
			dwf[c0+j] += float32(a)
		}
	})
}

// ropeTable holds cos and sin for positions 0..len/half−1, row-major
// [pos][half]. A table is never modified once published; growing it
// replaces it.
type ropeTable struct {
	cos, sin []float32
}

// ropeAngles returns cos/sin tables for invFreq covering positions up to
// maxPos. The angle float32(pos)·invFreq is rounded to float32 before its
// cosine is taken, exactly where transformers' LlamaRotaryEmbedding rounds.
// Tables are cached by the frequencies' bits, so each model computes its
// trigonometry once.
func (be *Backend) ropeAngles(invFreq []float32, maxPos int) *ropeTable {
	key := make([]byte, 0, 4*len(invFreq))
	for _, f := range invFreq {
		key = binary.LittleEndian.AppendUint32(key, math.Float32bits(f))
	}
	be.ropeMu.Lock()
	defer be.ropeMu.Unlock()
	half := len(invFreq)
	t := be.rope[string(key)]
	if t != nil && len(t.cos)/half > maxPos {
		return t
	}
	n := 64
	for n <= maxPos {
		n *= 2
	}
	nt := &ropeTable{cos: make([]float32, n*half), sin: make([]float32, n*half)}
	for p := 0; p < n; p++ {
		for i, f := range invFreq {
			a := float64(float32(p) * f)
			nt.cos[p*half+i] = float32(math.Cos(a))
			nt.sin[p*half+i] = float32(math.Sin(a))
		}
	}
	be.rope[string(key)] = nt
	return nt
}

// RoPE implements tensor.Backend.
func (be *Backend) RoPE(x, pos, invFreq tensor.Buffer, heads, headDim int, inverse bool) {
	xf, ps, fr := f32(x), i32(pos), f32(invFreq)
	if headDim <= 0 || headDim%2 != 0 {
		panic(fmt.Sprintf("cpu: RoPE head dim %d must be even", headDim))
	}
	half := headDim / 2
	mustLen("RoPE frequencies", len(fr), half)
	width := heads * headDim
	rows := mustRows("RoPE", len(xf), width)
	mustLen("RoPE positions", len(ps), rows)
	maxPos := 0
	for _, p := range ps {
		if p < 0 {
			panic("cpu: RoPE negative position")
		}
		maxPos = max(maxPos, int(p))
	}
	t := be.ropeAngles(fr, maxPos)
	var sign float32 = 1
	if inverse {
		sign = -1
	}
	be.parallel(rows, rowGrain(width), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			p := int(ps[r])
			cs, sn := t.cos[p*half:(p+1)*half], t.sin[p*half:(p+1)*half]
			for h := 0; h < heads; h++ {
				v := xf[r*width+h*headDim : r*width+(h+1)*headDim]
				for i := 0; i < half; i++ {
					a, b := v[i], v[i+half]
					c, s := cs[i], sign*sn[i]
					v[i] = a*c - b*s
					v[i+half] = b*c + a*s
				}
			}
		}
	})
}
