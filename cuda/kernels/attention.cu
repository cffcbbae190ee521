// Causal grouped-query attention, forward and backward, in the layouts of
// tensor.AttnShape:
//
//   q, out, dq, dout: [batch·seq_q, heads·head_dim]
//   k, v, dk, dv:     [batch·seq_k, kv_heads·head_dim]
//   lse, dsum:        [batch, heads, seq_q]
//
// Query i sits at position q_offset+i and sees keys 0..q_offset+i. Each
// block has HP_ATTN_THREADS threads (4 warps); a warp computes one score at
// a time with its lanes striding over head_dim, so a score is the same bits
// in every pass and every kernel. Keys (or queries) are visited in chunks
// of HP_ATTN_CHUNK whose probabilities go through shared memory, where the
// threads, one per output column, accumulate them. head_dim is at most
// HP_ATTN_THREADS·HP_ATTN_COLS. No atomics: every output element is written
// by one thread, so results are deterministic.
#include "common.cuh"

#define HP_ATTN_THREADS 128
#define HP_ATTN_WARPS (HP_ATTN_THREADS / 32)
#define HP_ATTN_CHUNK 32
#define HP_ATTN_COLS 4

// hp_warp_dot returns Σ a[c]·b[c] to every lane of the warp.
__device__ __forceinline__ float hp_warp_dot(const float* a, const float* b, int n) {
  int lane = threadIdx.x & 31;
  float s = 0;
  for (int c = lane; c < n; c += 32) s += a[c] * b[c];
  return hp_warp_sum(s);
}

// hp_attn_forward: grid (seq_q, heads, batch). Three passes over the visible
// keys: the maximum score, the float64 sum of exponentials (hence the
// log-sum-exp), then out = Σ p·v.
extern "C" __global__ void __launch_bounds__(HP_ATTN_THREADS)
    hp_attn_forward(float* out, float* lse, const float* q, const float* k, const float* v, int heads,
                    int kv_heads, int head_dim, int seq_q, int seq_k, int q_offset, float scale) {
  HP_DYN_SHARED(float, sh);  // the query row: head_dim floats
  __shared__ float sp[HP_ATTN_CHUNK];
  __shared__ float wmax[HP_ATTN_WARPS];
  __shared__ double wsum[HP_ATTN_WARPS];
  int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int g = h / (heads / kv_heads);
  size_t qs = (size_t)heads * head_dim, kvs = (size_t)kv_heads * head_dim;
  const float* qi = q + ((size_t)b * seq_q + i) * qs + (size_t)h * head_dim;
  const float* kb = k + (size_t)b * seq_k * kvs + (size_t)g * head_dim;
  const float* vb = v + (size_t)b * seq_k * kvs + (size_t)g * head_dim;
  int lim = q_offset + i + 1;

  for (int c = threadIdx.x; c < head_dim; c += blockDim.x) sh[c] = qi[c];
  __syncthreads();

  float m = HP_NEG_INF;
  for (int j = warp; j < lim; j += HP_ATTN_WARPS) m = fmaxf(m, scale * hp_warp_dot(sh, kb + j * kvs, head_dim));
  if (lane == 0) wmax[warp] = m;
  __syncthreads();
  m = wmax[0];
  for (int w = 1; w < HP_ATTN_WARPS; w++) m = fmaxf(m, wmax[w]);

  double z = 0;
  for (int j = warp; j < lim; j += HP_ATTN_WARPS)
    z += (double)hp_exp(scale * hp_warp_dot(sh, kb + j * kvs, head_dim) - m);
  if (lane == 0) wsum[warp] = z;
  __syncthreads();
  z = 0;
  for (int w = 0; w < HP_ATTN_WARPS; w++) z += wsum[w];
  double inv = 1.0 / z;
  if (threadIdx.x == 0) lse[((size_t)b * heads + h) * seq_q + i] = (float)((double)m + log(z));

  float acc[HP_ATTN_COLS];
#pragma unroll
  for (int t = 0; t < HP_ATTN_COLS; t++) acc[t] = 0;
  for (int j0 = 0; j0 < lim; j0 += HP_ATTN_CHUNK) {
    for (int jj = warp; jj < HP_ATTN_CHUNK; jj += HP_ATTN_WARPS) {
      int j = j0 + jj;
      float p = 0;
      if (j < lim) p = (float)((double)hp_exp(scale * hp_warp_dot(sh, kb + j * kvs, head_dim) - m) * inv);
      if (lane == 0) sp[jj] = p;
    }
    __syncthreads();
    int n = min(HP_ATTN_CHUNK, lim - j0);
#pragma unroll
    for (int t = 0; t < HP_ATTN_COLS; t++) {
      int c = threadIdx.x + t * HP_ATTN_THREADS;
      if (c < head_dim) {
        float a = acc[t];
        for (int jj = 0; jj < n; jj++) a += sp[jj] * vb[(size_t)(j0 + jj) * kvs + c];
        acc[t] = a;
      }
    }
    __syncthreads();
  }
  float* oi = out + ((size_t)b * seq_q + i) * qs + (size_t)h * head_dim;
#pragma unroll
  for (int t = 0; t < HP_ATTN_COLS; t++) {
    int c = threadIdx.x + t * HP_ATTN_THREADS;
    if (c < head_dim) oi[c] = acc[t];
  }
}

// hp_attn_backward_q: grid (seq_q, heads, batch). Writes D_i = dO_i·O_i to
// dsum (needed by hp_attn_backward_kv, launched after it) and
// dq_i = scale·Σ_j P_ij(dO_i·v_j − D_i)·k_j.
extern "C" __global__ void __launch_bounds__(HP_ATTN_THREADS)
    hp_attn_backward_q(float* dq, float* dsum, const float* dout, const float* q, const float* k, const float* v,
                       const float* out, const float* lse, int heads, int kv_heads, int head_dim, int seq_q,
                       int seq_k, int q_offset, float scale) {
  HP_DYN_SHARED(float, sh);  // query row, then output-gradient row
  float* sq = sh;
  float* sdo = sh + head_dim;
  __shared__ float sds[HP_ATTN_CHUNK];
  int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int g = h / (heads / kv_heads);
  size_t qs = (size_t)heads * head_dim, kvs = (size_t)kv_heads * head_dim;
  size_t qoff = ((size_t)b * seq_q + i) * qs + (size_t)h * head_dim;
  const float* kb = k + (size_t)b * seq_k * kvs + (size_t)g * head_dim;
  const float* vb = v + (size_t)b * seq_k * kvs + (size_t)g * head_dim;
  int lim = q_offset + i + 1;

  double d = 0;
  for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
    sq[c] = q[qoff + c];
    sdo[c] = dout[qoff + c];
    d += (double)dout[qoff + c] * (double)out[qoff + c];
  }
  d = hp_block_sum_d(d);  // its barriers also publish sq and sdo
  float D = (float)d;
  size_t row = ((size_t)b * heads + h) * seq_q + i;
  if (threadIdx.x == 0) dsum[row] = D;
  float l = lse[row];

  float acc[HP_ATTN_COLS];
#pragma unroll
  for (int t = 0; t < HP_ATTN_COLS; t++) acc[t] = 0;
  for (int j0 = 0; j0 < lim; j0 += HP_ATTN_CHUNK) {
    for (int jj = warp; jj < HP_ATTN_CHUNK; jj += HP_ATTN_WARPS) {
      int j = j0 + jj;
      float ds = 0;
      if (j < lim) {
        float s = scale * hp_warp_dot(sq, kb + j * kvs, head_dim);
        float dp = hp_warp_dot(sdo, vb + j * kvs, head_dim);
        float p = hp_exp(s - l);
        ds = p * (dp - D);
      }
      if (lane == 0) sds[jj] = ds;
    }
    __syncthreads();
    int n = min(HP_ATTN_CHUNK, lim - j0);
#pragma unroll
    for (int t = 0; t < HP_ATTN_COLS; t++) {
      int c = threadIdx.x + t * HP_ATTN_THREADS;
      if (c < head_dim) {
        float a = acc[t];
        for (int jj = 0; jj < n; jj++) a += sds[jj] * kb[(size_t)(j0 + jj) * kvs + c];
        acc[t] = a;
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int t = 0; t < HP_ATTN_COLS; t++) {
    int c = threadIdx.x + t * HP_ATTN_THREADS;
    if (c < head_dim) dq[qoff + c] = scale * acc[t];
  }
}

// hp_attn_backward_kv: grid (seq_k, kv_heads, batch). For key row j of kv
// head g, sums over the query heads of the group and the queries that see
// j: dv_j = Σ P_ij·dO_i and dk_j = scale·Σ P_ij(dO_i·v_j − D_i)·q_i.
extern "C" __global__ void __launch_bounds__(HP_ATTN_THREADS)
    hp_attn_backward_kv(float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                        const float* lse, const float* dsum, int heads, int kv_heads, int head_dim, int seq_q,
                        int seq_k, int q_offset, float scale) {
  HP_DYN_SHARED(float, sh);  // key row, then value row
  float* sk = sh;
  float* sv = sh + head_dim;
  __shared__ float sp[HP_ATTN_CHUNK];
  __shared__ float sds[HP_ATTN_CHUNK];
  int j = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int group = heads / kv_heads;
  size_t qs = (size_t)heads * head_dim, kvs = (size_t)kv_heads * head_dim;
  size_t koff = ((size_t)b * seq_k + j) * kvs + (size_t)g * head_dim;

  for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
    sk[c] = k[koff + c];
    sv[c] = v[koff + c];
  }
  __syncthreads();

  float acck[HP_ATTN_COLS], accv[HP_ATTN_COLS];
#pragma unroll
  for (int t = 0; t < HP_ATTN_COLS; t++) acck[t] = accv[t] = 0;
  int first = max(0, j - q_offset);
  for (int hh = 0; hh < group; hh++) {
    int h = g * group + hh;
    const float* qb = q + (size_t)b * seq_q * qs + (size_t)h * head_dim;
    const float* dob = dout + (size_t)b * seq_q * qs + (size_t)h * head_dim;
    const float* lrow = lse + ((size_t)b * heads + h) * seq_q;
    const float* drow = dsum + ((size_t)b * heads + h) * seq_q;
    for (int i0 = first; i0 < seq_q; i0 += HP_ATTN_CHUNK) {
      for (int ii = warp; ii < HP_ATTN_CHUNK; ii += HP_ATTN_WARPS) {
        int i = i0 + ii;
        float p = 0, ds = 0;
        if (i < seq_q) {
          float s = scale * hp_warp_dot(sk, qb + i * qs, head_dim);
          float dp = hp_warp_dot(sv, dob + i * qs, head_dim);
          p = hp_exp(s - lrow[i]);
          ds = p * (dp - drow[i]);
        }
        if (lane == 0) {
          sp[ii] = p;
          sds[ii] = ds;
        }
      }
      __syncthreads();
      int n = min(HP_ATTN_CHUNK, seq_q - i0);
#pragma unroll
      for (int t = 0; t < HP_ATTN_COLS; t++) {
        int c = threadIdx.x + t * HP_ATTN_THREADS;
        if (c < head_dim) {
          float ak = acck[t], av = accv[t];
          for (int ii = 0; ii < n; ii++) {
            size_t o = (size_t)(i0 + ii) * qs + c;
            av += sp[ii] * dob[o];
            ak += sds[ii] * qb[o];
          }
          acck[t] = ak;
          accv[t] = av;
        }
      }
      __syncthreads();
    }
  }
#pragma unroll
  for (int t = 0; t < HP_ATTN_COLS; t++) {
    int c = threadIdx.x + t * HP_ATTN_THREADS;
    if (c < head_dim) {
      dk[koff + c] = scale * acck[t];
      dv[koff + c] = accv[t];
    }
  }
}
