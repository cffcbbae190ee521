//go:build darwin && cgo && metal

// The Objective-C side of the metal driver: device, library, pipelines,
// shared-storage buffers and the command stream. Compiled with ARC.

#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <stdio.h>

#include "bridge.h"

// Dispatches per command buffer before it is committed without waiting,
// so the GPU starts on long sequences of ops.
static const int kDispatchesPerCommandBuffer = 256;

@interface HPMetal : NSObject
@property(nonatomic, strong) id<MTLDevice> device;
@property(nonatomic, strong) id<MTLCommandQueue> queue;
@property(nonatomic, strong) NSArray<id<MTLComputePipelineState>> *pipelines;
@property(nonatomic, strong) id<MTLCommandBuffer> current;
@property(nonatomic, strong) id<MTLComputeCommandEncoder> encoder;
@property(nonatomic, strong) NSMutableArray<id<MTLCommandBuffer>> *committed;
@property(nonatomic) int encoded;
@end

@implementation HPMetal
@end

static void set_err(char *err, int errlen, NSString *msg) {
  if (errlen > 0) snprintf(err, (size_t)errlen, "%s", msg != nil ? msg.UTF8String : "unknown Metal error");
}

void *hp_mtl_open(const char *source, const char *const *kernels, int nkernels, int *no_device, char *err,
                  int errlen) {
  @autoreleasepool {
    *no_device = 0;
    id<MTLDevice> dev = MTLCreateSystemDefaultDevice();
    if (dev == nil) {
      *no_device = 1;
      set_err(err, errlen, @"MTLCreateSystemDefaultDevice found no Metal device");
      return NULL;
    }
    MTLCompileOptions *opts = [MTLCompileOptions new];
    // The kernels need IEEE exp, log, sqrt and division to agree with the
    // cpu backend. (macOS 15 prefers mathMode; this property still works.)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
    opts.fastMathEnabled = NO;
#pragma clang diagnostic pop
    NSError *e = nil;
    id<MTLLibrary> lib = [dev newLibraryWithSource:[NSString stringWithUTF8String:source] options:opts error:&e];
    if (lib == nil) {
      set_err(err, errlen, [NSString stringWithFormat:@"compiling kernels.metal: %@", e.localizedDescription]);
      return NULL;
    }
    NSMutableArray<id<MTLComputePipelineState>> *pipes = [NSMutableArray arrayWithCapacity:(NSUInteger)nkernels];
    for (int i = 0; i < nkernels; i++) {
      NSString *name = [NSString stringWithUTF8String:kernels[i]];
      id<MTLFunction> fn = [lib newFunctionWithName:name];
      if (fn == nil) {
        set_err(err, errlen, [NSString stringWithFormat:@"kernel %@ is not in kernels.metal", name]);
        return NULL;
      }
      id<MTLComputePipelineState> ps = [dev newComputePipelineStateWithFunction:fn error:&e];
      if (ps == nil) {
        set_err(err, errlen, [NSString stringWithFormat:@"pipeline %@: %@", name, e.localizedDescription]);
        return NULL;
      }
      [pipes addObject:ps];
    }
    HPMetal *m = [HPMetal new];
    m.device = dev;
    m.queue = [dev newCommandQueue];
    m.pipelines = pipes;
    m.committed = [NSMutableArray array];
    if (m.queue == nil) {
      set_err(err, errlen, @"newCommandQueue failed");
      return NULL;
    }
    return (__bridge_retained void *)m;
  }
}

void hp_mtl_close(void *h) {
  @autoreleasepool {
    HPMetal *m = (__bridge_transfer HPMetal *)h;
    m.encoder = nil;
    m.current = nil;
  }
}

uint64_t hp_mtl_describe(void *h, char *name, int namelen) {
  @autoreleasepool {
    HPMetal *m = (__bridge HPMetal *)h;
    set_err(name, namelen, m.device.name);
    return (uint64_t)m.device.recommendedMaxWorkingSetSize;
  }
}

int hp_mtl_max_threads(void *h, int k) {
  HPMetal *m = (__bridge HPMetal *)h;
  return (int)m.pipelines[(NSUInteger)k].maxTotalThreadsPerThreadgroup;
}

int hp_mtl_simd_width(void *h, int k) {
  HPMetal *m = (__bridge HPMetal *)h;
  return (int)m.pipelines[(NSUInteger)k].threadExecutionWidth;
}

void *hp_mtl_alloc(void *h, int64_t bytes) {
  @autoreleasepool {
    HPMetal *m = (__bridge HPMetal *)h;
    id<MTLBuffer> b = [m.device newBufferWithLength:(NSUInteger)bytes options:MTLResourceStorageModeShared];
    if (b == nil) return NULL;
    return (__bridge_retained void *)b;
  }
}

void hp_mtl_free(void *buf) {
  @autoreleasepool {
    id<MTLBuffer> b = (__bridge_transfer id<MTLBuffer>)buf;
    b = nil;
  }
}

void *hp_mtl_contents(void *buf) { return [(__bridge id<MTLBuffer>)buf contents]; }

static void commit_current(HPMetal *m) {
  if (m.encoder == nil) return;
  [m.encoder endEncoding];
  [m.current commit];
  [m.committed addObject:m.current];
  m.encoder = nil;
  m.current = nil;
  m.encoded = 0;
}

int hp_mtl_dispatch(void *h, int k, int gx, int gy, int gz, int threads, void *const *bufs, const int64_t *offs,
                    int nbufs, const void *args, int argbytes, char *err, int errlen) {
  @autoreleasepool {
    HPMetal *m = (__bridge HPMetal *)h;
    if (m.encoder == nil) {
      // Serial dispatch: each dispatch sees the writes of those before it.
      m.current = [m.queue commandBuffer];
      m.encoder = [m.current computeCommandEncoder];
      if (m.encoder == nil) {
        set_err(err, errlen, @"cannot make a compute command encoder");
        m.current = nil;
        return -1;
      }
    }
    id<MTLComputeCommandEncoder> enc = m.encoder;
    [enc setComputePipelineState:m.pipelines[(NSUInteger)k]];
    for (int i = 0; i < nbufs; i++) {
      [enc setBuffer:(__bridge id<MTLBuffer>)bufs[i] offset:(NSUInteger)offs[i] atIndex:(NSUInteger)i];
    }
    [enc setBytes:args length:(NSUInteger)argbytes atIndex:(NSUInteger)nbufs];
    [enc dispatchThreadgroups:MTLSizeMake((NSUInteger)gx, (NSUInteger)gy, (NSUInteger)gz)
        threadsPerThreadgroup:MTLSizeMake((NSUInteger)threads, 1, 1)];
    if (++m.encoded >= kDispatchesPerCommandBuffer) commit_current(m);
    return 0;
  }
}

int hp_mtl_flush(void *h, char *err, int errlen) {
  @autoreleasepool {
    HPMetal *m = (__bridge HPMetal *)h;
    commit_current(m);
    int rc = 0;
    for (id<MTLCommandBuffer> cb in m.committed) {
      [cb waitUntilCompleted];
      if (cb.status == MTLCommandBufferStatusError && rc == 0) {
        set_err(err, errlen, [NSString stringWithFormat:@"command buffer failed: %@", cb.error.localizedDescription]);
        rc = -1;
      }
    }
    [m.committed removeAllObjects];
    return rc;
  }
}
