package model

import (
	"strings"

	"github.com/holopeer/holopeer/stage/subspace"
)

// Tensors downloads the stage's parameters as stored (subspace factors
// under their .z names): what a training checkpoint of the stage holds.
func (s *Stage) Tensors() []HostTensor {
	out := make([]HostTensor, 0, len(s.params))
	for _, p := range s.params {
		out = append(out, HostTensor{Name: p.Name, Shape: cloneShape(p.Shape), Data: p.Data()})
	}
	return out
}

// LazyTensor is a tensor whose values are downloaded only when Read is
// called: a shard streams from a stage one tensor at a time.
type LazyTensor struct {
	Name  string
	Shape []int
	Read  func(dst []float32)
}

// LazyTensors lists the stage's parameters under their Hugging Face names,
// as Tensors does, without downloading them.
func (s *Stage) LazyTensors() []LazyTensor {
	out := make([]LazyTensor, 0, len(s.params))
	for _, p := range s.params {
		out = append(out, LazyTensor{Name: p.Name, Shape: cloneShape(p.Shape), Read: func(dst []float32) { s.be.Download(dst, p.Value) }})
	}
	return out
}

// ExportDense downloads the stage's weights as a dense Hugging Face Llama
// model would hold them: a constrained projection as W = U·Z under its
// .weight name, and a constrained embedding as Z_emb·Uᵀ + E_fix (V×d), so
// that the exported model computes exactly what this one does.
func (s *Stage) ExportDense() []HostTensor {
	out := make([]HostTensor, 0, len(s.params))
	for _, p := range s.params {
		t := HostTensor{Name: p.Name, Shape: cloneShape(p.Shape), Data: p.Data()}
		if s.basis != nil {
			switch {
			case p.Name == NameEmbedZ:
				t = s.denseEmbedding(t)
			case strings.HasSuffix(p.Name, ".z"):
				t = s.denseProjection(t)
			}
		}
		out = append(out, t)
	}
	return out
}

// denseProjection turns Z (k×in) into W = U·Z (d×in).
func (s *Stage) denseProjection(z HostTensor) HostTensor { return DenseProjection(s.basis, z) }

// denseEmbedding turns Z_emb (V×k) into E = Z_emb·Uᵀ + E_fix (V×d).
func (s *Stage) denseEmbedding(z HostTensor) HostTensor { return DenseEmbedding(s.basis, z) }

// DenseProjection turns a constrained projection's factor Z (k×in, named
// ….z) into the Hugging Face weight W = U·Z (d×in, named ….weight).
func DenseProjection(b *subspace.Basis, z HostTensor) HostTensor {
	d, k, in := b.Dim(), b.Rank(), z.Shape[1]
	u := b.U()
	w := make([]float32, d*in)
	for i := 0; i < d; i++ {
		for l := 0; l < k; l++ {
			ul := u[i*k+l]
			zr := z.Data[l*in : (l+1)*in]
			wr := w[i*in : (i+1)*in]
			for j, zv := range zr {
				wr[j] += ul * zv
			}
		}
	}
	return HostTensor{Name: strings.TrimSuffix(z.Name, ".z") + ".weight", Shape: []int{d, in}, Data: w}
}

// DenseEmbedding turns a constrained embedding's factor Z_emb (V×k) into
// E = Z_emb·Uᵀ + E_fix (V×d), row t with E_fix's row t.
func DenseEmbedding(b *subspace.Basis, z HostTensor) HostTensor {
	d, k, v := b.Dim(), b.Rank(), z.Shape[0]
	u := b.U()
	e := make([]float32, v*d)
	for t := 0; t < v; t++ {
		row := e[t*d : (t+1)*d]
		b.EFixRow(t, row)
		zr := z.Data[t*k : (t+1)*k]
		for i := range row {
			var acc float32
			for l, zv := range zr {
				acc += zv * u[i*k+l]
			}
			row[i] += acc
		}
	}
	return HostTensor{Name: NameEmbed, Shape: []int{v, d}, Data: e}
}
