// The C face of bridge.m, the Objective-C side of the metal driver.
// Handles are retained Objective-C objects passed as void*.
#ifndef HOLOPEER_METAL_BRIDGE_H
#define HOLOPEER_METAL_BRIDGE_H

#include <stddef.h>
#include <stdint.h>

// hp_mtl_open makes the system's default device, compiles source with fast
// math off and makes a compute pipeline per kernel name, in order. It
// returns NULL with a message in err and *no_device set when there is no
// Metal device.
void *hp_mtl_open(const char *source, const char *const *kernels, int nkernels, int *no_device, char *err,
                  int errlen);
void hp_mtl_close(void *m);

// hp_mtl_describe writes the device's name; it returns the working set
// size Metal recommends for it, in bytes.
uint64_t hp_mtl_describe(void *m, char *name, int namelen);
int hp_mtl_max_threads(void *m, int kernel);
int hp_mtl_simd_width(void *m, int kernel);

// Buffers are in shared storage: their contents are the CPU's view of the
// same memory.
void *hp_mtl_alloc(void *m, int64_t bytes);
void hp_mtl_free(void *buf);
void *hp_mtl_contents(void *buf);

// hp_mtl_dispatch encodes kernel over groups threadgroups of threads
// threads, binding bufs[i] at offs[i] to index i and the args bytes to
// index nbufs. Command buffers are committed every so many dispatches.
int hp_mtl_dispatch(void *m, int kernel, int gx, int gy, int gz, int threads, void *const *bufs,
                    const int64_t *offs, int nbufs, const void *args, int argbytes, char *err, int errlen);
// hp_mtl_flush commits what is encoded and waits for every command
// buffer committed since the last flush; it returns -1 with the first
// failure in err.
int hp_mtl_flush(void *m, char *err, int errlen);

#endif
