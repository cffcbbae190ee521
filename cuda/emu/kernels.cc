//go:build (cudaemu || metalemu) && linux && amd64

// The kernels of cuda/kernels, compiled as C++ against shim.h, and their
// table.

#include "registry.h"
#include "shim.h"

// kernel_*.h are links to ../kernels/*.cu: as .h files of this package
// they are part of its build hash, so editing a kernel rebuilds the
// emulator. (kernel_common.h is there for the same reason; the sources
// include common.cuh through -I../kernels.)
#include "kernel_elementwise.h"
#include "kernel_rows.h"
#include "kernel_attention.h"

using hp_emu_registry::entry;

const std::vector<hp_emu_kernel> &hp_emu_cuda_table() {
  static const std::vector<hp_emu_kernel> t = {
      entry("hp_add", hp_add),
      entry("hp_axpy", hp_axpy),
      entry("hp_scale", hp_scale),
      entry("hp_sumsq_partial", hp_sumsq_partial),
      entry("hp_gather", hp_gather),
      entry("hp_scatter_add", hp_scatter_add),
      entry("hp_swiglu", hp_swiglu),
      entry("hp_swiglu_backward", hp_swiglu_backward),
      entry("hp_adamw", hp_adamw),
      entry("hp_rope", hp_rope),
      entry("hp_softmax", hp_softmax),
      entry("hp_rmsnorm", hp_rmsnorm),
      entry("hp_rmsnorm_backward_dx", hp_rmsnorm_backward_dx),
      entry("hp_rmsnorm_backward_dw_partial", hp_rmsnorm_backward_dw_partial),
      entry("hp_rmsnorm_backward_dw_final", hp_rmsnorm_backward_dw_final),
      entry("hp_softmax_xent", hp_softmax_xent),
      entry("hp_attn_forward", hp_attn_forward),
      entry("hp_attn_backward_q", hp_attn_backward_q),
      entry("hp_attn_backward_kv", hp_attn_backward_kv),
  };
  return t;
}
