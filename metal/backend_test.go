//go:build (darwin && cgo && metal) || metalemu

package metal_test

import (
	"slices"
	"testing"

	"github.com/holopeer/holopeer/cuda/gputest"
	"github.com/holopeer/holopeer/metal"
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

// Metal has no float64, so SumSquares's partials are float32 sums.
func TestLargeShapesMatchCPU(t *testing.T) {
	gputest.CheckLargeShapes(t, testBackend(t), gputest.Options{SumTol: 1e-6})
}

func TestStageMatchesCPU(t *testing.T) {
	be := testBackend(t)
	liveBefore, _ := be.MemStats()
	gputest.CheckStage(t, be)
	if live, _ := be.MemStats(); live != liveBefore {
		t.Errorf("%d bytes of buffers live after the stages closed, %d before", live, liveBefore)
	}
}

func TestConcurrentUse(t *testing.T) {
	gputest.CheckConcurrent(t, testBackend(t))
}

// A buffer's unified memory is readable without a copy.
func TestHostSliceSharesMemory(t *testing.T) {
	be := testBackend(t)
	b := be.Alloc(tensor.Float32, 5)
	defer be.Free(b)
	be.Fill(be.View(b, 1, 3), 2.5)
	if got, want := be.HostSlice(b), []float32{0, 2.5, 2.5, 2.5, 0}; !slices.Equal(got, want) {
		t.Fatalf("HostSlice = %v, want %v", got, want)
	}
	be.HostSlice(b)[4] = 7
	got := make([]float32, 5)
	be.Download(got, b)
	if got[4] != 7 {
		t.Fatalf("a write through HostSlice is not in the buffer: %v", got)
	}
}

// An id outside the table cannot panic on the device; the next Sync says
// so, the row is zero, and the Sync after is clean again.
func TestBadIndexReportedBySync(t *testing.T) {
	gputest.CheckBadIndex(t, testBackend(t), metal.ErrBadIndex)
}

func TestMisuseFailsLoudly(t *testing.T) {
	gputest.CheckMisuse(t, testBackend(t))
}

func BenchmarkGemm1024(b *testing.B) {
	be := testBackend(b)
	const n = 1024
	x, y, z := be.Alloc(tensor.Float32, n*n), be.Alloc(tensor.Float32, n*n), be.Alloc(tensor.Float32, n*n)
	be.Fill(x, 0.5)
	be.Fill(y, 0.25)
	for b.Loop() {
		be.Gemm(false, true, n, n, n, 1, x, y, 0, z)
	}
	if err := be.Sync(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(2*n*n*n*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}
