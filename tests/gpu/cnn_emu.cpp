/* src/gpu/cnn.cu's kernels on CPU threads (cuda_emu.h, emu_host.h), under
 * names of their own beside the library's. */
#define DT_CUDA_EMU 1
#include "cuda_emu.h"
#include "emu_host.h"
#include "emu_names.h"
#include "gpu/cnn.cu"
