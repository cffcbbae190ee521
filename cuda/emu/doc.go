// Package emu runs GPU kernels on the CPU, so that the cuda and metal
// backends' kernels and the Go code that launches them can be tested where
// no GPU is (build tag cudaemu or metalemu, linux/amd64, cgo with a C++
// compiler; no CUDA toolkit, no Mac).
//
// It compiles the very sources the GPUs compile, through headers that
// render their built-ins in C++: shim.h for the .cu files of cuda/kernels,
// msl_shim.h for metal/kernels.metal (whose kernels are named "metal/…").
// A launch runs block by block (threadgroup by threadgroup). Each thread
// of a block is a fiber with its own stack, switched by a few lines of
// assembly; __syncthreads parks a fiber until every thread of the block
// has arrived, and a warp shuffle (or SIMD-group reduction) parks it until
// its 32 lanes have, so code that diverges around a barrier or a shuffle
// deadlocks here and is reported instead of silently working. Device
// memory is host memory that ends at an inaccessible page, so reading or
// writing past the end of an allocation faults. cuBLAS's Sgemm is a plain
// column-major loop.
//
// What it cannot show: anything about the real hardware (speed, memory
// coalescing, the driver, PTX, cuBLAS, the Metal compiler, MSL's address
// space rules), and races between threads of a block that the order of
// fibers hides. It checks the kernels' logic and the launch arguments; it
// is no substitute for a GPU run.
package emu
