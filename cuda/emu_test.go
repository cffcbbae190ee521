//go:build cudaemu && !cuda

package cuda_test

import (
	"slices"
	"sync"
	"testing"

	"github.com/holopeer/holopeer/cuda"
	"github.com/holopeer/holopeer/cuda/emu"
	"github.com/holopeer/holopeer/cuda/kernels"
)

var emulated = sync.OnceValues(cuda.NewEmulated)

// testBackend returns a backend whose kernels run on the CPU emulator.
func testBackend(t testing.TB) *cuda.Backend {
	t.Helper()
	be, err := emulated()
	if err != nil {
		t.Fatal(err)
	}
	return be
}

// Every kernel the backend launches is compiled into the emulator.
func TestEmulatorHasEveryKernel(t *testing.T) {
	have := emu.Kernels()
	for _, m := range kernels.Modules() {
		for _, k := range m.Kernels {
			if !slices.Contains(have, k) {
				t.Errorf("kernel %s (%s.cu) is not in cuda/emu's table", k, m.Name)
			}
		}
	}
}
