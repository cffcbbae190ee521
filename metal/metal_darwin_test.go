//go:build darwin && cgo && metal

package metal_test

import (
	"errors"
	"testing"

	"github.com/holopeer/holopeer/metal"
	"github.com/holopeer/holopeer/stage/tensor"
)

// testBackend returns the process's metal backend, or skips the test on a
// Mac without a Metal device (a VM, a CI runner).
func testBackend(t testing.TB) *metal.Backend {
	t.Helper()
	be, err := tensor.Open("metal")
	if errors.Is(err, metal.ErrUnavailable) {
		t.Skipf("no Metal device: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return be.(*metal.Backend)
}

// On a Mac with a GPU, auto picks metal (cuda is not built for macOS).
func TestOpenPicksMetal(t *testing.T) {
	be := testBackend(t)
	t.Logf("device: %s", be.Device())
	auto, err := tensor.Open("auto")
	if err != nil || auto.Name() != "metal" {
		t.Fatalf("Open(auto) = %v, %v; want metal", auto, err)
	}
}
