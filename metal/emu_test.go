//go:build metalemu && !(darwin && cgo && metal)

package metal_test

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/holopeer/holopeer/cuda/emu"
	"github.com/holopeer/holopeer/metal"
)

var emulated = sync.OnceValues(metal.NewEmulated)

// testBackend returns a backend whose kernels.metal kernels run on the CPU
// emulator.
func testBackend(t testing.TB) *metal.Backend {
	t.Helper()
	be, err := emulated()
	if err != nil {
		t.Fatal(err)
	}
	return be
}

// Every kernel of kernels.metal is compiled into the emulator.
func TestEmulatorHasEveryKernel(t *testing.T) {
	var have []string
	for _, k := range emu.Kernels() {
		if name, ok := strings.CutPrefix(k, "metal/"); ok {
			have = append(have, name)
		}
	}
	src := metal.Source()
	for _, line := range strings.Split(src, "\n") {
		if name, ok := strings.CutPrefix(line, "kernel void "); ok {
			name, _, _ = strings.Cut(name, "(")
			if !slices.Contains(have, name) {
				t.Errorf("kernel %s is not in cuda/emu's table", name)
			}
		}
	}
}
