// The CUDA built-ins that the kernels of cuda/kernels use, for compiling
// them as C++ and running them on the emulator's fibers (runtime.cc).
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>

struct hp_uint3 {
  unsigned int x, y, z;
};

// The current thread's coordinates; the scheduler sets them before it
// resumes a fiber.
extern hp_uint3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// One block runs at a time, so a function-scope static is the block's
// shared memory.
#define __shared__ static
#define HP_DYN_SHARED(T, name) T *name = static_cast<T *>(hp_emu_dyn_shared())

void *hp_emu_dyn_shared();
void __syncthreads();
void hp_emu_warp_barrier();
uint64_t *hp_emu_shfl_slots();
[[noreturn]] void hp_emu_fault(const char *what);

template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  if (mask != 0xffffffffu) hp_emu_fault("__shfl_xor_sync with a partial mask");
  uint64_t *slots = hp_emu_shfl_slots();
  unsigned me = threadIdx.x;
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(T));
  slots[me] = bits;
  hp_emu_warp_barrier();
  unsigned src = (me & ~31u) | ((me & 31u) ^ (unsigned)lane_mask);
  if (src >= blockDim.x) hp_emu_fault("__shfl_xor_sync from a lane outside the block");
  T out;
  memcpy(&out, &slots[src], sizeof(T));
  hp_emu_warp_barrier();
  return out;
}

inline float __int_as_float(unsigned int u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// Fibers never run at the same time, so a plain read-modify-write is
// atomic.
inline unsigned int atomicOr(unsigned int *p, unsigned int v) {
  unsigned int old = *p;
  *p = old | v;
  return old;
}

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

// hp_emu_kernel is one compiled kernel: run unpacks the 8-byte argument
// slots into its parameters.
struct hp_emu_kernel {
  const char *name;
  int nargs;
  std::function<void(const uint64_t *)> run;
};

const hp_emu_kernel *hp_emu_find_kernel(const char *name);
int hp_emu_kernels_len();
const hp_emu_kernel &hp_emu_kernel_at(int i);
