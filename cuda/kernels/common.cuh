// Shared helpers of holopeer's CUDA kernels. Compiled by NVRTC with
// --fmad=false so that elementwise arithmetic rounds exactly as the Go cpu
// backend's does; only the summation order of reductions differs.
#pragma once

// Error bits a kernel ORs into the backend's error word when it meets a
// value it must not use (the Go side reports them from Sync). Keep in step
// with errBits in cuda/launch.go.
#define HP_ERR_GATHER_ID 1u
#define HP_ERR_SCATTER_ID 2u
#define HP_ERR_XENT_TARGET 4u
#define HP_ERR_ROPE_POS 8u

// Every kernel that reduces over a row runs with blockDim.x a multiple of
// 32 and at most HP_MAX_THREADS.
#define HP_MAX_THREADS 1024
#define HP_FULL_MASK 0xffffffffu

// A grid-stride loop over [0, n) with 64-bit indices.
#define HP_GRID_LOOP(i, n)                                                  \
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;      \
       i < (n); i += (long long)gridDim.x * blockDim.x)

#define HP_NEG_INF (__int_as_float(0xff800000))

// HP_DYN_SHARED declares a kernel's dynamic shared memory (the launch's
// sharedMemBytes). cuda/emu, which runs these kernels on the CPU, defines
// it otherwise.
#ifndef HP_DYN_SHARED
#define HP_DYN_SHARED(T, name) extern __shared__ T name[]
#endif

__device__ __forceinline__ float hp_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(HP_FULL_MASK, v, o);
  return v;
}

__device__ __forceinline__ double hp_warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(HP_FULL_MASK, v, o);
  return v;
}

__device__ __forceinline__ float hp_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(HP_FULL_MASK, v, o));
  return v;
}

// hp_block_sum_d returns the sum of v over the block to every thread. The
// leading barrier lets a block call it repeatedly.
__device__ double hp_block_sum_d(double v) {
  __shared__ double part[32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int warps = (blockDim.x + 31) >> 5;
  v = hp_warp_sum_d(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double w = lane < warps ? part[lane] : 0.0;
    w = hp_warp_sum_d(w);
    if (lane == 0) part[0] = w;
  }
  __syncthreads();
  return part[0];
}

// hp_block_max returns the maximum of v over the block to every thread.
__device__ float hp_block_max(float v) {
  __shared__ float part[32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int warps = (blockDim.x + 31) >> 5;
  v = hp_warp_max(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < warps ? part[lane] : HP_NEG_INF;
    w = hp_warp_max(w);
    if (lane == 0) part[0] = w;
  }
  __syncthreads();
  return part[0];
}

// hp_exp is e^x in float32; expf is within 2 ulp of the true value, as the
// cpu backend's exp32 is within 1.
__device__ __forceinline__ float hp_exp(float x) { return expf(x); }
