/* The GPU device: what a CUDA build offers the engine (docs/gpu.md).
 * The .cu files of src/gpu/ implement it where CMake finds the CUDA toolkit; elsewhere
 * src/gpu/none.c answers that this build has none. Pointers called `dev`
 * are device memory: the host never reads them. Every CUDA call is
 * checked; an error names the call and CUDA's words for it. */
#ifndef DT_GPU_H
#define DT_GPU_H

#include "dtrain/core.h"
#include "gpu/cnn_hd.h"
#include "optim/elem.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What this build was compiled for: "CUDA 13.0 (sm_90 and its PTX)", or
 * "no CUDA device in this build". */
const char *dt_gpu_build(void);
/* The usable GPUs: their count, or 0 with the reason in why[n] (no CUDA in
 * this build; no driver or one too old for this build's runtime: CUDA's
 * own words; no device). */
int dt_gpu_count(char *why, size_t n);
/* Device `index`'s name and memory ("NVIDIA H100 80GB HBM3, 79.2 GiB,
 * sm_90") into out[n]. */
dt_status dt_gpu_describe(int index, char *out, size_t n);
dt_status dt_gpu_use(int index);

dt_status dt_gpu_alloc(void **dev, size_t bytes);
void dt_gpu_free(void *dev);
dt_status dt_gpu_to_device(void *dev, const void *host, size_t bytes);
dt_status dt_gpu_to_host(void *host, const void *dev, size_t bytes);
dt_status dt_gpu_to_device_async(void *dev, const void *host, size_t bytes);
uint64_t dt_gpu_reads(void);
/* The ops' scratch (dev.h's scratch_*): the buffer's bytes and the calls
 * that allocated after a reservation; the buffer made at least `bytes`
 * long; the bytes the encoder's backward of n positions and a convolution
 * (its forward's or backward's, the larger) ask for (0 where they cannot
 * say: their call then does). */
size_t dt_gpu_scratch_bytes(uint64_t *allocs);
dt_status dt_gpu_scratch_reserve(size_t bytes);
size_t dt_gpu_encoder_scratch(size_t n);
size_t dt_gpu_conv2d_scratch(size_t B, const dt_im2col_t *g, int OC);
dt_status dt_gpu_copy(void *dev_to, const void *dev_from, size_t bytes);
dt_status dt_gpu_memset0(void *dev, size_t bytes);
/* The current device's free and total memory. */
dt_status dt_gpu_mem_info(size_t *free_bytes, size_t *total);
/* Memory backed on demand (dev.h's vm_*): CUDA's virtual memory management
 * (cuMemAddressReserve, cuMemCreate + cuMemMap, cuMemUnmap), the driver's
 * calls found through the runtime; the granularity the driver's minimum. */
dt_status dt_gpu_vm_reserve(void **dev, size_t bytes, size_t *gran);
dt_status dt_gpu_vm_map(void *dev, size_t bytes);
dt_status dt_gpu_vm_unmap(void *dev, size_t bytes);
void dt_gpu_vm_free(void *dev, size_t bytes);
/* Page-locked host memory (cudaMallocHost): the copies' pinned buffers. */
dt_status dt_gpu_host_alloc(void **host, size_t bytes);
void dt_gpu_host_free(void *host);
/* Waits for every launch so far; an error a kernel raised is named here. */
dt_status dt_gpu_sync(void);
/* A stream of the current device (a cudaStream_t, as NCCL takes it) that
 * does not wait for the kernels' stream (cuda_check.h's dt_cu_stream) by
 * itself; after_compute: what is queued on it from now on waits for what
 * the kernels' stream has queued so far (an event); query: *done once it has run everything queued
 * (cudaStreamQuery, never blocks; an error a kernel raised is named). */
dt_status dt_gpu_stream_create(void **stream);
void dt_gpu_stream_destroy(void *stream);
dt_status dt_gpu_stream_after_compute(void *stream);
dt_status dt_gpu_stream_query(void *stream, int *done);
/* CUDA events (timing off) of the current device: record on the default
 * stream; a stream made to wait for the last record (dev.h's). */
dt_status dt_gpu_event_create(void **event);
void dt_gpu_event_destroy(void *event);
dt_status dt_gpu_event_record(void *event);
/* cudaEventQuery: *done once the event's work has run (never blocks). */
dt_status dt_gpu_event_query(void *event, int *done);
dt_status dt_gpu_stream_wait_event(void *stream, void *event);
/* A step as a CUDA graph (dev.h's graph_capture and the rest): the
 * kernels' stream captured, or its work skipped while the graph made of it
 * is replayed; run ends either and launches the graph. */
dt_status dt_gpu_graph_capture(void);
dt_status dt_gpu_graph_replay(void);
dt_status dt_gpu_graph_run(void);
void dt_gpu_graph_drop(void);

/* The optimizers over n elements of device blocks, the CPU's rules
 * (optim/elem.h) with the constants the host computed, k in device
 * memory. m, v, buf: the state (buf NULL: SGD without momentum); guard:
 * dev.h's (NULL: none). */
dt_status dt_gpu_adamw(float *w, const float *g, float *m, float *v, size_t n, const dt_adamw_k *k,
                       const float *guard);
dt_status dt_gpu_sgd(float *w, const float *g, float *buf, size_t n, const dt_sgd_k *k, const float *guard);
/* dev.h's step_scale: one thread. */
dt_status dt_gpu_step_scale(float *guard, const double *vals, float unscale, float clip);

/* C = alpha op(A) op(B) + beta C on device blocks: dt_sgemm's row-major
 * contract (ta, tb: A, B transposed; lda, ldb, ldc the row strides), by
 * cuBLASLt (loaded at the first call) in fp32, or TF32 after
 * dt_gpu_set_tf32(1) (the inputs rounded to 10 bits of mantissa, fp32
 * sums). beta 0: C is not read. */
dt_status dt_gpu_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc);
void dt_gpu_set_tf32(int on);
int dt_gpu_tf32(void);

/* The GPT's layers on device blocks, the CPU's contracts (dtrain/nn.h:
 * backward accumulates with +=) over N rows, each element's arithmetic
 * nn/rows.h's; a row's sums in a block's fixed tree (the CPU's in order).
 * Layernorm over rows of C (mean, rstd [N]); dinp, dw or db NULL: not
 * computed. out16 non-NULL (t DT_BF16 or DT_F16): the output rounded to t
 * there (dt_gpu_from_f32's bits) instead of out, which is not written
 * (the linears' 16-bit input made with no fp32 copy). */
dt_status dt_gpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                   const float *b, size_t N, int C, float eps, void *out16, dt_dtype t);
dt_status dt_gpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                    const float *w, const float *mean, const float *rstd, size_t N, int C);
/* The residual add and the layernorm of its sum in one pass: res = a + b
 * (dt_gpu_residual_forward's bits; res may be a or b), then
 * dt_gpu_layernorm_forward of res (its bits) into out (not res), or
 * out16. */
dt_status dt_gpu_layernorm_residual(float *out, float *mean, float *rstd, float *res, const float *a, const float *b,
                                    const float *w, const float *bias, size_t N, int C, float eps, void *out16,
                                    dt_dtype t);
/* GELU (tanh approximation) over n elements; out16 non-NULL (t DT_BF16 or
 * DT_F16): the output rounded to t there (dt_gpu_from_f32's bits) instead
 * of out, which is not written. */
dt_status dt_gpu_gelu_forward(float *out, const float *inp, size_t n, void *out16, dt_dtype t);
dt_status dt_gpu_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n);
/* Softmax cross-entropy over N rows of V logits stored ld apart (ld >= V: a
 * padded vocabulary's columns past V are neither read nor written): probs
 * as the logits; row_loss [N] (doubles) each row's loss, *loss (one float,
 * device) their mean in order. A target outside [0, V) gives a NaN loss.
 * Backward: dlogits += (probs - onehot) dloss / N. */
dt_status dt_gpu_crossentropy_forward(float *probs, double *row_loss, float *loss, const float *logits,
                                      const int32_t *targets, size_t N, int V, size_t ld);
dt_status dt_gpu_crossentropy_backward(float *dlogits, const float *probs, const int32_t *targets, size_t N, int V,
                                       size_t ld, float dloss);
/* Forward and backward in one pass (llm.c's fused classifier): row_loss
 * and *loss as the forward's, each logit then replaced by its gradient as
 * the backward gives it onto zeros (dloss / N its scale); the
 * probabilities never stored (each recomputed from the row's maximum and
 * sum), so the head keeps one [N, V] block, not two. d16 non-NULL (t
 * DT_BF16 or DT_F16): the gradient goes there instead, rounded to t
 * (dt_gpu_from_f32's bits), rows ld apart, and the logits stay as they
 * were: in 16 bits the head's output gradient made for its GEMMs with no
 * fp32 copy written or read again. */
dt_status dt_gpu_crossentropy_fused(float *logits, double *row_loss, float *loss, const int32_t *targets, size_t N,
                                    int V, size_t ld, float dloss, void *d16, dt_dtype t);

/* The GPT's embedding, residual add and attention on device blocks,
 * dtrain/gpt.h's contracts and argument lists. The encoder is the CPU's
 * bits: forward one sum an element; backward each dwte row summed over
 * the positions holding its token in order (a stable sort of the
 * positions by token, on the device: no float atomics), dwpe over the
 * batch in order. inp (int32) must hold valid rows of wte (unchecked, as
 * on the CPU). The backward's scratch (3 B T ints and the sort's) is taken
 * from the stream's pool and given back in the call; B T below 2^31 (the
 * sort's count; else DT_ERR_ARG). */
dt_status dt_gpu_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe, int B, int T,
                                 int C);
dt_status dt_gpu_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B, int T, int C);
/* A GPT's tensor-parallel shard holding wte's rows [v0, v0 + V) (dtrain/gpt.h's
 * dt_encoder_split_forward, _backward; the backward's dwte rows summed over
 * their positions in order, no float atomics, as dt_gpu_encoder_backward's)
 * and the vocabulary-parallel cross-entropy over logits [N, V] of the
 * shard's columns (dt_ce_split_max, _exp, _finish: mx[N], sums[2N] and
 * row_loss[N] device buffers, *loss one device float; the rows' sums on the
 * device in a block's tree, so to rounding of the CPU's, and the mean in
 * order). */
dt_status dt_gpu_encoder_split_forward(float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                                       int T, int C, int v0, int V);
dt_status dt_gpu_encoder_split_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B, int T,
                                        int C, int v0, int V);
dt_status dt_gpu_ce_split_max(float *mx, const float *logits, size_t N, int V);
dt_status dt_gpu_ce_split_exp(float *probs, float *sums, const float *logits, const float *mx, const int32_t *targets,
                              size_t N, int V);
dt_status dt_gpu_ce_split_finish(float *probs, double *row_loss, float *loss, const float *mx, const float *sums,
                                 size_t N, int V);
/* out = a + b; backward: da += dout, db += dout (either NULL: skipped). */
dt_status dt_gpu_residual_forward(float *out, const float *a, const float *b, size_t N);
dt_status dt_gpu_residual_backward(float *da, float *db, const float *dout, size_t N);
/* Causal multi-head attention over qkv [B,T,3C], NH heads of hs = C / NH
 * (NH dividing C): out [B,T,C], as the CPU's; backward: dqkv the
 * gradient, written whole (the CPU's op adds it). att: what the forward keeps for the backward, datt the
 * backward's scratch, work the rounded factors' room, each of the bytes
 * gpu/att_plan.h's dt_att_room_of says: heads of up to DT_ATT_FUSED_HS
 * columns on flash.cu's fused kernels (att each row's log-sum-exp and the
 * output's copy; work unused), larger ones on att_plan.h's GEMMs (cuBLASLt,
 * a strided batch of the heads per batch row) and row passes (att the
 * probabilities [B,NH,T,T], zeros right of the diagonal; datt the softmax's
 * gradient, likewise). The same bits every run, the CPU's to rounding. t:
 * the precision of its products, as the CPU's attention's GEMMs in t:
 * DT_F32 (the plan's GEMMs TF32 as dt_gpu_set_tf32 says; the fused kernels
 * fp32 always), or DT_BF16 / DT_F16, each product's two factors (q, k, v,
 * the probabilities; in backward dout and the softmax's gradient) rounded to
 * t, fp32 sums. out16 non-NULL (t 16-bit): the output rounded to t there
 * (dt_gpu_from_f32's bits); out then room the op may write (the fused
 * kernels do not; the GEMM plan's output is made there and rounded). */
dt_status dt_gpu_attention_forward(float *out, float *att, const float *qkv, void *work, int B, int T, int C, int NH,
                                   dt_dtype t, void *out16);
dt_status dt_gpu_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const void *out,
                                    const float *att, void *work, int B, int T, int C, int NH, dt_dtype t);

/* The CNN's layers (gpu/cnn_hd.h's arithmetic, docs/gpu.md): the columns
 * col[C K K, B OH OW] of x[B, C, H, W]; dx += the input's gradient from the
 * columns' dcol; out[nb, C, R] = each of the nb matrices of in[nb, R, C]
 * transposed; K x K max pooling, stride S, over `images` images of H x W
 * (out and arg [images, OH, OW]; dx += the gradient); dropout of B samples
 * of n values with the CPU's masks (dt_dropout_mask: mask[B, n], each
 * sample's after skip draws; backward dx += dout mask). */
dt_status dt_gpu_im2col(float *col, const float *x, size_t B, const dt_im2col_t *g);
dt_status dt_gpu_col2im(float *dx, const float *dcol, size_t B, const dt_im2col_t *g);
dt_status dt_gpu_transpose(float *out, const float *in, size_t nb, size_t R, size_t C);
/* dev.h's conv2d ops by cuDNN (conv.cu): loaded at the first call;
 * dt_gpu_conv2d_ready says whether it was, else why. */
int dt_gpu_conv2d_ready(char *why, size_t n);
dt_status dt_gpu_conv2d_forward(float *out, const float *inp, const float *w, const float *b, size_t B,
                                const dt_im2col_t *g, int OC);
dt_status dt_gpu_conv2d_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                 const float *w, size_t B, const dt_im2col_t *g, int OC);
dt_status dt_gpu_maxpool_forward(float *out, int32_t *arg, const float *x, size_t images, int H, int W, int K, int S);
dt_status dt_gpu_maxpool_backward(float *dx, const float *dout, const int32_t *arg, size_t images, int H, int W, int K,
                                  int S);
dt_status dt_gpu_dropout_forward(float *out, float *mask, const float *x, int B, size_t n, float p, uint64_t seed,
                                 uint64_t step, int64_t first, int layer, size_t skip);
dt_status dt_gpu_dropout_backward(float *dx, const float *dout, const float *mask, size_t N);

/* ReLU over N elements (backward accumulates). */
dt_status dt_gpu_relu_forward(float *out, const float *inp, size_t N);
dt_status dt_gpu_relu_backward(float *dinp, const float *dout, const float *inp, size_t N);
/* out[N,OC] += b[OC] (the CPU's bits); db[OC] += the column sums of
 * dout[N,OC], in chunks of rows across the GPU in a fixed order (launch.h:
 * the same bits every run; the CPU's to rounding); dout16 non-NULL (t
 * DT_BF16 or DT_F16): dout rounded to t there in the same pass
 * (dt_gpu_from_f32's bits), dout read once for both. */
dt_status dt_gpu_bias_forward(float *out, const float *b, size_t N, int OC);
dt_status dt_gpu_bias_backward(float *db, const float *dout, size_t N, int OC, void *dout16, dt_dtype t);
/* The linear layer, dt_linear_*'s contract (dtrain/nn.h), its operands
 * inp[B,C] and w[OC,C] of type t (DT_F32; DT_BF16, DT_F16: 16-bit, fp32
 * sums), out fp32: pre NULL: out[B,OC] = inp w^T + b (b NULL: none; the
 * bias added by cuBLASLt's BIAS epilogue); pre: the linear layer followed
 * by GELU, pre = inp w^T + b and out = gelu(pre), fused where cuBLASLt can
 * (OC a multiple of 8: GELU_AUX(_BIAS), with cuBLASLt's own GELU) and the
 * products are not exact fp32 (16-bit operands, or TF32 on).
 * Elsewhere the GEMM, dt_gpu_bias_forward and dt_gpu_gelu_forward.
 * Backward dinp, dw, db += (each NULL: skipped; db by
 * dt_gpu_bias_backward). */
dt_status dt_gpu_linear_forward(float *out, float *pre, const void *inp, const void *w, const float *b, int B, int C,
                                int OC, dt_dtype t);
dt_status dt_gpu_linear_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                 const float *w, int B, int C, int OC);
/* The input gradient of a linear layer whose input is gelu(pre) (pre
 * [B,C]): dpre = gelu'(pre) (dout w), WRITTEN, not accumulated, dout
 * [B,OC] and w [OC,C] of type t (C a multiple of 8 and the products not
 * exact fp32: cuBLASLt's DGELU epilogue; elsewhere the GEMM and
 * nn/rows.h's GELU gradient). The weights' and bias's gradients are
 * dt_gpu_linear_backward's (dinp NULL). */
dt_status dt_gpu_linear_dgelu(float *dpre, const void *dout, const void *w, const float *pre, int B, int C, int OC,
                              dt_dtype t);

/* The global norm's sum of squares of x[n] into *out_dev (one device
 * double): dt_sum_squares's blocks of 4096 summed in order, each block in
 * order, so the CPU's bits. Its partial sums in scratch from the stream's
 * pool. */
dt_status dt_gpu_sumsq(double *out_dev, const float *x, size_t n);
/* The pieces of a slice x[n] that begins `first` into one of those blocks
 * into part_dev (a device double each, the first from carry): the CPU's
 * dt_sum_squares_parts, bitwise. */
dt_status dt_gpu_sumsq_parts(double *part_dev, const float *x, size_t n, size_t first, double carry);
/* x[n] *= *s_dev (a float on the device, such as the clipping factor): no
 * wait for the host. */
dt_status dt_gpu_scale(float *x, size_t n, const float *s_dev);
/* acc[0] += (double)loss[0] * w: one thread, __dmul_rn then __dadd_rn (no
 * contraction: the host's bits). */
dt_status dt_gpu_loss_add(double *acc, const float *loss, double w);

/* Deterministic mode's fixed point (core/fixed.h's rules, the CPU's
 * bits): acc[n] += round(g x 2^32) clamped; g[n] = acc / 2^32. */
dt_status dt_gpu_fixed_add(int64_t *acc, const float *g, size_t n);
dt_status dt_gpu_fixed_to_float(float *g, const int64_t *acc, size_t n);

/* C[M,N] = alpha op(A) op(B) + beta C as dt_gpu_sgemm, on 16-bit operands
 * A and B of type t (DT_BF16 or DT_F16: dt_from_f32's values), fp32 sums
 * and C (cuBLASLt's CUBLAS_COMPUTE_32F): dt_gemm16's contract. */
dt_status dt_gpu_gemm16(dt_dtype t, int ta, int tb, int M, int N, int K, float alpha, const void *A, int lda,
                        const void *B, int ldb, float beta, float *C, int ldc);
/* The same over a strided batch: for i < batch, C + i sc = alpha op(A + i
 * sa) op(B + i sb) + beta (C + i sc), strides in elements; A and B of type
 * t (DT_F32: dt_gpu_sgemm's, TF32 as dt_gpu_set_tf32 says; DT_BF16,
 * DT_F16: dt_gpu_gemm16's), C fp32; one cuBLASLt call, or one a matrix
 * where cuBLASLt has no algorithm for the batch (its strides' alignment). */
dt_status dt_gpu_gemm_batched(dt_dtype t, int ta, int tb, int M, int N, int K, float alpha, const void *A, int lda,
                              long long sa, const void *B, int ldb, long long sb, float beta, float *C, int ldc,
                              long long sc, int batch);
/* dt_to_f32 / dt_from_f32 on device blocks, t DT_BF16 (round to nearest
 * even, NaN kept quiet: core/bf16.h's bits, the CPU's) or DT_F16 (CUDA's
 * round-to-nearest-even conversions: IEEE binary16, the CPU's bits but for
 * a NaN's payload); another t is DT_ERR_ARG. */
dt_status dt_gpu_to_f32(float *dst, const void *src, size_t n, dt_dtype t);
dt_status dt_gpu_from_f32(void *dst, const float *src, size_t n, dt_dtype t);
/* dt_from_f32_ef on device blocks (the same types and bits as
 * dt_gpu_from_f32): g[n] += res, dst = g rounded to t, res = g - dst
 * widened. */
dt_status dt_gpu_from_f32_ef(void *dst, float *g, float *res, size_t n, dt_dtype t);

/* cuBLASLt, cuDNN and NCCL, loaded at run time (never linked;
 * src/gpu/dl.c, every build): `which` "cublaslt" (libcublasLt.so.<the
 * build's CUDA major>, that major), "cudnn" (libcudnn.so.9, 9.x) or "nccl"
 * (libnccl.so.2, 2.18 or later). Looked for where DTRAIN_CUBLASLT /
 * DTRAIN_CUDNN / DTRAIN_NCCL say (that file only), else on the loader's
 * path, else in PyTorch's packages (nvidia/cublas/lib, nvidia/cudnn/lib,
 * nvidia/nccl/lib under a Python site). A library not
 * found, not loadable, not the library or of another version is an error
 * naming the file and the version. */
typedef struct {
    void *handle;
    char path[1024];
    long version;  // major*10000 + minor*100 + patch
} dt_gpu_lib;
dt_status dt_gpu_lib_open(const char *which, dt_gpu_lib *out);
void *dt_gpu_lib_sym(const dt_gpu_lib *lib, const char *name);
void dt_gpu_lib_close(dt_gpu_lib *lib);

#ifdef __cplusplus
}
#endif
#endif
