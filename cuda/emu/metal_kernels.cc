//go:build (cudaemu || metalemu) && linux && amd64

// The kernels of metal/kernels.metal, compiled as C++ against msl_shim.h
// (namespace hp_metal keeps them apart from the CUDA ones), and their
// table, whose names have a "metal/" prefix.

#include "msl_shim.h"
#include "registry.h"

namespace hp_metal {
// kernel_metal.h is a link to ../../metal/kernels.metal: as a .h file of
// this package it is part of its build hash.
#include "kernel_metal.h"
}  // namespace hp_metal

using hp_emu_registry::entry;

const std::vector<hp_emu_kernel> &hp_emu_metal_table() {
  static const std::vector<hp_emu_kernel> t = {
      entry("metal/hp_fill", hp_metal::hp_fill),
      entry("metal/hp_copy", hp_metal::hp_copy),
      entry("metal/hp_add", hp_metal::hp_add),
      entry("metal/hp_axpy", hp_metal::hp_axpy),
      entry("metal/hp_scale", hp_metal::hp_scale),
      entry("metal/hp_sumsq_partial", hp_metal::hp_sumsq_partial),
      entry("metal/hp_gather", hp_metal::hp_gather),
      entry("metal/hp_scatter_add", hp_metal::hp_scatter_add),
      entry("metal/hp_swiglu", hp_metal::hp_swiglu),
      entry("metal/hp_swiglu_backward", hp_metal::hp_swiglu_backward),
      entry("metal/hp_adamw", hp_metal::hp_adamw),
      entry("metal/hp_rope", hp_metal::hp_rope),
      entry("metal/hp_softmax", hp_metal::hp_softmax),
      entry("metal/hp_rmsnorm", hp_metal::hp_rmsnorm),
      entry("metal/hp_rmsnorm_backward_dx", hp_metal::hp_rmsnorm_backward_dx),
      entry("metal/hp_rmsnorm_backward_dw_partial", hp_metal::hp_rmsnorm_backward_dw_partial),
      entry("metal/hp_rmsnorm_backward_dw_final", hp_metal::hp_rmsnorm_backward_dw_final),
      entry("metal/hp_softmax_xent", hp_metal::hp_softmax_xent),
      entry("metal/hp_attn_forward", hp_metal::hp_attn_forward),
      entry("metal/hp_attn_backward_q", hp_metal::hp_attn_backward_q),
      entry("metal/hp_attn_backward_kv", hp_metal::hp_attn_backward_kv),
      entry("metal/hp_gemm", hp_metal::hp_gemm),
  };
  return t;
}
