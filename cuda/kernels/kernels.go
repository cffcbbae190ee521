// Package kernels holds the CUDA C sources of the cuda backend's kernels
// and the PTX that NVRTC made of them.
//
// The PTX is committed (ptx/*.ptx) and loaded at run time with
// cu.LoadData, so a machine running the backend needs the NVIDIA driver and
// cuBLAS but not NVRTC. The tests regenerate it: TestKernelsCompile
// (build tag cuda; it imports gorgonia.org/cu/nvrtc and nothing that needs a
// GPU) compiles every source with NVRTC on any machine, fails on a compile
// error or a missing entry point, and fails when the committed PTX differs
// from what the same NVRTC release makes. After editing a .cu file:
//
//	go test -tags cuda ./cuda/kernels -update
//
// The package itself has no cgo and no build tag.
package kernels

import (
	"embed"
	"fmt"
	"strings"
)

// Arch is the virtual architecture the PTX targets: compute capability 6.0
// (Pascal) and every later GPU, whose driver compiles the PTX for itself.
const Arch = "compute_60"

// Options are the NVRTC options every module is compiled with. --fmad=false
// keeps a·b+c as two roundings, as Go computes it on amd64, so elementwise
// results equal the cpu backend's.
var Options = []string{"--gpu-architecture=" + Arch, "--fmad=false", "--std=c++14"}

// Module is one compilation unit: a .cu source, the extern "C" kernels it
// defines and its committed PTX.
type Module struct {
	Name    string   // file name without .cu, e.g. "attention"
	Source  string   // CUDA C source
	PTX     string   // committed NVRTC output for Arch
	Kernels []string // entry points the Go side launches
}

// Header is a file the sources #include.
type Header struct {
	Name, Source string
}

//go:embed *.cu *.cuh ptx/*.ptx
var files embed.FS

// kernelNames lists each module's entry points; the cuda backend launches
// exactly these.
var kernelNames = []struct {
	module  string
	kernels []string
}{
	{"elementwise", []string{
		"hp_add", "hp_axpy", "hp_scale", "hp_sumsq_partial", "hp_gather", "hp_scatter_add",
		"hp_swiglu", "hp_swiglu_backward", "hp_adamw", "hp_rope",
	}},
	{"rows", []string{
		"hp_softmax", "hp_rmsnorm", "hp_rmsnorm_backward_dx", "hp_rmsnorm_backward_dw_partial",
		"hp_rmsnorm_backward_dw_final", "hp_softmax_xent",
	}},
	{"attention", []string{"hp_attn_forward", "hp_attn_backward_q", "hp_attn_backward_kv"}},
}

// Modules returns every module with its source and committed PTX.
func Modules() []Module {
	mods := make([]Module, 0, len(kernelNames))
	for _, kn := range kernelNames {
		mods = append(mods, Module{
			Name:    kn.module,
			Source:  mustRead(kn.module + ".cu"),
			PTX:     mustRead("ptx/" + kn.module + ".ptx"),
			Kernels: append([]string(nil), kn.kernels...),
		})
	}
	return mods
}

// Headers returns the files the sources include, for NVRTC.
func Headers() []Header {
	return []Header{{Name: "common.cuh", Source: mustRead("common.cuh")}}
}

// Release returns the "Cuda compilation tools, release X" line NVRTC
// writes at the top of its PTX, or "" when ptx has none.
func Release(ptx string) string {
	for line := range strings.Lines(ptx) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "//") {
			if strings.HasPrefix(line, ".version") {
				break
			}
			continue
		}
		if _, after, ok := strings.Cut(line, "Cuda compilation tools, "); ok {
			return after
		}
	}
	return ""
}

func mustRead(name string) string {
	b, err := files.ReadFile(name)
	if err != nil {
		panic(fmt.Sprintf("kernels: embedded file %s: %v", name, err))
	}
	return string(b)
}
