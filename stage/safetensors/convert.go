package safetensors

import (
	"encoding/binary"
	"math"
)

// decode converts little-endian elements of dtype dt in b to float32.
// len(b) is len(dst) times the dtype size.
func decode(dt DType, b []byte, dst []float32) {
	le := binary.LittleEndian
	switch dt {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(le.Uint32(b[4*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = BF16ToFloat32(le.Uint16(b[2*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = F16ToFloat32(le.Uint16(b[2*i:]))
		}
	case F64:
		for i := range dst {
			dst[i] = float32(math.Float64frombits(le.Uint64(b[8*i:])))
		}
	default:
		panic("safetensors: decode of non-float dtype " + string(dt))
	}
}

// encode converts src to dtype dt (F32, BF16 or F16) into b.
func encode(dt DType, src []float32, b []byte) {
	le := binary.LittleEndian
	switch dt {
	case F32:
		for i, v := range src {
			le.PutUint32(b[4*i:], math.Float32bits(v))
		}
	case BF16:
		for i, v := range src {
			le.PutUint16(b[2*i:], Float32ToBF16(v))
		}
	case F16:
		for i, v := range src {
			le.PutUint16(b[2*i:], Float32ToF16(v))
		}
	default:
		panic("safetensors: encode to unsupported dtype " + string(dt))
	}
}

// BF16ToFloat32 widens a bfloat16, which is the top half of a float32;
// the conversion is exact.
func BF16ToFloat32(h uint16) float32 {
	return math.Float32frombits(uint32(h) << 16)
}

// Float32ToBF16 rounds to the nearest bfloat16, ties to even, as PyTorch
// does. NaN stays NaN (quiet) with its sign.
func Float32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x0040
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// F16ToFloat32 widens an IEEE 754 half, subnormals included; the conversion
// is exact.
func F16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0:
		// Zero or subnormal: mant * 2^-24, exact in float32.
		v := float32(mant) * (1.0 / (1 << 24))
		return math.Float32frombits(math.Float32bits(v) | sign)
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	default:
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	}
}

// Float32ToF16 rounds to the nearest IEEE 754 half, ties to even, with
// subnormals; values past the half range become infinities.
func Float32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00 | uint16(mant>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Subnormal half. Below half the smallest subnormal (2^-25) even
		// the rounding cannot reach it.
		if e < -10 {
			return sign
		}
		mant |= 0x800000
		shift := uint(14 - e)
		half := uint32(1) << (shift - 1)
		rem := mant & (1<<shift - 1)
		m := mant >> shift
		if rem > half || (rem == half && m&1 == 1) {
			m++ // may become 0x400, the smallest normal: still the right bits
		}
		return sign | uint16(m)
	}
	out := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && out&1 == 1) {
		out++ // a carry into the exponent is correct, up to infinity
	}
	return sign | uint16(out)
}
