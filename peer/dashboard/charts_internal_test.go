package dashboard

import (
	"math"
	"testing"

	"github.com/holopeer/holopeer/peer/api"
)

func TestDownsample(t *testing.T) {
	pts := make([]api.Point, 1_000_000)
	for i := range pts {
		pts[i] = api.Point{X: float64(i), Y: 1 / float64(i+1)}
	}
	pts[500] = api.Point{X: math.NaN(), Y: math.Inf(1)}
	got := downsample(pts, maxChartPoints)
	if len(got) > maxChartPoints {
		t.Fatalf("%d points, want at most %d", len(got), maxChartPoints)
	}
	if last := got[len(got)-1]; last.X != float64(len(pts)-1) {
		t.Fatalf("last point %v: the curve must end where the job is", last)
	}
	for _, p := range got {
		if math.IsNaN(p.X) || math.IsNaN(p.Y) || math.IsInf(p.Y, 0) {
			t.Fatalf("non-finite point %v", p)
		}
	}
	if small := downsample(pts[:10], maxChartPoints); len(small) != 10 {
		t.Fatalf("a short curve lost points: %d", len(small))
	}
}

func TestThroughputHistoryBounds(t *testing.T) {
	h := newThroughputHistory(2, 5)
	for step := range 20 {
		h.add("a", step, 100)
		h.add("a", step, 200) // same step: ignored
	}
	if n := h.len("a"); n != 5 {
		t.Fatalf("%d samples, want 5", n)
	}
	h.add("b", 1, 1)
	h.add("c", 1, 1) // evicts a, the oldest job
	if h.len("a") != 0 || h.len("c") != 1 {
		t.Fatalf("job bound not kept")
	}
	h.add("d", 1, math.NaN())
	if h.len("d") != 0 {
		t.Fatal("NaN kept")
	}
}
