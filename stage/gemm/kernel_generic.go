package gemm

import "unsafe"

// The portable kernels are plain Go shaped for the register file the
// compiler has, since it neither vectorizes nor (on amd64 without
// GOAMD64=v3) fuses multiply-adds:
//
//   - amd64 and 386 have 15 usable XMM registers for scalars, so a 2×4 tile
//     (8 accumulators, 4 B values, 1 A value) is the largest that does not
//     spill; a 4×4 tile there spills every step and runs at half the speed.
//   - arm64 and the other 32-register ISAs fit a 4×4 tile, which the arm64
//     compiler turns into 16 FMADDS per step with no spills.
//
// Both are always compiled and tested; genericKernel picks one per GOARCH.
// It is used on other architectures, on x86 CPUs without AVX2+FMA, and
// under the purego build tag.
var (
	generic2x4 = &microKernel{
		name: "generic", mr: 2, nr: 4,
		kc: 256, mc: 128, nc: 2048,
		run: kernGeneric2x4,
	}
	generic4x4 = &microKernel{
		name: "generic", mr: 4, nr: 4,
		kc: 256, mc: 128, nc: 2048,
		run: kernGeneric4x4,
	}
)

// kernGeneric2x4 takes two k steps per iteration, which saves a third of
// the loop and bounds-check overhead on amd64.
func kernGeneric2x4(k int, a, b, c *float32, ldc int, alpha, beta float32) {
	ap := unsafe.Slice(a, 2*k)
	bp := unsafe.Slice(b, 4*k)
	var c00, c01, c02, c03, c10, c11, c12, c13 float32
	for len(ap) >= 4 && len(bp) >= 8 {
		b0, b1, b2, b3 := bp[0], bp[1], bp[2], bp[3]
		a0 := ap[0]
		c00 += a0 * b0
		c01 += a0 * b1
		c02 += a0 * b2
		c03 += a0 * b3
		a1 := ap[1]
		c10 += a1 * b0
		c11 += a1 * b1
		c12 += a1 * b2
		c13 += a1 * b3
		b0, b1, b2, b3 = bp[4], bp[5], bp[6], bp[7]
		a0 = ap[2]
		c00 += a0 * b0
		c01 += a0 * b1
		c02 += a0 * b2
		c03 += a0 * b3
		a1 = ap[3]
		c10 += a1 * b0
		c11 += a1 * b1
		c12 += a1 * b2
		c13 += a1 * b3
		ap, bp = ap[4:], bp[8:]
	}
	if len(ap) >= 2 && len(bp) >= 4 {
		b0, b1, b2, b3 := bp[0], bp[1], bp[2], bp[3]
		a0, a1 := ap[0], ap[1]
		c00 += a0 * b0
		c01 += a0 * b1
		c02 += a0 * b2
		c03 += a0 * b3
		c10 += a1 * b0
		c11 += a1 * b1
		c12 += a1 * b2
		c13 += a1 * b3
	}
	cs := unsafe.Slice(c, ldc+4)
	storeRow4(cs[0:4:4], alpha, beta, c00, c01, c02, c03)
	storeRow4(cs[ldc:ldc+4:ldc+4], alpha, beta, c10, c11, c12, c13)
}

func kernGeneric4x4(k int, a, b, c *float32, ldc int, alpha, beta float32) {
	ap := unsafe.Slice(a, 4*k)
	bp := unsafe.Slice(b, 4*k)
	var c00, c01, c02, c03 float32
	var c10, c11, c12, c13 float32
	var c20, c21, c22, c23 float32
	var c30, c31, c32, c33 float32
	for len(ap) >= 4 && len(bp) >= 4 {
		a0, a1, a2, a3 := ap[0], ap[1], ap[2], ap[3]
		b0, b1, b2, b3 := bp[0], bp[1], bp[2], bp[3]
		c00 += a0 * b0
		c01 += a0 * b1
		c02 += a0 * b2
		c03 += a0 * b3
		c10 += a1 * b0
		c11 += a1 * b1
		c12 += a1 * b2
		c13 += a1 * b3
		c20 += a2 * b0
		c21 += a2 * b1
		c22 += a2 * b2
		c23 += a2 * b3
		c30 += a3 * b0
		c31 += a3 * b1
		c32 += a3 * b2
		c33 += a3 * b3
		ap, bp = ap[4:], bp[4:]
	}
	cs := unsafe.Slice(c, 3*ldc+4)
	storeRow4(cs[0:4:4], alpha, beta, c00, c01, c02, c03)
	storeRow4(cs[ldc:ldc+4:ldc+4], alpha, beta, c10, c11, c12, c13)
	storeRow4(cs[2*ldc:2*ldc+4:2*ldc+4], alpha, beta, c20, c21, c22, c23)
	storeRow4(cs[3*ldc:3*ldc+4:3*ldc+4], alpha, beta, c30, c31, c32, c33)
}

func storeRow4(c []float32, alpha, beta, x0, x1, x2, x3 float32) {
	c = c[:4]
	if beta == 0 {
		c[0], c[1], c[2], c[3] = alpha*x0, alpha*x1, alpha*x2, alpha*x3
		return
	}
	c[0] = alpha*x0 + beta*c[0]
	c[1] = alpha*x1 + beta*c[1]
	c[2] = alpha*x2 + beta*c[2]
	c[3] = alpha*x3 + beta*c[3]
}
