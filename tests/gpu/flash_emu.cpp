/* The fused attention's kernels (src/gpu/flash.cu) on CPU threads
 * (cuda_emu.h), under names of their own beside the library's. */
#define DT_CUDA_EMU 1
#include "emu_names.h"
#include "gpu/flash.cu"
