/* The emulated kernels' entry points (tests/gpu/flash_emu.cpp,
 * layers_emu.cpp, optim_emu.cpp): the library's names (gpu/gpu.h, gpu/att_plan.h) made
 * names of their own, so that they stand beside the library's. Included
 * before those headers, which then declare them under these names. */
#ifndef DT_TESTS_EMU_NAMES_H
#define DT_TESTS_EMU_NAMES_H

#define dt_gpu_flash_forward dt_emu_flash_forward
#define dt_gpu_flash_backward dt_emu_flash_backward
#define dt_gpu_layernorm_forward dt_emu_layernorm_forward
#define dt_gpu_layernorm_backward dt_emu_layernorm_backward
#define dt_gpu_gelu_forward dt_emu_gelu_forward
#define dt_gpu_gelu_backward dt_emu_gelu_backward
#define dt_gpu_ce_split_max dt_emu_ce_split_max
#define dt_gpu_ce_split_exp dt_emu_ce_split_exp
#define dt_gpu_ce_split_finish dt_emu_ce_split_finish
#define dt_gpu_crossentropy_forward dt_emu_crossentropy_forward
#define dt_gpu_crossentropy_fused dt_emu_crossentropy_fused
#define dt_gpu_crossentropy_backward dt_emu_crossentropy_backward
#define dt_gpu_relu_forward dt_emu_relu_forward
#define dt_gpu_relu_backward dt_emu_relu_backward
#define dt_gpu_bias_forward dt_emu_bias_forward
#define dt_gpu_bias_backward dt_emu_bias_backward
#define dt_gpu_adamw dt_emu_adamw
#define dt_gpu_sgd dt_emu_sgd
#define dt_gpu_sumsq dt_emu_sumsq
#define dt_gpu_sumsq_parts dt_emu_sumsq_parts
#define dt_gpu_step_scale dt_emu_step_scale
#define dt_gpu_scale dt_emu_scale
#define dt_gpu_loss_add dt_emu_loss_add
#define dt_gpu_fixed_add dt_emu_fixed_add
#define dt_gpu_fixed_to_float dt_emu_fixed_to_float

#endif
