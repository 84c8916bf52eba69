/* What a kernel source compiled on the emulator (cuda_emu.h) takes from
 * the CUDA build besides its kernels, on the host: a kernel's __shared__
 * arrays are statics, one for all the threads of the block, as on a GPU
 * (the blocks run one at a time), in a section of their own
 * (DT_EMU_SHARED_SECTION) that each block starts with filled with NaNs,
 * as the dynamic shared memory (cuda_emu.cpp); scratch is malloc's, a
 * memset the host's. Included after cuda_emu.h, before the source. */
#ifndef DT_TESTS_EMU_HOST_H
#define DT_TESTS_EMU_HOST_H

#include <stdlib.h>

#undef __shared__
#define __shared__ __attribute__((section(DT_EMU_SHARED_SECTION))) static
#define DT_QUEUE(call) (void)(call)
#define cudaMemsetAsync(p, v, n, stream) memset(p, v, n)
static void *const dt_cu_stream = NULL;
static const int dt_gpu_skipping = 0;
[[maybe_unused]] static dt_status dt_gpu_scratch(void **p, size_t bytes) {
    *p = malloc(bytes ? bytes : 1);
    return *p ? DT_OK : DT_ERR_NOMEM;
}
[[maybe_unused]] static void dt_gpu_scratch_free(void *p) { free(p); }

#endif
