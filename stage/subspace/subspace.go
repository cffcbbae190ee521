// Package subspace holds the shared objects of the Protocol Models
// ("subspace networks") compression scheme: a fixed orthonormal basis U
// (d×k) and a fixed random token embedding E_fix (V×d).
//
// Every stage of a job derives both from the job's seed, so nothing is
// shipped; the Hash lets two stages prove in their handshake that they hold
// bit-identical copies. A model whose output projections and trainable
// embedding live in span(U) keeps h − E_fix[token] inside span(U) at every
// block boundary, so a boundary only needs k coefficients per token.
//
// Determinism across machines is the point of this package. It therefore
// uses only integer hashing, IEEE +, −, ×, ÷ and √ (which are correctly
// rounded everywhere), and rounds each product explicitly so the compiler
// cannot fuse it into an FMA on one architecture and not another. It never
// calls math.Log or math.Cos, whose results differ between assembly and
// pure-Go implementations.
package subspace

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
)

// MaxDim bounds d and k so that a hostile manifest or handshake cannot make
// a node allocate an absurd basis (d·k·4 bytes; 16384·1024·4 = 64 MiB).
const (
	MaxDim  = 16384
	MaxRank = 1024
)

// Config names one basis. Two stages with equal configs derive equal bases.
type Config struct {
	Dim   int    // d_model
	Rank  int    // k, the number of coefficients per token on the wire
	Vocab int    // V, number of token ids E_fix has rows for
	Seed  uint64 // the job's subspace seed
}

// Validate reports the first field that is out of range.
func (c Config) Validate() error {
	switch {
	case c.Dim <= 0 || c.Dim > MaxDim:
		return fmt.Errorf("subspace: dim %d out of range 1..%d", c.Dim, MaxDim)
	case c.Rank <= 0 || c.Rank > MaxRank || c.Rank > c.Dim:
		return fmt.Errorf("subspace: rank %d out of range 1..min(%d, dim %d)", c.Rank, MaxRank, c.Dim)
	case c.Vocab <= 0 || c.Vocab > 1<<24:
		return fmt.Errorf("subspace: vocab %d out of range 1..%d", c.Vocab, 1<<24)
	}
	return nil
}

// Basis is a derived U and the generator of E_fix. It is immutable and safe
// for concurrent use.
type Basis struct {
	cfg  Config
	u    []float32 // d×k row-major, orthonormal columns
	hash [32]byte
}

// New derives the basis for cfg. It costs O(d·k²) once per job.
func New(cfg Config) (*Basis, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d, k := cfg.Dim, cfg.Rank
	// Gaussian d×k in float64, column-major for Gram-Schmidt.
	cols := make([][]float64, k)
	for j := range cols {
		col := make([]float64, d)
		for i := range col {
			col[i] = normal(cfg.Seed^0x5eed_0000_0000_0001, uint64(j), uint64(i))
		}
		cols[j] = col
	}
	// Modified Gram-Schmidt, applied twice for orthogonality to ~1e-15.
	for j := 0; j < k; j++ {
		for pass := 0; pass < 2; pass++ {
			for p := 0; p < j; p++ {
				r := dot(cols[p], cols[j])
				for i := range cols[j] {
					cols[j][i] -= float64(r * cols[p][i])
				}
			}
		}
		n := math.Sqrt(dot(cols[j], cols[j]))
		if n == 0 {
			return nil, fmt.Errorf("subspace: degenerate basis column %d", j)
		}
		for i := range cols[j] {
			cols[j][i] /= n
		}
	}
	b := &Basis{cfg: cfg, u: make([]float32, d*k)}
	for i := 0; i < d; i++ {
		for j := 0; j < k; j++ {
			b.u[i*k+j] = float32(cols[j][i])
		}
	}
	b.hash = b.computeHash()
	return b, nil
}

// Config returns the configuration the basis was derived from.
func (b *Basis) Config() Config { return b.cfg }

// Dim is d_model.
func (b *Basis) Dim() int { return b.cfg.Dim }

// Rank is k.
func (b *Basis) Rank() int { return b.cfg.Rank }

// U returns the d×k row-major basis. Callers must not modify it.
func (b *Basis) U() []float32 { return b.u }

// Hash commits to the config, every bit of U and sample rows of E_fix, so a
// handshake can detect a peer whose arithmetic differs from ours.
func (b *Basis) Hash() [32]byte { return b.hash }

// EFixRow writes row tok of the fixed embedding (i.i.d. approximately
// N(0,1)) into dst, which must have length Dim. Rows are generated on demand
// from a counter-based hash, so no V×d table is ever held in memory.
func (b *Basis) EFixRow(tok int, dst []float32) {
	if tok < 0 || tok >= b.cfg.Vocab {
		panic(fmt.Sprintf("subspace: token %d outside vocab %d", tok, b.cfg.Vocab))
	}
	if len(dst) != b.cfg.Dim {
		panic(fmt.Sprintf("subspace: EFixRow dst has length %d, want %d", len(dst), b.cfg.Dim))
	}
	for i := range dst {
		dst[i] = float32(normal(b.cfg.Seed^0xf1c5_0000_0000_0002, uint64(tok), uint64(i)))
	}
}

// Encode writes the coefficients C = (H − E_fix[tok])·U of n tokens into c
// (n×k) and returns the relative residual ‖(I−UUᵀ)(H−E)‖/‖H−E‖, the
// invariant monitor: about 1e-7 for a model that keeps the constraint.
func (b *Basis) Encode(h []float32, toks []int, c []float32) (residual float64) {
	d, k := b.cfg.Dim, b.cfg.Rank
	b.checkShapes(h, toks, c)
	row := make([]float32, d)
	var resid, total float64
	for t, tok := range toks {
		b.EFixRow(tok, row)
		hr := h[t*d : (t+1)*d]
		for i := range row {
			row[i] = hr[i] - row[i]
		}
		cr := c[t*k : (t+1)*k]
		for j := range cr {
			cr[j] = 0
		}
		for i, x := range row {
			ui := b.u[i*k : (i+1)*k]
			for j := range cr {
				cr[j] += x * ui[j]
			}
		}
		// Residual of this token: ‖row − U·c‖².
		for i, x := range row {
			ui := b.u[i*k : (i+1)*k]
			var p float32
			for j := range cr {
				p += ui[j] * cr[j]
			}
			r := float64(x - p)
			resid += r * r
			total += float64(x) * float64(x)
		}
	}
	if total == 0 {
		return 0
	}
	return math.Sqrt(resid / total)
}

// Decode rebuilds H = C·Uᵀ + E_fix[tok] for n tokens into h (n×d).
func (b *Basis) Decode(c []float32, toks []int, h []float32) {
	d, k := b.cfg.Dim, b.cfg.Rank
	b.checkShapes(h, toks, c)
	for t, tok := range toks {
		hr := h[t*d : (t+1)*d]
		b.EFixRow(tok, hr)
		cr := c[t*k : (t+1)*k]
		for i := range hr {
			ui := b.u[i*k : (i+1)*k]
			var p float32
			for j := range cr {
				p += ui[j] * cr[j]
			}
			hr[i] += p
		}
	}
}

// ProjectGrad writes G·U (n×k) for an activation gradient G (n×d): the
// backward payload. Components of G outside span(U) cannot move any
// upstream parameter, so dropping them is exact.
func (b *Basis) ProjectGrad(g []float32, n int, gc []float32) {
	d, k := b.cfg.Dim, b.cfg.Rank
	if len(g) != n*d || len(gc) != n*k {
		panic(fmt.Sprintf("subspace: ProjectGrad shapes g=%d gc=%d for n=%d d=%d k=%d", len(g), len(gc), n, d, k))
	}
	for t := 0; t < n; t++ {
		cr := gc[t*k : (t+1)*k]
		for j := range cr {
			cr[j] = 0
		}
		for i, x := range g[t*d : (t+1)*d] {
			ui := b.u[i*k : (i+1)*k]
			for j := range cr {
				cr[j] += x * ui[j]
			}
		}
	}
}

// LiftGrad writes G = G_C·Uᵀ (n×d) from the k-dimensional backward payload.
func (b *Basis) LiftGrad(gc []float32, n int, g []float32) {
	d, k := b.cfg.Dim, b.cfg.Rank
	if len(g) != n*d || len(gc) != n*k {
		panic(fmt.Sprintf("subspace: LiftGrad shapes g=%d gc=%d for n=%d d=%d k=%d", len(g), len(gc), n, d, k))
	}
	for t := 0; t < n; t++ {
		cr := gc[t*k : (t+1)*k]
		gr := g[t*d : (t+1)*d]
		for i := range gr {
			ui := b.u[i*k : (i+1)*k]
			var p float32
			for j := range cr {
				p += ui[j] * cr[j]
			}
			gr[i] = p
		}
	}
}

func (b *Basis) checkShapes(h []float32, toks []int, c []float32) {
	n := len(toks)
	if len(h) != n*b.cfg.Dim || len(c) != n*b.cfg.Rank {
		panic(fmt.Sprintf("subspace: shapes h=%d c=%d for %d tokens, d=%d k=%d", len(h), len(c), n, b.cfg.Dim, b.cfg.Rank))
	}
}

func (b *Basis) computeHash() [32]byte {
	s := sha256.New()
	var buf [8]byte
	for _, v := range []uint64{uint64(b.cfg.Dim), uint64(b.cfg.Rank), uint64(b.cfg.Vocab), b.cfg.Seed} {
		binary.LittleEndian.PutUint64(buf[:], v)
		s.Write(buf[:])
	}
	for _, x := range b.u {
		binary.LittleEndian.PutUint32(buf[:4], math.Float32bits(x))
		s.Write(buf[:4])
	}
	row := make([]float32, b.cfg.Dim)
	for _, tok := range []int{0, b.cfg.Vocab / 2, b.cfg.Vocab - 1} {
		b.EFixRow(tok, row)
		for _, x := range row {
			binary.LittleEndian.PutUint32(buf[:4], math.Float32bits(x))
			s.Write(buf[:4])
		}
	}
	var out [32]byte
	copy(out[:], s.Sum(nil))
	return out
}

func dot(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += float64(a[i] * b[i])
	}
	return s
}

// normal returns an approximately standard normal deviate for the counter
// (stream, row, col): the Irwin–Hall sum of four 16-bit uniforms from one
// SplitMix64 output, centred and scaled to unit variance. Integer hashing
// and exactly representable float arithmetic make it bit-identical on every
// architecture.
func normal(stream, row, col uint64) float64 {
	x := splitmix(splitmix(stream^splitmix(row)) ^ col)
	var s float64
	for i := 0; i < 4; i++ {
		s += float64(uint16(x >> (16 * i)))
	}
	// Each term is uniform on {0..65535}: mean 32767.5, variance (65536²−1)/12.
	const mean = 4 * 32767.5
	const sd = 37837.22692452188 // sqrt(4 * (65536*65536 - 1) / 12)
	return (s - mean) / sd
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
