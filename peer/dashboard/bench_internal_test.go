package dashboard

import (
	"math"
	"testing"

	"github.com/holopeer/holopeer/peer/api"
)

// BenchmarkLossChart draws a 100,000-step loss curve as SVG (downsampled
// to maxChartPoints), what a cache miss of /dashboard/loss.svg costs.
func BenchmarkLossChart(b *testing.B) {
	pts := make([]api.Point, 100_000)
	for i := range pts {
		pts[i] = api.Point{X: float64(i), Y: 2 + 8*math.Exp(-float64(i)/5000)}
	}
	for b.Loop() {
		if _, _, err := lineSVG(pts, "step", "loss", lossColor, false); err != nil {
			b.Fatal(err)
		}
	}
}
