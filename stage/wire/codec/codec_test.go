package codec

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/holopeer/holopeer/stage/subspace"
)

func mustBasis(t testing.TB, d, k, vocab int) *subspace.Basis {
	t.Helper()
	b, err := subspace.New(subspace.Config{Dim: d, Rank: k, Vocab: vocab, Seed: 42})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustCodec(t testing.TB, id ID, d int, b *subspace.Basis) Codec {
	t.Helper()
	c, err := New(id, Params{Dim: d, Basis: b})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func randVec(r *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * scale)
	}
	return x
}

func TestFP32RoundTripIsBitExact(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	c := mustCodec(t, FP32, 96, nil)
	x := randVec(r, 5*96, 3)
	x[0], x[1], x[2] = math.MaxFloat32, math.SmallestNonzeroFloat32, float32(math.Copysign(0, -1))
	for _, dir := range []Direction{Forward, Backward} {
		p, res, err := c.Encode(nil, dir, x, nil)
		if err != nil || res != 0 {
			t.Fatalf("encode: %v residual %g", err, res)
		}
		if len(p) != c.PayloadSize(dir, 5) {
			t.Fatalf("payload %d bytes, PayloadSize says %d", len(p), c.PayloadSize(dir, 5))
		}
		y := make([]float32, len(x))
		if err := c.Decode(p, dir, 5, y, nil); err != nil {
			t.Fatal(err)
		}
		for i := range x {
			if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
				t.Fatalf("value %d: %g became %g", i, x[i], y[i])
			}
		}
	}
}

// bf16Reference rounds to the nearest bfloat16 with ties to even using exact
// rational arithmetic, independent of the bit trick under test.
func bf16Reference(f float32) float32 {
	if f == 0 {
		return f
	}
	bits := math.Float32bits(f)
	lo := math.Float32frombits(bits &^ 0xffff)             // truncated toward zero
	hi := math.Float32frombits((bits &^ 0xffff) + 0x10000) // next bf16 away from zero
	x, a, b := new(big.Float).SetFloat64(float64(f)), new(big.Float).SetFloat64(float64(lo)), new(big.Float).SetFloat64(float64(hi))
	da := new(big.Float).Sub(x, a)
	db := new(big.Float).Sub(b, x)
	da.Abs(da)
	db.Abs(db)
	switch da.Cmp(db) {
	case -1:
		return lo
	case 1:
		return hi
	}
	if (bits>>16)&1 == 0 {
		return lo
	}
	return hi
}

func TestBF16RoundsToNearestEven(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	cases := []float32{1, -1, 1.00390625 /* tie, even below */, 1.01171875 /* tie, odd below */, 3.1415927, 1e-40, -65504, 1e30}
	for i := 0; i < 20000; i++ {
		cases = append(cases, math.Float32frombits(r.Uint32()&0x7f7f_ffff|r.Uint32()&0x8000_0000))
	}
	for _, f := range cases {
		h, ok := ToBF16(f)
		if !ok {
			// Only values at or past max bf16 + half an ulp may be refused.
			if math.Float32bits(f)&0x7fff_ffff < 0x7f7f_8000 {
				t.Fatalf("ToBF16(%g) refused a value bfloat16 can carry", f)
			}
			continue
		}
		want := bf16Reference(f)
		if got := FromBF16(h); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("bf16(%g) = %g, want %g", f, got, want)
		}
	}
	for _, f := range []float32{float32(math.Inf(1)), float32(math.NaN()), math.MaxFloat32} {
		if _, ok := ToBF16(f); ok {
			t.Fatalf("ToBF16(%g) accepted a value bfloat16 cannot carry", f)
		}
	}
}

func TestBF16RoundTripExactOnRepresentableValues(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	c := mustCodec(t, BF16, 130, nil)
	x := randVec(r, 3*130, 10)
	for i := range x {
		x[i] = bf16Reference(x[i]) // make every value representable
	}
	p, _, err := c.Encode(nil, Forward, x, nil)
	if err != nil {
		t.Fatal(err)
	}
	y := make([]float32, len(x))
	if err := c.Decode(p, Forward, 3, y, nil); err != nil {
		t.Fatal(err)
	}
	for i := range x {
		if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
			t.Fatalf("value %d: %g became %g", i, x[i], y[i])
		}
	}
}

func TestInt8RoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	const d = 200 // not a multiple of the block size: the last block is short
	c := mustCodec(t, Int8Block, d, nil)
	t.Run("representable values are exact", func(t *testing.T) {
		x := make([]float32, 2*d)
		// Each block is q·2^e with one |q| = 127: it reproduces exactly.
		for tok := 0; tok < 2; tok++ {
			row := x[tok*d : (tok+1)*d]
			for b := 0; b*Int8BlockSize < d; b++ {
				e := r.IntN(40) - 20
				blk := row[b*Int8BlockSize : min((b+1)*Int8BlockSize, d)]
				for i := range blk {
					blk[i] = float32(math.Ldexp(float64(r.IntN(255)-127), e))
				}
				blk[0] = float32(math.Ldexp(-127, e))
			}
		}
		p, _, err := c.Encode(nil, Forward, x, nil)
		if err != nil {
			t.Fatal(err)
		}
		y := make([]float32, len(x))
		if err := c.Decode(p, Forward, 2, y, nil); err != nil {
			t.Fatal(err)
		}
		for i := range x {
			if x[i] != y[i] {
				t.Fatalf("value %d: %g became %g", i, x[i], y[i])
			}
		}
		// Re-encoding what came out gives the same bytes.
		p2, _, err := c.Encode(nil, Forward, y, nil)
		if err != nil || !bytes.Equal(p, p2) {
			t.Fatalf("re-encode differs (err %v)", err)
		}
	})
	t.Run("random values within half a step", func(t *testing.T) {
		x := randVec(r, 7*d, 5)
		x[3] = 0
		for i := d; i < 2*d; i++ {
			x[i] = 0 // an all-zero token
		}
		p, _, err := c.Encode(nil, Backward, x, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(p) != 7*(d+4*4) {
			t.Fatalf("payload %d bytes, want %d", len(p), 7*(d+16))
		}
		y := make([]float32, len(x))
		if err := c.Decode(p, Backward, 7, y, nil); err != nil {
			t.Fatal(err)
		}
		for tok := 0; tok < 7; tok++ {
			for b := 0; b*Int8BlockSize < d; b++ {
				lo, hi := tok*d+b*Int8BlockSize, tok*d+min((b+1)*Int8BlockSize, d)
				var amax float64
				for _, v := range x[lo:hi] {
					amax = max(amax, math.Abs(float64(v)))
				}
				step := amax / 127
				for i := lo; i < hi; i++ {
					if e := math.Abs(float64(x[i] - y[i])); e > step/2*(1+1e-6) {
						t.Fatalf("value %d: error %g exceeds half a step %g", i, e, step/2)
					}
				}
			}
		}
	})
}

func TestSubspaceFP32ReconstructsInsideSpanTo1e6(t *testing.T) {
	const d, k, n = 4096, 40, 6
	b := mustBasis(t, d, k, 50257)
	c := mustCodec(t, SubspaceFP32, d, b)
	r := rand.New(rand.NewPCG(5, 5))
	ids := []int{0, 50256, 17, 65535 % 50257, 1234, 42}
	// H = C·Uᵀ + E_fix[ids] lies in the constrained set by construction.
	h := make([]float32, n*d)
	b.Decode(randVec(r, n*k, 2), ids, h)
	p, residual, err := c.Encode(nil, Forward, h, ids)
	if err != nil {
		t.Fatal(err)
	}
	if residual > 1e-6 {
		t.Fatalf("invariant residual %g for a vector inside span(U)", residual)
	}
	got := make([]float32, n*d)
	gotIDs := make([]int, n)
	if err := c.Decode(p, Forward, n, got, gotIDs); err != nil {
		t.Fatal(err)
	}
	for i := range ids {
		if gotIDs[i] != ids[i] {
			t.Fatalf("token %d: id %d became %d", i, ids[i], gotIDs[i])
		}
	}
	// The relative error that matters is that of the part the wire carries,
	// h − E_fix: E_fix is rebuilt bit-exactly on both sides.
	e := make([]float32, d)
	var num, den, numH, denH float64
	for tok := 0; tok < n; tok++ {
		b.EFixRow(ids[tok], e)
		for i := 0; i < d; i++ {
			x, y := float64(h[tok*d+i]), float64(got[tok*d+i])
			num += (x - y) * (x - y)
			den += (x - float64(e[i])) * (x - float64(e[i]))
			denH += x * x
		}
	}
	numH = num
	if rel := math.Sqrt(num / den); rel > 1e-6 {
		t.Fatalf("relative error of h − E_fix after the round trip is %g, want ≤ 1e-6", rel)
	}
	if rel := math.Sqrt(numH / denH); rel > 1e-6 {
		t.Fatalf("relative error of h after the round trip is %g, want ≤ 1e-6", rel)
	}
}

func TestSubspaceReportsResidualOutsideSpan(t *testing.T) {
	const d, k = 256, 16
	b := mustBasis(t, d, k, 1000)
	c := mustCodec(t, SubspaceBF16, d, b)
	r := rand.New(rand.NewPCG(6, 6))
	h := randVec(r, 2*d, 1) // not constrained: almost all of it is outside span(U)
	_, residual, err := c.Encode(nil, Forward, h, []int{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	if residual < 0.5 {
		t.Fatalf("residual %g for a random vector; the invariant monitor should flag it", residual)
	}
}

func TestSubspaceBF16AndBackward(t *testing.T) {
	const d, k, n = 1024, 160, 4
	b := mustBasis(t, d, k, 300)
	c := mustCodec(t, SubspaceBF16, d, b)
	r := rand.New(rand.NewPCG(7, 7))
	ids := []int{0, 299, 5, 6}
	h := make([]float32, n*d)
	b.Decode(randVec(r, n*k, 1), ids, h)
	p, _, err := c.Encode(nil, Forward, h, ids)
	if err != nil {
		t.Fatal(err)
	}
	if len(p) != n*(2+2*k) {
		t.Fatalf("forward payload %d bytes, want %d", len(p), n*(2+2*k))
	}
	got, gotIDs := make([]float32, n*d), make([]int, n)
	if err := c.Decode(p, Forward, n, got, gotIDs); err != nil {
		t.Fatal(err)
	}
	// bf16 keeps 8 significant bits: relative error ≤ 2^-8 per coefficient.
	if rel := relErrMinusEFix(b, h, got, ids); rel > 4e-3 {
		t.Fatalf("bf16 forward relative error %g, want ≤ 4e-3", rel)
	}

	// Backward: G·U then lift; a gradient inside span(U) comes back.
	g := make([]float32, n*d)
	b.LiftGrad(randVec(r, n*k, 1), n, g)
	cf := mustCodec(t, SubspaceFP32, d, b)
	p, _, err = cf.Encode(nil, Backward, g, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(p) != n*4*k {
		t.Fatalf("backward payload %d bytes, want %d", len(p), n*4*k)
	}
	gg := make([]float32, n*d)
	if err := cf.Decode(p, Backward, n, gg, nil); err != nil {
		t.Fatal(err)
	}
	var num, den float64
	for i := range g {
		num += float64(g[i]-gg[i]) * float64(g[i]-gg[i])
		den += float64(g[i]) * float64(g[i])
	}
	if rel := math.Sqrt(num / den); rel > 1e-6 {
		t.Fatalf("backward relative error %g", rel)
	}
}

func relErrMinusEFix(b *subspace.Basis, h, got []float32, ids []int) float64 {
	d := b.Dim()
	e := make([]float32, d)
	var num, den float64
	for tok, id := range ids {
		b.EFixRow(id, e)
		for i := 0; i < d; i++ {
			x, y := float64(h[tok*d+i]), float64(got[tok*d+i])
			num += (x - y) * (x - y)
			den += (x - float64(e[i])) * (x - float64(e[i]))
		}
	}
	return math.Sqrt(num / den)
}

// The acceptance bound of the Wire issue: subspace at d 4096, k 40 sends at
// most 1.5% of the bf16 bytes per token, forward and backward.
func TestSubspaceBytesPerTokenAtD4096(t *testing.T) {
	b := mustBasis(t, 4096, 40, 50257)
	bf := mustCodec(t, BF16, 4096, nil)
	for _, id := range []ID{SubspaceBF16, SubspaceFP32} {
		c := mustCodec(t, id, 4096, b)
		for _, dir := range []Direction{Forward, Backward} {
			ratio := float64(c.PayloadSize(dir, 1)) / float64(bf.PayloadSize(dir, 1))
			t.Logf("%s %s: %d B/token, %.3f%% of bf16", id, dir, c.PayloadSize(dir, 1), 100*ratio)
			if id == SubspaceBF16 && ratio > 0.015 {
				t.Fatalf("%s %s sends %.2f%% of bf16, want ≤ 1.5%%", id, dir, 100*ratio)
			}
		}
	}
}

func TestDecodersRefuseHostilePayloads(t *testing.T) {
	b := mustBasis(t, 128, 8, 1000)
	nan32 := []byte{0, 0, 0xc0, 0x7f}
	for _, tc := range []struct {
		name    string
		id      ID
		dir     Direction
		payload func(c Codec) []byte
		want    error
	}{
		{"fp32 NaN", FP32, Forward, func(c Codec) []byte { p := make([]byte, c.PayloadSize(Forward, 1)); copy(p[8:], nan32); return p }, ErrNonFinite},
		{"fp32 Inf", FP32, Backward, func(c Codec) []byte {
			p := make([]byte, c.PayloadSize(Backward, 1))
			copy(p[4:], []byte{0, 0, 0x80, 0x7f})
			return p
		}, ErrNonFinite},
		{"bf16 Inf", BF16, Forward, func(c Codec) []byte { p := make([]byte, c.PayloadSize(Forward, 1)); p[3] = 0x7f; p[2] = 0x80; return p }, ErrNonFinite},
		{"int8 negative scale", Int8Block, Forward, func(c Codec) []byte { p := make([]byte, c.PayloadSize(Forward, 1)); p[3] = 0xbf; return p }, ErrNonFinite},
		{"int8 huge scale", Int8Block, Forward, func(c Codec) []byte {
			p := make([]byte, c.PayloadSize(Forward, 1))
			copy(p, []byte{0xff, 0xff, 0x7f, 0x7f})
			return p
		}, ErrNonFinite},
		{"subspace id past vocab", SubspaceBF16, Forward, func(c Codec) []byte { p := make([]byte, c.PayloadSize(Forward, 1)); p[0], p[1] = 0xe8, 0x03; return p }, ErrTokenID},
		{"subspace NaN coefficient", SubspaceFP32, Forward, func(c Codec) []byte { p := make([]byte, c.PayloadSize(Forward, 1)); copy(p[2:], nan32); return p }, ErrNonFinite},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := mustCodec(t, tc.id, 128, b)
			err := c.Decode(tc.payload(c), tc.dir, 1, make([]float32, 128), make([]int, 1))
			if !errors.Is(err, tc.want) {
				t.Fatalf("Decode = %v, want %v", err, tc.want)
			}
		})
	}
	// Finite coefficients whose reconstruction overflows float32: with
	// d = 16, k = 8 every row of U has Σ|U_ij| > 1, so ±MaxFloat32 aligned
	// with the signs of U overflows.
	small := mustBasis(t, 16, 8, 10)
	c := mustCodec(t, SubspaceFP32, 16, small)
	u := small.U()
	coef := make([]float32, 8)
	for j := range coef {
		coef[j] = float32(math.Copysign(math.MaxFloat32, float64(u[j])))
	}
	p, _, err := c.Encode(nil, Backward, make([]float32, 16), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := putF32s(p, coef); err != nil {
		t.Fatal(err)
	}
	if err := c.Decode(p, Backward, 1, make([]float32, 16), nil); !errors.Is(err, ErrNonFinite) {
		t.Fatalf("overflowing reconstruction: %v", err)
	}
	// Wrong lengths are refused for every codec.
	for _, id := range []ID{FP32, BF16, Int8Block, SubspaceFP32, SubspaceBF16} {
		c := mustCodec(t, id, 128, b)
		p := make([]byte, c.PayloadSize(Forward, 2)+1)
		if err := c.Decode(p, Forward, 2, make([]float32, 256), make([]int, 2)); !errors.Is(err, ErrShape) {
			t.Fatalf("%s: one byte too many: %v", id, err)
		}
	}
}

func TestEncodersRefuseWhatTheyCannotCarry(t *testing.T) {
	b := mustBasis(t, 64, 4, 10)
	for _, id := range []ID{FP32, BF16, Int8Block} {
		c := mustCodec(t, id, 64, nil)
		x := make([]float32, 64)
		x[5] = float32(math.NaN())
		if _, _, err := c.Encode(nil, Forward, x, nil); !errors.Is(err, ErrNonFinite) {
			t.Fatalf("%s encoded a NaN: %v", id, err)
		}
		if _, _, err := c.Encode(nil, Forward, make([]float32, 65), nil); !errors.Is(err, ErrShape) {
			t.Fatalf("%s encoded a ragged tensor: %v", id, err)
		}
	}
	c := mustCodec(t, SubspaceBF16, 64, b)
	if _, _, err := c.Encode(nil, Forward, make([]float32, 64), []int{10}); !errors.Is(err, ErrTokenID) {
		t.Fatalf("subspace encoded id 10 of vocab 10: %v", err)
	}
	if _, _, err := c.Encode(nil, Forward, make([]float32, 128), []int{1}); !errors.Is(err, ErrShape) {
		t.Fatalf("subspace encoded 2 tokens with 1 id: %v", err)
	}
}

func TestFingerprintsSeparateCodecsAndBases(t *testing.T) {
	b1 := mustBasis(t, 64, 4, 10)
	b2, err := subspace.New(subspace.Config{Dim: 64, Rank: 4, Vocab: 10, Seed: 43})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[[32]byte]string{}
	for _, c := range []Codec{
		mustCodec(t, FP32, 64, nil), mustCodec(t, FP32, 65, nil), mustCodec(t, BF16, 64, nil), mustCodec(t, Int8Block, 64, nil),
		mustCodec(t, SubspaceBF16, 64, b1), mustCodec(t, SubspaceFP32, 64, b1), mustCodec(t, SubspaceBF16, 64, b2),
	} {
		f := c.Fingerprint()
		if prev, dup := seen[f]; dup {
			t.Fatalf("%s d=%d has the fingerprint of %s", c.ID(), c.Dim(), prev)
		}
		seen[f] = c.ID().String()
	}
	if mustCodec(t, SubspaceBF16, 64, b1).Fingerprint() != mustCodec(t, SubspaceBF16, 64, mustBasis(t, 64, 4, 10)).Fingerprint() {
		t.Fatal("equal bases give different fingerprints")
	}
}

func TestParseID(t *testing.T) {
	for s, want := range map[string]ID{"fp32": FP32, "BF16": BF16, "int8": Int8Block, "subspace": SubspaceBF16, "subspace-fp32": SubspaceFP32} {
		got, err := ParseID(s)
		if err != nil || got != want {
			t.Fatalf("ParseID(%q) = %v, %v; want %v", s, got, err, want)
		}
		if again, _ := ParseID(got.String()); again != got {
			t.Fatalf("%v does not round-trip through its name", got)
		}
	}
	if _, err := ParseID("fp8"); err == nil {
		t.Fatal("ParseID accepted fp8")
	}
}

// FuzzDecode feeds arbitrary payloads to every codec's decoder: it must
// return an error or finite values, never panic.
func FuzzDecode(f *testing.F) {
	b := mustBasis(f, 64, 4, 300)
	codecs := []Codec{mustCodec(f, FP32, 64, nil), mustCodec(f, BF16, 64, nil), mustCodec(f, Int8Block, 64, nil),
		mustCodec(f, SubspaceFP32, 64, b), mustCodec(f, SubspaceBF16, 64, b)}
	f.Add(uint8(0), uint8(1), uint8(1), make([]byte, 256))
	f.Add(uint8(2), uint8(2), uint8(3), make([]byte, 3*(64+4)))
	f.Add(uint8(4), uint8(1), uint8(2), make([]byte, 2*(2+8)))
	f.Fuzz(func(t *testing.T, which, dir, n uint8, p []byte) {
		c := codecs[int(which)%len(codecs)]
		dr := Direction(dir%2 + 1)
		nt := int(n%8) + 1
		x := make([]float32, nt*64)
		ids := make([]int, nt)
		want := c.PayloadSize(dr, nt)
		if n&0x80 != 0 && len(p) != want {
			if err := c.Decode(p, dr, nt, x, ids); err == nil {
				t.Fatalf("%s accepted %d bytes for %d tokens (want %d)", c.ID(), len(p), nt, want)
			}
			return
		}
		// Mostly exercise payloads of the right length: pad or cut.
		p = append(p, make([]byte, max(0, want-len(p)))...)[:want]
		if err := c.Decode(p, dr, nt, x, ids); err != nil {
			return
		}
		for i, v := range x {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("%s decoded a non-finite value at %d", c.ID(), i)
			}
		}
		if c.NeedsIDs(dr) {
			for _, id := range ids {
				if id < 0 || id >= 300 {
					t.Fatalf("%s decoded id %d", c.ID(), id)
				}
			}
		}
	})
}

// BenchmarkCodec measures encode+decode of a 512-token microbatch, forward
// and backward, per codec and d_model; ns/token is the figure to compare
// with a stage's compute per token.
func BenchmarkCodec(b *testing.B) {
	const n = 512
	for _, dk := range [][2]int{{128, 32}, {1024, 40}, {4096, 40}} {
		d, k := dk[0], dk[1]
		basis := mustBasis(b, d, k, 50257)
		r := rand.New(rand.NewPCG(1, 1))
		ids := make([]int, n)
		for i := range ids {
			ids[i] = r.IntN(50257)
		}
		h := make([]float32, n*d)
		basis.Decode(randVec(r, n*k, 1), ids, h)
		for _, id := range []ID{BF16, Int8Block, SubspaceBF16} {
			c := mustCodec(b, id, d, basis)
			b.Run(fmt.Sprintf("%s/d%d", id, d), func(b *testing.B) {
				out := make([]float32, n*d)
				gotIDs := make([]int, n)
				var p []byte
				for b.Loop() {
					for _, dir := range []Direction{Forward, Backward} {
						var err error
						p, _, err = c.Encode(p[:0], dir, h, ids)
						if err != nil {
							b.Fatal(err)
						}
						if err := c.Decode(p, dir, n, out, gotIDs); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/token")
			})
		}
	}
}
