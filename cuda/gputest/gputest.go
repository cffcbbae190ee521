// Package gputest checks a device tensor.Backend against the cpu backend
// beyond tensortest's small cases: large shapes, a whole model's training
// step, a pipeline that mixes the device with cpu, concurrent use. The
// cuda and metal backends' tests share it (it would sit well in
// stage/tensor/tensortest).
package gputest

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/holopeer/holopeer/stage/model"
	"github.com/holopeer/holopeer/stage/model/modeltest"
	"github.com/holopeer/holopeer/stage/tensor"
	"github.com/holopeer/holopeer/stage/tensor/cpu"
	"github.com/holopeer/holopeer/stage/tensor/tensortest"
)

// pair runs the same calls on the device and on cpu and compares what
// comes back.
type pair struct {
	t        *testing.T
	gpu, cpu tensor.Backend
	r        *rand.Rand
}

func newPair(t *testing.T, dev tensor.Backend) *pair {
	return &pair{t: t, gpu: dev, cpu: cpu.New(), r: rand.New(rand.NewPCG(1, 2))}
}

type twin struct{ g, c tensor.Buffer }

func (p *pair) rand(n int, scale float64) twin {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(p.r.NormFloat64() * scale)
	}
	return p.upload(x)
}

func (p *pair) upload(x []float32) twin {
	b := twin{p.gpu.Alloc(tensor.Float32, len(x)), p.cpu.Alloc(tensor.Float32, len(x))}
	p.gpu.Upload(b.g, x)
	p.cpu.Upload(b.c, x)
	return b
}

func (p *pair) ints(x []int32) twin {
	b := twin{p.gpu.Alloc(tensor.Int32, len(x)), p.cpu.Alloc(tensor.Int32, len(x))}
	p.gpu.UploadInt32(b.g, x)
	p.cpu.UploadInt32(b.c, x)
	return b
}

func (p *pair) zeros(n int) twin {
	return twin{p.gpu.Alloc(tensor.Float32, n), p.cpu.Alloc(tensor.Float32, n)}
}

// check compares b on both backends: within tol of cpu's largest element,
// or bit for bit when tol is 0.
func (p *pair) check(name string, b twin, tol float64) {
	p.t.Helper()
	g, c := make([]float32, b.g.Len()), make([]float32, b.c.Len())
	p.gpu.Download(g, b.g)
	p.cpu.Download(c, b.c)
	if err := p.gpu.Sync(); err != nil {
		p.t.Fatalf("%s: Sync: %v", name, err)
	}
	if tol == 0 {
		for i := range g {
			if math.Float32bits(g[i]) != math.Float32bits(c[i]) {
				p.t.Errorf("%s: element %d is %v on %s, %v on cpu; want the same bits", name, i, g[i], p.gpu.Name(), c[i])
				return
			}
		}
		return
	}
	e := tensortest.RelErr(g, tensortest.F64(c))
	p.t.Logf("%-24s rel diff %.2e", name, e)
	if !(e <= tol) {
		p.t.Errorf("%s: %s differs from cpu by %.3g of the largest element (tol %.0e)", name, p.gpu.Name(), e, tol)
	}
}

// Options say how close a device must come to cpu.
type Options struct {
	// Exact: Add, Axpy, Scale, Gather, ScatterAdd and AdamW round as cpu
	// does, bit for bit (the device computes them in the same order
	// without fused multiply-adds); otherwise they are held to 1e-6.
	Exact bool
	// SumTol bounds SumSquares's relative difference (float64 partial sums
	// agree to 1e-12; float32 partials to about 1e-6).
	SumTol float64
}

// CheckLargeShapes compares dev with the cpu backend on shapes the small
// tensortest cases do not reach: grid-stride loops, many warps per row,
// head dims over one thread per column, key chunks longer than one
// chunk, RMSNorm weight gradients over several row segments, long rows.
func CheckLargeShapes(t *testing.T, dev tensor.Backend, o Options) {
	p := newPair(t, dev)
	exact := 0.0
	if !o.Exact {
		exact = 1e-6
	}
	both := func(f func(be tensor.Backend, sel func(twin) tensor.Buffer)) {
		f(p.gpu, func(b twin) tensor.Buffer { return b.g })
		f(p.cpu, func(b twin) tensor.Buffer { return b.c })
	}

	t.Run("Elementwise", func(t *testing.T) {
		p.t = t
		const n = 1<<20 + 3
		a, b := p.rand(n, 1), p.rand(n, 1)
		sum, y, s := p.zeros(n), p.rand(n, 1), p.rand(n, 2)
		both(func(be tensor.Backend, x func(twin) tensor.Buffer) {
			be.Add(x(sum), x(a), x(b))
			be.Axpy(-0.37, x(a), x(y))
			be.Scale(x(s), 1.7)
		})
		p.check("add", sum, exact)
		p.check("axpy", y, exact)
		p.check("scale", s, exact)
		big := p.rand(3<<20+11, 1)
		g, c := p.gpu.SumSquares(big.g), p.cpu.SumSquares(big.c)
		if e := math.Abs(g-c) / c; !(e <= o.SumTol) {
			t.Errorf("SumSquares: %v on %s, %v on cpu (rel %.2g, tol %.0e)", g, dev.Name(), c, e, o.SumTol)
		}
	})

	t.Run("Gemm", func(t *testing.T) {
		p.t = t
		const m, n, k = 300, 500, 700
		for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
			a, b, c := p.rand(m*k, 1), p.rand(k*n, 1), p.rand(m*n, 1)
			both(func(be tensor.Backend, x func(twin) tensor.Buffer) {
				be.Gemm(tr[0], tr[1], m, n, k, 0.5, x(a), x(b), 0.25, x(c))
			})
			p.check(fmt.Sprintf("gemm %v", tr), c, 1e-5)
		}
	})

	t.Run("Rows", func(t *testing.T) {
		p.t = t
		const rows, dim = 600, 300
		x, w, dy := p.rand(rows*dim, 1.5), p.rand(dim, 1), p.rand(rows*dim, 1)
		out, rstd, dx, dw := p.zeros(rows*dim), p.zeros(rows), p.rand(rows*dim, 1), p.rand(dim, 1)
		sm := p.rand(40*3000, 3)
		both(func(be tensor.Backend, s func(twin) tensor.Buffer) {
			be.RMSNorm(s(out), s(rstd), s(x), s(w), dim, 1e-5)
			be.RMSNormBackward(s(dx), s(dw), s(dy), s(x), s(w), s(rstd), dim)
			be.Softmax(s(sm), s(sm), 3000)
		})
		p.check("rmsnorm out", out, 1e-6)
		p.check("rmsnorm rstd", rstd, 1e-6)
		p.check("rmsnorm dx+=", dx, 1e-5)
		p.check("rmsnorm dw+=", dw, 1e-5)
		p.check("softmax 3000", sm, 1e-6)
	})

	t.Run("CrossEntropy", func(t *testing.T) {
		p.t = t
		const rows, vocab = 40, 5000
		logits := p.rand(rows*vocab, 2)
		targets := make([]int32, rows)
		for i := range targets {
			targets[i] = int32(p.r.IntN(vocab))
		}
		targets[3], targets[17] = -100, -1
		tg := p.ints(targets)
		var loss [2]float64
		i := 0
		both(func(be tensor.Backend, s func(twin) tensor.Buffer) {
			loss[i] = be.SoftmaxCrossEntropy(s(logits), s(logits), s(tg), vocab, 0.01)
			i++
		})
		if e := math.Abs(loss[0]-loss[1]) / loss[1]; e > 1e-6 {
			t.Errorf("loss %v on %s, %v on cpu (rel %.2g)", loss[0], dev.Name(), loss[1], e)
		}
		p.check("dlogits", logits, 1e-6)
	})

	t.Run("GatherScatterRoPEAdamW", func(t *testing.T) {
		p.t = t
		const vocab, dim, rows = 97, 70, 1000
		ids := make([]int32, rows)
		pos := make([]int32, rows)
		for i := range ids {
			ids[i] = int32(p.r.IntN(vocab))
			pos[i] = int32(p.r.IntN(8192))
		}
		table, src := p.rand(vocab*dim, 1), p.rand(rows*dim, 1)
		idb, g, grad := p.ints(ids), p.zeros(rows*dim), p.rand(vocab*dim, 1)
		const heads, hd = 4, 64
		freq := make([]float32, hd/2)
		for i := range freq {
			freq[i] = float32(math.Pow(500000, -float64(2*i)/hd))
		}
		fb, pb, rx := p.upload(freq), p.ints(pos), p.rand(rows*heads*hd, 1)
		pp, pg, pm, pv := p.rand(1<<18, 1), p.rand(1<<18, 0.1), p.zeros(1<<18), p.zeros(1<<18)
		both(func(be tensor.Backend, s func(twin) tensor.Buffer) {
			be.Gather(s(g), s(table), s(idb), dim)
			be.ScatterAdd(s(grad), s(idb), s(src), dim)
			be.RoPE(s(rx), s(pb), s(fb), heads, hd, false)
			for step := 1; step <= 3; step++ {
				be.AdamW(s(pp), s(pg), s(pm), s(pv), tensor.AdamWStep{LR: 1e-3, Beta1: 0.9, Beta2: 0.95,
					Eps: 1e-8, WeightDecay: 0.1, GradScale: 0.5, Step: step})
			}
		})
		p.check("gather", g, exact)
		p.check("scatter-add", grad, exact)
		p.check("rope", rx, 1e-6)
		p.check("adamw p", pp, exact)
		p.check("adamw m", pm, exact)
		p.check("adamw v", pv, exact)
	})

	for _, s := range []tensor.AttnShape{
		{Batch: 2, Heads: 4, KVHeads: 2, HeadDim: 160, SeqQ: 40, SeqK: 40},
		{Batch: 1, Heads: 4, KVHeads: 4, HeadDim: 64, SeqQ: 70, SeqK: 70},
		{Batch: 3, Heads: 6, KVHeads: 2, HeadDim: 32, SeqQ: 5, SeqK: 77, QOffset: 72},
	} {
		t.Run(fmt.Sprintf("Attention%dx%dq%dk%d", s.Heads, s.HeadDim, s.SeqQ, s.SeqK), func(t *testing.T) {
			p.t = t
			s.Scale = float32(1 / math.Sqrt(float64(s.HeadDim)))
			qn, kn := s.Batch*s.SeqQ*s.Heads*s.HeadDim, s.Batch*s.SeqK*s.KVHeads*s.HeadDim
			q, k, v, dout := p.rand(qn, 1), p.rand(kn, 1), p.rand(kn, 1), p.rand(qn, 1)
			out, lse := p.zeros(qn), p.zeros(s.Batch*s.Heads*s.SeqQ)
			dq, dk, dv := p.zeros(qn), p.zeros(kn), p.zeros(kn)
			both(func(be tensor.Backend, x func(twin) tensor.Buffer) {
				be.Attention(x(out), x(lse), x(q), x(k), x(v), s)
				be.AttentionBackward(x(dq), x(dk), x(dv), x(dout), x(q), x(k), x(v), x(out), x(lse), s)
			})
			p.check("out", out, 1e-5)
			p.check("lse", lse, 1e-6)
			p.check("dq", dq, 1e-5)
			p.check("dk", dk, 1e-5)
			p.check("dv", dv, 1e-5)
		})
	}
}

func stageConfig() model.Config {
	return model.Config{
		Vocab: 61, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, FFNDim: 96, MaxSeq: 64,
		RopeTheta: 10000, NormEps: 1e-5, InitStd: 0.02,
	}
}

func microbatches(cfg model.Config) []model.Input {
	r := rand.New(rand.NewPCG(9, 9))
	mk := func(b, s int) model.Input {
		in := model.Input{Batch: b, Seq: s, Tokens: make([]int32, b*s), Targets: make([]int32, b*s)}
		for i := range in.Tokens {
			in.Tokens[i] = int32(r.IntN(cfg.Vocab))
			in.Targets[i] = int32(r.IntN(cfg.Vocab))
		}
		return in
	}
	a, b := mk(2, 33), mk(3, 20)
	b.Targets[5] = -100
	total := 0
	for _, in := range []model.Input{a, b} {
		for _, t := range in.Targets {
			if t >= 0 {
				total++
			}
		}
	}
	a.LossTokens, b.LossTokens = total, total
	return []model.Input{a, b}
}

// trainPipeline runs two microbatches forward and backward through stages
// (stage i on backends[i]), then one AdamW step on every parameter and a
// second forward, and returns both losses and every gradient by name.
// (Parameters after the step are not compared: Adam's first step moves
// each one by ±LR whatever its gradient's size, so a gradient at rounding
// level may move it either way; the AdamW op itself is checked bit for
// bit.)
func trainPipeline(t *testing.T, cfg model.Config, backends ...tensor.Backend) (loss [2]float64, grads map[string][]float32) {
	t.Helper()
	spans, err := model.EvenSpans(cfg.Layers, len(backends))
	if err != nil {
		t.Fatal(err)
	}
	stages := make([]*model.Stage, len(backends))
	for i, be := range backends {
		if stages[i], err = model.NewStage(cfg, spans[i], model.WithSeed(5), model.WithBackend(be)); err != nil {
			t.Fatal(err)
		}
		defer stages[i].Close()
	}
	modeltest.Perturb(t, modeltest.Weights{Stream: 77, Norm: 0.2, Matrix: 0.3}, stages...)
	forward := func(mb int, in model.Input, noGrad bool) float64 {
		var hidden []float32
		for i, s := range stages {
			x := model.Input{Batch: in.Batch, Seq: in.Seq, Tokens: in.Tokens, Hidden: hidden, NoGrad: noGrad}
			if i == len(stages)-1 {
				x.Targets, x.LossTokens = in.Targets, in.LossTokens
			}
			out, err := s.Forward(mb, x)
			if err != nil {
				t.Fatalf("stage %d (%s) forward: %v", i, s.Backend().Name(), err)
			}
			hidden = out.Hidden
			if i == len(stages)-1 {
				return out.Loss
			}
		}
		return 0
	}
	mbs := microbatches(cfg)
	for mb, in := range mbs {
		loss[0] += forward(mb, in, false)
		var g []float32
		for i := len(stages) - 1; i >= 0; i-- {
			if g, err = stages[i].Backward(mb, g); err != nil {
				t.Fatalf("stage %d backward: %v", i, err)
			}
		}
	}
	grads = map[string][]float32{}
	for _, s := range stages {
		be := s.Backend()
		for _, p := range s.Params() {
			grads[p.Name] = p.GradData()
			m, v := be.Alloc(tensor.Float32, p.Len()), be.Alloc(tensor.Float32, p.Len())
			be.AdamW(p.Value, p.Grad, m, v, tensor.AdamWStep{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8,
				WeightDecay: 0.1, GradScale: 1, Step: 1})
			be.Free(m)
			be.Free(v)
		}
		if err := be.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	for mb, in := range mbs {
		loss[1] += forward(mb, in, true)
	}
	return loss, grads
}

func compareRuns(t *testing.T, label string, gotLoss, wantLoss [2]float64, got, want map[string][]float32, tol float64) {
	t.Helper()
	for i := range gotLoss {
		if e := math.Abs(gotLoss[i]-wantLoss[i]) / wantLoss[i]; !(e <= tol) {
			t.Errorf("%s: loss %d is %.9g, cpu %.9g (rel %.2g)", label, i, gotLoss[i], wantLoss[i], e)
		}
	}
	names := make([]string, 0, len(want))
	for name := range want {
		names = append(names, name)
	}
	slices.Sort(names)
	worst, worstName := 0.0, ""
	for _, name := range names {
		e := tensortest.RelErr(got[name], tensortest.F64(want[name]))
		if e > worst {
			worst, worstName = e, name
		}
		if !(e <= tol) {
			t.Errorf("%s: %s differs from cpu by %.3g of its largest element (tol %.0e)", label, name, e, tol)
		}
	}
	t.Logf("%s: losses %.6f → %.6f; %d tensors, worst rel diff %.2e (%s)", label, gotLoss[0], gotLoss[1], len(names), worst, worstName)
}

// CheckStage runs a whole small model's forward, backward and an AdamW
// step on dev and on cpu and compares losses and every gradient; then a
// two-stage pipeline whose first stage runs on dev and second on cpu, as
// in a swarm that mixes machines.
func CheckStage(t *testing.T, dev tensor.Backend) {
	gpu := dev
	for name, cfg := range map[string]model.Config{
		"dense": stageConfig(),
		"subspace": func() model.Config {
			c := stageConfig()
			c.Subspace = model.SubspaceConfig{Rank: 8, Seed: 4}
			return c
		}(),
	} {
		t.Run(name, func(t *testing.T) {
			c := cpu.New()
			wantLoss, wantG := trainPipeline(t, cfg, c)
			gotLoss, gotG := trainPipeline(t, cfg, gpu)
			compareRuns(t, "whole model", gotLoss, wantLoss, gotG, wantG, 1e-4)

			wantLoss, wantG = trainPipeline(t, cfg, c, c)
			gotLoss, gotG = trainPipeline(t, cfg, gpu, c)
			compareRuns(t, "pipeline gpu→cpu", gotLoss, wantLoss, gotG, wantG, 1e-4)
		})
	}
}

// CheckConcurrent has several goroutines share dev, as the stages of one
// process do, and compares each one's results with cpu.
func CheckConcurrent(t *testing.T, dev tensor.Backend) {
	gpu := dev
	ref := cpu.New()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 3))
			const m, n, k = 64, 48, 80
			a, b := make([]float32, m*k), make([]float32, k*n)
			for it := range 25 {
				for i := range a {
					a[i] = float32(r.NormFloat64())
				}
				for i := range b {
					b[i] = float32(r.NormFloat64())
				}
				var out [2][]float32
				for i, be := range []tensor.Backend{gpu, ref} {
					ab, bb, cb := be.Alloc(tensor.Float32, m*k), be.Alloc(tensor.Float32, k*n), be.Alloc(tensor.Float32, m*n)
					be.Upload(ab, a)
					be.Upload(bb, b)
					be.Gemm(false, true, m, n, k, 1, ab, bb, 0, cb)
					be.Softmax(cb, cb, n)
					out[i] = make([]float32, m*n)
					be.Download(out[i], cb)
					be.Free(ab)
					be.Free(bb)
					be.Free(cb)
				}
				if e := tensortest.RelErr(out[0], tensortest.F64(out[1])); e > 1e-5 {
					t.Errorf("worker %d iteration %d: rel diff %.2g", w, it, e)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := gpu.Sync(); err != nil {
		t.Fatal(err)
	}
}

// CheckBadIndex checks that an id outside the table, which cannot panic
// on the device, makes the next Sync fail with badIndex (the backend's
// ErrBadIndex) and zeroes its row, and that the Sync after is clean again.
func CheckBadIndex(t *testing.T, dev tensor.Backend, badIndex error) {
	gpu := dev
	if err := gpu.Sync(); err != nil {
		t.Fatal(err)
	}
	table := gpu.Alloc(tensor.Float32, 4*3)
	gpu.Fill(table, 1)
	ids := gpu.Alloc(tensor.Int32, 2)
	gpu.UploadInt32(ids, []int32{1, 9})
	dst := gpu.Alloc(tensor.Float32, 2*3)
	gpu.Gather(dst, table, ids, 3)
	if err := gpu.Sync(); !errors.Is(err, badIndex) {
		t.Fatalf("Sync after a bad Gather id: %v, want ErrBadIndex", err)
	}
	got := make([]float32, 6)
	gpu.Download(got, dst)
	if want := []float32{1, 1, 1, 0, 0, 0}; !slices.Equal(got, want) {
		t.Errorf("gathered %v, want %v", got, want)
	}
	if err := gpu.Sync(); err != nil {
		t.Errorf("second Sync: %v", err)
	}
}

// CheckMisuse checks that dev panics on calls that cannot be right: a
// buffer of another backend, an int buffer as a float one, a view out of
// range, a use after Free, a Gemm whose buffers do not fit its shape, and
// an attention head wider than a device's kernels take.
func CheckMisuse(t *testing.T, dev tensor.Backend) {
	gpu := dev
	for name, f := range map[string]func(){
		"foreign buffer": func() { gpu.Fill(cpu.New().Alloc(tensor.Float32, 3), 1) },
		"int as float":   func() { gpu.Fill(gpu.Alloc(tensor.Int32, 3), 1) },
		"view range":     func() { gpu.View(gpu.Alloc(tensor.Float32, 3), 2, 2) },
		"use after free": func() {
			b := gpu.Alloc(tensor.Float32, 3)
			v := gpu.View(b, 1, 1)
			gpu.Free(b)
			gpu.Fill(v, 1)
		},
		"gemm shape": func() {
			gpu.Gemm(false, false, 2, 2, 2, 1, gpu.Alloc(tensor.Float32, 3), gpu.Alloc(tensor.Float32, 4), 0, gpu.Alloc(tensor.Float32, 4))
		},
		"head dim": func() {
			s := tensor.AttnShape{Batch: 1, Heads: 1, KVHeads: 1, HeadDim: 1024, SeqQ: 1, SeqK: 1, Scale: 1}
			q := gpu.Alloc(tensor.Float32, 1024)
			gpu.Attention(gpu.Alloc(tensor.Float32, 1024), gpu.Alloc(tensor.Float32, 1), q, q, q, s)
		},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}
