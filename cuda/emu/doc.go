// Package emu runs the CUDA kernels of package cuda/kernels on the CPU, so
// that the cuda backend's kernels and the Go code that launches them can
// be tested where no GPU is (build tag cudaemu, linux/amd64, cgo with a
// C++ compiler; no CUDA toolkit needed).
//
// It compiles the very .cu sources NVRTC compiles, through a header (shim.h)
// that renders CUDA's built-ins in C++, and executes a launch block by
// block. Each thread of a block is a fiber with its own stack, switched by
// a few lines of assembly; __syncthreads parks a fiber until every thread
// of the block has arrived, and a warp shuffle parks it until its 32 lanes
// have, so code that diverges around a barrier or a shuffle deadlocks here
// and is reported instead of silently working. Device memory is host
// memory that ends at an inaccessible page, so reading or writing past the
// end of an allocation faults. cuBLAS's Sgemm is a plain column-major loop.
//
// What it cannot show: anything about the real hardware (speed, memory
// coalescing, the driver, PTX, cuBLAS itself), and races between threads
// of a block that the order of fibers hides. It is a check of the kernels'
// logic and of the launch arguments, not a substitute for a GPU run.
package emu
