// Elementwise and gather/scatter ops of the tensor.Backend interface. Each
// mirrors the arithmetic order of stage/tensor/cpu so that, with --fmad=false,
// results round identically.
#include "common.cuh"

extern "C" __global__ void hp_add(float* dst, const float* a, const float* b, long long n) {
  HP_GRID_LOOP(i, n) { dst[i] = a[i] + b[i]; }
}

extern "C" __global__ void hp_axpy(float alpha, const float* x, float* y, long long n) {
  HP_GRID_LOOP(i, n) { y[i] += alpha * x[i]; }
}

extern "C" __global__ void hp_scale(float* x, float alpha, long long n) {
  HP_GRID_LOOP(i, n) { x[i] *= alpha; }
}

// hp_sumsq_partial writes one float64 partial sum of squares per block; the
// host adds the partials in order.
extern "C" __global__ void hp_sumsq_partial(double* part, const float* x, long long n) {
  double s = 0;
  HP_GRID_LOOP(i, n) {
    double v = (double)x[i];
    s += v * v;
  }
  s = hp_block_sum_d(s);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// hp_gather: one block row per output row, dst[r,:] = table[ids[r],:].
extern "C" __global__ void hp_gather(float* dst, const float* table, const int* ids, int rows, int dim,
                                     int vocab, unsigned int* err) {
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    int t = ids[r];
    float* d = dst + (size_t)r * dim;
    if (t < 0 || t >= vocab) {
      if (threadIdx.x == 0) atomicOr(err, HP_ERR_GATHER_ID);
      for (int c = threadIdx.x; c < dim; c += blockDim.x) d[c] = 0;
      continue;
    }
    const float* s = table + (size_t)t * dim;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) d[c] = s[c];
  }
}

// hp_scatter_add: one thread per column walks the rows in order, so repeated
// ids accumulate in exactly the cpu backend's order, without atomics.
extern "C" __global__ void hp_scatter_add(float* table, const int* ids, const float* src, int rows, int dim,
                                          int vocab, unsigned int* err) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  for (int r = 0; r < rows; r++) {
    int t = ids[r];
    if (t < 0 || t >= vocab) {
      if (c == 0) atomicOr(err, HP_ERR_SCATTER_ID);
      continue;
    }
    table[(size_t)t * dim + c] += src[(size_t)r * dim + c];
  }
}

__device__ __forceinline__ float hp_silu(float x) { return x * (1.0f / (1.0f + hp_exp(-x))); }

extern "C" __global__ void hp_swiglu(float* out, const float* gate, const float* up, long long n) {
  HP_GRID_LOOP(i, n) { out[i] = hp_silu(gate[i]) * up[i]; }
}

extern "C" __global__ void hp_swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                                              const float* up, long long n) {
  HP_GRID_LOOP(i, n) {
    float x = gate[i];
    float s = 1.0f / (1.0f + hp_exp(-x));
    dgate[i] = dout[i] * up[i] * (s * (1.0f + x * (1.0f - s)));
    dup[i] = dout[i] * (x * s);
  }
}

// hp_adamw follows PyTorch's AdamW (and the cpu backend) operation by
// operation; the bias corrections come from the host in float64.
extern "C" __global__ void hp_adamw(float* p, const float* g, float* m, float* v, long long n, float decay,
                                    float b1, float b2, float eps, float gscale, float step_size,
                                    float bc2_sqrt) {
  float ob1 = 1.0f - b1, ob2 = 1.0f - b2;
  HP_GRID_LOOP(i, n) {
    float gi = g[i] * gscale;
    float pi = p[i] * decay;
    float mi = b1 * m[i] + ob1 * gi;
    float vi = b2 * v[i] + ob2 * gi * gi;
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - step_size * (mi / denom);
  }
}

// hp_rope rotates rows of heads·headDim in place. One thread per (row,
// frequency) pair computes the angle float32(pos)·invFreq rounded to float32
// and its cosine and sine in float64 rounded to float32, exactly where the
// cpu backend's table rounds, and applies them to every head.
extern "C" __global__ void hp_rope(float* x, const int* pos, const float* inv_freq, int rows, int heads,
                                   int head_dim, float sign, unsigned int* err) {
  int half = head_dim / 2;
  long long total = (long long)rows * half;
  HP_GRID_LOOP(idx, total) {
    int r = (int)(idx / half), i = (int)(idx % half);
    int p = pos[r];
    if (p < 0) {
      atomicOr(err, HP_ERR_ROPE_POS);
      continue;
    }
    float ang = (float)p * inv_freq[i];
    float c = (float)cos((double)ang);
    float s = sign * (float)sin((double)ang);
    float* row = x + (size_t)r * heads * head_dim;
    for (int h = 0; h < heads; h++) {
      float* v = row + h * head_dim;
      float a = v[i], b = v[i + half];
      v[i] = a * c - b * s;
      v[i + half] = b * c + a * s;
    }
  }
}
