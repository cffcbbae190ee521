// C interface of the CUDA emulator (see doc.go).
#ifndef HOLOPEER_CUDA_EMU_H
#define HOLOPEER_CUDA_EMU_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// hp_emu_alloc returns bytes of zeroed memory that end at an inaccessible
// page, or 0.
uintptr_t hp_emu_alloc(int64_t bytes);
// hp_emu_free releases an allocation; it returns -1 for an unknown address.
int hp_emu_free(uintptr_t p);
void hp_emu_memset32(uintptr_t p, uint32_t v, int64_t n);
void hp_emu_copy(uintptr_t dst, uintptr_t src, int64_t bytes);
void hp_emu_copy_in(uintptr_t dst, const void *src, int64_t bytes);
void hp_emu_copy_out(void *dst, uintptr_t src, int64_t bytes);

// hp_emu_launch runs kernel over the grid with 1-D blocks of block
// threads and shmem bytes of dynamic shared memory, with arguments in
// 8-byte slots as cuLaunchKernel's caller passes them. It returns 0, or -1
// with a message in err.
int hp_emu_launch(const char *kernel, int gx, int gy, int gz, int block, int shmem, const uint64_t *args,
                  int nargs, char *err, int errlen);

// hp_emu_kernel_count and hp_emu_kernel_name list the kernels compiled in.
int hp_emu_kernel_count(void);
const char *hp_emu_kernel_name(int i);

// hp_emu_sgemm is cublasSgemm's arithmetic: column-major,
// C = alpha·op(A)·op(B) + beta·C, with C not read when beta is 0.
void hp_emu_sgemm(int transa, int transb, int m, int n, int k, float alpha, uintptr_t a, int lda, uintptr_t b,
                  int ldb, float beta, uintptr_t c, int ldc);

#ifdef __cplusplus
}
#endif

#endif
