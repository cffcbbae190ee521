//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"math"
)

// Kernel arguments travel in 8-byte slots (cu's Function.Launch copies 8
// bytes per parameter); the driver reads as many bytes of a slot as the
// kernel's parameter has, so a little-endian int or float sits in the low
// bytes.
func ptrArg(b *buffer) uint64   { return uint64(b.ptr) }
func devArg(p devPtr) uint64    { return uint64(p) }
func longArg(v int) uint64      { return uint64(int64(v)) }
func floatArg(v float32) uint64 { return uint64(math.Float32bits(v)) }
func intArg(v int) uint64 {
	if v < math.MinInt32 || v > math.MaxInt32 {
		panic(fmt.Sprintf("cuda: kernel argument %d does not fit an int", v))
	}
	return uint64(uint32(int32(v)))
}

// Launch geometry.
const (
	threads    = 256     // elementwise kernels
	maxGrid    = 1 << 16 // blocks of a grid-stride loop: enough to fill any GPU
	attnThread = 128     // HP_ATTN_THREADS in attention.cu
	attnCols   = 4       // HP_ATTN_COLS: head_dim ≤ attnThread·attnCols
	maxGridYZ  = 65535
)

// elemGrid is the number of blocks for n elements, one per thread up to
// maxGrid blocks.
func elemGrid(n int) int { return min(max((n+threads-1)/threads, 1), maxGrid) }

// rowThreads is the block size of a one-block-per-row kernel: a multiple
// of 32 covering width, at most 256.
func rowThreads(width int) int { return min(max((width+31)/32*32, 32), 256) }

// launchLocked queues kernel name on the default stream.
func (be *Backend) launchLocked(name string, grid [3]int, block, shmem int, args ...uint64) {
	if err := be.drv.launch(name, grid, block, shmem, args); err != nil {
		be.failLocked(name, err)
	}
}

// launch1D queues a grid-stride kernel over n elements.
func (be *Backend) launch1D(name string, n int, args ...uint64) {
	if n == 0 {
		return
	}
	defer be.lock()()
	be.launchLocked(name, [3]int{elemGrid(n), 1, 1}, threads, 0, args...)
}
