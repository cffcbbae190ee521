package checkpoint_test

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"

	"github.com/holopeer/holopeer/stage/checkpoint"
	"github.com/holopeer/holopeer/stage/safetensors"
)

// hfForward is LlamaForCausalLM's forward for one sequence, written from
// transformers' modeling_llama.py in float64, reading the checkpoint
// straight from its safetensors file and config.json, and sharing no
// code with package model. It follows transformers step by step:
//
//   - LlamaRMSNorm: variance = mean(x²) in float32, x·rsqrt(var + eps),
//     cast back, then weight · x;
//   - LlamaRotaryEmbedding: inv_freq = 1/base^(arange(0, dim, 2)/dim)
//     (with rope_scaling llama3, rescaled as _compute_llama3_parameters
//     does) and
//     freqs = position · inv_freq in float32, emb = cat(freqs, freqs);
//     apply_rotary_pos_emb: q·cos + rotate_half(q)·sin with
//     rotate_half(x) = cat(−x[dim/2:], x[:dim/2]);
//   - repeat_kv: query head h attends with key/value head h / n_rep;
//   - eager attention: softmax(q·kᵀ·head_dim^−½ + causal mask)·v, heads
//     concatenated then o_proj;
//   - LlamaMLP: down_proj(silu(gate_proj(x)) · up_proj(x));
//   - lm_head, or embed_tokens when tie_word_embeddings.
func hfForward(t *testing.T, f *safetensors.File, hf checkpoint.HFConfig, ids []int32) []float64 {
	t.Helper()
	w := func(name string) []float64 {
		x, err := f.ReadTensor(name)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]float64, len(x.Data))
		for i, v := range x.Data {
			out[i] = float64(v)
		}
		return out
	}
	d, nl, nh := hf.HiddenSize, hf.NumHiddenLayers, hf.NumAttentionHeads
	nkv := *hf.NumKeyValueHeads
	hd := d / nh
	nRep := nh / nkv
	eps := *hf.RMSNormEps
	theta := *hf.RopeTheta
	v := hf.VocabSize
	s := len(ids)

	// linear(x [s, in], W [out, in]) = x·Wᵀ.
	linear := func(x, wt []float64, out, in int) []float64 {
		y := make([]float64, s*out)
		for r := 0; r < s; r++ {
			for o := 0; o < out; o++ {
				var acc float64
				for i := 0; i < in; i++ {
					acc += x[r*in+i] * wt[o*in+i]
				}
				y[r*out+o] = acc
			}
		}
		return y
	}
	rmsNorm := func(x, weight []float64) []float64 {
		y := make([]float64, len(x))
		for r := 0; r < s; r++ {
			row := x[r*d : (r+1)*d]
			var ss float64
			for _, e := range row {
				ss += e * e
			}
			inv := 1 / math.Sqrt(ss/float64(d)+eps)
			for i, e := range row {
				y[r*d+i] = weight[i] * (e * inv)
			}
		}
		return y
	}
	// Rotary tables as transformers computes them: inv_freq (rescaled by
	// _compute_llama3_parameters when rope_scaling says llama3), then
	// float32 angles.
	invFreq := make([]float64, hd/2)
	for i := range invFreq {
		invFreq[i] = float64(float32(1 / math.Pow(theta, float64(float32(2*i)/float32(hd)))))
	}
	if len(hf.RopeScaling) > 0 && string(hf.RopeScaling) != "null" {
		var rs struct {
			RopeType       string  `json:"rope_type"`
			Factor         float64 `json:"factor"`
			LowFreqFactor  float64 `json:"low_freq_factor"`
			HighFreqFactor float64 `json:"high_freq_factor"`
			Old            float64 `json:"original_max_position_embeddings"`
		}
		if err := json.Unmarshal(hf.RopeScaling, &rs); err != nil || rs.RopeType != "llama3" {
			t.Fatalf("reference: rope_scaling %s", hf.RopeScaling)
		}
		lowW, highW := rs.Old/rs.LowFreqFactor, rs.Old/rs.HighFreqFactor
		for i, f := range invFreq {
			wavelen := 2 * math.Pi / f
			scaled := f
			if wavelen > lowW {
				scaled = f / rs.Factor
			}
			if !(wavelen < highW) && !(wavelen > lowW) {
				smooth := (rs.Old/wavelen - rs.LowFreqFactor) / (rs.HighFreqFactor - rs.LowFreqFactor)
				scaled = (1-smooth)*scaled/rs.Factor + smooth*scaled
			}
			invFreq[i] = scaled
		}
	}
	cos := make([][]float64, s)
	sin := make([][]float64, s)
	for p := 0; p < s; p++ {
		cos[p], sin[p] = make([]float64, hd), make([]float64, hd)
		for i := 0; i < hd/2; i++ {
			angle := float64(float32(p) * float32(invFreq[i]))
			cos[p][i], cos[p][i+hd/2] = math.Cos(angle), math.Cos(angle)
			sin[p][i], sin[p][i+hd/2] = math.Sin(angle), math.Sin(angle)
		}
	}
	// rope applies q·cos + rotate_half(q)·sin to x [s, heads·hd].
	rope := func(x []float64, heads int) {
		tmp := make([]float64, hd)
		for p := 0; p < s; p++ {
			for h := 0; h < heads; h++ {
				head := x[(p*heads+h)*hd : (p*heads+h+1)*hd]
				for i := 0; i < hd; i++ {
					var rot float64
					if i < hd/2 {
						rot = -head[i+hd/2]
					} else {
						rot = head[i-hd/2]
					}
					tmp[i] = head[i]*cos[p][i] + rot*sin[p][i]
				}
				copy(head, tmp)
			}
		}
	}

	embed := w("model.embed_tokens.weight")
	h := make([]float64, s*d)
	for p, id := range ids {
		copy(h[p*d:(p+1)*d], embed[int(id)*d:(int(id)+1)*d])
	}
	for l := 0; l < nl; l++ {
		ln := func(suffix string) []float64 { return w(fmt.Sprintf("model.layers.%d.%s", l, suffix)) }
		x := rmsNorm(h, ln("input_layernorm.weight"))
		q := linear(x, ln("self_attn.q_proj.weight"), nh*hd, d)
		k := linear(x, ln("self_attn.k_proj.weight"), nkv*hd, d)
		vv := linear(x, ln("self_attn.v_proj.weight"), nkv*hd, d)
		rope(q, nh)
		rope(k, nkv)
		attn := make([]float64, s*d)
		scale := 1 / math.Sqrt(float64(hd))
		for head := 0; head < nh; head++ {
			kvh := head / nRep // repeat_kv
			for i := 0; i < s; i++ {
				scores := make([]float64, i+1) // causal: keys 0..i
				mx := math.Inf(-1)
				for j := 0; j <= i; j++ {
					var dot float64
					for c := 0; c < hd; c++ {
						dot += q[(i*nh+head)*hd+c] * k[(j*nkv+kvh)*hd+c]
					}
					scores[j] = dot * scale
					mx = math.Max(mx, scores[j])
				}
				var sum float64
				for j := range scores {
					scores[j] = math.Exp(scores[j] - mx)
					sum += scores[j]
				}
				for j := range scores {
					p := scores[j] / sum
					for c := 0; c < hd; c++ {
						attn[i*d+head*hd+c] += p * vv[(j*nkv+kvh)*hd+c]
					}
				}
			}
		}
		o := linear(attn, ln("self_attn.o_proj.weight"), d, d)
		for i := range h {
			h[i] += o[i]
		}
		x = rmsNorm(h, ln("post_attention_layernorm.weight"))
		ffn := hf.IntermediateSize
		gate := linear(x, ln("mlp.gate_proj.weight"), ffn, d)
		up := linear(x, ln("mlp.up_proj.weight"), ffn, d)
		for i := range gate {
			gate[i] = gate[i] / (1 + math.Exp(-gate[i])) * up[i]
		}
		dn := linear(gate, ln("mlp.down_proj.weight"), d, ffn)
		for i := range h {
			h[i] += dn[i]
		}
	}
	x := rmsNorm(h, w("model.norm.weight"))
	head := embed
	if !hf.TieWordEmbeddings {
		head = w("lm_head.weight")
	}
	return linear(x, head, v, d)
}
