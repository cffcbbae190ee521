//go:build (cudaemu || metalemu) && linux && amd64

// The emulator's scheduler and memory (see doc.go).

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "emu.h"
#include "registry.h"
#include "shim.h"

hp_uint3 threadIdx, blockIdx, blockDim, gridDim;

extern "C" void hp_emu_swap(void **save_sp, void *load_sp);
extern "C" void hp_emu_trampoline(void);

namespace {

enum State { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kDone, kFaulted };

struct Fiber {
  void *sp = nullptr;
  State state = kDone;
};

constexpr size_t kStackBytes = 256 << 10;
constexpr int kMaxThreads = 1024;
constexpr int kMaxSharedBytes = 48 << 10;  // CUDA's default per block

std::mutex launch_mu;  // one launch at a time: the state below is global
std::vector<char *> stacks;
std::vector<Fiber> fibers;
std::vector<uint64_t> shfl_slots(kMaxThreads);
std::vector<unsigned char> dyn_shared;
void *sched_sp;
int cur;
const hp_emu_kernel *cur_kernel;
const uint64_t *cur_args;
std::string fault;

std::mutex mem_mu;
std::map<uintptr_t, std::pair<void *, size_t>> mappings;  // allocation → its mapping

size_t page_size() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

// stack returns fiber i's stack, mapped once with an inaccessible page at
// its low end, so an overflow faults.
char *stack(int i) {
  while (static_cast<int>(stacks.size()) <= i) {
    size_t guard = page_size();
    void *m = mmap(nullptr, kStackBytes + guard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    mprotect(m, guard, PROT_NONE);
    stacks.push_back(static_cast<char *>(m) + guard);
  }
  return stacks[i];
}

void park(State s) {
  fibers[cur].state = s;
  hp_emu_swap(&fibers[cur].sp, sched_sp);
}

extern "C" void hp_emu_fiber_main(void *) {
  cur_kernel->run(cur_args);
  fibers[cur].state = kDone;
  hp_emu_swap(&fibers[cur].sp, sched_sp);
  __builtin_trap();  // a finished fiber is never resumed
}

bool start_fiber(int i) {
  char *base = stack(i);
  if (base == nullptr) return false;
  auto top = reinterpret_cast<uintptr_t>(base + kStackBytes) & ~static_cast<uintptr_t>(15);
  auto *sp = reinterpret_cast<uint64_t *>(top);
  *--sp = 0;                                                  // padding
  *--sp = reinterpret_cast<uint64_t>(&hp_emu_trampoline);     // where the first switch returns
  *--sp = 0;                                                  // rbp
  *--sp = 0;                                                  // rbx
  *--sp = 0;                                                  // r12: the entry's argument
  *--sp = reinterpret_cast<uint64_t>(&hp_emu_fiber_main);     // r13: the entry
  *--sp = 0;                                                  // r14
  *--sp = 0;                                                  // r15
  fibers[i].sp = sp;
  fibers[i].state = kRunnable;
  return true;
}

std::string where() {
  char buf[160];
  snprintf(buf, sizeof buf, "%s block (%u,%u,%u)", cur_kernel->name, blockIdx.x, blockIdx.y, blockIdx.z);
  return buf;
}

// run_block runs every thread of the current block to completion.
bool run_block(int n) {
  for (int i = 0; i < n; i++) {
    if (!start_fiber(i)) {
      fault = "cannot map a fiber stack";
      return false;
    }
  }
  // Shared memory starts as garbage on a GPU; NaNs make a read before the
  // first write show.
  for (size_t i = 0; i + 4 <= dyn_shared.size(); i += 4) {
    uint32_t nan = 0x7fc0dead;
    memcpy(&dyn_shared[i], &nan, 4);
  }
  for (;;) {
    for (int i = 0; i < n; i++) {
      if (fibers[i].state != kRunnable) continue;
      cur = i;
      threadIdx = hp_uint3{static_cast<unsigned>(i), 0, 0};
      hp_emu_swap(&sched_sp, fibers[i].sp);
      if (fibers[i].state == kFaulted) {
        fault = where() + " thread " + std::to_string(i) + ": " + fault;
        return false;
      }
    }
    int done = 0, at_block = 0;
    for (int i = 0; i < n; i++) {
      done += fibers[i].state == kDone;
      at_block += fibers[i].state == kAtBlockBarrier;
    }
    if (done == n) return true;
    bool released = false;
    for (int lo = 0; lo < n; lo += 32) {
      int hi = min(n, lo + 32);
      bool all = true;
      for (int i = lo; i < hi; i++) all = all && fibers[i].state == kAtWarpBarrier;
      if (all) {
        for (int i = lo; i < hi; i++) fibers[i].state = kRunnable;
        released = true;
      }
    }
    if (!released && at_block > 0 && at_block + done == n) {
      for (int i = 0; i < n; i++) {
        if (fibers[i].state == kAtBlockBarrier) fibers[i].state = kRunnable;
      }
      released = true;
    }
    if (!released) {
      int at_warp = n - done - at_block;
      fault = where() + ": threads diverge around a barrier (" + std::to_string(at_block) +
              " at __syncthreads, " + std::to_string(at_warp) + " in a warp shuffle whose warp is not complete, " +
              std::to_string(done) + " finished)";
      return false;
    }
  }
}

void set_err(char *err, int errlen, const std::string &msg) {
  if (errlen > 0) snprintf(err, static_cast<size_t>(errlen), "%s", msg.c_str());
}

}  // namespace

void *hp_emu_dyn_shared() { return dyn_shared.data(); }

const hp_emu_kernel *hp_emu_find_kernel(const char *name) {
  for (const auto *t : {&hp_emu_cuda_table(), &hp_emu_metal_table()}) {
    for (const auto &k : *t) {
      if (strcmp(k.name, name) == 0) return &k;
    }
  }
  return nullptr;
}

int hp_emu_kernels_len() { return static_cast<int>(hp_emu_cuda_table().size() + hp_emu_metal_table().size()); }

const hp_emu_kernel &hp_emu_kernel_at(int i) {
  const auto &c = hp_emu_cuda_table();
  if (i < static_cast<int>(c.size())) return c[i];
  return hp_emu_metal_table()[i - c.size()];
}

void __syncthreads() { park(kAtBlockBarrier); }

void hp_emu_warp_barrier() { park(kAtWarpBarrier); }

uint64_t *hp_emu_shfl_slots() { return shfl_slots.data(); }

void hp_emu_fault(const char *what) {
  fault = what;
  park(kFaulted);
  __builtin_trap();  // a faulted fiber is never resumed
}

extern "C" int hp_emu_launch(const char *kernel, int gx, int gy, int gz, int block, int shmem,
                             const uint64_t *args, int nargs, char *err, int errlen) {
  std::lock_guard<std::mutex> lock(launch_mu);
  const hp_emu_kernel *k = hp_emu_find_kernel(kernel);
  if (k == nullptr) {
    set_err(err, errlen, std::string("no kernel ") + kernel);
    return -1;
  }
  if (nargs != k->nargs) {
    set_err(err, errlen, std::string(kernel) + ": " + std::to_string(nargs) + " arguments for " +
                             std::to_string(k->nargs) + " parameters");
    return -1;
  }
  if (gx < 1 || gy < 1 || gz < 1 || gy > 65535 || gz > 65535 || block < 1 || block > kMaxThreads) {
    set_err(err, errlen, std::string(kernel) + ": invalid launch geometry");
    return -1;
  }
  if (shmem < 0 || shmem > kMaxSharedBytes) {
    set_err(err, errlen, std::string(kernel) + ": " + std::to_string(shmem) + " bytes of shared memory");
    return -1;
  }
  fibers.assign(block, Fiber{});
  dyn_shared.assign(static_cast<size_t>(shmem), 0);
  cur_kernel = k;
  cur_args = args;
  gridDim = hp_uint3{static_cast<unsigned>(gx), static_cast<unsigned>(gy), static_cast<unsigned>(gz)};
  blockDim = hp_uint3{static_cast<unsigned>(block), 1, 1};
  for (int z = 0; z < gz; z++) {
    for (int y = 0; y < gy; y++) {
      for (int x = 0; x < gx; x++) {
        blockIdx = hp_uint3{static_cast<unsigned>(x), static_cast<unsigned>(y), static_cast<unsigned>(z)};
        if (!run_block(block)) {
          set_err(err, errlen, fault);
          return -1;
        }
      }
    }
  }
  return 0;
}

extern "C" int hp_emu_kernel_count(void) { return hp_emu_kernels_len(); }

extern "C" const char *hp_emu_kernel_name(int i) { return hp_emu_kernel_at(i).name; }

extern "C" uintptr_t hp_emu_alloc(int64_t bytes) {
  if (bytes <= 0) return 0;
  size_t page = page_size();
  size_t body = (static_cast<size_t>(bytes) + page - 1) / page * page;
  void *m = mmap(nullptr, body + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return 0;
  mprotect(static_cast<char *>(m) + body, page, PROT_NONE);
  auto p = reinterpret_cast<uintptr_t>(m) + body - static_cast<size_t>(bytes);
  std::lock_guard<std::mutex> lock(mem_mu);
  mappings[p] = {m, body + page};
  return p;
}

extern "C" int hp_emu_free(uintptr_t p) {
  std::lock_guard<std::mutex> lock(mem_mu);
  auto it = mappings.find(p);
  if (it == mappings.end()) return -1;
  munmap(it->second.first, it->second.second);
  mappings.erase(it);
  return 0;
}

extern "C" void hp_emu_memset32(uintptr_t p, uint32_t v, int64_t n) {
  auto *d = reinterpret_cast<uint32_t *>(p);
  for (int64_t i = 0; i < n; i++) d[i] = v;
}

extern "C" void hp_emu_copy(uintptr_t dst, uintptr_t src, int64_t bytes) {
  memmove(reinterpret_cast<void *>(dst), reinterpret_cast<const void *>(src), static_cast<size_t>(bytes));
}

extern "C" void hp_emu_copy_in(uintptr_t dst, const void *src, int64_t bytes) {
  memcpy(reinterpret_cast<void *>(dst), src, static_cast<size_t>(bytes));
}

extern "C" void hp_emu_copy_out(void *dst, uintptr_t src, int64_t bytes) {
  memcpy(dst, reinterpret_cast<const void *>(src), static_cast<size_t>(bytes));
}

extern "C" void hp_emu_sgemm(int transa, int transb, int m, int n, int k, float alpha, uintptr_t a, int lda,
                             uintptr_t b, int ldb, float beta, uintptr_t c, int ldc) {
  const float *A = reinterpret_cast<const float *>(a);
  const float *B = reinterpret_cast<const float *>(b);
  float *C = reinterpret_cast<float *>(c);
  for (int j = 0; j < n; j++) {
    for (int i = 0; i < m; i++) {
      float s = 0;
      for (int p = 0; p < k; p++) {
        float av = transa ? A[p + static_cast<size_t>(i) * lda] : A[i + static_cast<size_t>(p) * lda];
        float bv = transb ? B[j + static_cast<size_t>(p) * ldb] : B[p + static_cast<size_t>(j) * ldb];
        s += av * bv;
      }
      float *cij = &C[i + static_cast<size_t>(j) * ldc];
      *cij = beta == 0 ? alpha * s : alpha * s + beta * *cij;
    }
  }
}
