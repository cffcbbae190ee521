package model_test

import (
	"math"

	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/subspace"
	"github.com/holopeer/holopeer/stage/tensor"
	tt "github.com/holopeer/holopeer/stage/tensor/tensortest"
)

// refModel is the whole model written again in float64 from the tensortest
// references, independent of the stage code: the oracle for the stage's
// forward and for central differences of its loss.
type refModel struct {
	cfg   model.Config
	p     map[string][]float64
	basis *subspace.Basis
}

func newRef(cfg model.Config, tensors []model.HostTensor, basis *subspace.Basis) *refModel {
	r := &refModel{cfg: cfg, p: map[string][]float64{}, basis: basis}
	for _, t := range tensors {
		r.p[t.Name] = tt.F64(t.Data)
	}
	return r
}

// loss is Σ over microbatches of ΣNLL / total.
func (r *refModel) loss(mbs []model.Input, total int) float64 {
	var s float64
	for _, mb := range mbs {
		logits := r.logits(mb)
		s += tt.RefCrossEntropy(logits, mb.Targets, r.cfg.Vocab) / float64(total)
	}
	return s
}

func (r *refModel) logits(in model.Input) []float64 {
	c := r.cfg
	n, d, v := in.Batch*in.Seq, c.Dim, c.Vocab
	h := r.embed(in.Tokens)
	pos := in.Positions
	if pos == nil {
		pos = make([]int32, n)
		for i := range pos {
			pos[i] = int32(i % in.Seq)
		}
	}
	for i := 0; i < c.Layers; i++ {
		h = r.block(i, h, pos, in.Batch, in.Seq)
	}
	hn, _ := tt.RefRMSNorm(h, r.p[model.NameFinalNorm], d, c.NormEps)
	head := r.p[model.NameHead]
	if c.TieEmbeddings {
		head = r.p[model.NameEmbed]
	}
	return tt.RefGemm(false, true, n, v, d, 1, hn, head, 0, make([]float64, n*v))
}

func (r *refModel) embed(tokens []int32) []float64 {
	d := r.cfg.Dim
	h := make([]float64, len(tokens)*d)
	if r.basis == nil {
		e := r.p[model.NameEmbed]
		for i, t := range tokens {
			copy(h[i*d:(i+1)*d], e[int(t)*d:(int(t)+1)*d])
		}
		return h
	}
	k := r.basis.Rank()
	u := tt.F64(r.basis.U())
	z := r.p[model.NameEmbedZ]
	row := make([]float32, d)
	for i, t := range tokens {
		r.basis.EFixRow(int(t), row)
		for j := 0; j < d; j++ {
			acc := float64(row[j])
			for l := 0; l < k; l++ {
				acc += z[int(t)*k+l] * u[j*k+l]
			}
			h[i*d+j] = acc
		}
	}
	return h
}

// weight returns a projection as a dense [out, in] matrix, expanding U·Z.
func (r *refModel) weight(layer int, dense, factor string) []float64 {
	if w, ok := r.p[model.LayerName(layer, dense)]; ok {
		return w
	}
	z := r.p[model.LayerName(layer, factor)]
	k := r.basis.Rank()
	in := len(z) / k
	return tt.RefGemm(false, false, r.cfg.Dim, in, k, 1, tt.F64(r.basis.U()), z, 0, make([]float64, r.cfg.Dim*in))
}

func (r *refModel) block(i int, x []float64, pos []int32, batch, seq int) []float64 {
	c := r.cfg
	n, d, kvd, f := batch*seq, c.Dim, c.KVDim(), c.FFNDim
	hd := c.HeadDim()
	w := func(s string) []float64 { return r.p[model.LayerName(i, s)] }
	lin := func(x, w []float64, out, in int) []float64 {
		return tt.RefGemm(false, true, n, out, in, 1, x, w, 0, make([]float64, n*out))
	}
	xn, _ := tt.RefRMSNorm(x, w("input_layernorm.weight"), d, c.NormEps)
	freq := tt.F64(model.RopeInvFreq(c)) // checked against transformers' formula in TestRopeInvFreq
	q := tt.RefRoPE(lin(xn, w("self_attn.q_proj.weight"), d, d), pos, freq, c.Heads, hd, false)
	k := tt.RefRoPE(lin(xn, w("self_attn.k_proj.weight"), kvd, d), pos, freq, c.KVHeads, hd, false)
	v := lin(xn, w("self_attn.v_proj.weight"), kvd, d)
	attn, _ := tt.RefAttention(q, k, v, tensor.AttnShape{
		Batch: batch, Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: hd, SeqQ: seq, SeqK: seq,
		Scale: float32(1 / math.Sqrt(float64(hd))),
	})
	o := lin(attn, r.weight(i, "self_attn.o_proj.weight", "self_attn.o_proj.z"), d, d)
	hmid := make([]float64, n*d)
	for j := range hmid {
		hmid[j] = x[j] + o[j]
	}
	hn, _ := tt.RefRMSNorm(hmid, w("post_attention_layernorm.weight"), d, c.NormEps)
	act := tt.RefSwiGLU(lin(hn, w("mlp.gate_proj.weight"), f, d), lin(hn, w("mlp.up_proj.weight"), f, d))
	down := lin(act, r.weight(i, "mlp.down_proj.weight", "mlp.down_proj.z"), d, f)
	out := make([]float64, n*d)
	for j := range out {
		out[j] = hmid[j] + down[j]
	}
	return out
}
