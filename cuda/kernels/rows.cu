// Row-wise ops: softmax, RMSNorm and its backward, softmax cross-entropy.
// One block per row; sums run in float64 as the cpu backend's do.
#include "common.cuh"

// hp_softmax writes softmax(x) row by row to dst, which may alias x: each
// thread reads and writes only its own columns, after the block's maximum
// is known.
extern "C" __global__ void hp_softmax(float* dst, const float* x, int rows, int cols) {
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + (size_t)r * cols;
    float* dr = dst + (size_t)r * cols;
    float m = HP_NEG_INF;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, xr[j]);
    m = hp_block_max(m);
    double s = 0;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
      float e = hp_exp(xr[j] - m);
      dr[j] = e;
      s += (double)e;
    }
    s = hp_block_sum_d(s);
    double inv = 1.0 / s;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) dr[j] = (float)((double)dr[j] * inv);
  }
}

// hp_rmsnorm: out = w ∘ (x·rstd) with rstd = 1/sqrt(mean(x²)+eps) rounded as
// transformers' LlamaRMSNorm does in float32.
extern "C" __global__ void hp_rmsnorm(float* out, float* rstd, const float* x, const float* w, int rows, int dim,
                                      float eps) {
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + (size_t)r * dim;
    float* orow = out + (size_t)r * dim;
    double ss = 0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
      double v = (double)xr[j];
      ss += v * v;
    }
    ss = hp_block_sum_d(ss);
    float mean = (float)(ss / (double)dim);
    float inv = (float)(1.0 / sqrt((double)(mean + eps)));
    if (threadIdx.x == 0) rstd[r] = inv;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) orow[j] = w[j] * (xr[j] * inv);
  }
}

// hp_rmsnorm_backward_dx: dx += rstd·w∘dy − rstd³·(Σ w·dy·x)/dim · x.
extern "C" __global__ void hp_rmsnorm_backward_dx(float* dx, const float* dy, const float* x, const float* w,
                                                  const float* rstd, int rows, int dim) {
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + (size_t)r * dim;
    const float* dyr = dy + (size_t)r * dim;
    float* dxr = dx + (size_t)r * dim;
    double inv = (double)rstd[r];
    double dot = 0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) dot += (double)w[j] * (double)dyr[j] * (double)xr[j];
    dot = hp_block_sum_d(dot);
    double c = inv * inv * inv * dot / (double)dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
      dxr[j] += (float)(inv * (double)w[j] * (double)dyr[j] - c * (double)xr[j]);
  }
}

// hp_rmsnorm_backward_dw_partial sums dy·(x·rstd) over one segment of rows
// per blockIdx.y, one column per thread, rows in order, into part[seg,col].
extern "C" __global__ void hp_rmsnorm_backward_dw_partial(double* part, const float* dy, const float* x,
                                                          const float* rstd, int rows, int dim, int seg_rows) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  int seg = blockIdx.y;
  int r0 = seg * seg_rows, r1 = min(rows, r0 + seg_rows);
  double acc = 0;
  for (int r = r0; r < r1; r++) {
    float inv = rstd[r];
    acc += (double)dy[(size_t)r * dim + c] * (double)(x[(size_t)r * dim + c] * inv);
  }
  part[(size_t)seg * dim + c] = acc;
}

// hp_rmsnorm_backward_dw_final adds the segments in order: dw += Σ part.
extern "C" __global__ void hp_rmsnorm_backward_dw_final(float* dw, const double* part, int dim, int segs) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  double acc = 0;
  for (int s = 0; s < segs; s++) acc += part[(size_t)s * dim + c];
  dw[c] += (float)acc;
}

// hp_softmax_xent writes dlogits = scale·(softmax(x) − onehot(t)) per row and
// the row's −log softmax(x)[t] into loss (0 where the target is ignored).
// dlogits may alias logits: x[t] is read by every thread before the block's
// first barrier, and each thread writes only the columns it read.
extern "C" __global__ void hp_softmax_xent(float* d, const float* x, const int* targets, double* loss, int rows,
                                           int vocab, float scale, unsigned int* err) {
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + (size_t)r * vocab;
    float* dr = d + (size_t)r * vocab;
    int t = targets[r];
    if (t < 0 || t >= vocab) {
      if (t >= vocab && threadIdx.x == 0) atomicOr(err, HP_ERR_XENT_TARGET);
      for (int j = threadIdx.x; j < vocab; j += blockDim.x) dr[j] = 0;
      if (threadIdx.x == 0) loss[r] = 0;
      continue;
    }
    double xt = (double)xr[t];
    float m = HP_NEG_INF;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) m = fmaxf(m, xr[j]);
    m = hp_block_max(m);
    double s = 0;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
      float e = hp_exp(xr[j] - m);
      dr[j] = e;
      s += (double)e;
    }
    s = hp_block_sum_d(s);
    if (threadIdx.x == 0) loss[r] = (double)m + log(s) - xt;
    double inv = 1.0 / s;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
      float v = (float)((double)dr[j] * inv) * scale;
      if (j == t) v -= scale;
      dr[j] = v;
    }
  }
}
