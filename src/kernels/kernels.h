/* Compute kernels shared by the layers. oneDNN sits behind this header
 * alone (gemm.c, conv.c): nothing else in the tree includes its header. */
#ifndef DT_KERNELS_H
#define DT_KERNELS_H

#include "dtrain/core.h"

#include <stddef.h>

/* Applies DTRAIN_ISA's cap (dt_cpu_get) to oneDNN, once; every kernel calls
 * it before its first use of oneDNN. */
void dt_kernels_init(void);
/* The instruction set oneDNN's kernels use, by oneDNN's name for it (e.g.
 * "cpu_isa_avx512_core_bf16"), after the cap. */
const char *dt_kernels_isa(void);
/* The precision of every GEMM and convolution below, process-wide: DT_F32
 * (the default), DT_BF16 or DT_F16 (else DT_ERR_ARG). In a low precision
 * the operands (the inputs, the weights and, in backward, the output
 * gradients) are rounded to it, to nearest even; products are summed in
 * fp32 and results are fp32. dt_kernels_native(t): oneDNN has kernels for
 * t on this CPU (bf16: AVX-512 BF16, AMX) and runs them; elsewhere the
 * rounded values are multiplied in fp32, the same products summed in
 * another order. dt_kernels_describe(t) says which, in a few words. */
dt_status dt_kernels_set_precision(dt_dtype t);
dt_dtype dt_kernels_precision(void);
int dt_kernels_native(dt_dtype t);
const char *dt_kernels_describe(dt_dtype t);

/* The weights' working copy. In a low precision the GEMMs round their
 * operands at every call; the weights, read by a layer's forward and again
 * by its backward (and by every micro-batch), need it only once after each
 * change. dt_kernels_set_weights(w, n) names the parameter block [w, w+n)
 * (NULL: none, the copy freed): the kernels keep a copy of it in the
 * precision (n 16-bit elements, allocated here), and a GEMM operand that is
 * a contiguous part of the block (row stride = its columns) is read from
 * the copy, that part converted on its first use after
 * dt_kernels_weights_changed(), which a forward pass calls before it reads
 * the weights. The rounding is the same, so are the results, bit for bit.
 * dt_kernels_weights_stats: the copy's bytes, the weight elements rounded
 * into it, and those read from it without rounding (each a conversion the
 * GEMMs no longer make). DT_ERR_NOMEM when the copy cannot be had. */
dt_status dt_kernels_set_weights(const float *w, size_t n);
void dt_kernels_weights_changed(void);
typedef struct {
    size_t bytes;
    unsigned long long converted, reused;
} dt_kernels_wstats;
void dt_kernels_weights_stats(dt_kernels_wstats *s);

/* Row-major C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C, where
 * op(X) is X or X^T as ta/tb are 0 or 1, and lda/ldb/ldc are row strides of
 * the matrices as stored. Uses all compute threads, or one when called from
 * inside an OpenMP parallel region. Deterministic for a fixed thread count. */
void dt_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);
/* dt_sgemm in precision t (DT_BF16 or DT_F16), whatever the kernels'
 * precision, on operands already in t: A and B hold t's 16-bit values
 * (dt_from_f32's), strided as dt_sgemm's. The same bits as dt_sgemm in t
 * on their fp32 values (rounding them again changes nothing): the
 * simulated GPU's 16-bit GEMM (gpu/dev_sim.c) is this one. */
void dt_gemm16(dt_dtype t, int ta, int tb, int M, int N, int K, float alpha, const void *A, int lda, const void *B,
               int ldb, float beta, float *C, int ldc);
/* The stored matrix X[rows, cols] (row stride ld) as an operand of
 * dt_gemm16 in t (row stride cols): the weights' working copy where X is a
 * contiguous part of the weight block, else X rounded into this thread's
 * buffer number `slot` (0 .. DT_OPERAND_SLOTS-1), valid until this thread's
 * next call with the same slot. For an operand that several GEMMs read
 * (a layer's output gradient in its backward; attention's q, k and v):
 * rounded once, the same bits as dt_sgemm's rounding at each call. */
#define DT_OPERAND_SLOTS 8
const void *dt_kernels_operand16(int slot, const float *X, int rows, int cols, int ld, dt_dtype t);
/* The same product by the portable GEMM (gemm_portable.c): what dt_sgemm
 * runs in a build without oneDNN; in every build, for the tests. */
void dt_sgemm_portable(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc);

/* 2-D convolution, square kernel K, stride S, zero padding P, on inputs
 * inp[B,IC,H,W], weights w[OC,IC,K,K], bias b[OC] (may be NULL) and outputs
 * out[B,OC,OH,OW], NCHW (or blocked, below) and OIHW: oneDNN's direct
 * convolutions, which run in their own blocked layouts and reorder at the
 * edges, or the portable path (im2col and dt_sgemm, below) where this
 * build has no oneDNN or oneDNN would run the shape on its reference
 * kernel. `save` is written by forward (the input in the convolution's
 * layout: in 16 bits in a low precision, on every CPU) and read by
 * backward, so forward's caller may reuse inp afterwards; `scratch` is the
 * room both use during a call and holds nothing between calls (one can
 * serve several convolutions run one after another). dt_conv_size() gives
 * the floats each needs for a shape; the sizes grow with B and cover both
 * paths, so the sizes for B serve every smaller batch whichever path it
 * takes. Backward ADDS into dw and db, and into dinp unless set_dinp (then
 * it overwrites dinp); any of the three may be NULL (dinp must be with
 * no_dinp). With out_room, forward may use `room` (a buffer of out's size
 * the caller does not need until the backward; NULL without out_room) for
 * its output in the primitive's layout, and backward may use `out`, the
 * forward's output buffer, for its copies of dout and dinp (the caller no
 * longer needs the output then). Deterministic for a fixed thread count; the plan of each
 * shape (its path, oneDNN's primitives) is made on first use and kept.
 * Reentrant: every call writes only the caller's buffers, so calls from
 * several threads at once are safe (each with its own save and scratch). */
typedef struct {
    int B, IC, H, W, OC, K, S, P;
    // Layout of inp/dinp and of out/dout: 0 NCHW, 1 blocked by
    // DT_CONV_BLOCK channels (nChw16c: [B, ceil(C/16), H, W, 16], the
    // channels past C zero), which saves the reorders between convolutions.
    int src_blocked, dst_blocked;
    int relu;      // forward applies ReLU to its output (after the bias)
    int no_dinp;   // backward is never asked for dinp (no room planned for it)
    int out_room;  // forward may use room and backward out (above)
    int keep32;    // save the input in fp32 as the fp32 primitives read it (rounded values), not in
                   // 16 bits: the reference tests compare the 16-bit one with
} dt_conv_shape;
#define DT_CONV_BLOCK 16
void dt_conv_size(const dt_conv_shape *s, size_t *save, size_t *scratch);
/* Whether the primitives of shape s (layouts ignored) work on blocked
 * inputs and outputs: where they do, a caller gains by keeping tensors
 * blocked between convolutions (never on the portable path). */
void dt_conv_prefers_blocked(const dt_conv_shape *s, int *src, int *dst);
void dt_conv_forward(float *out, float *room, float *save, float *scratch, const float *inp, const float *w,
                     const float *b, const dt_conv_shape *s);
void dt_conv_backward(float *dinp, float *dw, float *db, float *scratch, float *out, const float *dout,
                      const float *save, const float *w, const dt_conv_shape *s, int set_dinp);
/* The path that runs shape s: DT_CONV_ONEDNN, DT_CONV_PORTABLE or
 * DT_CONV_MIXED (backward weights portable, the rest oneDNN's). oneDNN's
 * plan is made for every shape where this build has oneDNN, and a shape
 * goes portable when oneDNN chose its reference implementation ("ref...")
 * for any of the three passes (with layouts and precision as given); mixed
 * when that is backward weights alone and forward saves the input plain
 * (NCHW), as the portable path reads it. *impls (may be NULL): oneDNN's
 * implementation names of the passes, e.g. "forward jit:avx512_core,
 * backward data jit:avx512_core, backward weights ref:any" (kept with the
 * plan; "no oneDNN in this build" without it). */
enum { DT_CONV_ONEDNN = 0, DT_CONV_PORTABLE = 1, DT_CONV_MIXED = 2 };
int dt_conv_path(const dt_conv_shape *s, const char **impls);
/* Routing on (the default) or off: every shape made after this on
 * oneDNN's primitives, its reference kernels included (plans are kept per
 * setting). For the tests and benchmarks that compare the two paths. */
void dt_conv_set_routing(int on);
/* The portable path itself (conv_portable.c), with dt_conv_*'s contract
 * (plain NCHW preferred; out_room unused); its sizes are its own. */
void dt_conv_portable_size(const dt_conv_shape *s, size_t *save, size_t *scratch);
void dt_conv_portable_forward(float *out, float *save, float *scratch, const float *inp, const float *w,
                              const float *b, const dt_conv_shape *s);
void dt_conv_portable_backward(float *dinp, float *dw, float *db, float *scratch, float *out, const float *dout,
                               const float *save, const float *w, const dt_conv_shape *s, int set_dinp);

#endif
