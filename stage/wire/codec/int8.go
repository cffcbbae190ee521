package codec

import (
	"encoding/binary"
	"fmt"
	"math"
)

// int8Block is blockwise absmax quantisation: each run of Int8BlockSize
// values of a token shares one float32 scale = absmax/127, and each value
// travels as round(x/scale) in int8. Error per value is at most scale/2;
// values of the form q·2^e with max|q| = 127 in their block round-trip
// exactly.
type int8Block struct{ d int }

// Bounds that keep q·scale finite for every int8 q (including −128, which a
// hostile payload may carry).
const (
	maxInt8Abs   = math.MaxFloat32 / 4
	maxInt8Scale = math.MaxFloat32 / 256
)

func (c int8Block) ID() ID                  { return Int8Block }
func (c int8Block) Dim() int                { return c.d }
func (c int8Block) Cols(Direction) int      { return c.d }
func (c int8Block) NeedsIDs(Direction) bool { return false }
func (c int8Block) Fingerprint() [32]byte {
	return fingerprint(Int8Block, uint64(c.d), Int8BlockSize)
}

func (c int8Block) blocks() int { return (c.d + Int8BlockSize - 1) / Int8BlockSize }

// rowBytes is one token's payload: the scales, then the values.
func (c int8Block) rowBytes() int                      { return 4*c.blocks() + c.d }
func (c int8Block) PayloadSize(_ Direction, n int) int { return n * c.rowBytes() }

func (c int8Block) Encode(dst []byte, dir Direction, x []float32, _ []int) ([]byte, float64, error) {
	if err := checkDir(dir); err != nil {
		return dst, 0, err
	}
	n, err := tokens(x, c.d)
	if err != nil {
		return dst, 0, err
	}
	out, p := grow(dst, c.PayloadSize(dir, n))
	nb, rb := c.blocks(), c.rowBytes()
	for t := 0; t < n; t++ {
		row := x[t*c.d : (t+1)*c.d]
		pr := p[t*rb : (t+1)*rb]
		scales, vals := pr[:4*nb], pr[4*nb:]
		for b := 0; b < nb; b++ {
			blk := row[b*Int8BlockSize : min((b+1)*Int8BlockSize, c.d)]
			var amax float32
			for i, v := range blk {
				if math.Float32bits(v)&0x7f80_0000 == 0x7f80_0000 {
					return dst, 0, fmt.Errorf("%w at index %d", ErrNonFinite, t*c.d+b*Int8BlockSize+i)
				}
				amax = max(amax, float32(math.Abs(float64(v))))
			}
			if amax > maxInt8Abs {
				return dst, 0, fmt.Errorf("%w: |x| = %g in token %d block %d is too large for int8 scales", ErrNonFinite, amax, t, b)
			}
			scale := amax / 127
			binary.LittleEndian.PutUint32(scales[4*b:], math.Float32bits(scale))
			q := vals[b*Int8BlockSize : b*Int8BlockSize+len(blk)]
			if scale == 0 {
				clear(q)
				continue
			}
			inv := 1 / float64(scale)
			for i, v := range blk {
				r := math.Round(float64(v) * inv)
				q[i] = byte(int8(max(-127, min(127, r))))
			}
		}
	}
	return out, 0, nil
}

func (c int8Block) Decode(src []byte, dir Direction, n int, x []float32, _ []int) error {
	if err := checkDir(dir); err != nil {
		return err
	}
	if len(x) != n*c.d || len(src) != c.PayloadSize(dir, n) {
		return fmt.Errorf("%w: %d tokens of %d need %d values from %d bytes, got %d values from %d bytes",
			ErrShape, n, c.d, n*c.d, c.PayloadSize(dir, n), len(x), len(src))
	}
	nb, rb := c.blocks(), c.rowBytes()
	for t := 0; t < n; t++ {
		pr := src[t*rb : (t+1)*rb]
		scales, vals := pr[:4*nb], pr[4*nb:]
		row := x[t*c.d : (t+1)*c.d]
		for b := 0; b < nb; b++ {
			sb := binary.LittleEndian.Uint32(scales[4*b:])
			// A negative, NaN or infinite scale is never produced by
			// Encode; refusing it keeps hostile payloads out of the math.
			if sb&0x8000_0000 != 0 || sb&0x7f80_0000 == 0x7f80_0000 || math.Float32frombits(sb) > maxInt8Scale {
				return fmt.Errorf("%w: scale %g of token %d block %d", ErrNonFinite, math.Float32frombits(sb), t, b)
			}
			scale := math.Float32frombits(sb)
			lo, hi := b*Int8BlockSize, min((b+1)*Int8BlockSize, c.d)
			for i := lo; i < hi; i++ {
				row[i] = float32(int8(vals[i])) * scale
			}
		}
	}
	return nil
}
