package codec

import (
	"fmt"
	"math"

	"github.com/holopeer/holopeer/stage/gemm"
	"github.com/holopeer/holopeer/stage/subspace"
)

// subspaceCodec carries k coefficients per token instead of d values: the
// Protocol Models scheme (research/compression.md §a). Forward it sends the
// token ids and C = (H − E_fix[ids])·U, from which the receiver rebuilds
// H = C·Uᵀ + E_fix[ids] exactly when the sender's model keeps
// H − E_fix[ids] inside span(U). Backward it sends G·U; the parts of G
// outside span(U) cannot move any upstream parameter of a constrained
// model, so dropping them is exact.
type subspaceCodec struct {
	id      ID
	b       *subspace.Basis
	idWidth int // bytes per token id: 2 when the vocabulary fits, else 3
	efix    *efixCache
}

func newSubspace(id ID, b *subspace.Basis, cacheBytes int) subspaceCodec {
	w := 2
	if b.Config().Vocab > 1<<16 {
		w = 3 // subspace.Config caps Vocab at 1<<24
	}
	return subspaceCodec{id: id, b: b, idWidth: w, efix: newEFixCache(b, cacheBytes)}
}

func (c subspaceCodec) ID() ID                      { return c.id }
func (c subspaceCodec) Dim() int                    { return c.b.Dim() }
func (c subspaceCodec) Cols(Direction) int          { return c.b.Rank() }
func (c subspaceCodec) NeedsIDs(dir Direction) bool { return dir == Forward }
func (c subspaceCodec) Basis() *subspace.Basis      { return c.b }

func (c subspaceCodec) Fingerprint() [32]byte {
	h := c.b.Hash()
	fields := []uint64{uint64(c.b.Dim()), uint64(c.b.Rank()), uint64(c.b.Config().Vocab), uint64(c.idWidth)}
	for i := 0; i < 32; i += 8 {
		var v uint64
		for j := 0; j < 8; j++ {
			v |= uint64(h[i+j]) << (8 * j)
		}
		fields = append(fields, v)
	}
	return fingerprint(c.id, fields...)
}

func (c subspaceCodec) coefBytes() int {
	if c.id == SubspaceFP32 {
		return 4
	}
	return 2
}

func (c subspaceCodec) PayloadSize(dir Direction, n int) int {
	p := n * c.b.Rank() * c.coefBytes()
	if dir == Forward {
		p += n * c.idWidth
	}
	return p
}

func (c subspaceCodec) Encode(dst []byte, dir Direction, x []float32, ids []int) ([]byte, float64, error) {
	if err := checkDir(dir); err != nil {
		return dst, 0, err
	}
	d, k := c.b.Dim(), c.b.Rank()
	n, err := tokens(x, d)
	if err != nil {
		return dst, 0, err
	}
	coef := make([]float32, n*k)
	var residual float64
	if dir == Forward {
		if len(ids) != n {
			return dst, 0, fmt.Errorf("%w: %d token ids for %d tokens", ErrShape, len(ids), n)
		}
		if err := c.checkIDs(ids); err != nil {
			return dst, 0, err
		}
		residual = c.project(x, ids, coef)
	} else {
		// G·U: n×d times d×k.
		gemm.Sgemm(false, false, n, k, d, 1, x, d, c.b.U(), k, 0, coef, k)
	}
	out, p := grow(dst, c.PayloadSize(dir, n))
	if dir == Forward {
		for t, id := range ids {
			for j := 0; j < c.idWidth; j++ {
				p[t*c.idWidth+j] = byte(id >> (8 * j))
			}
		}
		p = p[n*c.idWidth:]
	}
	if c.id == SubspaceFP32 {
		err = putF32s(p, coef)
	} else {
		err = putBF16s(p, coef)
	}
	if err != nil {
		return dst, 0, fmt.Errorf("subspace %s coefficients: %w", dir, err)
	}
	return out, residual, nil
}

func (c subspaceCodec) Decode(src []byte, dir Direction, n int, x []float32, ids []int) error {
	if err := checkDir(dir); err != nil {
		return err
	}
	d, k := c.b.Dim(), c.b.Rank()
	if len(x) != n*d || len(src) != c.PayloadSize(dir, n) {
		return fmt.Errorf("%w: %d tokens of %d need %d values from %d bytes, got %d values from %d bytes",
			ErrShape, n, d, n*d, c.PayloadSize(dir, n), len(x), len(src))
	}
	if dir == Forward {
		if len(ids) != n {
			return fmt.Errorf("%w: room for %d token ids, need %d", ErrShape, len(ids), n)
		}
		for t := range ids {
			var id int
			for j := 0; j < c.idWidth; j++ {
				id |= int(src[t*c.idWidth+j]) << (8 * j)
			}
			ids[t] = id
		}
		if err := c.checkIDs(ids); err != nil {
			return err
		}
		src = src[n*c.idWidth:]
	}
	coef := make([]float32, n*k)
	var err error
	if c.id == SubspaceFP32 {
		err = getF32s(coef, src)
	} else {
		err = getBF16s(coef, src)
	}
	if err != nil {
		return fmt.Errorf("subspace %s coefficients: %w", dir, err)
	}
	if dir == Forward {
		// H = E_fix[ids] + C·Uᵀ.
		c.efix.fill(ids, x)
		gemm.Sgemm(false, true, n, d, k, 1, coef, k, c.b.U(), k, 1, x, d)
	} else {
		gemm.Sgemm(false, true, n, d, k, 1, coef, k, c.b.U(), k, 0, x, d)
	}
	// Finite but huge coefficients can still overflow C·Uᵀ.
	for i, v := range x {
		if math.Float32bits(v)&0x7f80_0000 == 0x7f80_0000 {
			return fmt.Errorf("%w: reconstructed value %d overflows", ErrNonFinite, i)
		}
	}
	return nil
}

// project writes C = (H − E_fix[ids])·U and returns the invariant residual
// ‖(I−UUᵀ)(H−E)‖/‖H−E‖. It does with two GEMMs what subspace.Basis.Encode
// does token by token (the same U and E_fix rows, so the same numbers up
// to rounding), because a boundary encodes whole microbatches.
func (c subspaceCodec) project(h []float32, ids []int, coef []float32) float64 {
	d, k, n := c.b.Dim(), c.b.Rank(), len(ids)
	dev := scratch.Get(n * d)
	defer scratch.Put(dev)
	c.efix.fill(ids, dev)
	var total float64
	for i, e := range dev {
		v := h[i] - e
		dev[i] = v
		total += float64(v) * float64(v)
	}
	gemm.Sgemm(false, false, n, k, d, 1, dev, d, c.b.U(), k, 0, coef, k)
	if total == 0 {
		return 0
	}
	// dev −= C·Uᵀ leaves the part outside span(U).
	gemm.Sgemm(false, true, n, d, k, -1, coef, k, c.b.U(), k, 1, dev, d)
	var resid float64
	for _, v := range dev {
		resid += float64(v) * float64(v)
	}
	return math.Sqrt(resid / total)
}

func (c subspaceCodec) checkIDs(ids []int) error {
	v := c.b.Config().Vocab
	for t, id := range ids {
		if id < 0 || id >= v {
			return fmt.Errorf("%w: token %d has id %d, vocabulary is %d", ErrTokenID, t, id, v)
		}
	}
	return nil
}
