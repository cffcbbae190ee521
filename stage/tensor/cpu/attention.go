package cpu

import (
	"fmt"

	"github.com/holopeer/holopeer/stage/gemm"
	"github.com/holopeer/holopeer/stage/tensor"
)

func checkAttn(op string, s tensor.AttnShape, q, k, v, out, lse []float32) {
	if err := s.Validate(); err != nil {
		panic(fmt.Sprintf("cpu: %s: %v", op, err))
	}
	qn := s.Batch * s.SeqQ * s.Heads * s.HeadDim
	kn := s.Batch * s.SeqK * s.KVHeads * s.HeadDim
	if len(q) != qn || len(out) != qn || len(k) != kn || len(v) != kn || len(lse) != s.Batch*s.Heads*s.SeqQ {
		panic(fmt.Sprintf("cpu: %s: buffers q=%d k=%d v=%d out=%d lse=%d do not fit %+v",
			op, len(q), len(k), len(v), len(out), len(lse), s))
	}
}

// Attention implements tensor.Backend. Each (sequence, head) pair is one
// independent task: scores = scale·Q·Kᵀ, a causal softmax per row, then
// out = P·V, with strided GEMMs reading the head's columns in place.
func (be *Backend) Attention(out, lse, q, k, v tensor.Buffer, s tensor.AttnShape) {
	of, lf, qf, kf, vf := f32(out), f32(lse), f32(q), f32(k), f32(v)
	checkAttn("Attention", s, qf, kf, vf, of, lf)
	hd := s.HeadDim
	qs, kvs := s.Heads*hd, s.KVHeads*hd
	group := s.Heads / s.KVHeads
	be.parallel(s.Batch*s.Heads, 1, func(lo, hi int) {
		p := make([]float32, s.SeqQ*s.SeqK)
		for idx := lo; idx < hi; idx++ {
			b, h := idx/s.Heads, idx%s.Heads
			g := h / group
			qh := qf[b*s.SeqQ*qs+h*hd:]
			oh := of[b*s.SeqQ*qs+h*hd:]
			kg := kf[b*s.SeqK*kvs+g*hd:]
			vg := vf[b*s.SeqK*kvs+g*hd:]
			gemm.Sgemm(false, true, s.SeqQ, s.SeqK, hd, s.Scale, qh, qs, kg, kvs, 0, p, s.SeqK)
			for i := 0; i < s.SeqQ; i++ {
				lim := s.QOffset + i + 1
				row := p[i*s.SeqK : (i+1)*s.SeqK]
				lf[idx*s.SeqQ+i] = float32(softmaxRow(row[:lim], row[:lim]))
				clear(row[lim:])
			}
			gemm.Sgemm(false, false, s.SeqQ, hd, s.SeqK, 1, p, s.SeqK, vg, kvs, 0, oh, qs)
		}
	})
}

// AttentionBackward implements tensor.Backend. Tasks are (sequence, kv
// head) pairs, so the query heads sharing a kv head add into dk and dv in
// a fixed order on one goroutine.
//
// With P the probabilities, dO the output gradient and D_i = dO_i·O_i:
//
//	dV = Pᵀ·dO,  dS = P∘(dO·Vᵀ − D),  dQ = scale·dS·K,  dK = scale·dSᵀ·Q
func (be *Backend) AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse tensor.Buffer, s tensor.AttnShape) {
	dqf, dkf, dvf, dof := f32(dq), f32(dk), f32(dv), f32(dout)
	qf, kf, vf, of, lf := f32(q), f32(k), f32(v), f32(out), f32(lse)
	checkAttn("AttentionBackward", s, qf, kf, vf, of, lf)
	mustLen("AttentionBackward dq", len(dqf), len(qf))
	mustLen("AttentionBackward dout", len(dof), len(qf))
	mustLen("AttentionBackward dk", len(dkf), len(kf))
	mustLen("AttentionBackward dv", len(dvf), len(vf))
	hd := s.HeadDim
	qs, kvs := s.Heads*hd, s.KVHeads*hd
	group := s.Heads / s.KVHeads
	be.parallel(s.Batch*s.KVHeads, 1, func(lo, hi int) {
		p := make([]float32, s.SeqQ*s.SeqK)
		dp := make([]float32, s.SeqQ*s.SeqK)
		for idx := lo; idx < hi; idx++ {
			b, g := idx/s.KVHeads, idx%s.KVHeads
			kg := kf[b*s.SeqK*kvs+g*hd:]
			vg := vf[b*s.SeqK*kvs+g*hd:]
			dkg := dkf[b*s.SeqK*kvs+g*hd:]
			dvg := dvf[b*s.SeqK*kvs+g*hd:]
			for j := 0; j < group; j++ {
				h := g*group + j
				off := b*s.SeqQ*qs + h*hd
				qh, oh, doh, dqh := qf[off:], of[off:], dof[off:], dqf[off:]
				gemm.Sgemm(false, true, s.SeqQ, s.SeqK, hd, s.Scale, qh, qs, kg, kvs, 0, p, s.SeqK)
				gemm.Sgemm(false, true, s.SeqQ, s.SeqK, hd, 1, doh, qs, vg, kvs, 0, dp, s.SeqK)
				for i := 0; i < s.SeqQ; i++ {
					lim := s.QOffset + i + 1
					l := lf[(b*s.Heads+h)*s.SeqQ+i]
					var d64 float64
					for c := 0; c < hd; c++ {
						d64 += float64(doh[i*qs+c]) * float64(oh[i*qs+c])
					}
					d := float32(d64)
					pr, dr := p[i*s.SeqK:(i+1)*s.SeqK], dp[i*s.SeqK:(i+1)*s.SeqK]
					for c := 0; c < lim; c++ {
						pc := exp32(pr[c] - l)
						pr[c] = pc
						dr[c] = pc * (dr[c] - d)
					}
					clear(pr[lim:])
					clear(dr[lim:])
				}
				var beta float32
				if j > 0 {
					beta = 1
				}
				gemm.Sgemm(true, false, s.SeqK, hd, s.SeqQ, 1, p, s.SeqK, doh, qs, beta, dvg, kvs)
				gemm.Sgemm(false, false, s.SeqQ, hd, s.SeqK, s.Scale, dp, s.SeqK, kg, kvs, 0, dqh, qs)
				gemm.Sgemm(true, false, s.SeqK, hd, s.SeqQ, s.Scale, dp, s.SeqK, qh, qs, beta, dkg, kvs)
			}
		}
	})
}
