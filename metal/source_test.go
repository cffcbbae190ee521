package metal

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The kernels the Go side dispatches are exactly the kernels of
// kernels.metal, in the order of the kernel* constants.
func TestKernelNamesMatchSource(t *testing.T) {
	re := regexp.MustCompile(`(?m)^kernel void (\w+)\(`)
	var defined []string
	for _, m := range re.FindAllStringSubmatch(Source(), -1) {
		defined = append(defined, m[1])
	}
	if !slices.Equal(defined, kernelNames) {
		t.Fatalf("kernels.metal defines\n  %s\nthe Go side dispatches\n  %s", strings.Join(defined, " "), strings.Join(kernelNames, " "))
	}
	if kernelNames[kernelGemm] != "hp_gemm" || kernelNames[kernelAttnForward] != "hp_attn_forward" {
		t.Fatal("kernel constants out of step with kernelNames")
	}
}
