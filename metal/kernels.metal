// holopeer's Metal kernels: every op of the tensor.Backend interface,
// compiled at run time with newLibraryWithSource (fast math off) and
// dispatched by metal/backend.go. They mirror cuda/kernels one for one.
//
// Conventions, which let cuda/emu run this file as C++ (build tag
// metalemu) to check the kernels' logic off a Mac:
//   - every kernel takes its buffers at indices 0..k−1, then HpArgs at
//     index k, then HP_THREAD_PARAMS;
//   - threadgroup arrays are declared with HP_SHARED, in kernel scope;
//     helper functions receive them as threadgroup pointers;
//   - SIMD groups are 32 wide (every Apple GPU); the Go side checks the
//     pipelines' threadExecutionWidth.
// Reductions run in float32 (Metal has no float64), so sums differ from
// the cpu backend's float64 ones in the last bits.
#include <metal_stdlib>
using namespace metal;

#ifndef HP_THREAD_PARAMS
#define HP_THREAD_PARAMS                                 \
  uint3 hp_group [[threadgroup_position_in_grid]],        \
      uint3 hp_thread [[thread_position_in_threadgroup]], \
      uint3 hp_group_size [[threads_per_threadgroup]],    \
      uint3 hp_groups [[threadgroups_per_grid]],          \
      uint hp_lane [[thread_index_in_simdgroup]],         \
      uint hp_simd [[simdgroup_index_in_threadgroup]]
#define HP_SHARED threadgroup
#endif

// HpArgs carries a kernel's scalars (setBytes): which slot means what is
// written at the top of each kernel. Keep in step with kernelArgs in
// metal/launch.go.
struct HpArgs {
  int i[8];
  float f[8];
};

// Error bits a kernel ORs into the backend's error word. Keep in step with
// metal/memory.go.
constant uint HP_ERR_GATHER_ID = 1;
constant uint HP_ERR_SCATTER_ID = 2;
constant uint HP_ERR_XENT_TARGET = 4;
constant uint HP_ERR_ROPE_POS = 8;

// A grid-stride loop over [0, n).
#define HP_GRID_LOOP(i, n) \
  for (uint i = hp_group.x * hp_group_size.x + hp_thread.x; i < (n); i += hp_groups.x * hp_group_size.x)

// hp_group_sum returns the sum of v over the threadgroup to every thread;
// part holds at least one float per SIMD group. Every thread adds the
// partials in the same order, so all agree. The leading barrier lets a
// kernel call it repeatedly.
static float hp_group_sum(float v, threadgroup float* part, uint lane, uint simd, uint nsimd) {
  v = simd_sum(v);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lane == 0) part[simd] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float s = 0;
  for (uint w = 0; w < nsimd; w++) s += part[w];
  return s;
}

static float hp_group_max(float v, threadgroup float* part, uint lane, uint simd, uint nsimd) {
  v = simd_max(v);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lane == 0) part[simd] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float m = part[0];
  for (uint w = 1; w < nsimd; w++) m = fmax(m, part[w]);
  return m;
}

// ---- Elementwise -----------------------------------------------------

// args: i0 = n; f0 = value.
kernel void hp_fill(device float* x [[buffer(0)]], constant HpArgs& args [[buffer(1)]], HP_THREAD_PARAMS) {
  const uint n = uint(args.i[0]);
  const float v = args.f[0];
  HP_GRID_LOOP(i, n) { x[i] = v; }
}

// args: i0 = n.
kernel void hp_copy(device float* dst [[buffer(0)]], const device float* src [[buffer(1)]],
                    constant HpArgs& args [[buffer(2)]], HP_THREAD_PARAMS) {
  const uint n = uint(args.i[0]);
  HP_GRID_LOOP(i, n) { dst[i] = src[i]; }
}

// args: i0 = n.
kernel void hp_add(device float* dst [[buffer(0)]], const device float* a [[buffer(1)]],
                   const device float* b [[buffer(2)]], constant HpArgs& args [[buffer(3)]], HP_THREAD_PARAMS) {
  const uint n = uint(args.i[0]);
  HP_GRID_LOOP(i, n) { dst[i] = a[i] + b[i]; }
}

// args: i0 = n; f0 = alpha.
kernel void hp_axpy(const device float* x [[buffer(0)]], device float* y [[buffer(1)]],
                    constant HpArgs& args [[buffer(2)]], HP_THREAD_PARAMS) {
  const uint n = uint(args.i[0]);
  const float alpha = args.f[0];
  HP_GRID_LOOP(i, n) { y[i] += alpha * x[i]; }
}

// args: i0 = n; f0 = alpha.
kernel void hp_scale(device float* x [[buffer(0)]], constant HpArgs& args [[buffer(1)]], HP_THREAD_PARAMS) {
  const uint n = uint(args.i[0]);
  const float alpha = args.f[0];
  HP_GRID_LOOP(i, n) { x[i] *= alpha; }
}

// hp_sumsq_partial writes one partial sum of squares per threadgroup; the
// host adds the partials in float64. args: i0 = n.
kernel void hp_sumsq_partial(device float* part [[buffer(0)]], const device float* x [[buffer(1)]],
                             constant HpArgs& args [[buffer(2)]], HP_THREAD_PARAMS) {
  HP_SHARED float red[32];
  const uint n = uint(args.i[0]);
  float s = 0;
  HP_GRID_LOOP(i, n) { s += x[i] * x[i]; }
  s = hp_group_sum(s, red, hp_lane, hp_simd, (hp_group_size.x + 31) / 32);
  if (hp_thread.x == 0) part[hp_group.x] = s;
}

// hp_gather: one threadgroup per output row. args: i0 = rows, i1 = dim,
// i2 = vocab.
kernel void hp_gather(device float* dst [[buffer(0)]], const device float* table [[buffer(1)]],
                      const device int* ids [[buffer(2)]], device atomic_uint* err [[buffer(3)]],
                      constant HpArgs& args [[buffer(4)]], HP_THREAD_PARAMS) {
  const int rows = args.i[0], dim = args.i[1], vocab = args.i[2];
  for (int r = int(hp_group.x); r < rows; r += int(hp_groups.x)) {
    const int t = ids[r];
    device float* d = dst + ulong(r) * ulong(dim);
    if (t < 0 || t >= vocab) {
      if (hp_thread.x == 0) atomic_fetch_or_explicit(err, HP_ERR_GATHER_ID, memory_order_relaxed);
      for (int c = int(hp_thread.x); c < dim; c += int(hp_group_size.x)) d[c] = 0;
      continue;
    }
    const device float* s = table + ulong(t) * ulong(dim);
    for (int c = int(hp_thread.x); c < dim; c += int(hp_group_size.x)) d[c] = s[c];
  }
}

// hp_scatter_add: one thread per column walks the rows in order, so
// repeated ids accumulate in the cpu backend's order, without atomics.
// args: i0 = rows, i1 = dim, i2 = vocab.
kernel void hp_scatter_add(device float* table [[buffer(0)]], const device int* ids [[buffer(1)]],
                           const device float* src [[buffer(2)]], device atomic_uint* err [[buffer(3)]],
                           constant HpArgs& args [[buffer(4)]], HP_THREAD_PARAMS) {
  const int rows = args.i[0], dim = args.i[1], vocab = args.i[2];
  const int c = int(hp_group.x * hp_group_size.x + hp_thread.x);
  if (c >= dim) return;
  for (int r = 0; r < rows; r++) {
    const int t = ids[r];
    if (t < 0 || t >= vocab) {
      if (c == 0) atomic_fetch_or_explicit(err, HP_ERR_SCATTER_ID, memory_order_relaxed);
      continue;
    }
    table[ulong(t) * ulong(dim) + ulong(c)] += src[ulong(r) * ulong(dim) + ulong(c)];
  }
}

static float hp_silu(float x) { return x * (1.0f / (1.0f + precise::exp(-x))); }

// args: i0 = n.
kernel void hp_swiglu(device float* out [[buffer(0)]], const device float* gate [[buffer(1)]],
                      const device float* up [[buffer(2)]], constant HpArgs& args [[buffer(3)]], HP_THREAD_PARAMS) {
  const uint n = uint(args.i[0]);
  HP_GRID_LOOP(i, n) { out[i] = hp_silu(gate[i]) * up[i]; }
}

// args: i0 = n.
kernel void hp_swiglu_backward(device float* dgate [[buffer(0)]], device float* dup [[buffer(1)]],
                               const device float* dout [[buffer(2)]], const device float* gate [[buffer(3)]],
                               const device float* up [[buffer(4)]], constant HpArgs& args [[buffer(5)]],
                               HP_THREAD_PARAMS) {
  const uint n = uint(args.i[0]);
  HP_GRID_LOOP(i, n) {
    const float x = gate[i];
    const float s = 1.0f / (1.0f + precise::exp(-x));
    dgate[i] = dout[i] * up[i] * (s * (1.0f + x * (1.0f - s)));
    dup[i] = dout[i] * (x * s);
  }
}

// hp_adamw: PyTorch's AdamW step, bias corrections from the host.
// args: i0 = n; f0 = decay (1−lr·wd), f1 = beta1, f2 = beta2, f3 = eps,
// f4 = grad scale, f5 = step size (lr/(1−beta1^t)), f6 = sqrt(1−beta2^t).
kernel void hp_adamw(device float* p [[buffer(0)]], const device float* g [[buffer(1)]],
                     device float* m [[buffer(2)]], device float* v [[buffer(3)]],
                     constant HpArgs& args [[buffer(4)]], HP_THREAD_PARAMS) {
  const uint n = uint(args.i[0]);
  const float decay = args.f[0], b1 = args.f[1], b2 = args.f[2], eps = args.f[3];
  const float gscale = args.f[4], step_size = args.f[5], bc2_sqrt = args.f[6];
  const float ob1 = 1.0f - b1, ob2 = 1.0f - b2;
  HP_GRID_LOOP(i, n) {
    const float gi = g[i] * gscale;
    const float pi = p[i] * decay;
    const float mi = b1 * m[i] + ob1 * gi;
    const float vi = b2 * v[i] + ob2 * gi * gi;
    const float denom = precise::sqrt(vi) / bc2_sqrt + eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - step_size * (mi / denom);
  }
}

// hp_rope rotates rows of heads·head_dim in place, one thread per (row,
// frequency) pair: angle float(pos)·inv_freq rounded to float, precise
// cosine and sine. args: i0 = rows, i1 = heads, i2 = head_dim; f0 = ±1.
kernel void hp_rope(device float* x [[buffer(0)]], const device int* pos [[buffer(1)]],
                    const device float* inv_freq [[buffer(2)]], device atomic_uint* err [[buffer(3)]],
                    constant HpArgs& args [[buffer(4)]], HP_THREAD_PARAMS) {
  const int rows = args.i[0], heads = args.i[1], head_dim = args.i[2];
  const float sign = args.f[0];
  const int half_dim = head_dim / 2;
  const uint total = uint(rows) * uint(half_dim);
  HP_GRID_LOOP(idx, total) {
    const int r = int(idx / uint(half_dim)), i = int(idx % uint(half_dim));
    const int p = pos[r];
    if (p < 0) {
      atomic_fetch_or_explicit(err, HP_ERR_ROPE_POS, memory_order_relaxed);
      continue;
    }
    const float ang = float(p) * inv_freq[i];
    const float c = precise::cos(ang);
    const float s = sign * precise::sin(ang);
    device float* row = x + ulong(r) * ulong(heads * head_dim);
    for (int h = 0; h < heads; h++) {
      device float* v = row + h * head_dim;
      const float a0 = v[i], b0 = v[i + half_dim];
      v[i] = a0 * c - b0 * s;
      v[i + half_dim] = b0 * c + a0 * s;
    }
  }
}

// ---- Rows ------------------------------------------------------------

// hp_softmax: one threadgroup per row; dst may alias x (each thread reads
// and writes only its own columns, after the maximum is known).
// args: i0 = rows, i1 = cols.
kernel void hp_softmax(device float* dst [[buffer(0)]], const device float* x [[buffer(1)]],
                       constant HpArgs& args [[buffer(2)]], HP_THREAD_PARAMS) {
  HP_SHARED float red[32];
  const int rows = args.i[0], cols = args.i[1];
  const uint nsimd = (hp_group_size.x + 31) / 32;
  for (int r = int(hp_group.x); r < rows; r += int(hp_groups.x)) {
    const device float* xr = x + ulong(r) * ulong(cols);
    device float* dr = dst + ulong(r) * ulong(cols);
    float m = -INFINITY;
    for (int j = int(hp_thread.x); j < cols; j += int(hp_group_size.x)) m = fmax(m, xr[j]);
    m = hp_group_max(m, red, hp_lane, hp_simd, nsimd);
    float s = 0;
    for (int j = int(hp_thread.x); j < cols; j += int(hp_group_size.x)) {
      const float e = precise::exp(xr[j] - m);
      dr[j] = e;
      s += e;
    }
    s = hp_group_sum(s, red, hp_lane, hp_simd, nsimd);
    const float inv = 1.0f / s;
    for (int j = int(hp_thread.x); j < cols; j += int(hp_group_size.x)) dr[j] = dr[j] * inv;
  }
}

// hp_rmsnorm: out = w ∘ (x·rstd), rstd = 1/sqrt(mean(x²)+eps).
// args: i0 = rows, i1 = dim; f0 = eps.
kernel void hp_rmsnorm(device float* out [[buffer(0)]], device float* rstd [[buffer(1)]],
                       const device float* x [[buffer(2)]], const device float* w [[buffer(3)]],
                       constant HpArgs& args [[buffer(4)]], HP_THREAD_PARAMS) {
  HP_SHARED float red[32];
  const int rows = args.i[0], dim = args.i[1];
  const float eps = args.f[0];
  const uint nsimd = (hp_group_size.x + 31) / 32;
  for (int r = int(hp_group.x); r < rows; r += int(hp_groups.x)) {
    const device float* xr = x + ulong(r) * ulong(dim);
    device float* orow = out + ulong(r) * ulong(dim);
    float ss = 0;
    for (int j = int(hp_thread.x); j < dim; j += int(hp_group_size.x)) ss += xr[j] * xr[j];
    ss = hp_group_sum(ss, red, hp_lane, hp_simd, nsimd);
    const float mean = ss / float(dim);
    const float inv = 1.0f / precise::sqrt(mean + eps);
    if (hp_thread.x == 0) rstd[r] = inv;
    for (int j = int(hp_thread.x); j < dim; j += int(hp_group_size.x)) orow[j] = w[j] * (xr[j] * inv);
  }
}

// hp_rmsnorm_backward_dx: dx += rstd·w∘dy − rstd³·(Σ w·dy·x)/dim · x.
// args: i0 = rows, i1 = dim.
kernel void hp_rmsnorm_backward_dx(device float* dx [[buffer(0)]], const device float* dy [[buffer(1)]],
                                   const device float* x [[buffer(2)]], const device float* w [[buffer(3)]],
                                   const device float* rstd [[buffer(4)]], constant HpArgs& args [[buffer(5)]],
                                   HP_THREAD_PARAMS) {
  HP_SHARED float red[32];
  const int rows = args.i[0], dim = args.i[1];
  const uint nsimd = (hp_group_size.x + 31) / 32;
  for (int r = int(hp_group.x); r < rows; r += int(hp_groups.x)) {
    const device float* xr = x + ulong(r) * ulong(dim);
    const device float* dyr = dy + ulong(r) * ulong(dim);
    device float* dxr = dx + ulong(r) * ulong(dim);
    const float inv = rstd[r];
    float dot = 0;
    for (int j = int(hp_thread.x); j < dim; j += int(hp_group_size.x)) dot += w[j] * dyr[j] * xr[j];
    dot = hp_group_sum(dot, red, hp_lane, hp_simd, nsimd);
    const float c = inv * inv * inv * dot / float(dim);
    for (int j = int(hp_thread.x); j < dim; j += int(hp_group_size.x)) dxr[j] += inv * w[j] * dyr[j] - c * xr[j];
  }
}

// hp_rmsnorm_backward_dw_partial: part[seg, c] = Σ over the segment's rows
// of dy·(x·rstd), one column per thread, rows in order; the segment is
// hp_group.y. args: i0 = rows, i1 = dim, i2 = rows per segment.
kernel void hp_rmsnorm_backward_dw_partial(device float* part [[buffer(0)]], const device float* dy [[buffer(1)]],
                                           const device float* x [[buffer(2)]], const device float* rstd [[buffer(3)]],
                                           constant HpArgs& args [[buffer(4)]], HP_THREAD_PARAMS) {
  const int rows = args.i[0], dim = args.i[1], seg_rows = args.i[2];
  const int c = int(hp_group.x * hp_group_size.x + hp_thread.x);
  if (c >= dim) return;
  const int seg = int(hp_group.y);
  const int r0 = seg * seg_rows, r1 = min(rows, r0 + seg_rows);
  float acc = 0;
  for (int r = r0; r < r1; r++) {
    const ulong o = ulong(r) * ulong(dim) + ulong(c);
    acc += dy[o] * (x[o] * rstd[r]);
  }
  part[ulong(seg) * ulong(dim) + ulong(c)] = acc;
}

// hp_rmsnorm_backward_dw_final: dw += Σ part over the segments, in order.
// args: i0 = dim, i1 = segments.
kernel void hp_rmsnorm_backward_dw_final(device float* dw [[buffer(0)]], const device float* part [[buffer(1)]],
                                         constant HpArgs& args [[buffer(2)]], HP_THREAD_PARAMS) {
  const int dim = args.i[0], segs = args.i[1];
  const int c = int(hp_group.x * hp_group_size.x + hp_thread.x);
  if (c >= dim) return;
  float acc = 0;
  for (int s = 0; s < segs; s++) acc += part[ulong(s) * ulong(dim) + ulong(c)];
  dw[c] += acc;
}

// hp_softmax_xent: dlogits = scale·(softmax(x) − onehot(t)) per row and
// the row's −log softmax(x)[t] in loss (0 where ignored). d may alias x:
// x[t] is read before the first barrier, and each thread writes only the
// columns it read. args: i0 = rows, i1 = vocab; f0 = scale.
kernel void hp_softmax_xent(device float* d [[buffer(0)]], const device float* x [[buffer(1)]],
                            const device int* targets [[buffer(2)]], device float* loss [[buffer(3)]],
                            device atomic_uint* err [[buffer(4)]], constant HpArgs& args [[buffer(5)]],
                            HP_THREAD_PARAMS) {
  HP_SHARED float red[32];
  const int rows = args.i[0], vocab = args.i[1];
  const float scale = args.f[0];
  const uint nsimd = (hp_group_size.x + 31) / 32;
  for (int r = int(hp_group.x); r < rows; r += int(hp_groups.x)) {
    const device float* xr = x + ulong(r) * ulong(vocab);
    device float* dr = d + ulong(r) * ulong(vocab);
    const int t = targets[r];
    if (t < 0 || t >= vocab) {
      if (t >= vocab && hp_thread.x == 0) atomic_fetch_or_explicit(err, HP_ERR_XENT_TARGET, memory_order_relaxed);
      for (int j = int(hp_thread.x); j < vocab; j += int(hp_group_size.x)) dr[j] = 0;
      if (hp_thread.x == 0) loss[r] = 0;
      continue;
    }
    const float xt = xr[t];
    float m = -INFINITY;
    for (int j = int(hp_thread.x); j < vocab; j += int(hp_group_size.x)) m = fmax(m, xr[j]);
    m = hp_group_max(m, red, hp_lane, hp_simd, nsimd);
    float s = 0;
    for (int j = int(hp_thread.x); j < vocab; j += int(hp_group_size.x)) {
      const float e = precise::exp(xr[j] - m);
      dr[j] = e;
      s += e;
    }
    s = hp_group_sum(s, red, hp_lane, hp_simd, nsimd);
    if (hp_thread.x == 0) loss[r] = (m + precise::log(s)) - xt;
    const float inv = 1.0f / s;
    for (int j = int(hp_thread.x); j < vocab; j += int(hp_group_size.x)) {
      float v = dr[j] * inv * scale;
      if (j == t) v -= scale;
      dr[j] = v;
    }
  }
}

// ---- Attention ---------------------------------------------------------
//
// Layouts as tensor.AttnShape says: q, out [batch·seq_q, heads·head_dim];
// k, v [batch·seq_k, kv_heads·head_dim]; lse, dsum [batch, heads, seq_q].
// Threadgroups of HP_ATTN_THREADS threads (4 SIMD groups); a SIMD group
// computes one score at a time, its lanes striding over head_dim; chunks
// of HP_ATTN_CHUNK keys (or queries) pass their probabilities through
// threadgroup memory to threads that each own output columns.
// head_dim ≤ HP_ATTN_MAX_DIM. Shared args: i0 = heads, i1 = kv_heads,
// i2 = head_dim, i3 = seq_q, i4 = seq_k, i5 = q_offset; f0 = scale.

#define HP_ATTN_THREADS 128
#define HP_ATTN_SIMDS 4
#define HP_ATTN_CHUNK 32
#define HP_ATTN_COLS 4
#define HP_ATTN_MAX_DIM (HP_ATTN_THREADS * HP_ATTN_COLS)

static float hp_simd_dot(threadgroup const float* a, const device float* b, int n, uint lane) {
  float s = 0;
  for (int c = int(lane); c < n; c += 32) s += a[c] * b[c];
  return simd_sum(s);
}

// Threadgroups (seq_q, heads, batch).
kernel void hp_attn_forward(device float* out [[buffer(0)]], device float* lse [[buffer(1)]],
                            const device float* q [[buffer(2)]], const device float* k [[buffer(3)]],
                            const device float* v [[buffer(4)]], constant HpArgs& args [[buffer(5)]],
                            HP_THREAD_PARAMS) {
  HP_SHARED float sq[HP_ATTN_MAX_DIM];
  HP_SHARED float sp[HP_ATTN_CHUNK];
  HP_SHARED float wmax[HP_ATTN_SIMDS];
  HP_SHARED float wsum[HP_ATTN_SIMDS];
  const int heads = args.i[0], kv_heads = args.i[1], head_dim = args.i[2];
  const int seq_q = args.i[3], seq_k = args.i[4], q_offset = args.i[5];
  const float scale = args.f[0];
  const int i = int(hp_group.x), h = int(hp_group.y), b = int(hp_group.z);
  const int tid = int(hp_thread.x);
  const int g = h / (heads / kv_heads);
  const ulong qs = ulong(heads) * ulong(head_dim), kvs = ulong(kv_heads) * ulong(head_dim);
  const device float* qi = q + (ulong(b) * ulong(seq_q) + ulong(i)) * qs + ulong(h) * ulong(head_dim);
  const device float* kb = k + ulong(b) * ulong(seq_k) * kvs + ulong(g) * ulong(head_dim);
  const device float* vb = v + ulong(b) * ulong(seq_k) * kvs + ulong(g) * ulong(head_dim);
  const int lim = q_offset + i + 1;

  for (int c = tid; c < head_dim; c += HP_ATTN_THREADS) sq[c] = qi[c];
  threadgroup_barrier(mem_flags::mem_threadgroup);

  float m = -INFINITY;
  for (int j = int(hp_simd); j < lim; j += HP_ATTN_SIMDS)
    m = fmax(m, scale * hp_simd_dot(sq, kb + ulong(j) * kvs, head_dim, hp_lane));
  if (hp_lane == 0) wmax[hp_simd] = m;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  m = wmax[0];
  for (int w = 1; w < HP_ATTN_SIMDS; w++) m = fmax(m, wmax[w]);

  float z = 0;
  for (int j = int(hp_simd); j < lim; j += HP_ATTN_SIMDS)
    z += precise::exp(scale * hp_simd_dot(sq, kb + ulong(j) * kvs, head_dim, hp_lane) - m);
  if (hp_lane == 0) wsum[hp_simd] = z;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  z = 0;
  for (int w = 0; w < HP_ATTN_SIMDS; w++) z += wsum[w];
  const float inv = 1.0f / z;
  if (tid == 0) lse[(ulong(b) * ulong(heads) + ulong(h)) * ulong(seq_q) + ulong(i)] = m + precise::log(z);

  float acc[HP_ATTN_COLS] = {0, 0, 0, 0};
  for (int j0 = 0; j0 < lim; j0 += HP_ATTN_CHUNK) {
    for (int jj = int(hp_simd); jj < HP_ATTN_CHUNK; jj += HP_ATTN_SIMDS) {
      const int j = j0 + jj;
      float p = 0;
      if (j < lim) p = precise::exp(scale * hp_simd_dot(sq, kb + ulong(j) * kvs, head_dim, hp_lane) - m) * inv;
      if (hp_lane == 0) sp[jj] = p;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const int n = min(HP_ATTN_CHUNK, lim - j0);
    for (int t = 0; t < HP_ATTN_COLS; t++) {
      const int c = tid + t * HP_ATTN_THREADS;
      if (c < head_dim) {
        float a = acc[t];
        for (int jj = 0; jj < n; jj++) a += sp[jj] * vb[ulong(j0 + jj) * kvs + ulong(c)];
        acc[t] = a;
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  device float* oi = out + (ulong(b) * ulong(seq_q) + ulong(i)) * qs + ulong(h) * ulong(head_dim);
  for (int t = 0; t < HP_ATTN_COLS; t++) {
    const int c = tid + t * HP_ATTN_THREADS;
    if (c < head_dim) oi[c] = acc[t];
  }
}

// Threadgroups (seq_q, heads, batch). Writes D_i = dO_i·O_i to dsum, for
// hp_attn_backward_kv, and dq_i = scale·Σ_j P_ij(dO_i·v_j − D_i)·k_j.
kernel void hp_attn_backward_q(device float* dq [[buffer(0)]], device float* dsum [[buffer(1)]],
                               const device float* dout [[buffer(2)]], const device float* q [[buffer(3)]],
                               const device float* k [[buffer(4)]], const device float* v [[buffer(5)]],
                               const device float* out [[buffer(6)]], const device float* lse [[buffer(7)]],
                               constant HpArgs& args [[buffer(8)]], HP_THREAD_PARAMS) {
  HP_SHARED float sq[HP_ATTN_MAX_DIM];
  HP_SHARED float sdo[HP_ATTN_MAX_DIM];
  HP_SHARED float sds[HP_ATTN_CHUNK];
  HP_SHARED float red[HP_ATTN_SIMDS];
  const int heads = args.i[0], kv_heads = args.i[1], head_dim = args.i[2];
  const int seq_q = args.i[3], seq_k = args.i[4], q_offset = args.i[5];
  const float scale = args.f[0];
  const int i = int(hp_group.x), h = int(hp_group.y), b = int(hp_group.z);
  const int tid = int(hp_thread.x);
  const int g = h / (heads / kv_heads);
  const ulong qs = ulong(heads) * ulong(head_dim), kvs = ulong(kv_heads) * ulong(head_dim);
  const ulong qoff = (ulong(b) * ulong(seq_q) + ulong(i)) * qs + ulong(h) * ulong(head_dim);
  const device float* kb = k + ulong(b) * ulong(seq_k) * kvs + ulong(g) * ulong(head_dim);
  const device float* vb = v + ulong(b) * ulong(seq_k) * kvs + ulong(g) * ulong(head_dim);
  const int lim = q_offset + i + 1;

  float d = 0;
  for (int c = tid; c < head_dim; c += HP_ATTN_THREADS) {
    sq[c] = q[qoff + ulong(c)];
    sdo[c] = dout[qoff + ulong(c)];
    d += dout[qoff + ulong(c)] * out[qoff + ulong(c)];
  }
  d = hp_group_sum(d, red, hp_lane, hp_simd, HP_ATTN_SIMDS);  // its barriers also publish sq and sdo
  const ulong row = (ulong(b) * ulong(heads) + ulong(h)) * ulong(seq_q) + ulong(i);
  if (tid == 0) dsum[row] = d;
  const float l = lse[row];

  float acc[HP_ATTN_COLS] = {0, 0, 0, 0};
  for (int j0 = 0; j0 < lim; j0 += HP_ATTN_CHUNK) {
    for (int jj = int(hp_simd); jj < HP_ATTN_CHUNK; jj += HP_ATTN_SIMDS) {
      const int j = j0 + jj;
      float ds = 0;
      if (j < lim) {
        const float s = scale * hp_simd_dot(sq, kb + ulong(j) * kvs, head_dim, hp_lane);
        const float dp = hp_simd_dot(sdo, vb + ulong(j) * kvs, head_dim, hp_lane);
        ds = precise::exp(s - l) * (dp - d);
      }
      if (hp_lane == 0) sds[jj] = ds;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const int n = min(HP_ATTN_CHUNK, lim - j0);
    for (int t = 0; t < HP_ATTN_COLS; t++) {
      const int c = tid + t * HP_ATTN_THREADS;
      if (c < head_dim) {
        float a = acc[t];
        for (int jj = 0; jj < n; jj++) a += sds[jj] * kb[ulong(j0 + jj) * kvs + ulong(c)];
        acc[t] = a;
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  for (int t = 0; t < HP_ATTN_COLS; t++) {
    const int c = tid + t * HP_ATTN_THREADS;
    if (c < head_dim) dq[qoff + ulong(c)] = scale * acc[t];
  }
}

// Threadgroups (seq_k, kv_heads, batch). For key row j of kv head g, over
// the group's query heads and the queries that see j:
// dv_j = Σ P_ij·dO_i and dk_j = scale·Σ P_ij(dO_i·v_j − D_i)·q_i.
kernel void hp_attn_backward_kv(device float* dk [[buffer(0)]], device float* dv [[buffer(1)]],
                                const device float* dout [[buffer(2)]], const device float* q [[buffer(3)]],
                                const device float* k [[buffer(4)]], const device float* v [[buffer(5)]],
                                const device float* lse [[buffer(6)]], const device float* dsum [[buffer(7)]],
                                constant HpArgs& args [[buffer(8)]], HP_THREAD_PARAMS) {
  HP_SHARED float sk[HP_ATTN_MAX_DIM];
  HP_SHARED float sv[HP_ATTN_MAX_DIM];
  HP_SHARED float sp[HP_ATTN_CHUNK];
  HP_SHARED float sds[HP_ATTN_CHUNK];
  const int heads = args.i[0], kv_heads = args.i[1], head_dim = args.i[2];
  const int seq_q = args.i[3], seq_k = args.i[4], q_offset = args.i[5];
  const float scale = args.f[0];
  const int j = int(hp_group.x), g = int(hp_group.y), b = int(hp_group.z);
  const int tid = int(hp_thread.x);
  const int group = heads / kv_heads;
  const ulong qs = ulong(heads) * ulong(head_dim), kvs = ulong(kv_heads) * ulong(head_dim);
  const ulong koff = (ulong(b) * ulong(seq_k) + ulong(j)) * kvs + ulong(g) * ulong(head_dim);

  for (int c = tid; c < head_dim; c += HP_ATTN_THREADS) {
    sk[c] = k[koff + ulong(c)];
    sv[c] = v[koff + ulong(c)];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  float acck[HP_ATTN_COLS] = {0, 0, 0, 0};
  float accv[HP_ATTN_COLS] = {0, 0, 0, 0};
  const int first = max(0, j - q_offset);
  for (int hh = 0; hh < group; hh++) {
    const int h = g * group + hh;
    const device float* qb = q + ulong(b) * ulong(seq_q) * qs + ulong(h) * ulong(head_dim);
    const device float* dob = dout + ulong(b) * ulong(seq_q) * qs + ulong(h) * ulong(head_dim);
    const device float* lrow = lse + (ulong(b) * ulong(heads) + ulong(h)) * ulong(seq_q);
    const device float* drow = dsum + (ulong(b) * ulong(heads) + ulong(h)) * ulong(seq_q);
    for (int i0 = first; i0 < seq_q; i0 += HP_ATTN_CHUNK) {
      for (int ii = int(hp_simd); ii < HP_ATTN_CHUNK; ii += HP_ATTN_SIMDS) {
        const int i = i0 + ii;
        float p = 0, ds = 0;
        if (i < seq_q) {
          const float s = scale * hp_simd_dot(sk, qb + ulong(i) * qs, head_dim, hp_lane);
          const float dp = hp_simd_dot(sv, dob + ulong(i) * qs, head_dim, hp_lane);
          p = precise::exp(s - lrow[i]);
          ds = p * (dp - drow[i]);
        }
        if (hp_lane == 0) {
          sp[ii] = p;
          sds[ii] = ds;
        }
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      const int n = min(HP_ATTN_CHUNK, seq_q - i0);
      for (int t = 0; t < HP_ATTN_COLS; t++) {
        const int c = tid + t * HP_ATTN_THREADS;
        if (c < head_dim) {
          float ak = acck[t], av = accv[t];
          for (int ii = 0; ii < n; ii++) {
            const ulong o = ulong(i0 + ii) * qs + ulong(c);
            av += sp[ii] * dob[o];
            ak += sds[ii] * qb[o];
          }
          acck[t] = ak;
          accv[t] = av;
        }
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
    }
  }
  for (int t = 0; t < HP_ATTN_COLS; t++) {
    const int c = tid + t * HP_ATTN_THREADS;
    if (c < head_dim) {
      dk[koff + ulong(c)] = scale * acck[t];
      dv[koff + ulong(c)] = accv[t];
    }
  }
}

// ---- GEMM --------------------------------------------------------------

// hp_gemm: C = alpha·op(A)·op(B) + beta·C, row-major, op(A) m×k, op(B)
// k×n; C is not read when beta is 0. Threadgroups (⌈n/64⌉, ⌈m/64⌉) of
// 256 threads; each thread computes a 4×4 block of a 64×64 tile of C,
// stepping through k in slices of 16 staged in threadgroup memory.
// args: i0 = m, i1 = n, i2 = k, i3 = transA, i4 = transB; f0 = alpha,
// f1 = beta.
#define HP_GEMM_TILE 64
#define HP_GEMM_K 16
#define HP_GEMM_THREADS 256

kernel void hp_gemm(const device float* A [[buffer(0)]], const device float* B [[buffer(1)]],
                    device float* C [[buffer(2)]], constant HpArgs& args [[buffer(3)]], HP_THREAD_PARAMS) {
  HP_SHARED float As[HP_GEMM_K][HP_GEMM_TILE];
  HP_SHARED float Bs[HP_GEMM_K][HP_GEMM_TILE];
  const int m = args.i[0], n = args.i[1], kd = args.i[2], ta = args.i[3], tb = args.i[4];
  const float alpha = args.f[0], beta = args.f[1];
  const int tid = int(hp_thread.x);
  const int tx = tid % 16, ty = tid / 16;
  const int row0 = int(hp_group.y) * HP_GEMM_TILE, col0 = int(hp_group.x) * HP_GEMM_TILE;
  float acc[4][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}};
  for (int k0 = 0; k0 < kd; k0 += HP_GEMM_K) {
    for (int e = tid; e < HP_GEMM_TILE * HP_GEMM_K; e += HP_GEMM_THREADS) {
      const int r = e / HP_GEMM_K, kk = e % HP_GEMM_K;
      const int gr = row0 + r, gk = k0 + kk;
      float val = 0;
      if (gr < m && gk < kd) val = ta != 0 ? A[ulong(gk) * ulong(m) + ulong(gr)] : A[ulong(gr) * ulong(kd) + ulong(gk)];
      As[kk][r] = val;
    }
    for (int e = tid; e < HP_GEMM_TILE * HP_GEMM_K; e += HP_GEMM_THREADS) {
      const int kk = e / HP_GEMM_TILE, c = e % HP_GEMM_TILE;
      const int gk = k0 + kk, gc = col0 + c;
      float val = 0;
      if (gk < kd && gc < n) val = tb != 0 ? B[ulong(gc) * ulong(kd) + ulong(gk)] : B[ulong(gk) * ulong(n) + ulong(gc)];
      Bs[kk][c] = val;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int kk = 0; kk < HP_GEMM_K; kk++) {
      float av[4], bv[4];
      for (int x = 0; x < 4; x++) av[x] = As[kk][ty * 4 + x];
      for (int y = 0; y < 4; y++) bv[y] = Bs[kk][tx * 4 + y];
      for (int x = 0; x < 4; x++)
        for (int y = 0; y < 4; y++) acc[x][y] += av[x] * bv[y];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  for (int x = 0; x < 4; x++) {
    for (int y = 0; y < 4; y++) {
      const int r = row0 + ty * 4 + x, c = col0 + tx * 4 + y;
      if (r < m && c < n) {
        const ulong o = ulong(r) * ulong(n) + ulong(c);
        float val = alpha * acc[x][y];
        if (beta != 0) val += beta * C[o];
        C[o] = val;
      }
    }
  }
}
