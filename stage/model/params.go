package model

import (
	"fmt"
	"hash/fnv"
	"math"
	"slices"

	"github.com/holopeer/holopeer/stage/tensor"
)

// Hugging Face tensor names. The subspace factors Z get names of their own
// (…o_proj.z, …down_proj.z, model.embed_tokens.z), so a checkpoint never
// confuses k×in factors with d×in matrices; ExportDense writes W = U·Z
// under the Hugging Face name.
const (
	NameEmbed     = "model.embed_tokens.weight"
	NameEmbedZ    = "model.embed_tokens.z"
	NameFinalNorm = "model.norm.weight"
	NameHead      = "lm_head.weight"
)

// LayerName is the name of tensor suffix of block i, e.g.
// LayerName(3, "self_attn.q_proj.weight").
func LayerName(i int, suffix string) string {
	return fmt.Sprintf("model.layers.%d.%s", i, suffix)
}

// Param is one trainable tensor of a stage.
type Param struct {
	Name  string
	Shape []int // Hugging Face shape: [out, in] for a linear weight
	Value tensor.Buffer
	Grad  tensor.Buffer // accumulates across microbatches until ZeroGrad
	// Decay says whether AdamW applies weight decay (not to norm gains).
	Decay bool
	// Tied marks a replica of a weight that another stage holds too (the
	// LM head of a last stage when embeddings are tied and the first stage
	// is another Stage). TieGrads sums the replicas' gradients; a global
	// gradient norm must count the weight once, so it skips Tied params.
	Tied bool

	be tensor.Backend
}

// Len is the number of elements.
func (p *Param) Len() int { return p.Value.Len() }

// Data downloads the value.
func (p *Param) Data() []float32 {
	out := make([]float32, p.Len())
	p.be.Download(out, p.Value)
	return out
}

// GradData downloads the accumulated gradient.
func (p *Param) GradData() []float32 {
	out := make([]float32, p.Len())
	if p.Grad == nil {
		return out // an inference-only stage has accumulated nothing
	}
	p.be.Download(out, p.Grad)
	return out
}

// Set uploads a new value (a checkpoint, a replica's broadcast).
func (p *Param) Set(data []float32) error {
	if len(data) != p.Len() {
		return fmt.Errorf("model: %s: %d values for shape %v (%d)", p.Name, len(data), p.Shape, p.Len())
	}
	for i, v := range data {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("model: %s: non-finite value at %d", p.Name, i)
		}
	}
	p.be.Upload(p.Value, data)
	return nil
}

// SetGrad uploads a gradient (after averaging among replicas).
func (p *Param) SetGrad(data []float32) error {
	if len(data) != p.Len() {
		return fmt.Errorf("model: %s: %d gradient values for shape %v", p.Name, len(data), p.Shape)
	}
	if p.Grad == nil {
		return ErrNoGrad
	}
	p.be.Upload(p.Grad, data)
	return nil
}

// paramSpec describes a parameter before it is allocated.
type paramSpec struct {
	name  string
	shape []int
	std   float64 // init N(0, std²); 0 means a norm gain initialised to 1
	decay bool
	tied  bool
}

func (p paramSpec) size() int {
	n := 1
	for _, d := range p.shape {
		n *= d
	}
	return n
}

// paramSpecs lists the parameters a span holds, in a fixed order:
// embedding, blocks, final norm, head.
func (c Config) paramSpecs(span Span) []paramSpec {
	c = c.withDefaults()
	d, kv, f, v := c.Dim, c.KVDim(), c.FFNDim, c.Vocab
	k := c.Subspace.Rank
	std := c.InitStd
	// Output projections are scaled down by depth (GPT-2) so the residual
	// stream does not grow with the number of blocks.
	outStd := std / math.Sqrt(2*float64(max(c.Layers, 1)))
	// A factor Z with entries of std s gives W = U·Z entries of average
	// variance s²·k/d; scale so W matches the dense init.
	var zScale float64
	if k > 0 {
		zScale = math.Sqrt(float64(d) / float64(k))
	}
	var specs []paramSpec
	if span.Embed {
		if c.Subspace.Enabled() {
			specs = append(specs, paramSpec{name: NameEmbedZ, shape: []int{v, k}, std: std * zScale, decay: true})
		} else {
			specs = append(specs, paramSpec{name: NameEmbed, shape: []int{v, d}, std: std, decay: true})
		}
	}
	for i := span.First; i < span.Last; i++ {
		ln := func(s string) string { return LayerName(i, s) }
		oName, oShape, oStd := ln("self_attn.o_proj.weight"), []int{d, d}, outStd
		dName, dShape, dStd := ln("mlp.down_proj.weight"), []int{d, f}, outStd
		if c.Constrained(i) {
			oName, oShape, oStd = ln("self_attn.o_proj.z"), []int{k, d}, outStd*zScale
			dName, dShape, dStd = ln("mlp.down_proj.z"), []int{k, f}, outStd*zScale
		}
		specs = append(specs,
			paramSpec{name: ln("input_layernorm.weight"), shape: []int{d}},
			paramSpec{name: ln("self_attn.q_proj.weight"), shape: []int{d, d}, std: std, decay: true},
			paramSpec{name: ln("self_attn.k_proj.weight"), shape: []int{kv, d}, std: std, decay: true},
			paramSpec{name: ln("self_attn.v_proj.weight"), shape: []int{kv, d}, std: std, decay: true},
			paramSpec{name: oName, shape: oShape, std: oStd, decay: true},
			paramSpec{name: ln("post_attention_layernorm.weight"), shape: []int{d}},
			paramSpec{name: ln("mlp.gate_proj.weight"), shape: []int{f, d}, std: std, decay: true},
			paramSpec{name: ln("mlp.up_proj.weight"), shape: []int{f, d}, std: std, decay: true},
			paramSpec{name: dName, shape: dShape, std: dStd, decay: true},
		)
	}
	if span.Head {
		specs = append(specs, paramSpec{name: NameFinalNorm, shape: []int{d}})
		switch {
		case !c.TieEmbeddings:
			specs = append(specs, paramSpec{name: NameHead, shape: []int{v, d}, std: std, decay: true})
		case !span.Embed:
			specs = append(specs, paramSpec{name: NameEmbed, shape: []int{v, d}, std: std, decay: true, tied: true})
		}
	}
	return specs
}

// InitialTensors lists the parameters of span as NewStage with
// WithSeed(seed) would initialise them, each computed only when read: a
// random model of any size can be written tensor by tensor.
func (c Config) InitialTensors(span Span, seed uint64) []LazyTensor {
	var out []LazyTensor
	for _, spec := range c.withDefaults().paramSpecs(span) {
		out = append(out, LazyTensor{Name: spec.name, Shape: cloneShape(spec.shape), Read: func(dst []float32) { copy(dst, initValues(seed, spec)) }})
	}
	return out
}

// initValues draws a parameter's initial values from a counter-based
// generator keyed by (seed, name, index): a weight gets the same values
// whichever stage holds it, so a model cut into stages starts exactly where
// the uncut model does, and replicas agree without a broadcast. Integer
// hashing and a single rounding multiply make it bit-identical on every
// architecture.
func initValues(seed uint64, spec paramSpec) []float32 {
	out := make([]float32, spec.size())
	if spec.std == 0 {
		for i := range out {
			out[i] = 1
		}
		return out
	}
	h := fnv.New64a()
	h.Write([]byte(spec.name))
	key := splitmix(seed ^ splitmix(h.Sum64()))
	for i := range out {
		out[i] = float32(normal(key, uint64(i)) * spec.std)
	}
	return out
}

// normal is an Irwin–Hall approximation of N(0,1): the centred, scaled sum
// of the four 16-bit lanes of one SplitMix64 output (bounded at ±3.46σ,
// which suits an initialisation).
func normal(key, i uint64) float64 {
	x := splitmix(key ^ splitmix(i))
	var s float64
	for j := 0; j < 4; j++ {
		s += float64(uint16(x >> (16 * j)))
	}
	const mean = 4 * 32767.5
	const sd = 37837.22692452188 // sqrt(4·(65536²−1)/12)
	return (s - mean) / sd
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// HostTensor is a named tensor in host memory.
type HostTensor struct {
	Name  string
	Shape []int
	Data  []float32
}

func cloneShape(s []int) []int { return slices.Clone(s) }
