// Command kerngen writes the amd64 assembly micro-kernels of package gemm.
//
// The kernels are generated rather than hand-written because a register
// tile is dozens of near-identical FMA lines, and the best tile shape and
// unroll depth were found by trying several; changing a shape is one line
// here. Run `go generate ./stage/gemm` after editing.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
)

// kernel describes one register-tiled micro-kernel:
//
//	C[0:mr, 0:nv*lanes] = alpha·Ã·B̃ + beta·C
//
// where Ã is a packed mr×k panel (k-major: mr values per step of k) and B̃ a
// packed k×(nv·lanes) panel (nv·lanes values per step of k). Rows of C are
// ldc elements apart. beta == 0 writes C without reading it.
type kernel struct {
	name   string
	zmm    bool // AVX-512 (zmm, 32 registers) or AVX2 (ymm, 16 registers)
	mr     int  // rows of the tile: one broadcast of Ã each
	nv     int  // vectors per row of the tile
	unroll int  // k steps per loop iteration (a power of two)
	prefA  int  // bytes ahead to prefetch in Ã, 0 for none
	// strided reads B straight from a row-major matrix (row stride ldb,
	// an extra argument) instead of a packed panel, for products with a
	// single row panel, where packing B would buy no reuse. unroll ≤ 4.
	strided bool
}

func (k kernel) vlen() int {
	if k.zmm {
		return 64
	}
	return 32
}

func (k kernel) reg(i int) string {
	if k.zmm {
		return fmt.Sprintf("Z%d", i)
	}
	return fmt.Sprintf("Y%d", i)
}

func (k kernel) nregs() int {
	if k.zmm {
		return 32
	}
	return 16
}

type writer struct{ bytes.Buffer }

func (w *writer) f(format string, args ...any) { fmt.Fprintf(&w.Buffer, format+"\n", args...) }

func (k kernel) emit(w *writer) {
	nacc := k.mr * k.nv
	bBase := nacc            // B vectors of one k step
	bc := []int{nacc + k.nv} // broadcast registers, alternated when two are free
	if nacc+k.nv+2 <= k.nregs() {
		bc = append(bc, nacc+k.nv+1)
	}
	if nacc+k.nv+len(bc) > k.nregs() {
		log.Fatalf("%s: %d accumulators + %d B + broadcast exceed %d registers", k.name, nacc, k.nv, k.nregs())
	}
	acc := func(r, v int) string { return k.reg(r*k.nv + v) }
	vl := k.vlen()
	aStep, bStep := 4*k.mr, vl*k.nv

	if k.strided {
		if k.unroll > 4 {
			log.Fatalf("%s: strided kernels unroll at most 4", k.name)
		}
		w.f("// func %s(k int, a, b, c *float32, ldc int, alpha, beta float32, ldb int)", k.name)
		w.f("// %d×%d tile, %d-byte vectors, k unrolled %d×, B read in place with row stride ldb.", k.mr, k.nv*vl/4, vl, k.unroll)
		w.f("TEXT ·%s(SB), NOSPLIT, $0-56", k.name)
		w.f("\tMOVQ ldb+48(FP), R10")
		w.f("\tSHLQ $2, R10")
		w.f("\tLEAQ (R10)(R10*2), R11")
		w.f("\tMOVQ R10, R12")
		w.f("\tSHLQ $2, R12")
	} else {
		w.f("// func %s(k int, a, b, c *float32, ldc int, alpha, beta float32)", k.name)
		w.f("// %d×%d tile, %d-byte vectors, k unrolled %d×.", k.mr, k.nv*vl/4, vl, k.unroll)
		w.f("TEXT ·%s(SB), NOSPLIT, $0-48", k.name)
	}
	w.f("\tMOVQ k+0(FP), CX")
	w.f("\tMOVQ a+8(FP), SI")
	w.f("\tMOVQ b+16(FP), DI")
	w.f("\tMOVQ c+24(FP), DX")
	w.f("\tMOVQ ldc+32(FP), R8")
	w.f("\tSHLQ $2, R8")
	for i := 0; i < nacc; i++ {
		if k.zmm {
			w.f("\tVPXORD %s, %s, %s", k.reg(i), k.reg(i), k.reg(i))
		} else {
			w.f("\tVXORPS %s, %s, %s", k.reg(i), k.reg(i), k.reg(i))
		}
	}
	// Touch the C tile early so its lines arrive while the k loop runs.
	w.f("\tMOVQ DX, R9")
	for r := 0; r < k.mr; r++ {
		w.f("\tPREFETCHT0 (R9)")
		if bStep > 64 {
			w.f("\tPREFETCHT0 %d(R9)", bStep-4)
		}
		if r < k.mr-1 {
			w.f("\tADDQ R8, R9")
		}
	}
	// bAddr is the address of vector v of B at unrolled step u.
	bAddr := func(u, v int) string {
		if !k.strided {
			return fmt.Sprintf("%d(DI)", u*bStep+v*vl)
		}
		return fmt.Sprintf("%d%s", v*vl, []string{"(DI)", "(DI)(R10*1)", "(DI)(R10*2)", "(DI)(R11*1)"}[u])
	}
	step := func(u, aoff int) {
		if k.prefA > 0 {
			w.f("\tPREFETCHT0 %d(SI)", aoff+k.prefA)
		}
		for v := 0; v < k.nv; v++ {
			w.f("\tVMOVUPS %s, %s", bAddr(u, v), k.reg(bBase+v))
		}
		for r := 0; r < k.mr; r++ {
			b := k.reg(bc[r%len(bc)])
			w.f("\tVBROADCASTSS %d(SI), %s", aoff+4*r, b)
			for v := 0; v < k.nv; v++ {
				w.f("\tVFMADD231PS %s, %s, %s", k.reg(bBase+v), b, acc(r, v))
			}
		}
	}
	shift := 0
	for 1<<shift < k.unroll {
		shift++
	}
	l := k.name
	if k.unroll > 1 {
		w.f("\tMOVQ CX, BX")
		w.f("\tSHRQ $%d, BX", shift)
		w.f("\tJZ %s_tail", l)
		w.f("%s_loop:", l)
		for u := 0; u < k.unroll; u++ {
			step(u, u*aStep)
		}
		w.f("\tADDQ $%d, SI", k.unroll*aStep)
		if k.strided {
			switch k.unroll {
			case 1:
				w.f("\tADDQ R10, DI")
			case 2:
				w.f("\tLEAQ (DI)(R10*2), DI")
			case 4:
				w.f("\tADDQ R12, DI")
			}
		} else {
			w.f("\tADDQ $%d, DI", k.unroll*bStep)
		}
		w.f("\tDECQ BX")
		w.f("\tJNZ %s_loop", l)
		w.f("%s_tail:", l)
		w.f("\tANDQ $%d, CX", k.unroll-1)
	} else {
		w.f("\tTESTQ CX, CX")
	}
	w.f("\tJZ %s_epilogue", l)
	w.f("%s_tailloop:", l)
	step(0, 0)
	w.f("\tADDQ $%d, SI", aStep)
	if k.strided {
		w.f("\tADDQ R10, DI")
	} else {
		w.f("\tADDQ $%d, DI", bStep)
	}
	w.f("\tDECQ CX")
	w.f("\tJNZ %s_tailloop", l)

	w.f("%s_epilogue:", l)
	alpha, beta := k.reg(bBase), k.reg(bBase+1)
	w.f("\tVBROADCASTSS alpha+40(FP), %s", alpha)
	for i := 0; i < nacc; i++ {
		w.f("\tVMULPS %s, %s, %s", alpha, k.reg(i), k.reg(i))
	}
	// beta == ±0 must not read C (it may hold NaN); test the bits, not a
	// float compare, so that the rule is exact.
	w.f("\tMOVL beta+44(FP), AX")
	w.f("\tANDL $0x7fffffff, AX")
	w.f("\tJZ %s_store", l)
	w.f("\tVBROADCASTSS beta+44(FP), %s", beta)
	for r := 0; r < k.mr; r++ {
		for v := 0; v < k.nv; v++ {
			w.f("\tVFMADD231PS %d(DX), %s, %s", v*vl, beta, acc(r, v))
			w.f("\tVMOVUPS %s, %d(DX)", acc(r, v), v*vl)
		}
		if r < k.mr-1 {
			w.f("\tADDQ R8, DX")
		}
	}
	w.f("\tVZEROUPPER")
	w.f("\tRET")
	w.f("%s_store:", l)
	for r := 0; r < k.mr; r++ {
		for v := 0; v < k.nv; v++ {
			w.f("\tVMOVUPS %s, %d(DX)", acc(r, v), v*vl)
		}
		if r < k.mr-1 {
			w.f("\tADDQ R8, DX")
		}
	}
	w.f("\tVZEROUPPER")
	w.f("\tRET")
	w.f("")
}

// emitDot4 writes dot4AVX2, four dot products of one vector with four rows
// of a row-major matrix: the kernel for op(A)·Bᵀ when op(A) has a handful
// of rows, where B's rows are contiguous and each is read once.
func emitDot4(w *writer) {
	w.f("// func dot4AVX2(k int, a, b *float32, ldb int, out *float32)")
	w.f("// out[j] = Σ_{q<k} a[q]·b[j·ldb+q] for j < 4; k must be a multiple of 8.")
	w.f("TEXT ·dot4AVX2(SB), NOSPLIT, $0-40")
	w.f("\tMOVQ k+0(FP), CX")
	w.f("\tMOVQ a+8(FP), SI")
	w.f("\tMOVQ b+16(FP), DI")
	w.f("\tMOVQ ldb+24(FP), R10")
	w.f("\tSHLQ $2, R10")
	w.f("\tLEAQ (R10)(R10*2), R11")
	w.f("\tMOVQ out+32(FP), DX")
	for i := 0; i < 8; i++ {
		w.f("\tVXORPS Y%d, Y%d, Y%d", i, i, i)
	}
	rows := []string{"(DI)", "(DI)(R10*1)", "(DI)(R10*2)", "(DI)(R11*1)"}
	// Two sets of four accumulators: eight independent FMA chains cover
	// the FMA latency on two pipes.
	w.f("\tMOVQ CX, BX")
	w.f("\tSHRQ $4, BX")
	w.f("\tJZ dot4AVX2_tail")
	w.f("dot4AVX2_loop:")
	w.f("\tVMOVUPS (SI), Y8")
	w.f("\tVMOVUPS 32(SI), Y9")
	for j, r := range rows {
		w.f("\tVFMADD231PS %s, Y8, Y%d", r, j)
		w.f("\tVFMADD231PS 32%s, Y9, Y%d", r, j+4)
	}
	w.f("\tADDQ $64, SI")
	w.f("\tADDQ $64, DI")
	w.f("\tDECQ BX")
	w.f("\tJNZ dot4AVX2_loop")
	w.f("dot4AVX2_tail:")
	w.f("\tTESTQ $8, CX")
	w.f("\tJZ dot4AVX2_reduce")
	w.f("\tVMOVUPS (SI), Y8")
	for j, r := range rows {
		w.f("\tVFMADD231PS %s, Y8, Y%d", r, j)
	}
	w.f("dot4AVX2_reduce:")
	for j := 0; j < 4; j++ {
		w.f("\tVADDPS Y%d, Y%d, Y%d", j+4, j, j)
	}
	// Horizontal sums: three HADDs leave [Σ0 Σ1 Σ2 Σ3] split across the
	// two 128-bit lanes, which one add combines.
	w.f("\tVHADDPS Y1, Y0, Y0")
	w.f("\tVHADDPS Y3, Y2, Y2")
	w.f("\tVHADDPS Y2, Y0, Y0")
	w.f("\tVEXTRACTF128 $1, Y0, X1")
	w.f("\tVADDPS X1, X0, X0")
	w.f("\tVMOVUPS X0, (DX)")
	w.f("\tVZEROUPPER")
	w.f("\tRET")
	w.f("")
}

// emitPeakLoops writes the loops PeakGFLOPS times: a chain of dependent
// integer adds (one per cycle on every x86 core, so it measures the clock)
// and runs of independent FMAs (which measure FMA throughput per cycle).
func emitPeakLoops(w *writer) {
	w.f("// func addChain(n int): n iterations of 16 dependent ADDQ, 16 cycles each.")
	w.f("TEXT ·addChain(SB), NOSPLIT, $0-8")
	w.f("\tMOVQ n+0(FP), CX")
	w.f("\tXORQ AX, AX")
	w.f("addChain_loop:")
	for i := 0; i < 16; i++ {
		w.f("\tADDQ $1, AX")
	}
	w.f("\tDECQ CX")
	w.f("\tJNZ addChain_loop")
	w.f("\tRET")
	w.f("")
	for _, z := range []bool{true, false} {
		k := kernel{zmm: z}
		name, chains := "fmaLoopAVX2", 12
		if z {
			name, chains = "fmaLoopAVX512", 24
		}
		w.f("// func %s(n int): n iterations of %d independent FMAs.", name, chains)
		w.f("TEXT ·%s(SB), NOSPLIT, $0-8", name)
		w.f("\tMOVQ n+0(FP), CX")
		x, y := k.reg(k.nregs()-2), k.reg(k.nregs()-1)
		for i := 0; i < chains; i++ {
			if z {
				w.f("\tVPXORD %s, %s, %s", k.reg(i), k.reg(i), k.reg(i))
			} else {
				w.f("\tVXORPS %s, %s, %s", k.reg(i), k.reg(i), k.reg(i))
			}
		}
		if z {
			w.f("\tVPXORD %s, %s, %s", x, x, x)
			w.f("\tVPXORD %s, %s, %s", y, y, y)
		} else {
			w.f("\tVXORPS %s, %s, %s", x, x, x)
			w.f("\tVXORPS %s, %s, %s", y, y, y)
		}
		w.f("%s_loop:", name)
		for i := 0; i < chains; i++ {
			w.f("\tVFMADD231PS %s, %s, %s", x, y, k.reg(i))
		}
		w.f("\tDECQ CX")
		w.f("\tJNZ %s_loop", name)
		w.f("\tVZEROUPPER")
		w.f("\tRET")
		w.f("")
	}
}

func main() {
	out := flag.String("o", ".", "directory of package gemm")
	exp := flag.Bool("experiment", false, "also write tuning variants to kernels_exp_amd64.s and exp_amd64_test.go (not committed)")
	flag.Parse()
	if *exp {
		writeExperiments(*out)
	}
	if err := os.WriteFile(filepath.Join(*out, "kernels_amd64.s"), generate(), 0o644); err != nil {
		log.Fatal(err)
	}
}

// kernels are the shipped micro-kernels.
var kernels = []kernel{
	{name: "kernAVX512", zmm: true, mr: 14, nv: 2, unroll: 4},
	{name: "kernAVX2", zmm: false, mr: 6, nv: 2, unroll: 4},
	{name: "kernAVX512B", zmm: true, mr: 14, nv: 2, unroll: 4, strided: true},
	{name: "kernAVX2B", zmm: false, mr: 6, nv: 2, unroll: 4, strided: true},
}

// generate returns the text of kernels_amd64.s.
func generate() []byte {
	var w writer
	w.f("// Code generated by kerngen; DO NOT EDIT.")
	w.f("")
	w.f("//go:build amd64 && !purego")
	w.f("")
	w.f("#include \"textflag.h\"")
	w.f("")
	for _, k := range kernels {
		k.emit(&w)
	}
	emitDot4(&w)
	emitPeakLoops(&w)
	return w.Bytes()
}

// experiments are tile shapes and unroll depths tried when tuning; the
// winners are the kernels in main.
var experiments = []kernel{
	{name: "xAVX2_6x16u1", mr: 6, nv: 2, unroll: 1},
	{name: "xAVX2_6x16u2", mr: 6, nv: 2, unroll: 2},
	{name: "xAVX2_6x16u4", mr: 6, nv: 2, unroll: 4},
	{name: "xAVX2_6x16u8", mr: 6, nv: 2, unroll: 8},
	{name: "xAVX2_4x24u4", mr: 4, nv: 3, unroll: 4},
	{name: "xAVX2_5x16u4", mr: 5, nv: 2, unroll: 4},
	{name: "xAVX2_6x16u4p", mr: 6, nv: 2, unroll: 4, prefA: 256},
}

func writeExperiments(dir string) {
	var w, g writer
	w.f("//go:build amd64 && !purego")
	w.f("")
	w.f("#include \"textflag.h\"")
	w.f("")
	g.f("//go:build amd64 && !purego")
	g.f("")
	g.f("package gemm")
	g.f("")
	g.f("func init() {")
	g.f("\texperimentKernels = []*microKernel{")
	for _, k := range experiments {
		k.emit(&w)
		g.f("\t\t{name: %q, mr: %d, nr: %d, kc: 256, mc: %d, nc: 4096, run: %s},", k.name, k.mr, k.nv*k.vlen()/4, k.mr*24, k.name)
	}
	g.f("\t}")
	g.f("}")
	for _, k := range experiments {
		g.f("")
		g.f("//go:noescape")
		g.f("func %s(k int, a, b, c *float32, ldc int, alpha, beta float32)", k.name)
	}
	if err := os.WriteFile(filepath.Join(dir, "kernels_exp_amd64.s"), w.Bytes(), 0o644); err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "exp_amd64_test.go"), g.Bytes(), 0o644); err != nil {
		log.Fatal(err)
	}
}
