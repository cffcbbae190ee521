//go:build cuda

// gorgonia.org/cu's init calls cuInit and exits the process when it fails.
// This definition of cuInit, in the executable, takes precedence over the
// one in libcuda.so.1 for every caller linked into the binary. It calls the
// driver's cuInit, keeps the result for Open to report, and always answers
// success, so a machine with the driver but no usable GPU falls back to the
// cpu backend instead of dying at start-up.

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <cuda.h>

#include "driver.h"

static int init_result = -1;

CUresult CUDAAPI cuInit(unsigned int flags) {
  typedef CUresult(CUDAAPI * init_fn)(unsigned int);
  init_fn real = (init_fn)dlsym(RTLD_NEXT, "cuInit");
  if (real == NULL) {
    init_result = CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND;
  } else {
    init_result = (int)real(flags);
  }
  return CUDA_SUCCESS;
}

int hp_cuda_init_result(void) { return init_result; }

const char *hp_cuda_error_name(int code) {
  const char *name = NULL;
  if (cuGetErrorName((CUresult)code, &name) == CUDA_SUCCESS && name != NULL) return name;
  // The driver's table is out of reach when libcuda is NVIDIA's stub.
  switch (code) {
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_STUB_LIBRARY: return "CUDA_ERROR_STUB_LIBRARY (libcuda.so.1 is the toolkit's stub, not the driver's)";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND: return "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND";
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE: return "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE";
  }
  return "unknown CUresult";
}
