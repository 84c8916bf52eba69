/* The emulated kernels' entry points (the tests/gpu sources named
 * <kernel source>_emu.cpp): the library's names (gpu/gpu.h, gpu/att_plan.h) made
 * names of their own, so that they stand beside the library's. Included
 * before those headers, which then declare them under these names. */
#ifndef DT_TESTS_EMU_NAMES_H
#define DT_TESTS_EMU_NAMES_H

#define dt_gpu_flash_forward dt_emu_flash_forward
#define dt_gpu_flash_backward dt_emu_flash_backward
#define dt_gpu_layernorm_forward dt_emu_layernorm_forward
#define dt_gpu_layernorm_backward dt_emu_layernorm_backward
#define dt_gpu_layernorm_residual dt_emu_layernorm_residual
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
#define dt_gpu_encoder_forward dt_emu_encoder_forward
#define dt_gpu_encoder_backward dt_emu_encoder_backward
#define dt_gpu_encoder_split_forward dt_emu_encoder_split_forward
#define dt_gpu_encoder_split_backward dt_emu_encoder_split_backward
#define dt_gpu_encoder_scratch dt_emu_encoder_scratch
#define dt_gpu_residual_forward dt_emu_residual_forward
#define dt_gpu_residual_backward dt_emu_residual_backward
#define dt_gpu_to_f32 dt_emu_to_f32
#define dt_gpu_from_f32 dt_emu_from_f32
#define dt_gpu_from_f32_ef dt_emu_from_f32_ef
#define dt_gpu_im2col dt_emu_im2col
#define dt_gpu_col2im dt_emu_col2im
#define dt_gpu_transpose dt_emu_transpose
#define dt_gpu_maxpool_forward dt_emu_maxpool_forward
#define dt_gpu_maxpool_backward dt_emu_maxpool_backward
#define dt_gpu_dropout_forward dt_emu_dropout_forward
#define dt_gpu_dropout_backward dt_emu_dropout_backward
#define dt_gpu_attention_forward dt_emu_attention_forward
#define dt_gpu_attention_backward dt_emu_attention_backward
#define dt_gpu_gemm_batched dt_emu_gemm_batched

#endif
