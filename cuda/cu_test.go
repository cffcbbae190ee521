//go:build cuda

package cuda_test

import (
	"errors"
	"testing"

	"github.com/holopeer/holopeer/cuda"
	"github.com/holopeer/holopeer/stage/tensor"
)

// testBackend returns the process's cuda backend, or skips the test where
// the driver reports no device (CI machines have the toolkit's stub
// libcuda).
func testBackend(t testing.TB) *cuda.Backend {
	t.Helper()
	be, err := tensor.Open("cuda")
	if errors.Is(err, cuda.ErrNoDevice) {
		t.Skipf("no GPU here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return be.(*cuda.Backend)
}

// This test binary links gorgonia.org/cu, whose init exits the process
// when cuInit fails. That it runs at all on a machine without a GPU shows
// the interposed cuInit works; here it checks what Open says and that
// "auto" falls back to cpu.
func TestNoDeviceIsAnErrorNotAnExit(t *testing.T) {
	auto, err := tensor.Open("auto")
	if err != nil {
		t.Fatalf("Open(auto): %v", err)
	}
	initErr := cuda.InitError()
	if initErr == nil {
		if auto.Name() != "cuda" {
			t.Fatalf("cuInit succeeded but auto opened %q", auto.Name())
		}
		t.Logf("GPU present: %s", auto.(*cuda.Backend).Device())
		return
	}
	if !errors.Is(initErr, cuda.ErrNoDevice) {
		t.Fatalf("InitError %v does not wrap ErrNoDevice", initErr)
	}
	if auto.Name() != "cpu" {
		t.Fatalf("without a device auto opened %q, want cpu", auto.Name())
	}
	_, err = tensor.Open("cuda")
	if !errors.Is(err, cuda.ErrNoDevice) {
		t.Fatalf("Open(cuda) without a device: %v, want ErrNoDevice", err)
	}
	t.Logf("no device, as the driver says: %v", err)
}
