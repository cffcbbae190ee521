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

	"gorgonia.org/cu"
	cublas "gorgonia.org/cu/blas"

	"github.com/holopeer/holopeer/cuda/kernels"
	"github.com/holopeer/holopeer/stage/tensor"
)

// Priority is the cuda backend's rank for tensor.Open("auto"): above metal
// (10) and cpu (0).
const Priority = 20

// ErrNoDevice means the CUDA driver reports no usable GPU, or is absent.
var ErrNoDevice = errors.New("cuda: no usable CUDA device")

// minCompute is the oldest compute capability the PTX runs on.
var minCompute = [2]int{6, 0}

// shared is the process's backend on device 0, opened once: the stages of
// one process share it (and its memory pool) rather than each holding a
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

// Backend runs tensor ops on one NVIDIA GPU. All driver calls go through
// one mutex and the device's legacy default stream, so ops run in the
// order they are called, whichever goroutines call them.
type Backend struct {
	// Static after New.
	ordinal  int
	dev      cu.Device
	ctx      cu.CUContext
	desc     string
	totalMem int64
	blas     *cublas.Standard
	mods     []cu.Module
	fns      map[string]cu.Function
	errWord  cu.DevicePtr // uint32 of error bits that kernels set

	mu     sync.Mutex // serialises every driver call and guards the fields below
	pool   map[int64][]cu.DevicePtr
	cached int64 // bytes in pool
	live   int64 // bytes handed out
	err    error // first driver or cuBLAS failure; sticky
	closed bool
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

// InitError is the driver's verdict on cuInit, nil when it succeeded. It
// wraps ErrNoDevice otherwise.
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
// kernels and creates a cuBLAS handle. It returns an error wrapping
// ErrNoDevice when there is no usable device, and never exits.
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
	be := &Backend{
		ordinal:  c.ordinal,
		dev:      dev,
		desc:     fmt.Sprintf("%s (compute %d.%d, %.1f GiB)", name, major, minor, float64(total)/(1<<30)),
		totalMem: total,
		fns:      map[string]cu.Function{},
		pool:     map[int64][]cu.DevicePtr{},
	}
	if be.ctx, err = dev.RetainPrimaryCtx(); err != nil {
		return nil, fmt.Errorf("cuda: %s: primary context: %w", name, err)
	}
	if err := be.setup(); err != nil {
		be.Close()
		return nil, fmt.Errorf("cuda: %s: %w", name, err)
	}
	return be, nil
}

// setup loads the kernels, creates the cuBLAS handle and the error word.
func (be *Backend) setup() (err error) {
	defer be.lock()()
	for _, m := range kernels.Modules() {
		mod, err := cu.LoadData(m.PTX)
		if err != nil {
			return fmt.Errorf("loading the PTX of %s: %w", m.Name, err)
		}
		be.mods = append(be.mods, mod)
		for _, k := range m.Kernels {
			fn, err := mod.Function(k)
			if err != nil {
				return fmt.Errorf("kernel %s: %w", k, err)
			}
			be.fns[k] = fn
		}
	}
	if be.errWord, err = cu.MemAlloc(4); err != nil {
		return fmt.Errorf("allocating the error word: %w", err)
	}
	if err := cu.MemsetD32(be.errWord, 0, 1); err != nil {
		return fmt.Errorf("clearing the error word: %w", err)
	}
	// cublas.New panics when cublasCreate fails.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cublasCreate: %v", r)
		}
	}()
	be.blas = cublas.New()
	return nil
}

// lock serialises a driver call sequence on this backend and makes its
// context current on the calling OS thread; call the returned function
// when done.
func (be *Backend) lock() func() {
	be.mu.Lock()
	if be.closed {
		be.mu.Unlock()
		panic("cuda: backend used after Close")
	}
	runtime.LockOSThread()
	if err := cu.SetCurrentContext(be.ctx); err != nil {
		be.failLocked("cuCtxSetCurrent", err)
	}
	return be.unlock
}

func (be *Backend) unlock() {
	runtime.UnlockOSThread()
	be.mu.Unlock()
}

// failLocked records the first failure for Sync to report.
func (be *Backend) failLocked(what string, err error) {
	if be.err == nil {
		be.err = fmt.Errorf("cuda: %s: %w", what, err)
	}
}

// Name implements tensor.Backend.
func (*Backend) Name() string { return "cuda" }

// Device describes the GPU, e.g. "NVIDIA H200 (compute 9.0, 139.8 GiB)".
func (be *Backend) Device() string { return be.desc }

// TotalMemory is the device's memory in bytes.
func (be *Backend) TotalMemory() int64 { return be.totalMem }

// Close frees the backend's device memory, kernels and cuBLAS handle and
// releases the context. Buffers must not be used afterwards.
func (be *Backend) Close() error {
	be.mu.Lock()
	if be.closed {
		be.mu.Unlock()
		return nil
	}
	be.mu.Unlock()
	unlock := be.lock()
	var errs []error
	if be.ctx != (cu.CUContext{}) {
		errs = append(errs, cu.Synchronize())
	}
	be.releaseCachedLocked()
	if be.errWord != 0 {
		errs = append(errs, cu.MemFree(be.errWord))
	}
	if be.blas != nil {
		errs = append(errs, be.blas.Close())
	}
	for _, m := range be.mods {
		errs = append(errs, m.Unload())
	}
	be.closed = true
	unlock()
	if be.ctx != (cu.CUContext{}) {
		errs = append(errs, be.dev.ReleasePrimaryCtx())
	}
	return errors.Join(errs...)
}
