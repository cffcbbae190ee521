// The cuInit interposer of driver.c; see doc.go.
#ifndef HOLOPEER_CUDA_DRIVER_H
#define HOLOPEER_CUDA_DRIVER_H

// hp_cuda_init_result is what the driver's cuInit returned, or -1 when
// cuInit has not been called.
int hp_cuda_init_result(void);

// hp_cuda_error_name names a CUresult, e.g. "CUDA_ERROR_NO_DEVICE".
const char *hp_cuda_error_name(int code);

#endif
