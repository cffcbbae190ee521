//go:build cuda

package cuda

/*
#cgo linux CFLAGS: -I/usr/local/cuda/include
#cgo linux LDFLAGS: -L/usr/local/cuda/lib64
#cgo LDFLAGS: -ldl
#include "driver.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"gonum.org/v1/gonum/blas"
	"gorgonia.org/cu"
	cublas "gorgonia.org/cu/blas"

	"github.com/holopeer/holopeer/cuda/kernels"
	"github.com/holopeer/holopeer/stage/tensor"
)

// Priority is the cuda backend's rank for tensor.Open("auto"): above metal
// (10) and cpu (0).
const Priority = 20

// ErrNoDevice means the CUDA driver reports no usable GPU.
var ErrNoDevice = errors.New("cuda: no usable CUDA device")

// minCompute is the oldest compute capability the PTX runs on
// (kernels.Arch).
var minCompute = [2]int{6, 0}

// shared is the process's backend on device 0, opened once: the stages of
// one process share it and its memory pool rather than each holding a
// context and a cuBLAS handle.
var shared = sync.OnceValues(func() (*Backend, error) { return New() })

func init() {
	tensor.Register("cuda", Priority, func() (tensor.Backend, error) {
		be, err := shared()
		if err != nil {
			return nil, err
		}
		return be, nil
	})
}

// Option configures New.
type Option func(*config) error

type config struct {
	ordinal int
}

// WithDevice selects the GPU by ordinal (default 0).
func WithDevice(ordinal int) Option {
	return func(c *config) error {
		if ordinal < 0 {
			return fmt.Errorf("cuda: device ordinal %d is negative", ordinal)
		}
		c.ordinal = ordinal
		return nil
	}
}

// InitError is the driver's verdict on cuInit: nil when it succeeded, an
// error wrapping ErrNoDevice otherwise (see driver.c).
func InitError() error {
	switch r := int(C.hp_cuda_init_result()); r {
	case 0:
		return nil
	case -1:
		return fmt.Errorf("%w: cuInit was never called", ErrNoDevice)
	default:
		return fmt.Errorf("%w: cuInit: %s (%d)", ErrNoDevice, C.GoString(C.hp_cuda_error_name(C.int(r))), r)
	}
}

// New opens a GPU: it retains the device's primary context, loads the
// kernels' PTX and creates a cuBLAS handle. Without a usable device it
// returns an error wrapping ErrNoDevice; it never exits.
func New(opts ...Option) (*Backend, error) {
	var c config
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	if err := InitError(); err != nil {
		return nil, err
	}
	n, err := cu.NumDevices()
	if err != nil {
		return nil, fmt.Errorf("%w: counting devices: %v", ErrNoDevice, err)
	}
	if c.ordinal >= n {
		return nil, fmt.Errorf("%w: device %d asked for, %d present", ErrNoDevice, c.ordinal, n)
	}
	dev, err := cu.GetDevice(c.ordinal)
	if err != nil {
		return nil, fmt.Errorf("cuda: device %d: %w", c.ordinal, err)
	}
	major, minor, err := dev.ComputeCapability()
	if err != nil {
		return nil, fmt.Errorf("cuda: device %d: %w", c.ordinal, err)
	}
	name, _ := dev.Name()
	if major < minCompute[0] || (major == minCompute[0] && minor < minCompute[1]) {
		return nil, fmt.Errorf("%w: %s has compute capability %d.%d; the kernels need %d.%d or later",
			ErrNoDevice, name, major, minor, minCompute[0], minCompute[1])
	}
	total, _ := dev.TotalMem()
	d := &cuDriver{dev: dev, fns: map[string]cu.Function{}}
	if d.ctx, err = dev.RetainPrimaryCtx(); err != nil {
		return nil, fmt.Errorf("cuda: %s: primary context: %w", name, err)
	}
	if err := d.setup(); err != nil {
		d.close()
		return nil, fmt.Errorf("cuda: %s: %w", name, err)
	}
	desc := fmt.Sprintf("%s (compute %d.%d, %.1f GiB)", name, major, minor, float64(total)/(1<<30))
	be, err := newBackend(d, desc, total)
	if err != nil {
		d.close()
		return nil, fmt.Errorf("cuda: %s: %w", name, err)
	}
	return be, nil
}

// cuDriver is the CUDA driver API through gorgonia.org/cu, on the legacy
// default stream, with cuBLAS for GEMM.
type cuDriver struct {
	dev  cu.Device
	ctx  cu.CUContext
	blas *cublas.Standard
	mods []cu.Module
	fns  map[string]cu.Function
}

// setup loads the kernels and creates the cuBLAS handle, on one OS thread
// with the context current.
func (d *cuDriver) setup() (err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := d.bind(); err != nil {
		return fmt.Errorf("cuCtxSetCurrent: %w", err)
	}
	for _, m := range kernels.Modules() {
		mod, err := cu.LoadData(m.PTX)
		if err != nil {
			return fmt.Errorf("loading the PTX of %s: %w", m.Name, err)
		}
		d.mods = append(d.mods, mod)
		for _, k := range m.Kernels {
			fn, err := mod.Function(k)
			if err != nil {
				return fmt.Errorf("kernel %s: %w", k, err)
			}
			d.fns[k] = fn
		}
	}
	// cublas.New panics when cublasCreate fails.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cublasCreate: %v", r)
		}
	}()
	d.blas = cublas.New()
	return nil
}

func (d *cuDriver) bind() error { return cu.SetCurrentContext(d.ctx) }

func (d *cuDriver) alloc(bytes int64) (devPtr, error) {
	p, err := cu.MemAlloc(bytes)
	return devPtr(p), err
}

func (d *cuDriver) free(p devPtr) error { return cu.MemFree(cu.DevicePtr(p)) }

func (d *cuDriver) memset32(p devPtr, v uint32, n int) error {
	return cu.MemsetD32Async(cu.DevicePtr(p), uint(v), int64(n), cu.NoStream)
}

// htod copies synchronously from pageable memory: src may be reused on
// return, and the copy is ordered after the work already queued.
func (d *cuDriver) htod(dst devPtr, src unsafe.Pointer, bytes int64) error {
	return cu.MemcpyHtoD(cu.DevicePtr(dst), src, bytes)
}

func (d *cuDriver) dtoh(dst unsafe.Pointer, src devPtr, bytes int64) error {
	return cu.MemcpyDtoH(dst, cu.DevicePtr(src), bytes)
}

func (d *cuDriver) dtod(dst, src devPtr, bytes int64) error {
	return cu.MemcpyDtoDAsync(cu.DevicePtr(dst), cu.DevicePtr(src), bytes, cu.NoStream)
}

func (d *cuDriver) launch(kernel string, grid [3]int, block, shmem int, args []uint64) error {
	fn, ok := d.fns[kernel]
	if !ok {
		return fmt.Errorf("no kernel %s", kernel)
	}
	params := make([]unsafe.Pointer, len(args))
	for i := range args {
		params[i] = unsafe.Pointer(&args[i])
	}
	return fn.Launch(grid[0], grid[1], grid[2], block, 1, 1, shmem, cu.NoStream, params)
}

// devSlice is a Go slice header over device memory, the form cu's cuBLAS
// wrapper takes: it passes &s[0] to cuBLAS and never dereferences it.
func devSlice(p devPtr) []float32 {
	u := uintptr(p)
	return unsafe.Slice(*(**float32)(unsafe.Pointer(&u)), 1)
}

func trans(t bool) blas.Transpose {
	if t {
		return blas.Trans
	}
	return blas.NoTrans
}

// sgemm calls cublasSgemm, which is column-major like the driver interface
// says. The handle stays on the default stream, so the GEMM is ordered
// with the kernels.
func (d *cuDriver) sgemm(transA, transB bool, m, n, k int, alpha float32, a devPtr, lda int, b devPtr, ldb int, beta float32, c devPtr, ldc int) error {
	d.blas.Sgemm(trans(transA), trans(transB), m, n, k, alpha, devSlice(a), lda, devSlice(b), ldb, beta, devSlice(c), ldc)
	return d.blas.Err()
}

func (d *cuDriver) sync() error {
	if err := cu.Synchronize(); err != nil {
		return err
	}
	if d.blas != nil {
		return d.blas.Err()
	}
	return nil
}

func (d *cuDriver) close() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	errs := []error{d.bind()}
	if d.blas != nil {
		errs = append(errs, d.blas.Close())
	}
	for _, m := range d.mods {
		errs = append(errs, m.Unload())
	}
	if d.ctx != (cu.CUContext{}) {
		errs = append(errs, d.dev.ReleasePrimaryCtx())
	}
	return errors.Join(errs...)
}
