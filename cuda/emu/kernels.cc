//go:build cudaemu && linux && amd64

// The kernels of cuda/kernels, compiled as C++ against shim.h, and the
// table that launches them by name.

#include <type_traits>
#include <utility>
#include <vector>

#include "shim.h"

// kernel_*.h are links to ../kernels/*.cu: as .h files of this package
// they are part of its build hash, so editing a kernel rebuilds the
// emulator. (kernel_common.h is there for the same reason; the sources
// include common.cuh through -I../kernels.)
#include "kernel_elementwise.h"
#include "kernel_rows.h"
#include "kernel_attention.h"

namespace {

// arg_as reads a kernel parameter of type T from its 8-byte slot the way
// the driver does: as many low bytes as T has.
template <typename T>
T arg_as(uint64_t v) {
  if constexpr (std::is_pointer_v<T>) {
    return reinterpret_cast<T>(static_cast<uintptr_t>(v));
  } else {
    static_assert(std::is_arithmetic_v<T>, "unsupported kernel parameter type");
    T out;
    memcpy(&out, &v, sizeof(T));
    return out;
  }
}

template <typename... A, size_t... I>
void call_with(void (*f)(A...), const uint64_t *args, std::index_sequence<I...>) {
  f(arg_as<A>(args[I])...);
}

template <typename... A>
hp_emu_kernel entry(const char *name, void (*f)(A...)) {
  return hp_emu_kernel{name, static_cast<int>(sizeof...(A)),
                       [f](const uint64_t *args) { call_with(f, args, std::index_sequence_for<A...>{}); }};
}

const std::vector<hp_emu_kernel> &table() {
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

}  // namespace

const hp_emu_kernel *hp_emu_find_kernel(const char *name) {
  for (const auto &k : table()) {
    if (strcmp(k.name, name) == 0) return &k;
  }
  return nullptr;
}

int hp_emu_kernels_len() { return static_cast<int>(table().size()); }

const hp_emu_kernel &hp_emu_kernel_at(int i) { return table()[i]; }
