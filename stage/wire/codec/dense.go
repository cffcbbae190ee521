package codec

import (
	"encoding/binary"
	"fmt"
	"math"
)

// dense carries every value: FP32 exactly, BF16 rounded to nearest even.
type dense struct {
	id ID
	d  int
}

func (c dense) ID() ID                             { return c.id }
func (c dense) Dim() int                           { return c.d }
func (c dense) Cols(Direction) int                 { return c.d }
func (c dense) NeedsIDs(Direction) bool            { return false }
func (c dense) Fingerprint() [32]byte              { return fingerprint(c.id, uint64(c.d)) }
func (c dense) PayloadSize(_ Direction, n int) int { return n * c.d * c.width() }

func (c dense) width() int {
	if c.id == FP32 {
		return 4
	}
	return 2
}

func (c dense) Encode(dst []byte, dir Direction, x []float32, _ []int) ([]byte, float64, error) {
	if err := checkDir(dir); err != nil {
		return dst, 0, err
	}
	n, err := tokens(x, c.d)
	if err != nil {
		return dst, 0, err
	}
	out, p := grow(dst, c.PayloadSize(dir, n))
	if c.id == FP32 {
		err = putF32s(p, x)
	} else {
		err = putBF16s(p, x)
	}
	if err != nil {
		return dst, 0, err
	}
	return out, 0, nil
}

func (c dense) Decode(src []byte, dir Direction, n int, x []float32, _ []int) error {
	if err := checkDir(dir); err != nil {
		return err
	}
	if len(x) != n*c.d || len(src) != c.PayloadSize(dir, n) {
		return fmt.Errorf("%w: %d tokens of %d need %d values from %d bytes, got %d values from %d bytes",
			ErrShape, n, c.d, n*c.d, c.PayloadSize(dir, n), len(x), len(src))
	}
	if c.id == FP32 {
		return getF32s(x, src)
	}
	return getBF16s(x, src)
}

// putF32s writes x little-endian, refusing NaN and ±Inf.
func putF32s(p []byte, x []float32) error {
	p = p[:4*len(x)]
	for i, v := range x {
		b := math.Float32bits(v)
		if b&0x7f80_0000 == 0x7f80_0000 {
			return fmt.Errorf("%w at index %d", ErrNonFinite, i)
		}
		binary.LittleEndian.PutUint32(p[4*i:], b)
	}
	return nil
}

func getF32s(x []float32, p []byte) error {
	p = p[:4*len(x)]
	for i := range x {
		b := binary.LittleEndian.Uint32(p[4*i:])
		if b&0x7f80_0000 == 0x7f80_0000 {
			return fmt.Errorf("%w at index %d", ErrNonFinite, i)
		}
		x[i] = math.Float32frombits(b)
	}
	return nil
}

func putBF16s(p []byte, x []float32) error {
	p = p[:2*len(x)]
	for i, v := range x {
		h, ok := ToBF16(v)
		if !ok {
			return fmt.Errorf("%w at index %d (%g does not fit bfloat16)", ErrNonFinite, i, v)
		}
		binary.LittleEndian.PutUint16(p[2*i:], h)
	}
	return nil
}

func getBF16s(x []float32, p []byte) error {
	p = p[:2*len(x)]
	for i := range x {
		h := binary.LittleEndian.Uint16(p[2*i:])
		if h&0x7f80 == 0x7f80 {
			return fmt.Errorf("%w at index %d", ErrNonFinite, i)
		}
		x[i] = FromBF16(h)
	}
	return nil
}

// ToBF16 rounds f to the nearest bfloat16, ties to even. ok is false when f
// is NaN or ±Inf, or is finite but rounds past the largest bfloat16.
func ToBF16(f float32) (h uint16, ok bool) {
	b := math.Float32bits(f)
	if b&0x7f80_0000 == 0x7f80_0000 {
		return 0, false
	}
	b += 0x7fff + (b>>16)&1
	h = uint16(b >> 16)
	return h, h&0x7f80 != 0x7f80
}

// FromBF16 widens a bfloat16 to float32 exactly.
func FromBF16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }
