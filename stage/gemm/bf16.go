package gemm

import (
	"encoding/binary"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// SgemmBF16 is Sgemm with B stored as bfloat16 (the top half of a float32,
// as Hugging Face checkpoints store weights): a serving stage keeps its
// matrices at 2 bytes per parameter and widens them as it goes. C is cut
// into slices of columns; each goroutine widens one slice of B at a time
// into a float32 panel that stays in cache and multiplies it by A on its
// own. The slice width depends only on m and k, never on the number of
// goroutines, so results are the same on any machine with the same
// kernel.
func SgemmBF16(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []uint16, ldb int, beta float32, c []float32, ldc int) {
	if !prologue(transA, transB, m, n, k, alpha, len(a), lda, len(b), ldb, beta, c, ldc) {
		return
	}
	w := bf16Cols(m, k)
	slices := ceilDiv(n, w)
	threads := runtime.GOMAXPROCS(0)
	if threadsOverride > 0 {
		threads = threadsOverride
	}
	if work := int64(m) * int64(n) * int64(k) / minWorkPerThread; work < int64(threads) {
		threads = max(int(work), 1)
	}
	threads = min(threads, slices)

	var next atomic.Int64
	worker := func() {
		pb := getBuf(w * k)
		defer putBuf(pb)
		for {
			s := int(next.Add(1)) - 1
			if s >= slices {
				return
			}
			j0 := s * w
			cols := min(w, n-j0)
			panel := pb.f[:cols*k]
			sub := args{transA: transA, transB: transB, m: m, n: cols, k: k, alpha: alpha, a: a, lda: lda, b: panel, beta: beta, c: c[j0:], ldc: ldc}
			if transB {
				// Rows j0.. of B are the slice: contiguous, k each.
				for r := range cols {
					widen(panel[r*k:(r+1)*k], b[(j0+r)*ldb:])
				}
				sub.ldb = k
			} else {
				for p := range k {
					widen(panel[p*cols:(p+1)*cols], b[p*ldb+j0:])
				}
				sub.ldb = cols
			}
			run(&sub, 1)
		}
	}
	if threads <= 1 {
		worker()
		return
	}
	var wg sync.WaitGroup
	for range threads - 1 {
		wg.Go(worker)
	}
	worker()
	wg.Wait()
}

// bf16Cols is the width of one slice of C: a widened panel of about 256 KiB
// (L2) when op(A) is a few rows and B is streamed once, and of about 1 MiB
// with enough rows of A to make the blocked kernel worth its packing.
func bf16Cols(m, k int) int {
	if m <= rowDotsMaxM {
		return max(4, (64<<10)/k/4*4)
	}
	return min(max(16, (256<<10)/k/16*16), 512)
}

// littleEndian says a uint64 load sees src[i] in its low half.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// widen converts len(dst) bfloat16 values from src to float32 (exact),
// four at a time from one 64-bit load: the conversion is a shift, so the
// loop is bound by loads and stores, and this halves the loads.
func widen(dst []float32, src []uint16) {
	n := len(dst)
	src = src[:n]
	i := 0
	for ; littleEndian && i+4 <= n; i += 4 {
		x := *(*uint64)(unsafe.Pointer(&src[i]))
		d := (*[4]uint32)(unsafe.Pointer(&dst[i]))
		d[0] = uint32(x) << 16
		d[1] = uint32(x) & 0xffff0000
		d[2] = uint32(x>>32) << 16
		d[3] = uint32(x>>32) & 0xffff0000
	}
	for ; i < n; i++ {
		dst[i] = math.Float32frombits(uint32(src[i]) << 16)
	}
}
