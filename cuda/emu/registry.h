// Building the emulator's kernel tables: entry(name, f) wraps a kernel
// function so that it can be called with its arguments in 8-byte slots.
#pragma once

#include <type_traits>
#include <utility>
#include <vector>

#include "shim.h"

// hp_emu_thread_params stands for a Metal kernel's thread-position
// parameters (HP_THREAD_PARAMS), which the scheduler supplies as globals:
// it takes no argument slot.
struct hp_emu_thread_params {};

namespace hp_emu_registry {

// arg_at reads parameter I of type T from its slot the way the driver
// does: as many low bytes as T has; a reference is the object at the
// address in the slot (Metal's constant HpArgs&).
template <typename T>
T arg_at(const uint64_t *args, size_t i) {
  if constexpr (std::is_same_v<std::decay_t<T>, hp_emu_thread_params>) {
    return T{};
  } else if constexpr (std::is_reference_v<T>) {
    return *reinterpret_cast<std::remove_reference_t<T> *>(static_cast<uintptr_t>(args[i]));
  } else if constexpr (std::is_pointer_v<T>) {
    return reinterpret_cast<T>(static_cast<uintptr_t>(args[i]));
  } else {
    static_assert(std::is_arithmetic_v<T>, "unsupported kernel parameter type");
    T out;
    uint64_t v = args[i];
    memcpy(&out, &v, sizeof(T));
    return out;
  }
}

template <typename... A, size_t... I>
void call_with(void (*f)(A...), const uint64_t *args, std::index_sequence<I...>) {
  f(arg_at<A>(args, I)...);
}

template <typename... A>
hp_emu_kernel entry(const char *name, void (*f)(A...)) {
  constexpr int slots = (0 + ... + (std::is_same_v<std::decay_t<A>, hp_emu_thread_params> ? 0 : 1));
  return hp_emu_kernel{name, slots,
                       [f](const uint64_t *args) { call_with(f, args, std::index_sequence_for<A...>{}); }};
}

}  // namespace hp_emu_registry

// The tables of the translation units that compile kernels.
const std::vector<hp_emu_kernel> &hp_emu_cuda_table();
const std::vector<hp_emu_kernel> &hp_emu_metal_table();
