package cpu

import (
	"math"
	"testing"
)

func TestExp32WithinOneULP(t *testing.T) {
	worst := 0.0
	check := func(x float32) {
		want := float64(float32(math.Exp(float64(x)))) // the nearest float32
		got := exp32(x)
		if math.IsInf(want, 1) || want < 0x1p-126 {
			if float64(got) != want {
				t.Fatalf("exp32(%g) = %g, want %g", x, got, want)
			}
			return
		}
		ulp := float64(math.Nextafter32(float32(want), float32(math.Inf(1)))) - want
		worst = math.Max(worst, math.Abs(float64(got)-want)/ulp)
	}
	for i := 0; i <= 1_000_000; i++ {
		check(float32(-100 + 200*float64(i)/1_000_000))
	}
	for _, x := range []float32{0, 1e-30, -1e-30, 1, -1, 88.72283, 88.7228, 88.73, -87.33654, -87.34, -103.9, -104, -200, 200} {
		check(x)
	}
	if got := exp32(float32(math.NaN())); got == got {
		t.Fatal("exp32(NaN) is not NaN")
	}
	if got := exp32(float32(math.Inf(-1))); got != 0 {
		t.Fatalf("exp32(-Inf) = %g", got)
	}
	t.Logf("worst error %.2f ulp", worst)
	if worst > 1 {
		t.Fatalf("worst error %.2f ulp", worst)
	}
}
