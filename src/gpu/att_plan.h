/* The GPU's causal attention as GEMMs and row passes, in plain C in every
 * build: attention.cu runs it on cuBLASLt and its kernels, and
 * tests/test_gpu_host.c on naive host loops against the CPU's attention,
 * so that the part most easily got wrong (every GEMM's operands, strides
 * and order) is checked without a GPU.
 *
 * The CPU's contract (dtrain/gpt.h, gpu.h): qkv [B,T,3C], NH heads of
 * hs = C / NH; out [B,T,C]; att [B,NH,T,T] the probabilities, zeros right
 * of the diagonal; backward: dqkv the gradient, WRITTEN (every element;
 * the CPU's op adds it to what is there), datt scratch written
 * whole (the softmax's gradient, zeros right of the diagonal). Per batch
 * row b, its NH heads one strided batch of GEMMs (a head's slice is hs
 * columns along qkv's rows, its att block T T along):
 *   forward   S = q k^T / sqrt(hs) into att; att = causal_softmax(S) in
 *             place; out = att v
 *   backward  dv = att^T dy; datt = dy v^T; datt = the softmax's gradient
 *             in place; dq = datt k; dk = datt^T q
 * The whole T x T square is multiplied (the zeros right of the diagonal
 * keep the sums causal). In bf16 or fp16 the products' factors are those
 * of the CPU's attention in that type (q, k, v, the probabilities, dy and
 * the softmax's gradient rounded to it, fp32 sums): copies rounded into
 * the caller's work block (dt_att_work_bytes) and 16-bit GEMMs. */
#ifndef DT_GPU_ATT_PLAN_H
#define DT_GPU_ATT_PLAN_H

#include "dtrain/core.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What runs the plan. gemm: C[i] = alpha op(A[i]) op(B[i]) + beta C[i]
 * for i < batch (dt_sgemm's row-major terms; A[i] = A + i sa elements,
 * ...), A and B of type t (DT_F32, DT_BF16 or DT_F16), C fp32. softmax:
 * each of `rows` rows of att [rows, T] (row r's position t = r % T) in
 * place, the causal softmax over 0..t and zeros after; p16 (NULL in fp32)
 * the same rows rounded to t. softmax_backward: datt's rows from dp to the
 * softmax's gradient att (dp - sum dp att) scale over 0..t, zeros after;
 * d16 likewise. round: dst[n] = src rounded to t (16-bit). */
typedef struct {
    dt_status (*gemm)(dt_dtype t, int ta, int tb, int M, int N, int K, float alpha, const void *A,
                      int lda, long long sa, const void *B, int ldb, long long sb, float beta, float *C, int ldc,
                      long long sc, int batch);
    dt_status (*softmax)(float *att, void *p16, size_t rows, int T, dt_dtype t);
    dt_status (*softmax_backward)(float *datt, const float *att, void *d16, size_t rows, int T, float scale,
                                  dt_dtype t);
    dt_status (*round)(void *dst, const float *src, size_t n, dt_dtype t);
} dt_att_ops;

/* The attention's room on the device. Heads of up to DT_ATT_FUSED_HS
 * (GPT-2's 64, Llama's 128) take the fused kernels (flash.cu: the T x T
 * scores never leave the chip), larger ones this plan. saved: what the
 * forward keeps for the backward (gpu.h's att): fused, each row's
 * log-sum-exp [B,NH,T] (the backward takes the layer's output too, as the
 * layer keeps it); the plan, the probabilities [B,NH,T,T]. scratch: the backward's (datt): fused, each
 * row's dout . out [B,NH,T]; the plan, [B,NH,T,T]. work: the plan's rounded
 * factors in 16 bits (dt_att_work_bytes; 0 fused). Bytes. */
#define DT_ATT_FUSED_HS 128
typedef struct {
    size_t saved, scratch, work;
} dt_att_room;

/* Whether heads of C / NH take the fused kernels, as this process's
 * choice (dev.h's dt_att_choose) says. */
int dt_att_fused(int C, int NH);
/* DT_OK, or DT_ERR_CONFIG naming the heads where FUSED was asked for
 * heads the fused kernels do not take. */
dt_status dt_att_choice_check(int C, int NH);
dt_att_room dt_att_room_of(int B, int T, int C, int NH, dt_dtype t);

/* B, T, C, NH and t as the attention takes them (NH dividing C; t F32,
 * BF16 or F16), else DT_ERR_ARG naming what (forward, backward). */
dt_status dt_att_args(const char *what, int B, int T, int C, int NH, dt_dtype t);

/* Bytes of the work block for products in t: 0 in fp32; in bf16 or fp16
 * the rounded copies of qkv, att and dy (2 bytes an element), each
 * starting on 256 bytes. */
size_t dt_att_work_bytes(int B, int T, int C, int NH, dt_dtype t);

/* The plan's forward and backward (work: dt_att_work_bytes of room). */
dt_status dt_att_forward(const dt_att_ops *x, float *out, float *att, const float *qkv, void *work, int B, int T,
                         int C, int NH, dt_dtype t);
dt_status dt_att_backward(const dt_att_ops *x, float *dqkv, float *datt, const float *dout, const float *qkv,
                          const float *att, void *work, int B, int T, int C, int NH, dt_dtype t);

/* The fused kernels (flash.cu, CUDA builds; heads of up to
 * DT_ATT_FUSED_HS): saved and scratch as dt_att_room_of says; out16
 * non-NULL (t 16-bit): the forward's output rounded to t there instead of
 * out (not written); out, the backward's: the forward's output, fp32 (t
 * DT_F32) or its copy in t. */
dt_status dt_gpu_flash_forward(float *out, float *saved, const float *qkv, int B, int T, int C, int NH, dt_dtype t,
                               void *out16);
dt_status dt_gpu_flash_backward(float *dqkv, float *scratch, const float *dout, const float *qkv, const void *out,
                                const float *saved, int B, int T, int C, int NH, dt_dtype t);

#ifdef __cplusplus
}
#endif
#endif
