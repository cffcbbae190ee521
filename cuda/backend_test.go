//go:build cuda || cudaemu

package cuda_test

import (
	"testing"

	"github.com/holopeer/holopeer/cuda"
	"github.com/holopeer/holopeer/cuda/gputest"
	"github.com/holopeer/holopeer/stage/tensor"
	"github.com/holopeer/holopeer/stage/tensor/cpu"
	"github.com/holopeer/holopeer/stage/tensor/tensortest"
)

func TestOpsAgainstFloat64Reference(t *testing.T) {
	tensortest.CheckBackend(t, testBackend(t))
}

func TestParityWithCPU(t *testing.T) {
	tensortest.CheckParity(t, testBackend(t), cpu.New(), 0)
}

// Elementwise ops, Gather, ScatterAdd and AdamW round exactly as cpu's.
func TestLargeShapesMatchCPU(t *testing.T) {
	gputest.CheckLargeShapes(t, testBackend(t), gputest.Options{Exact: true, SumTol: 1e-12})
}

func TestStageMatchesCPU(t *testing.T) {
	be := testBackend(t)
	liveBefore, _ := be.MemStats()
	gputest.CheckStage(t, be)
	if live, _ := be.MemStats(); live != liveBefore {
		t.Errorf("%d bytes of device memory live after the stages closed, %d before", live, liveBefore)
	}
}

func TestConcurrentUse(t *testing.T) {
	gputest.CheckConcurrent(t, testBackend(t))
}

// An id outside the table cannot panic on the device; the next Sync says
// so, the row is zero, and the Sync after is clean again.
func TestBadIndexReportedBySync(t *testing.T) {
	gputest.CheckBadIndex(t, testBackend(t), cuda.ErrBadIndex)
}

func TestMisuseFailsLoudly(t *testing.T) {
	gputest.CheckMisuse(t, testBackend(t))
}

func benchGemm(b *testing.B, n int) {
	gpu := testBackend(b)
	x := gpu.Alloc(tensor.Float32, n*n)
	y := gpu.Alloc(tensor.Float32, n*n)
	z := gpu.Alloc(tensor.Float32, n*n)
	gpu.Fill(x, 0.5)
	gpu.Fill(y, 0.25)
	b.ResetTimer()
	for b.Loop() {
		gpu.Gemm(false, true, n, n, n, 1, x, y, 0, z)
	}
	if err := gpu.Sync(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(2*float64(n)*float64(n)*float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

func BenchmarkGemm1024(b *testing.B) { benchGemm(b, 1024) }
func BenchmarkGemm4096(b *testing.B) { benchGemm(b, 4096) }

func BenchmarkAttentionTrain(b *testing.B) {
	gpu := testBackend(b)
	s := tensor.AttnShape{Batch: 8, Heads: 16, KVHeads: 4, HeadDim: 64, SeqQ: 512, SeqK: 512, Scale: 0.125}
	qn, kn := s.Batch*s.SeqQ*s.Heads*s.HeadDim, s.Batch*s.SeqK*s.KVHeads*s.HeadDim
	q, k, v := gpu.Alloc(tensor.Float32, qn), gpu.Alloc(tensor.Float32, kn), gpu.Alloc(tensor.Float32, kn)
	out, lse := gpu.Alloc(tensor.Float32, qn), gpu.Alloc(tensor.Float32, s.Batch*s.Heads*s.SeqQ)
	dq, dk, dv := gpu.Alloc(tensor.Float32, qn), gpu.Alloc(tensor.Float32, kn), gpu.Alloc(tensor.Float32, kn)
	for _, x := range []tensor.Buffer{q, k, v} {
		gpu.Fill(x, 0.1)
	}
	for b.Loop() {
		gpu.Attention(out, lse, q, k, v, s)
		gpu.AttentionBackward(dq, dk, dv, out, q, k, v, out, lse, s)
	}
	if err := gpu.Sync(); err != nil {
		b.Fatal(err)
	}
}
