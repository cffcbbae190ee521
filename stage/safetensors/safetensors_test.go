package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// llamaTensors is a tiny model with the tensor names Hugging Face uses for
// Llama checkpoints (SmolLM2, TinyLlama).
func llamaTensors(rng *rand.Rand) []Tensor {
	mk := func(name string, shape ...int) Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		data := make([]float32, n)
		for i := range data {
			data[i] = float32(rng.NormFloat64())
		}
		return Tensor{Name: name, Shape: shape, Data: data}
	}
	const vocab, d, ff = 11, 8, 12
	ts := []Tensor{
		mk("model.embed_tokens.weight", vocab, d),
		mk("model.norm.weight", d),
		mk("lm_head.weight", vocab, d),
	}
	for l := range 2 {
		p := fmt.Sprintf("model.layers.%d.", l)
		ts = append(ts,
			mk(p+"input_layernorm.weight", d),
			mk(p+"self_attn.q_proj.weight", d, d),
			mk(p+"self_attn.k_proj.weight", d/2, d),
			mk(p+"self_attn.v_proj.weight", d/2, d),
			mk(p+"self_attn.o_proj.weight", d, d),
			mk(p+"post_attention_layernorm.weight", d),
			mk(p+"mlp.gate_proj.weight", ff, d),
			mk(p+"mlp.up_proj.weight", ff, d),
			mk(p+"mlp.down_proj.weight", d, ff),
		)
	}
	return ts
}

func TestRoundTripF32(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ts := llamaTensors(rng)
	ts = append(ts,
		Tensor{Name: "scalar", Shape: nil, Data: []float32{3.5}},
		Tensor{Name: "empty", Shape: []int{0, 4}, Data: nil},
	)
	path := filepath.Join(t.TempDir(), "model.safetensors")
	meta := map[string]string{"format": "pt", "holopeer.step": "42"}
	if err := Write(path, ts, meta); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := binary.LittleEndian.Uint64(raw); (8+n)%8 != 0 {
		t.Errorf("data starts at %d, not 8-byte aligned", 8+n)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := f.Metadata(); got["format"] != "pt" || got["holopeer.step"] != "42" || len(got) != 2 {
		t.Errorf("metadata = %v", got)
	}
	infos := f.Tensors()
	if len(infos) != len(ts) {
		t.Fatalf("%d tensors, want %d", len(infos), len(ts))
	}
	if !slices.IsSortedFunc(infos, func(a, b TensorInfo) int { return strings.Compare(a.Name, b.Name) }) {
		t.Error("Tensors() not sorted by name")
	}
	for _, want := range ts {
		info, ok := f.Info(want.Name)
		if !ok || info.DType != F32 || !slices.Equal(info.Shape, shapeOrEmpty(want.Shape)) {
			t.Errorf("Info(%q) = %+v, %v", want.Name, info, ok)
		}
		got := make([]float32, len(want.Data))
		if err := f.ReadFloat32(want.Name, shapeOrEmpty(want.Shape), got); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want.Data) && len(want.Data) > 0 {
			t.Errorf("%s: data differs", want.Name)
		}
		rt, err := f.ReadTensor(want.Name)
		if err != nil || !slices.Equal(rt.Data, got) {
			t.Errorf("ReadTensor(%q) = %v, %v", want.Name, rt, err)
		}
	}
	// No temporary files are left beside the checkpoint.
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the checkpoint", len(entries))
	}
}

func shapeOrEmpty(s []int) []int {
	if s == nil {
		return []int{}
	}
	return s
}

func TestWriteReplacesAtomically(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ckpt.safetensors")
	for i := range 3 {
		ts := []Tensor{{Name: "w", Shape: []int{2}, Data: []float32{float32(i), float32(-i)}}}
		if err := Write(path, ts, nil); err != nil {
			t.Fatal(err)
		}
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]float32, 2)
	if err := f.ReadFloat32("w", []int{2}, got); err != nil || got[0] != 2 {
		t.Fatalf("got %v, %v", got, err)
	}
}

func TestWriteRefusesBadTensors(t *testing.T) {
	dir := t.TempDir()
	cases := map[string][]Tensor{
		"empty name":    {{Name: "", Shape: []int{1}, Data: []float32{1}}},
		"reserved name": {{Name: MetadataKey, Shape: []int{1}, Data: []float32{1}}},
		"duplicate":     {{Name: "a", Shape: []int{1}, Data: []float32{1}}, {Name: "a", Shape: []int{1}, Data: []float32{1}}},
		"short data":    {{Name: "a", Shape: []int{2, 2}, Data: []float32{1, 2, 3}}},
		"negative dim":  {{Name: "a", Shape: []int{-1}, Data: nil}},
	}
	for name, ts := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, "x.safetensors")
			if err := Write(path, ts, nil); err == nil {
				t.Fatal("Write accepted bad tensors")
			}
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
				t.Error("a refused write left a file")
			}
		})
	}
	if err := Write(filepath.Join(dir, "y"), nil, nil, WithDType(I32)); !errors.Is(err, ErrDType) {
		t.Errorf("WithDType(I32): %v", err)
	}
}

// rawFile assembles a safetensors file from a header string and data, the
// way a foreign writer would.
func rawFile(hdr string, data []byte) []byte {
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	out = append(out, hdr...)
	return append(out, data...)
}

func TestHandWrittenBF16AndF16(t *testing.T) {
	le := binary.LittleEndian
	bf := []uint16{0x3f80, 0xc000, 0x7f80, 0xff80, 0x0001, 0x3eaa, 0x8000, 0x4049}
	bfWant := []float32{1, -2, float32(math.Inf(1)), float32(math.Inf(-1)), math.Float32frombits(0x00010000), math.Float32frombits(0x3eaa0000), float32(math.Copysign(0, -1)), math.Float32frombits(0x40490000)}
	hf := []uint16{0x3c00, 0xc000, 0x0001, 0x03ff, 0x0400, 0x7bff, 0x3555, 0xfc00}
	hfWant := []float32{1, -2, 0x1p-24, 1023 * 0x1p-24, 0x1p-14, 65504, 0x1.554p-2, float32(math.Inf(-1))}
	var data []byte
	for _, v := range bf {
		data = le.AppendUint16(data, v)
	}
	for _, v := range hf {
		data = le.AppendUint16(data, v)
	}
	hdr := `{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,4],"data_offsets":[0,16]},"h":{"dtype":"F16","shape":[8],"data_offsets":[16,32]}}`
	path := filepath.Join(t.TempDir(), "hand.safetensors")
	if err := os.WriteFile(path, rawFile(hdr, data), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]float32, 8)
	if err := f.ReadFloat32("b", []int{2, 4}, got); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(bfWant[i]) {
			t.Errorf("BF16 %#04x = %g, want %g", bf[i], got[i], bfWant[i])
		}
	}
	if err := f.ReadFloat32("h", []int{8}, got); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != hfWant[i] {
			t.Errorf("F16 %#04x = %g, want %g", hf[i], got[i], hfWant[i])
		}
	}
}

func TestHalfConversionsExhaustive(t *testing.T) {
	for h := range 1 << 16 {
		h := uint16(h)
		f := F16ToFloat32(h)
		if f != f { // NaN stays NaN
			if g := F16ToFloat32(Float32ToF16(f)); g == g {
				t.Fatalf("F16 NaN %#04x lost", h)
			}
			continue
		}
		if back := Float32ToF16(f); back != h {
			t.Fatalf("F16 %#04x -> %g -> %#04x", h, f, back)
		}
		b := BF16ToFloat32(h)
		if b != b {
			continue
		}
		if back := Float32ToBF16(b); back != h {
			t.Fatalf("BF16 %#04x -> %g -> %#04x", h, b, back)
		}
	}
}

// TestHalfRoundingNearestEven checks, on random float32 and on exact ties,
// that narrowing picks the nearest half and breaks ties to the even one.
func TestHalfRoundingNearestEven(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	check := func(name string, f float32, enc func(float32) uint16, dec func(uint16) float32) {
		h := enc(f)
		got := float64(dec(h))
		err := math.Abs(float64(f) - got)
		if math.IsInf(got, 0) {
			return // overflow: checked separately
		}
		for _, n := range []uint16{h - 1, h + 1} {
			alt := float64(dec(n))
			if math.IsNaN(alt) || math.IsInf(alt, 0) || math.Signbit(alt) != math.Signbit(got) && got != 0 {
				continue
			}
			altErr := math.Abs(float64(f) - alt)
			if altErr < err || (altErr == err && h&1 == 1) {
				t.Fatalf("%s(%g) = %#04x (%g), but %#04x (%g) is nearer or an even tie", name, f, h, got, n, alt)
			}
		}
	}
	for range 200000 {
		f := math.Float32frombits(rng.Uint32())
		if f != f {
			continue
		}
		check("BF16", f, Float32ToBF16, BF16ToFloat32)
		// Keep F16 checks inside its range, subnormals included.
		g := float32(rng.NormFloat64() * math.Pow(2, float64(rng.IntN(40)-26)))
		check("F16", g, Float32ToF16, F16ToFloat32)
	}
	// Ties: halfway between two representable neighbours.
	ties := map[float32]float32{
		1 + 0x1p-11:   1,                    // F16: tie between 1 and 1+2^-10, even is 1
		1 + 3*0x1p-11: 1 + 2*0x1p-10,        // tie between 1+2^-10 (odd) and 1+2^-9 (even)
		0x1p-25:       0,                    // half the smallest subnormal: ties to zero
		3 * 0x1p-25:   2 * 0x1p-24,          // between 1 and 2 subnormal units: to 2
		65520:         float32(math.Inf(1)), // half an ulp past 65504 rounds up
		65519:         65504,
	}
	for in, want := range ties {
		if got := F16ToFloat32(Float32ToF16(in)); got != want {
			t.Errorf("F16 round(%g) = %g, want %g", in, got, want)
		}
	}
	if got := BF16ToFloat32(Float32ToBF16(1 + 0x1p-8)); got != 1 {
		t.Errorf("BF16 tie 1+2^-8 -> %g, want 1", got)
	}
	if got := BF16ToFloat32(Float32ToBF16(1 + 3*0x1p-8)); got != 1+0x1p-6 {
		t.Errorf("BF16 tie 1+3*2^-8 -> %g, want %g", got, 1+0x1p-6)
	}
}

func TestRoundTripHalfFiles(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	ts := llamaTensors(rng)
	for _, dt := range []DType{BF16, F16} {
		path := filepath.Join(t.TempDir(), string(dt)+".safetensors")
		if err := Write(path, ts, nil, WithDType(dt)); err != nil {
			t.Fatal(err)
		}
		f, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		enc, dec := Float32ToBF16, BF16ToFloat32
		if dt == F16 {
			enc, dec = Float32ToF16, F16ToFloat32
		}
		for _, want := range ts {
			info, _ := f.Info(want.Name)
			if info.DType != dt {
				t.Errorf("%s stored as %s", want.Name, info.DType)
			}
			got := make([]float32, len(want.Data))
			if err := f.ReadFloat32(want.Name, want.Shape, got); err != nil {
				t.Fatal(err)
			}
			for i, v := range want.Data {
				if got[i] != dec(enc(v)) {
					t.Fatalf("%s %s[%d] = %g, want %g", dt, want.Name, i, got[i], dec(enc(v)))
				}
			}
		}
		f.Close()
	}
}

func TestReadErrorsNameTheTensor(t *testing.T) {
	hdr := `{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"ids":{"dtype":"I32","shape":[2],"data_offsets":[24,32]}}`
	data := make([]byte, 32)
	f, err := OpenReader(bytes.NewReader(rawFile(hdr, data)), int64(8+len(hdr)+len(data)))
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]float32, 6)
	err = f.ReadFloat32("model.layers.3.mlp.up_proj.weight", []int{2, 3}, dst)
	if !errors.Is(err, ErrMissing) || !strings.Contains(err.Error(), "model.layers.3.mlp.up_proj.weight") {
		t.Errorf("missing tensor: %v", err)
	}
	err = f.ReadFloat32("w", []int{3, 2}, dst)
	if !errors.Is(err, ErrShape) || !strings.Contains(err.Error(), `"w"`) || !strings.Contains(err.Error(), "[2 3]") || !strings.Contains(err.Error(), "[3 2]") {
		t.Errorf("mis-shaped tensor: %v", err)
	}
	err = f.ReadFloat32("ids", []int{2}, dst[:2])
	if !errors.Is(err, ErrDType) || !strings.Contains(err.Error(), "ids") {
		t.Errorf("integer tensor: %v", err)
	}
	if err := f.ReadFloat32("w", []int{2, 3}, dst[:5]); err == nil {
		t.Error("short destination accepted")
	}
}

// countingReader records every byte range read, to show a stage reads its
// own tensors and nothing else.
type countingReader struct {
	mu     sync.Mutex
	r      *bytes.Reader
	ranges [][2]int64
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	c.mu.Lock()
	c.ranges = append(c.ranges, [2]int64{off, off + int64(len(p))})
	c.mu.Unlock()
	return c.r.ReadAt(p, off)
}

func TestReadsOnlyOwnTensor(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	ts := llamaTensors(rng)
	path := filepath.Join(t.TempDir(), "m.safetensors")
	if err := Write(path, ts, nil); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	cr := &countingReader{r: bytes.NewReader(raw)}
	f, err := OpenReader(cr, int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	hdrEnd := 8 + int64(binary.LittleEndian.Uint64(raw))
	for _, r := range cr.ranges {
		if r[1] > hdrEnd {
			t.Fatalf("Open read [%d, %d), past the header end %d", r[0], r[1], hdrEnd)
		}
	}
	cr.ranges = nil
	name := "model.layers.1.mlp.down_proj.weight"
	info, _ := f.Info(name)
	dst := make([]float32, info.NumElements())
	if err := f.ReadFloat32(name, info.Shape, dst); err != nil {
		t.Fatal(err)
	}
	lo, hi := hdrEnd+info.Begin, hdrEnd+info.End
	var read int64
	for _, r := range cr.ranges {
		if r[0] < lo || r[1] > hi {
			t.Fatalf("reading %s touched [%d, %d), outside its [%d, %d)", name, r[0], r[1], lo, hi)
		}
		read += r[1] - r[0]
	}
	if read != hi-lo {
		t.Errorf("read %d bytes for a %d-byte tensor", read, hi-lo)
	}
}

func TestTruncatedData(t *testing.T) {
	hdr := `{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`
	full := rawFile(hdr, make([]byte, 16))
	// The header promises 16 bytes the file does not have: Open refuses.
	short := full[:len(full)-4]
	if _, err := OpenReader(bytes.NewReader(short), int64(len(short))); !errors.Is(err, ErrHeader) || !strings.Contains(err.Error(), `"a"`) {
		t.Errorf("truncated file: %v", err)
	}
	// A file that shrinks after Open fails the read, naming the tensor.
	f, err := OpenReader(bytes.NewReader(short), int64(len(full)))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.ReadFloat32("a", []int{4}, make([]float32, 4)); !errors.Is(err, ErrTruncated) || !strings.Contains(err.Error(), `"a"`) {
		t.Errorf("shrunk file: %v", err)
	}
}

func TestOpenRefusesBadPrefix(t *testing.T) {
	huge := binary.LittleEndian.AppendUint64(nil, 1<<62)
	cases := map[string][]byte{
		"empty":              {},
		"short prefix":       {1, 2, 3},
		"huge length":        append(huge, '{', '}'),
		"over 100 MiB":       append(binary.LittleEndian.AppendUint64(nil, MaxHeaderSize+1), '{', '}'),
		"length past file":   append(binary.LittleEndian.AppendUint64(nil, 10), '{', '}'),
		"zero-length header": binary.LittleEndian.AppendUint64(nil, 0),
	}
	for name, raw := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "bad.safetensors")
			os.WriteFile(path, raw, 0o600)
			if f, err := Open(path); err == nil || !errors.Is(err, ErrHeader) {
				t.Errorf("Open = %v, %v; want ErrHeader", f, err)
			}
		})
	}
}

func TestParseHeaderRefusals(t *testing.T) {
	type tc struct {
		hdr      string
		dataSize int64
		want     error
		mention  string
	}
	cases := map[string]tc{
		"not json":         {`{"a":`, 0, ErrHeader, ""},
		"not an object":    {`[1,2]`, 0, ErrHeader, "object"},
		"bad utf8":         {"{\"\xff\":{}}", 0, ErrHeader, "UTF-8"},
		"trailing garbage": {`{} x`, 0, ErrHeader, "after"},
		"second object":    {`{}{}`, 0, ErrHeader, "after"},
		"empty name":       {`{"":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}`, 4, ErrHeader, "empty name"},
		"unknown dtype":    {`{"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}}`, 16, ErrDType, `"w"`},
		"missing dtype":    {`{"w":{"shape":[1],"data_offsets":[0,4]}}`, 4, ErrHeader, `"w"`},
		"missing offsets":  {`{"w":{"dtype":"F32","shape":[1]}}`, 4, ErrHeader, `"w"`},
		"entry not object": {`{"w":7}`, 4, ErrHeader, `"w"`},
		"three offsets":    {`{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, 8, ErrHeader, `"w"`},
		"negative offset":  {`{"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}}`, 8, ErrHeader, `"w"`},
		"begin after end":  {`{"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}}`, 8, ErrHeader, `"w"`},
		"past data":        {`{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, 12, ErrHeader, "truncated"},
		"huge offset":      {`{"w":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551611,18446744073709551615]}}`, 8, ErrHeader, `"w"`},
		"size mismatch":    {`{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}}`, 16, ErrHeader, "needs 12"},
		"wrong dtype size": {`{"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,16]}}`, 16, ErrHeader, "needs 8"},
		"negative dim":     {`{"w":{"dtype":"F32","shape":[-1,-4],"data_offsets":[0,16]}}`, 16, ErrHeader, "negative"},
		"fractional dim":   {`{"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}`, 4, ErrHeader, `"w"`},
		"numel overflow":   {`{"w":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,0]}}`, 0, ErrHeader, "overflow"},
		"byte overflow":    {`{"w":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}}`, 0, ErrHeader, "overflow"},
		"overlap":          {`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, 12, ErrHeader, "overlap"},
		"same range":       {`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 8, ErrHeader, "overlap"},
		"duplicate name":   {`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8, ErrHeader, "twice"},
		"metadata number":  {`{"__metadata__":{"step":3}}`, 0, ErrHeader, MetadataKey},
		"metadata twice":   {`{"__metadata__":{},"__metadata__":{}}`, 0, ErrHeader, "twice"},
		"negative data":    {`{}`, -1, ErrHeader, "negative"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, _, err := ParseHeader([]byte(c.hdr), c.dataSize)
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			if !strings.Contains(err.Error(), c.mention) {
				t.Errorf("err %q does not mention %q", err, c.mention)
			}
		})
	}
}

func TestParseHeaderAccepts(t *testing.T) {
	// Padding spaces, a null metadata entry, unknown extra fields, zero-size
	// tensors sharing an offset, and a gap between tensors all parse.
	hdr := `{"__metadata__":null,"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1},` +
		`"z1":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},"z2":{"dtype":"U8","shape":[3,0],"data_offsets":[4,4]},` +
		`"b":{"dtype":"I64","shape":[],"data_offsets":[8,16]}}      `
	ts, meta, err := ParseHeader([]byte(hdr), 16)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 4 || len(meta) != 0 || ts["b"].Begin != 8 || len(ts["b"].Shape) != 0 {
		t.Errorf("parsed %v, %v", ts, meta)
	}
}

func FuzzParseHeader(f *testing.F) {
	f.Add([]byte(`{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}`), int64(16))
	f.Add([]byte(`{"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},"b":{"dtype":"F16","shape":[1],"data_offsets":[6,8]}}  `), int64(8))
	f.Add([]byte(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`), int64(12))
	f.Add([]byte(`{"w":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,0]}}`), int64(0))
	f.Add([]byte(`{}`), int64(0))
	f.Add([]byte(`{"a":`), int64(1))
	f.Fuzz(func(t *testing.T, hdr []byte, dataSize int64) {
		ts, meta, err := ParseHeader(hdr, dataSize)
		if err != nil {
			return
		}
		if meta == nil {
			t.Fatal("nil metadata on success")
		}
		var spans []TensorInfo
		for name, info := range ts {
			if name == "" || name != info.Name || name == MetadataKey {
				t.Fatalf("bad name %q / %q", name, info.Name)
			}
			if info.Begin < 0 || info.End < info.Begin || info.End > dataSize {
				t.Fatalf("%q: range [%d, %d) outside [0, %d)", name, info.Begin, info.End, dataSize)
			}
			if info.NumElements()*info.DType.Size() != info.End-info.Begin {
				t.Fatalf("%q: size mismatch accepted", name)
			}
			if info.End > info.Begin {
				spans = append(spans, info)
			}
		}
		slices.SortFunc(spans, func(a, b TensorInfo) int { return int(a.Begin - b.Begin) })
		for i := 1; i < len(spans); i++ {
			if spans[i].Begin < spans[i-1].End {
				t.Fatal("overlap accepted")
			}
		}
	})
}

// FuzzOpenReader covers the whole file path: prefix, header and a read of
// every float tensor the header admits.
func FuzzOpenReader(f *testing.F) {
	f.Add(rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8)))
	f.Add(rawFile(`{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}`, make([]byte, 4)))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{'})
	f.Fuzz(func(t *testing.T, raw []byte) {
		file, err := OpenReader(bytes.NewReader(raw), int64(len(raw)))
		if err != nil {
			return
		}
		for _, info := range file.Tensors() {
			if info.DType.Float() {
				if _, err := file.ReadTensor(info.Name); err != nil {
					t.Fatalf("admitted tensor %q unreadable: %v", info.Name, err)
				}
			}
		}
	})
}

// Sources read on demand encode byte for byte as tensors in memory, and
// Layout's Size is what WriteTo writes, for every dtype.
func TestEncodeSourcesMatchesEncode(t *testing.T) {
	a := []float32{1, -2, 3.5, 4, 5, 6}
	b := []float32{0.25}
	for _, dt := range []DType{F32, BF16, F16} {
		var want bytes.Buffer
		if err := Encode(&want, []Tensor{{Name: "b", Shape: []int{1}, Data: b}, {Name: "a", Shape: []int{2, 3}, Data: a}}, map[string]string{"k": "v"}, WithDType(dt)); err != nil {
			t.Fatal(err)
		}
		reads := 0
		srcs := []Source{
			{Name: "a", Shape: []int{2, 3}, Read: func(dst []float32) error { reads++; copy(dst, a); return nil }},
			{Name: "b", Shape: []int{1}, Read: func(dst []float32) error { reads++; copy(dst, b); return nil }},
		}
		e, err := Layout(srcs, map[string]string{"k": "v"}, WithDType(dt))
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		n, err := e.WriteTo(&got)
		if err != nil {
			t.Fatal(err)
		}
		if n != e.Size() || int64(got.Len()) != e.Size() || reads != 2 || !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Fatalf("%s: wrote %d of Size %d after %d reads; equal=%v", dt, n, e.Size(), reads, bytes.Equal(got.Bytes(), want.Bytes()))
		}
	}
	if _, err := Layout([]Source{{Name: "x", Shape: []int{2}}}, nil); err == nil {
		t.Fatal("a source with neither data nor reader was accepted")
	}
}
