package tensortest

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/holopeer/holopeer/stage/tensor"
)

// Result is one output of an op case: what the backend computed and the
// float64 reference (a reference forward, or central differences of the
// reference forward for a backward op), with the tolerance on RelErr.
type Result struct {
	Got  []float32
	Want []float64
	Tol  float64
}

// Case runs one op (or one op's backward) on a backend with inputs drawn
// from r and returns its outputs by name.
type Case struct {
	Name string
	Run  func(be tensor.Backend, r *rand.Rand) map[string]Result
}

// Cases lists every op check, forward and backward.
func Cases() []Case { return slices.Clone(cases) }

// CheckBackend runs every case on be and fails t where an output is
// farther from its float64 reference than the case allows. The achieved
// errors are logged (go test -v shows them).
func CheckBackend(t *testing.T, be tensor.Backend) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			res := c.Run(be, caseRand(c.Name))
			for _, k := range sortedKeys(res) {
				r := res[k]
				e := RelErr(r.Got, r.Want)
				t.Logf("%-10s rel err %.2e (tol %.0e)", k, e, r.Tol)
				if !(e <= r.Tol) {
					t.Errorf("%s: %s: relative error %.3g exceeds %.1g", c.Name, k, e, r.Tol)
				}
			}
		})
	}
	if err := be.Sync(); err != nil {
		t.Fatalf("Sync: %v", err)
	}
}

// CheckParity runs every case on be and on ref with the same inputs and
// fails t where an output differs by more than tol relative to ref's
// largest element (tol <= 0 means 1e-5). GPU backends call it with the cpu
// backend as ref.
func CheckParity(t *testing.T, be, ref tensor.Backend, tol float64) {
	t.Helper()
	if tol <= 0 {
		tol = 1e-5
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			got := c.Run(be, caseRand(c.Name))
			want := c.Run(ref, caseRand(c.Name))
			for _, k := range sortedKeys(want) {
				e := RelErr(got[k].Got, F64(want[k].Got))
				t.Logf("%-10s %s vs %s: rel diff %.2e", k, be.Name(), ref.Name(), e)
				if !(e <= tol) {
					t.Errorf("%s: %s: %s differs from %s by %.3g (tol %.1g)", c.Name, k, be.Name(), ref.Name(), e, tol)
				}
			}
		})
	}
	if err := be.Sync(); err != nil {
		t.Fatalf("Sync: %v", err)
	}
}

func caseRand(name string) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(name))
	return rand.New(rand.NewPCG(0x7e57, h.Sum64()))
}

func sortedKeys(m map[string]Result) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func randF(r *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * scale)
	}
	return x
}

func up(be tensor.Backend, x []float32) tensor.Buffer {
	b := be.Alloc(tensor.Float32, len(x))
	be.Upload(b, x)
	return b
}

func upI(be tensor.Backend, x []int32) tensor.Buffer {
	b := be.Alloc(tensor.Int32, len(x))
	be.UploadInt32(b, x)
	return b
}

func down(be tensor.Backend, b tensor.Buffer) []float32 {
	x := make([]float32, b.Len())
	be.Download(x, b)
	return x
}

// Tolerances. Forward ops are float32 computations of a float64 formula;
// backward ops are compared with central differences (step fdStep) of the
// float64 forward, whose own error is ~1e-10, so what remains is float32
// rounding in the backend.
const (
	tolExact = 0
	tolFwd   = 2e-6
	tolGemm  = 1e-5
	tolGrad  = 2e-5
	fdStep   = 1e-5
)

var cases = []Case{
	{"Gemm", caseGemm},
	{"GemmBackward", caseGemmBackward},
	{"Elementwise", caseElementwise},
	{"Softmax", caseSoftmax},
	{"GatherScatter", caseGatherScatter},
	{"RMSNorm", caseRMSNorm},
	{"RoPE", caseRoPE},
	{"SwiGLU", caseSwiGLU},
	{"AttentionTrain", func(be tensor.Backend, r *rand.Rand) map[string]Result {
		return caseAttention(be, r, tensor.AttnShape{Batch: 2, Heads: 4, KVHeads: 2, HeadDim: 4, SeqQ: 5, SeqK: 5})
	}},
	{"AttentionMHA", func(be tensor.Backend, r *rand.Rand) map[string]Result {
		return caseAttention(be, r, tensor.AttnShape{Batch: 1, Heads: 2, KVHeads: 2, HeadDim: 8, SeqQ: 9, SeqK: 9})
	}},
	{"AttentionDecode", func(be tensor.Backend, r *rand.Rand) map[string]Result {
		return caseAttention(be, r, tensor.AttnShape{Batch: 1, Heads: 4, KVHeads: 1, HeadDim: 6, SeqQ: 3, SeqK: 7, QOffset: 4})
	}},
	{"CrossEntropy", caseCrossEntropy},
	{"AdamW", caseAdamW},
}

func caseGemm(be tensor.Backend, r *rand.Rand) map[string]Result {
	out := map[string]Result{}
	for _, sh := range [][3]int{{5, 7, 9}, {33, 17, 65}, {1, 40, 3}} {
		m, n, k := sh[0], sh[1], sh[2]
		for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
			a, b, c := randF(r, m*k, 1), randF(r, k*n, 1), randF(r, m*n, 1)
			cb := up(be, c)
			be.Gemm(tr[0], tr[1], m, n, k, 0.7, up(be, a), up(be, b), 0.3, cb)
			name := fmt.Sprintf("%dx%dx%d%s", m, n, k, transName(tr))
			out[name] = Result{down(be, cb), RefGemm(tr[0], tr[1], m, n, k, 0.7, F64(a), F64(b), 0.3, F64(c)), tolGemm}
		}
	}
	// beta = 0 must ignore whatever C held, NaN included (BLAS semantics).
	a, b := randF(r, 12, 1), randF(r, 12, 1)
	c := make([]float32, 9)
	for i := range c {
		c[i] = float32(math.NaN())
	}
	cb := up(be, c)
	be.Gemm(false, false, 3, 3, 4, 1, up(be, a), up(be, b), 0, cb)
	out["beta0"] = Result{down(be, cb), RefGemm(false, false, 3, 3, 4, 1, F64(a), F64(b), 0, make([]float64, 9)), tolGemm}
	return out
}

func transName(tr [2]bool) string {
	s := ""
	for _, t := range tr {
		if t {
			s += "T"
		} else {
			s += "N"
		}
	}
	return s
}

// caseGemmBackward checks the transposed GEMMs a linear layer's backward
// uses: for Y = X·Wᵀ, dX = dY·W and dW = dYᵀ·X.
func caseGemmBackward(be tensor.Backend, r *rand.Rand) map[string]Result {
	const n, in, outD = 6, 5, 7
	x, w, dy := randF(r, n*in, 1), randF(r, outD*in, 1), randF(r, n*outD, 1)
	dxb, dwb := be.Alloc(tensor.Float32, n*in), be.Alloc(tensor.Float32, outD*in)
	be.Gemm(false, false, n, in, outD, 1, up(be, dy), up(be, w), 0, dxb)
	be.Gemm(true, false, outD, in, n, 1, up(be, dy), up(be, x), 0, dwb)
	dy64 := F64(dy)
	x64, w64 := F64(x), F64(w)
	loss := func(x, w []float64) float64 {
		return Dot(dy64, RefGemm(false, true, n, outD, in, 1, x, w, 0, make([]float64, n*outD)))
	}
	return map[string]Result{
		"dx": {down(be, dxb), NumGrad(func(v []float64) float64 { return loss(v, w64) }, x64, fdStep), tolGrad},
		"dw": {down(be, dwb), NumGrad(func(v []float64) float64 { return loss(x64, v) }, w64, fdStep), tolGrad},
	}
}

func caseElementwise(be tensor.Backend, r *rand.Rand) map[string]Result {
	const n = 1000
	a, b := randF(r, n, 1), randF(r, n, 1)
	a64, b64 := F64(a), F64(b)
	out := map[string]Result{}

	rt := up(be, a)
	out["roundtrip"] = Result{down(be, rt), a64, tolExact}

	f := be.Alloc(tensor.Float32, n)
	be.Fill(f, 2.5)
	out["fill"] = Result{down(be, f), constant(n, 2.5), tolExact}

	c := be.Alloc(tensor.Float32, n)
	be.Copy(c, up(be, b))
	out["copy"] = Result{down(be, c), b64, tolExact}

	ab := up(be, a)
	be.Add(ab, ab, up(be, b)) // aliasing dst and a is allowed
	out["add"] = Result{down(be, ab), zipf(a64, b64, func(x, y float64) float64 { return float64(float32(x + y)) }), tolExact}

	y := up(be, b)
	be.Axpy(-0.5, up(be, a), y)
	out["axpy"] = Result{down(be, y), zipf(a64, b64, func(x, y float64) float64 { return y - 0.5*x }), tolFwd}

	s := up(be, a)
	be.Scale(s, 3)
	out["scale"] = Result{down(be, s), zipf(a64, a64, func(x, _ float64) float64 { return 3 * x }), tolFwd}

	big := randF(r, 3*4096+17, 1) // spans several reduction chunks
	out["sumsq"] = Result{[]float32{float32(be.SumSquares(up(be, big)))}, []float64{Dot(F64(big), F64(big))}, tolFwd}

	// A view shares memory with its parent.
	p := up(be, a)
	be.Fill(be.View(p, 10, 20), -1)
	want := slices.Clone(a64)
	for i := 10; i < 30; i++ {
		want[i] = -1
	}
	out["view"] = Result{down(be, p), want, tolExact}
	return out
}

func caseSoftmax(be tensor.Backend, r *rand.Rand) map[string]Result {
	const rows, cols = 7, 13
	x := randF(r, rows*cols, 3)
	xb := up(be, x)
	be.Softmax(xb, xb, cols)
	return map[string]Result{"softmax": {down(be, xb), RefSoftmax(F64(x), cols), tolFwd}}
}

func caseGatherScatter(be tensor.Backend, r *rand.Rand) map[string]Result {
	const vocab, dim = 9, 6
	ids := []int32{3, 0, 8, 3, 3, 5, 0}
	table := randF(r, vocab*dim, 1)
	g := be.Alloc(tensor.Float32, len(ids)*dim)
	be.Gather(g, up(be, table), upI(be, ids), dim)
	want := make([]float64, 0, len(ids)*dim)
	for _, id := range ids {
		want = append(want, F64(table[int(id)*dim:(int(id)+1)*dim])...)
	}
	// ScatterAdd is Gather's backward: d/dtable Σ dy·Gather(table).
	dy := randF(r, len(ids)*dim, 1)
	dt := be.Alloc(tensor.Float32, vocab*dim)
	be.ScatterAdd(dt, upI(be, ids), up(be, dy), dim)
	dy64 := F64(dy)
	loss := func(t []float64) float64 {
		var s float64
		for i, id := range ids {
			s += Dot(dy64[i*dim:(i+1)*dim], t[int(id)*dim:(int(id)+1)*dim])
		}
		return s
	}
	return map[string]Result{
		"gather":  {down(be, g), want, tolExact},
		"scatter": {down(be, dt), NumGrad(loss, F64(table), fdStep), tolGrad},
	}
}

func caseRMSNorm(be tensor.Backend, r *rand.Rand) map[string]Result {
	const rows, dim, eps = 6, 40, 1e-5
	x, w, dy := randF(r, rows*dim, 1.5), randF(r, dim, 1), randF(r, rows*dim, 1)
	x64, w64, dy64 := F64(x), F64(w), F64(dy)
	xb, wb := up(be, x), up(be, w)
	outb, rstdb := be.Alloc(tensor.Float32, rows*dim), be.Alloc(tensor.Float32, rows)
	be.RMSNorm(outb, rstdb, xb, wb, dim, eps)
	wantOut, wantRstd := RefRMSNorm(x64, w64, dim, eps)

	dxb, dwb := be.Alloc(tensor.Float32, rows*dim), be.Alloc(tensor.Float32, dim)
	dyb := up(be, dy)
	be.RMSNormBackward(dxb, dwb, dyb, xb, wb, rstdb, dim)
	dx1, dw1 := down(be, dxb), down(be, dwb)
	be.RMSNormBackward(dxb, dwb, dyb, xb, wb, rstdb, dim) // accumulates: 2× the gradient
	dx2, dw2 := down(be, dxb), down(be, dwb)

	loss := func(x, w []float64) float64 { o, _ := RefRMSNorm(x, w, dim, eps); return Dot(dy64, o) }
	gx := NumGrad(func(v []float64) float64 { return loss(v, w64) }, x64, fdStep)
	gw := NumGrad(func(v []float64) float64 { return loss(x64, v) }, w64, fdStep)
	return map[string]Result{
		"out":  {down(be, outb), wantOut, tolFwd},
		"rstd": {down(be, rstdb), wantRstd, tolFwd},
		"dx":   {dx1, gx, tolGrad},
		"dw":   {dw1, gw, tolGrad},
		"dx+=": {dx2, scaled(gx, 2), tolGrad},
		"dw+=": {dw2, scaled(gw, 2), tolGrad},
	}
}

func caseRoPE(be tensor.Backend, r *rand.Rand) map[string]Result {
	const rows, heads, hd = 5, 3, 8
	out := map[string]Result{}
	scaled := RefInvFreq(500000, hd)
	for i := 2; i < len(scaled); i++ { // low frequencies divided, as Llama 3 scaling does
		scaled[i] /= 8
	}
	for _, c := range []struct {
		tag  string
		freq []float64
	}{{"θ=1e4", RefInvFreq(10000, hd)}, {"θ=5e5", RefInvFreq(500000, hd)}, {"scaled", scaled}} {
		tag, freq := c.tag, c.freq
		f32 := make([]float32, len(freq))
		for i, f := range freq {
			f32[i] = float32(f)
		}
		freq = F64(f32) // both sides rotate by the same frequencies
		x, dy := randF(r, rows*heads*hd, 1), randF(r, rows*heads*hd, 1)
		pos := make([]int32, rows)
		for i := range pos {
			pos[i] = int32(r.IntN(60))
		}
		pb, fb := upI(be, pos), up(be, f32)
		xb := up(be, x)
		be.RoPE(xb, pb, fb, heads, hd, false)
		fwd := down(be, xb)
		be.RoPE(xb, pb, fb, heads, hd, true)
		back := down(be, xb)
		dyb := up(be, dy)
		be.RoPE(dyb, pb, fb, heads, hd, true) // the backward of a rotation
		dy64 := F64(dy)
		g := NumGrad(func(v []float64) float64 {
			return Dot(dy64, RefRoPE(v, pos, freq, heads, hd, false))
		}, F64(x), fdStep)
		out["fwd "+tag] = Result{fwd, RefRoPE(F64(x), pos, freq, heads, hd, false), 1e-5}
		out["inv "+tag] = Result{back, F64(x), 1e-6}
		out["dx "+tag] = Result{down(be, dyb), g, 1e-5}
	}
	return out
}

func caseSwiGLU(be tensor.Backend, r *rand.Rand) map[string]Result {
	const n = 96
	g, u, dy := randF(r, n, 2), randF(r, n, 1), randF(r, n, 1)
	g64, u64, dy64 := F64(g), F64(u), F64(dy)
	gb, ub := up(be, g), up(be, u)
	ob := be.Alloc(tensor.Float32, n)
	be.SwiGLU(ob, gb, ub)
	dg, du := be.Alloc(tensor.Float32, n), be.Alloc(tensor.Float32, n)
	be.SwiGLUBackward(dg, du, up(be, dy), gb, ub)
	loss := func(g, u []float64) float64 { return Dot(dy64, RefSwiGLU(g, u)) }
	return map[string]Result{
		"out":   {down(be, ob), RefSwiGLU(g64, u64), tolFwd},
		"dgate": {down(be, dg), NumGrad(func(v []float64) float64 { return loss(v, u64) }, g64, fdStep), tolGrad},
		"dup":   {down(be, du), NumGrad(func(v []float64) float64 { return loss(g64, v) }, u64, fdStep), tolGrad},
	}
}

func caseAttention(be tensor.Backend, r *rand.Rand, s tensor.AttnShape) map[string]Result {
	s.Scale = float32(1 / math.Sqrt(float64(s.HeadDim)))
	qn := s.Batch * s.SeqQ * s.Heads * s.HeadDim
	kn := s.Batch * s.SeqK * s.KVHeads * s.HeadDim
	q, k, v, dout := randF(r, qn, 1), randF(r, kn, 1), randF(r, kn, 1), randF(r, qn, 1)
	q64, k64, v64, do64 := F64(q), F64(k), F64(v), F64(dout)
	qb, kb, vb := up(be, q), up(be, k), up(be, v)
	ob, lb := be.Alloc(tensor.Float32, qn), be.Alloc(tensor.Float32, s.Batch*s.Heads*s.SeqQ)
	be.Attention(ob, lb, qb, kb, vb, s)
	dq, dk, dv := be.Alloc(tensor.Float32, qn), be.Alloc(tensor.Float32, kn), be.Alloc(tensor.Float32, kn)
	be.AttentionBackward(dq, dk, dv, up(be, dout), qb, kb, vb, ob, lb, s)
	wantOut, wantLSE := RefAttention(q64, k64, v64, s)
	loss := func(q, k, v []float64) float64 { o, _ := RefAttention(q, k, v, s); return Dot(do64, o) }
	return map[string]Result{
		"out": {down(be, ob), wantOut, tolFwd},
		"lse": {down(be, lb), wantLSE, tolFwd},
		"dq":  {down(be, dq), NumGrad(func(x []float64) float64 { return loss(x, k64, v64) }, q64, fdStep), tolGrad},
		"dk":  {down(be, dk), NumGrad(func(x []float64) float64 { return loss(q64, x, v64) }, k64, fdStep), tolGrad},
		"dv":  {down(be, dv), NumGrad(func(x []float64) float64 { return loss(q64, k64, x) }, v64, fdStep), tolGrad},
	}
}

func caseCrossEntropy(be tensor.Backend, r *rand.Rand) map[string]Result {
	const rows, vocab, scale = 6, 11, 0.37
	x := randF(r, rows*vocab, 2)
	targets := []int32{3, -1, 0, 10, 7, -100}
	x64 := F64(x)
	tb := upI(be, targets)
	d := be.Alloc(tensor.Float32, rows*vocab)
	loss := be.SoftmaxCrossEntropy(d, up(be, x), tb, vocab, scale)
	xa := up(be, x)
	lossAlias := be.SoftmaxCrossEntropy(xa, xa, tb, vocab, scale)
	g := scaled(NumGrad(func(v []float64) float64 { return RefCrossEntropy(v, targets, vocab) }, x64, fdStep), scale)
	want := RefCrossEntropy(x64, targets, vocab)
	return map[string]Result{
		"loss":       {[]float32{float32(loss)}, []float64{want}, tolFwd},
		"loss alias": {[]float32{float32(lossAlias)}, []float64{want}, tolFwd},
		"dlogits":    {down(be, d), g, tolGrad},
		"dlog alias": {down(be, xa), g, tolGrad},
	}
}

func caseAdamW(be tensor.Backend, r *rand.Rand) map[string]Result {
	const n = 300
	p := randF(r, n, 1)
	pb, mb, vb := up(be, p), be.Alloc(tensor.Float32, n), be.Alloc(tensor.Float32, n)
	p64, m64, v64 := F64(p), make([]float64, n), make([]float64, n)
	for step := 1; step <= 3; step++ {
		g := randF(r, n, 0.1)
		h := tensor.AdamWStep{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, GradScale: 0.5, Step: step}
		be.AdamW(pb, up(be, g), mb, vb, h)
		p64, m64, v64 = RefAdamW(p64, F64(g), m64, v64, h)
	}
	return map[string]Result{
		"p": {down(be, pb), p64, 1e-6},
		"m": {down(be, mb), m64, 1e-5},
		"v": {down(be, vb), v64, 1e-5},
	}
}

func constant(n int, v float64) []float64 {
	x := make([]float64, n)
	for i := range x {
		x[i] = v
	}
	return x
}

func scaled(x []float64, s float64) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = v * s
	}
	return out
}

func zipf(a, b []float64, f func(x, y float64) float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = f(a[i], b[i])
	}
	return out
}
