/* The GPT's layers' CUDA kernels (src/gpu/layers.cu) on CPU threads
 * (cuda_emu.h), under names of their own beside the library's. A kernel's
 * __shared__ arrays are statics here, one for all the threads of the
 * block, as on a GPU (the blocks run one at a time); scratch and memsets
 * are the host's. */
#define DT_CUDA_EMU 1
#include "cuda_emu.h"

#include <stdlib.h>

#undef __shared__
#define __shared__ static
#define DT_QUEUE(call) (void)(call)
#define cudaMemsetAsync(p, v, n, stream) memset(p, v, n)
static void *const dt_cu_stream = NULL;
static dt_status dt_gpu_scratch(void **p, size_t bytes) {
    *p = malloc(bytes ? bytes : 1);
    return *p ? DT_OK : DT_ERR_NOMEM;
}
static void dt_gpu_scratch_free(void *p) { free(p); }

#include "emu_names.h"
#include "gpu/layers.cu"
