// Package cuda is the NVIDIA GPU tensor.Backend, built only with the cuda
// build tag (go build -tags cuda) and cgo against the CUDA driver API
// through gorgonia.org/cu v0.9.6: GEMM goes to cuBLAS, every other op of
// the interface is a kernel of package cuda/kernels, whose PTX is loaded
// with cu.LoadData. Buffers live in device memory from Alloc to Free; only
// Upload, Download and the scalar results of SumSquares and
// SoftmaxCrossEntropy cross to the host, so a stage's activations stay on
// the GPU between its forward and its backward.
//
// Importing the package (with the tag) registers it as "cuda", ahead of
// "cpu" for tensor.Open("auto").
//
// # No device, no exit
//
// gorgonia.org/cu calls cuInit in an init function and exits the process
// when it fails, as it does on a machine with the NVIDIA driver but no
// usable GPU. This package defines cuInit itself (driver.c): the
// executable's definition takes precedence over libcuda's, so cu's init
// reaches it, and it calls the driver's cuInit (found with
// dlsym(RTLD_NEXT)), keeps the result and reports success to cu. Open then
// returns an error wrapping ErrNoDevice instead of the process dying, and
// "auto" falls back to the cpu backend. A binary built with the tag still
// needs the driver's libcuda.so.1 and cuBLAS's libcublas.so to start (the
// dynamic loader wants them before any Go code runs); machines without the
// NVIDIA driver run the default build, which contains no cgo.
//
// # Numbers
//
// Add, Axpy, Scale, AdamW, Gather and ScatterAdd round exactly as the cpu
// backend does (kernels built with --fmad=false, the same operation order);
// RoPE takes float64 cosines as cpu does, within an ulp. Reductions (norms,
// softmax, attention, GEMM) sum in another order, so results differ from
// cpu in the last bits; tensortest.CheckParity holds them to 1e-5 of the
// largest element. Every kernel writes each output element from one
// thread: results are deterministic from run to run.
//
// # Testing without a GPU
//
// With the build tag cudaemu instead of cuda, NewEmulated returns a
// backend whose kernels run on cuda/emu, a CPU emulator of the CUDA
// execution model, and the package's tests (tensortest's checks, and
// cuda/gputest's large shapes, whole-model training step and mixed
// pipeline against cpu) run on it. cuda/kernels' tests compile every
// kernel with NVRTC, which needs libnvrtc but no GPU. .ci/cuda.sh runs
// both, and compiles and vets the tagged package against the toolkit's
// headers and stub libraries.
package cuda
