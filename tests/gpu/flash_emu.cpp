/* The fused attention's kernels (src/gpu/flash.cu) on CPU threads
 * (cuda_emu.h), under names of their own beside the library's. */
#define DT_CUDA_EMU 1
#define dt_gpu_flash_forward dt_emu_flash_forward
#define dt_gpu_flash_backward dt_emu_flash_backward
#include "gpu/flash.cu"
