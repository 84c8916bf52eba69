/* The device seam (docs/gpu.md): the operations a model trained on a device
 * calls, as one table chosen at run time, as ggml's backends are.
 *
 *   dt_dev_cuda: the CUDA device, gpu.h's dt_gpu_* functions (the .cu files of src/gpu/;
 *                none.c's refusals in a build without CUDA). A kernel the
 *                device has no CUDA version of yet is NULL: a run that needs
 *                it is refused at its start, naming the op (dt_dev_lacks).
 *   dt_dev_sim:  dtrain's simulated GPU, for tests, in every build
 *                (DTRAIN_GPU=sim): device memory is mmap'ed and kept
 *                PROT_NONE except inside an op, which opens it, runs the
 *                CPU's own kernel (the op's twin: dt_sgemm,
 *                dt_layernorm_forward, ...) and closes it again; so any host
 *                read of a device pointer outside an op dies with SIGSEGV.
 *
 * Pointers called `dev` (and every float/int pointer a kernel takes) are
 * device memory; the kernels' contracts are their CPU twins' (dtrain/nn.h,
 * dtrain/gpt.h; backward accumulates with +=), gpu.h says where they
 * differ. */
#ifndef DT_GPU_DEV_H
#define DT_GPU_DEV_H

#include "dtrain/core.h"
#include "gpu/cnn_hd.h"
#include "optim/elem.h"

#include <stddef.h>
#include <stdint.h>

struct dt_dev_scratch_ask;

/* Which way this process's GPT attention takes on a device ([train]
 * attention, set at a run's start by dt_train_device_use; gpu/att_plan.c):
 * AUTO the fused kernels for heads of up to 128 columns (att_plan.h's
 * DT_ATT_FUSED_HS) and the GEMM plan for larger ones; FUSED the kernels
 * (larger heads refused at the model's start); GEMM the plan for every
 * head (its probabilities kept: B NH T T floats a layer). */
typedef enum { DT_ATT_AUTO, DT_ATT_FUSED, DT_ATT_GEMM } dt_att_choice;
void dt_att_choose(dt_att_choice c);

typedef struct dt_dev {
    const char *name;                                  /* "cuda" or "sim" */
    int (*count)(char *why, size_t n);                 /* usable devices, 0 with the reason */
    dt_status (*describe)(int index, char *out, size_t n);
    dt_status (*use)(int index);
    /* Device memory: free and total bytes of the device in use. */
    dt_status (*mem_info)(size_t *free_bytes, size_t *total);
    dt_status (*alloc)(void **dev, size_t bytes);
    void (*free)(void *dev);
    /* Page-locked host memory, which copies to and from the device read and
     * write directly (pinned buffers); plain memory on the simulated GPU. */
    dt_status (*host_alloc)(void **host, size_t bytes);
    void (*host_free)(void *host);
    dt_status (*memset0)(void *dev, size_t bytes);
    /* Memory backed on demand (ZeRO's gradients, dt_dev_vm): vm_reserve
     * takes an address range of `bytes` and no memory yet, *gran its
     * granularity (a power of two; the ranges vm_map and vm_unmap take are
     * multiples of it, aligned); vm_map backs [dev, dev + bytes) with
     * memory (its contents undefined: NaNs on the simulated GPU), vm_unmap
     * gives it back at once (it does not wait for work queued: the caller
     * makes sure nothing queued uses it); vm_free the whole range.
     * A kernel that touches memory not backed dies (an illegal address;
     * SIGSEGV on the simulated GPU). */
    dt_status (*vm_reserve)(void **dev, size_t bytes, size_t *gran);
    dt_status (*vm_map)(void *dev, size_t bytes);
    dt_status (*vm_unmap)(void *dev, size_t bytes);
    void (*vm_free)(void *dev, size_t bytes);
    dt_status (*to_device)(void *dev, const void *host, size_t bytes);
    dt_status (*to_host)(void *host, const void *dev, size_t bytes);
    /* to_device queued on the kernels' stream from pinned host memory
     * (host_alloc's), the host not waiting: it must not write `host` again
     * before an event recorded after it has run (dt_dev_blocks_stage).
     * to_device and to_host wait for the copy (and for every kernel queued
     * before it). Synchronous on the simulated GPU. */
    dt_status (*to_device_async)(void *dev, const void *host, size_t bytes);
    /* to_host's calls so far in this process: the host's waits for the
     * device (summary.json's gpu.reads_per_step). */
    uint64_t (*reads)(void);
    /* The ops' own scratch (the embedding's sort, the sums of squares' and
     * the column sums' partial sums, cuDNN's workspaces): one buffer of the
     * device's, reused by every call. scratch_of: the bytes one call asks
     * for; scratch_reserve: the buffer made at least `bytes` long, by a
     * run's plan before its first step (dt_dev_arena_open), so that no step
     * allocates; scratch_bytes: the buffer's bytes, and in *allocs (non-NULL)
     * the calls since a reservation that allocated (a shape no plan counted:
     * summary.json's gpu.scratch_allocations, 0 in a planned run). The
     * simulated GPU's ops take none, yet count what CUDA's would ask (its
     * sort's room and cuDNN's workspaces aside) so that its runs check the
     * plans. */
    size_t (*scratch_of)(const struct dt_dev_scratch_ask *q);
    dt_status (*scratch_reserve)(size_t bytes);
    size_t (*scratch_bytes)(uint64_t *allocs);
    dt_status (*copy)(void *dev_to, const void *dev_from, size_t bytes);
    dt_status (*sync)(void);
    /* A stream for communication (NCCL's): work queued on it runs beside
     * the kernels, which all go to one stream (the device's own).
     * stream_after_compute: what is queued on it from now on starts after
     * every kernel queued so far. stream_query: *done = 1 once everything
     * queued on it has finished (never blocks). On the simulated GPU every
     * op is done when it returns: a stream is a token, always done. */
    dt_status (*stream_create)(void **stream);
    void (*stream_destroy)(void *stream);
    dt_status (*stream_after_compute)(void *stream);
    dt_status (*stream_query)(void *stream, int *done);
    /* Events of the kernels' stream, reused: event_record marks the kernels
     * queued so far (again each time: the mark of the last record counts);
     * stream_wait_event: what is queued on stream from now on starts after
     * the kernels the event's last record marked. A gradient bucket is
     * summed after its own kernels, not after those queued since. Tokens on
     * the simulated GPU (done at once). */
    dt_status (*event_create)(void **event);
    void (*event_destroy)(void *event);
    dt_status (*event_record)(void *event);
    dt_status (*stream_wait_event)(void *stream, void *event);
    /* *done = 1 once the kernels the event's last record marked have run
     * (never blocks; a kernel's error is returned). */
    dt_status (*event_query)(void *event, int *done);
    /* A step as a graph (CUDA graphs; docs/gpu.md, "A step as a CUDA
     * graph"), one at a time. graph_capture: the ops from now on are
     * recorded into a new graph, not run, until graph_run; graph_replay:
     * the ops from now on are neither run nor recorded (the graph has
     * them: the host makes the same calls with the same arguments as in the
     * captured step, and writes the pinned memory the graph's copies read
     * before graph_run), until graph_run; graph_run: ends either (the
     * first makes the graph) and queues the graph's run, which reads the
     * pinned memory then. Inside either, a call that waits for the device
     * (to_host, to_device, sync) is an error, event_record marks nothing.
     * graph_drop: the graph and a capture under way given up. The simulated
     * GPU keeps the captured calls and runs them again at each graph_run
     * (their arguments the captured ones), as a graph does. */
    dt_status (*graph_capture)(void);
    dt_status (*graph_replay)(void);
    dt_status (*graph_run)(void);
    void (*graph_drop)(void);
    /* The simulated GPU only (NULL on cuda): opens (on = 1) its memory to
     * the calling thread's host code until the matching on = 0, as an op
     * does, for a library that stands in for one of the device's own: the
     * fake NCCL of the tests reads and writes device pointers on the CPU.
     * Other ops wait meanwhile. */
    void (*host_open)(int on);
    /* ---- kernels (NULL: not in this dtrain yet) ---- */
    /* sgemm: dt_sgemm in fp32. gemm16: the same on 16-bit operands of type
     * t (DT_BF16 or DT_F16: the values to16 makes), fp32 sums and C, as
     * dt_gemm16 (kernels.h). to16: dst[n] = src rounded to t (nearest
     * even; dt_from_f32's bits). docs/gpu.md, "Mixed precision". */
    dt_status (*sgemm)(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc);
    dt_status (*gemm16)(dt_dtype t, int ta, int tb, int M, int N, int K, float alpha, const void *A, int lda,
                        const void *B, int ldb, float beta, float *C, int ldc);
    dt_status (*to16)(void *dst, const float *src, size_t n, dt_dtype t);
    /* from16: dst[n] = src widened (dt_to_f32's). ef16: to16 with error
     * feedback, dt_from_f32_ef (g += res, dst = g rounded, res = what dst
     * lost). The fp16/bf16 gradient exchange (docs/gpu.md). */
    dt_status (*from16)(float *dst, const void *src, size_t n, dt_dtype t);
    dt_status (*ef16)(void *dst, float *g, float *res, size_t n, dt_dtype t);
    /* The linear layer (gpu.h's dt_gpu_linear_forward: cuBLASLt's BIAS and
     * GELU_AUX_BIAS epilogues): inp [N,C] and w [OC,C] of type t (DT_F32,
     * or 16-bit as gemm16's), b (NULL: none); pre NULL: out = inp w^T + b;
     * else pre = inp w^T + b, out = gelu(pre). The simulated GPU: the
     * bias written, the GEMM adding onto it, GELU after (the CPU's
     * dt_linear_forward and dt_gelu_forward). */
    dt_status (*linear_forward)(float *out, float *pre, const void *inp, const void *w, const float *b, int N, int C,
                                int OC, dt_dtype t);
    /* Its input gradient where its input was gelu(pre) (gpu.h's
     * dt_gpu_linear_dgelu: the DGELU epilogue): dpre[N,C] = gelu'(pre)
     * (g w), WRITTEN, g [N,OC] and w [OC,C] of type t. The simulated GPU:
     * g w into zeros, then the CPU's GELU gradient into zeros. */
    dt_status (*linear_dgelu)(float *dpre, const void *g, const void *w, const float *pre, int N, int C, int OC,
                              dt_dtype t);
    /* out16 non-NULL (layernorm_residual's too): the output rounded to t
     * (16-bit) there instead of out (not written: NULL will do), the
     * bits of out converted by to16. */
    dt_status (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                   const float *b, size_t N, int C, float eps, void *out16, dt_dtype t);
    dt_status (*layernorm_backward)(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                    const float *w, const float *mean, const float *rstd, size_t N, int C);
    /* residual_forward(res, a, b) and layernorm_forward of res into out in
     * one pass over the rows (gpu.h's dt_gpu_layernorm_residual): the two
     * ops' bits; res may be a or b. */
    dt_status (*layernorm_residual)(float *out, float *mean, float *rstd, float *res, const float *a, const float *b,
                                    const float *w, const float *bias, size_t N, int C, float eps, void *out16,
                                    dt_dtype t);
    /* out16 non-NULL: the output rounded to t (16-bit) there instead of
     * out (not written), the bits of out converted by to16. */
    dt_status (*gelu_forward)(float *out, const float *inp, size_t n, void *out16, dt_dtype t);
    dt_status (*gelu_backward)(float *dinp, const float *dout, const float *inp, size_t n);
    dt_status (*crossentropy_forward)(float *probs, double *row_loss, float *loss, const float *logits,
                                      const int32_t *targets, size_t N, int V, size_t ld);
    dt_status (*crossentropy_backward)(float *dlogits, const float *probs, const int32_t *targets, size_t N, int V,
                                       size_t ld, float dloss);
    /* Both in one pass, no probabilities kept (gpu.h's
     * dt_gpu_crossentropy_fused: the GPT's head over its vocabulary): the
     * loss as crossentropy_forward's, the logits replaced by
     * crossentropy_backward's gradient onto zeros; or, d16 given, that
     * gradient rounded to t (16-bit) into d16's rows (ld apart, V columns
     * each) and the logits left as they were. */
    dt_status (*crossentropy_fused)(float *logits, double *row_loss, float *loss, const int32_t *targets, size_t N,
                                    int V, size_t ld, float dloss, void *d16, dt_dtype t);
    /* k: the constants, in device memory (dt_dev_blocks' k). guard (NULL:
     * k's grad_scale, always applied): two device floats,
     * step_scale's, the gradient scale in place of k's, and a non-zero
     * second that skips the update (nothing written). */
    dt_status (*adamw)(float *w, const float *g, float *m, float *v, size_t n, const dt_adamw_k *k,
                       const float *guard);
    dt_status (*sgd)(float *w, const float *g, float *buf, size_t n, const dt_sgd_k *k, const float *guard);
    /* vals: two device doubles, the gradient's sum of squares and the
     * step's summed loss (dt_dev_blocks' sumsq). guard[0] = optim/elem.h's
     * dt_step_scale(sqrt(vals[0]), unscale, clip), guard[1] = 1 where that
     * norm or the loss is NaN or Inf (else 0): the step's end on the device
     * (its update skips itself), no wait for the host. */
    dt_status (*step_scale)(float *guard, const double *vals, float unscale, float clip);
    /* The CPU twins' argument lists (dtrain/gpt.h, dtrain/nn.h) on device
     * pointers; bias: out[N,OC] += b, db += the column sums of dout (rows in
     * order); sumsq: the sum of squares of x[n] into one device double (as
     * dt_sum_squares); scale: x *= *s_dev. */
    dt_status (*encoder_forward)(float *out, const int32_t *inp, const float *wte, const float *wpe, int B, int T,
                                 int C);
    dt_status (*encoder_backward)(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B, int T,
                                  int C);
    /* A GPT's tensor-parallel shard (gpu.h's dt_gpu_encoder_split_forward
     * and the rest: dtrain/gpt.h's vocabulary-parallel embedding and
     * cross-entropy). */
    dt_status (*encoder_split_forward)(float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                                       int T, int C, int v0, int V);
    dt_status (*encoder_split_backward)(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                                        int T, int C, int v0, int V);
    dt_status (*ce_split_max)(float *mx, const float *logits, size_t N, int V);
    dt_status (*ce_split_exp)(float *probs, float *sums, const float *logits, const float *mx, const int32_t *targets,
                              size_t N, int V);
    dt_status (*ce_split_finish)(float *probs, double *row_loss, float *loss, const float *mx, const float *sums,
                                 size_t N, int V);
    dt_status (*residual_forward)(float *out, const float *a, const float *b, size_t N);
    dt_status (*residual_backward)(float *da, float *db, const float *dout, size_t N);
    /* The attention's products in precision t (DT_F32; DT_BF16, DT_F16:
     * their operands rounded to t, fp32 sums, as the CPU's attention in t);
     * work: dt_att_work_bytes (gpu/att_plan.h) of room for the rounded
     * copies (NULL in fp32; the simulated GPU's CPU attention needs none).
     * The backward writes dqkv whole (the CPU's op adds into it; the
     * device's keeps no memset before it).
     * The backward's out: the forward's output as the layer keeps it,
     * fp32 (t DT_F32) or its copy in t (the fused kernels' row dots).
     * out16 non-NULL (t 16-bit): the forward's output rounded to t there
     * (to16's bits), out room it may write. */
    dt_status (*attention_forward)(float *out, float *att, const float *qkv, void *work, int B, int T, int C, int NH,
                                   dt_dtype t, void *out16);
    dt_status (*attention_backward)(float *dqkv, float *datt, const float *dout, const float *qkv, const void *out,
                                    const float *att, void *work, int B, int T, int C, int NH, dt_dtype t);
    dt_status (*relu_forward)(float *out, const float *inp, size_t N);
    dt_status (*relu_backward)(float *dinp, const float *dout, const float *inp, size_t N);
    dt_status (*bias_forward)(float *out, const float *b, size_t N, int OC);
    /* dout16 non-NULL: dout rounded to t (16-bit) there too, in the same
     * pass (to16's bits: the linears' output gradients in 16 bits). */
    dt_status (*bias_backward)(float *db, const float *dout, size_t N, int OC, void *dout16, dt_dtype t);
    dt_status (*sumsq)(double *out_dev, const float *x, size_t n);
    /* sumsq_parts: dt_sum_squares_parts on a slice x[n] into part_dev (one
     * device double a piece; ZeRO's sharded norm). */
    dt_status (*sumsq_parts)(double *part_dev, const float *x, size_t n, size_t first, double carry);
    dt_status (*scale)(float *x, size_t n, const float *s_dev);
    /* acc[0] += (double)loss[0] * w on the device, a product then a sum
     * (not fused): the host loop's sum of the micro-batches' losses
     * weighted by their sizes, the same bits, kept there until the step's
     * one read (dt_dev_blocks_step_values). */
    dt_status (*loss_add)(double *acc, const float *loss, double w);
    /* The CNN's (gpu.h's dt_gpu_im2col and the rest; cnn_hd.h's arithmetic). */
    dt_status (*im2col)(float *col, const float *x, size_t B, const dt_im2col_t *g);
    dt_status (*col2im)(float *dx, const float *dcol, size_t B, const dt_im2col_t *g);
    dt_status (*transpose)(float *out, const float *in, size_t nb, size_t R, size_t C);
    /* A convolution whole, in fp32 (dt_conv2d_forward's and _backward's
     * contract in NCHW, without their scratch: inp is the layer's input,
     * kept by the caller; b, db, dinp NULL: none): cuDNN's on cuda (its
     * deterministic algorithms), im2col and a GEMM on the simulated GPU.
     * conv2d_ready: 1 where they can run (cuDNN found), else 0 and why; the
     * device model then makes its convolutions of im2col and a GEMM. */
    int (*conv2d_ready)(char *why, size_t n);
    dt_status (*conv2d_forward)(float *out, const float *inp, const float *w, const float *b, size_t B,
                                const dt_im2col_t *g, int OC);
    dt_status (*conv2d_backward)(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                 const float *w, size_t B, const dt_im2col_t *g, int OC);
    dt_status (*maxpool_forward)(float *out, int32_t *arg, const float *x, size_t images, int H, int W, int K, int S);
    dt_status (*maxpool_backward)(float *dx, const float *dout, const int32_t *arg, size_t images, int H, int W, int K,
                                  int S);
    dt_status (*dropout_forward)(float *out, float *mask, const float *x, int B, size_t n, float p, uint64_t seed,
                                 uint64_t step, int64_t first, int layer, size_t skip);
    dt_status (*dropout_backward)(float *dx, const float *dout, const float *mask, size_t N);
    /* Deterministic mode's fixed point (core/fixed.h): acc[n] +=
     * round(g x 2^32); g[n] = acc / 2^32. */
    dt_status (*fixed_add)(int64_t *acc, const float *g, size_t n);
    dt_status (*fixed_to_float)(float *g, const int64_t *acc, size_t n);
} dt_dev;

extern const dt_dev dt_dev_cuda; /* gpu/dev.c */
extern const dt_dev dt_dev_sim;  /* gpu/dev_sim.c */

/* The device this process trains on: the simulated GPU when DTRAIN_GPU=sim,
 * else the CUDA device. */
const dt_dev *dt_dev_get(void);
/* A table of the program's own in place of that choice, NULL back to it
 * (tests/gpu/test_gpu_emu.c: the simulated GPU with the CUDA kernels on
 * emulated threads). */
void dt_dev_set(const dt_dev *d);
/* The simulated GPU's bracket around code of another's that reads and
 * writes its device memory (open 1, then 0): the memory is the host's
 * between the two, as inside one of its own ops. */
void dt_dev_sim_bracket(int open);
/* The first of the NULL-terminated op names (as the table's fields: "sgemm",
 * "bias_forward", ...) that d lacks, or NULL when it has them all. */
const char *dt_dev_lacks(const dt_dev *d, const char *const *ops);
/* The same, refused: "<what>: the GPU's <op> is not in this dtrain yet". */
dt_status dt_dev_require(const dt_dev *d, const char *const *ops, const char *what);

/* ---- one arena: every block a run keeps on the device, planned at start ---- */

/* A call's scratch (scratch_of): the encoder's backward (whole or split) of
 * n positions; the column sums of n rows of C (bias_backward); layernorm's
 * backward of n rows of C; sumsq of n floats; a convolution (conv2d_forward
 * or _backward) of n samples of geometry g into C filters. */
typedef enum { DT_ASK_ENCODER, DT_ASK_COLSUM, DT_ASK_LAYERNORM, DT_ASK_SUMSQ, DT_ASK_CONV } dt_dev_ask_op;
typedef struct dt_dev_scratch_ask {
    dt_dev_ask_op op;
    size_t n;
    int C;
    const dt_im2col_t *g;
} dt_dev_scratch_ask;
/* The bytes launch.h's formulas give a call (those of dtrain's own
 * kernels; the encoder's without its sort's room, a convolution none):
 * the simulated GPU's scratch_of, the CUDA device's but for those two. */
size_t dt_dev_scratch_kernels(const dt_dev_scratch_ask *q);

enum { DT_DEV_WEIGHTS, DT_DEV_GRADS, DT_DEV_OPTIM, DT_DEV_ACTS, DT_DEV_WORK, DT_DEV_KINDS };
extern const char *const dt_dev_kind_names[DT_DEV_KINDS]; /* "weights", "gradients", ... */

typedef struct {
    const dt_dev *d;
    size_t planned[DT_DEV_KINDS], used[DT_DEV_KINDS], size, at;
    size_t scratch; /* the most scratch one call of its plan asks for (dt_dev_ask_scratch) */
    char *base;     /* device memory, NULL while planning */
} dt_dev_arena;

/* Planning: dt_dev_take with base NULL counts the bytes (each block 256-byte
 * aligned) and returns NULL; dt_dev_arena_open then allocates them all at
 * once, refusing a plan larger than the device's free memory with the bytes
 * by kind; a second pass of the same takes hands out the blocks. */
void *dt_dev_take(dt_dev_arena *a, int kind, size_t bytes);
/* Planning too: a call the blocks' ops will make, its scratch counted
 * (the device's buffer, beside the arena: dt_dev_arena_open checks that
 * it fits with the arena and reserves it). */
void dt_dev_ask_scratch(dt_dev_arena *a, dt_dev_ask_op op, size_t n, int C, const dt_im2col_t *g);
dt_status dt_dev_arena_open(dt_dev_arena *a, const char *what);
/* After the taking pass: DT_OK when it took every block the counting pass
 * planned, kind by kind, else an internal error naming `what` and the
 * kinds (the two passes must make the same takes). */
dt_status dt_dev_arena_check(const dt_dev_arena *a, const char *what);
void dt_dev_arena_close(dt_dev_arena *a);

/* ---- a block backed on demand, chunk by chunk (ZeRO stage 2's gradients) ---- */

typedef struct {
    const dt_dev *d;
    const char *name;     /* what it holds, for errors ("gradients", ...) */
    char *base;           /* the block: bytes of address range */
    size_t bytes, gran;   /* ... backed in chunks of gran (the device's vm_reserve) */
    size_t nchunks;
    unsigned char *mapped; /* per chunk: backed */
    size_t *unused;        /* per chunk: bytes said unused this step (dt_dev_vm_unused) */
    size_t now, peak;      /* bytes backed, now and the most at once */
    /* The owner's bound (0: none): before a chunk is backed past `budget`
     * bytes, room(room_user) is called until it is back under it or room
     * returns 0 (nothing more to wait for): it waits for work using the
     * block to end, to give chunks back. The host is so kept at most a
     * budget ahead of the device. */
    size_t budget;
    int (*room)(void *user);
    void *room_user;
} dt_dev_vm;

/* A block of `bytes` with no memory yet, holding `name` (a string that
 * outlives it; errors say it); what: the run, for the refusal. */
dt_status dt_dev_vm_open(dt_dev_vm *v, const dt_dev *d, size_t bytes, const char *name, const char *what);
void dt_dev_vm_close(dt_dev_vm *v);
/* Bytes [off, off + len) of the block backed (the chunks not yet backed
 * mapped and zeroed): before a kernel writes them. An out-of-memory names
 * the bytes. */
dt_status dt_dev_vm_back(dt_dev_vm *v, size_t off, size_t len);
/* Bytes [off, off + len) are not needed again this step (nothing queued
 * reads or writes them any more): every chunk all of whose bytes are so is
 * given back. */
dt_status dt_dev_vm_unused(dt_dev_vm *v, size_t off, size_t len);
/* Every chunk backed zeroed, and the step's unused counts cleared: the
 * block zero for the next step, wherever it is backed. */
dt_status dt_dev_vm_zero(dt_dev_vm *v);
/* Every chunk wholly inside bytes [off, off + len) given back at once (its
 * owner knows nothing uses it; ZeRO stage 3's parameters). */
dt_status dt_dev_vm_give(dt_dev_vm *v, size_t off, size_t len);

#endif
