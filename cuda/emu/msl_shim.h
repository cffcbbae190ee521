// The Metal Shading Language built-ins that metal/kernels.metal uses, for
// compiling it as C++ and running it on the emulator's fibers. SIMD
// groups are 32 lanes, the width of every Apple GPU.
#pragma once

#include "shim.h"

struct hp_emu_thread_params;

namespace metal {}

#define kernel
#define device
#define constant const
#define threadgroup
// Threadgroup arrays: one group runs at a time, so a function-scope static
// is the group's memory.
#define HP_SHARED static
#define HP_THREAD_PARAMS hp_emu_thread_params
#define hp_group blockIdx
#define hp_thread threadIdx
#define hp_group_size blockDim
#define hp_groups gridDim
#define hp_lane (threadIdx.x & 31u)
#define hp_simd (threadIdx.x >> 5)

typedef unsigned int uint;
typedef unsigned long ulong;
typedef hp_uint3 uint3;
typedef unsigned int atomic_uint;

struct mem_flags {
  static const int mem_none = 0, mem_device = 1, mem_threadgroup = 2;
};

inline void threadgroup_barrier(int) { __syncthreads(); }

enum hp_memory_order { memory_order_relaxed };

// Fibers never run at the same time, so a plain read-modify-write is
// atomic.
inline unsigned int atomic_fetch_or_explicit(atomic_uint *p, unsigned int v, hp_memory_order) {
  unsigned int old = *p;
  *p = old | v;
  return old;
}

// hp_emu_simd_all hands every lane of the SIMD group the 32 values of its
// lanes, in lane order.
inline void hp_emu_simd_all(float v, float out[32]) {
  if (blockDim.x % 32 != 0) hp_emu_fault("a SIMD-group function in a threadgroup that is not whole SIMD groups");
  uint64_t *slots = hp_emu_shfl_slots();
  unsigned me = threadIdx.x, base = me & ~31u;
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof v);
  slots[me] = bits;
  hp_emu_warp_barrier();
  for (int l = 0; l < 32; l++) memcpy(&out[l], &slots[base + l], sizeof(float));
  hp_emu_warp_barrier();
}

// simd_sum adds in a tree, as hardware reductions do.
inline float simd_sum(float v) {
  float x[32];
  hp_emu_simd_all(v, x);
  for (int w = 16; w > 0; w >>= 1)
    for (int l = 0; l < w; l++) x[l] += x[l + w];
  return x[0];
}

inline float simd_max(float v) {
  float x[32];
  hp_emu_simd_all(v, x);
  float m = x[0];
  for (int l = 1; l < 32; l++) m = fmaxf(m, x[l]);
  return m;
}


namespace precise {
inline float exp(float x) { return expf(x); }
inline float log(float x) { return logf(x); }
inline float sqrt(float x) { return sqrtf(x); }
inline float cos(float x) { return cosf(x); }
inline float sin(float x) { return sinf(x); }
}  // namespace precise
