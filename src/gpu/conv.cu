/* The CNN's convolutions on the GPU by cuDNN (gpu.h's dt_gpu_conv2d_*):
 * cuDNN's convolutions in NCHW fp32 through its legacy API (declared in
 * cudnn_api.h: no cuDNN header needed to build), loaded at the first use
 * (dt_gpu_lib_open, dl.c: libcudnn.so.9), with the deterministic
 * algorithms only (forward IMPLICIT_PRECOMP_GEMM, backward data and filter
 * ALGO_1: no atomics, the same bits every run), TF32 tensor cores where
 * dt_gpu_set_tf32 says (else FMA math: no TF32); the bias and its gradient
 * our own kernels (a thread an element; a block a channel's sum, in a
 * fixed order). One device: the handle is the device's current at the
 * first use. Each shape's descriptors and workspace sizes are made once and
 * kept; the workspace comes from the stream's pool. Where cuDNN cannot be
 * loaded dt_gpu_conv2d_ready says why, and the device model keeps im2col
 * and a GEMM (cnn.cu). */
#include "gpu/block.h"
#include "gpu/cuda_check.h"
#include "gpu/cudnn_api.h"
#include "gpu/gpu.h"
#include "gpu/launch.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define DNN_FUNCS(X)                                                                                             \
    X(cudnnGetErrorString) X(cudnnCreate) X(cudnnSetStream) X(cudnnCreateTensorDescriptor)                      \
    X(cudnnSetTensor4dDescriptor) X(cudnnDestroyTensorDescriptor) X(cudnnCreateFilterDescriptor)                \
    X(cudnnSetFilter4dDescriptor) X(cudnnDestroyFilterDescriptor) X(cudnnCreateConvolutionDescriptor)           \
    X(cudnnSetConvolution2dDescriptor) X(cudnnSetConvolutionMathType) X(cudnnDestroyConvolutionDescriptor)      \
    X(cudnnGetConvolutionForwardWorkspaceSize) X(cudnnConvolutionForward)                                       \
    X(cudnnGetConvolutionBackwardDataWorkspaceSize) X(cudnnConvolutionBackwardData)                             \
    X(cudnnGetConvolutionBackwardFilterWorkspaceSize) X(cudnnConvolutionBackwardFilter)

static struct {
#define DNN_FIELD(f) f##_fn f;
    DNN_FUNCS(DNN_FIELD)
#undef DNN_FIELD
    cudnnHandle_t handle;
    int device;    // the device current at the first use: the handle's
    dt_status st;  // of the first use: DT_OK, or the error, kept in why
    char why[512];
} dnn;
static pthread_once_t dnn_once = PTHREAD_ONCE_INIT;

static void dnn_load(void) {
    dnn.st = DT_ERR_INTERNAL;
    dt_gpu_lib lib;
    if (dt_gpu_lib_open("cudnn", &lib) != DT_OK) {
        snprintf(dnn.why, sizeof dnn.why, "%s", dt_last_error());
        return;
    }
#define DNN_SYM(f)                                                                                               \
    if (!(dnn.f = (f##_fn)dt_gpu_lib_sym(&lib, #f))) {                                                   \
        snprintf(dnn.why, sizeof dnn.why, "%.400s has no %s", lib.path, #f);                                     \
        return;                                                                                                  \
    }
    DNN_FUNCS(DNN_SYM)
#undef DNN_SYM
    cudaError_t e = cudaGetDevice(&dnn.device);
    if (e != cudaSuccess) {
        snprintf(dnn.why, sizeof dnn.why, "cudaGetDevice: %s", cudaGetErrorString(e));
        return;
    }
    cudnnStatus_t s = dnn.cudnnCreate(&dnn.handle);
    if (s == CUDNN_STATUS_SUCCESS) s = dnn.cudnnSetStream(dnn.handle, dt_cu_stream);  // (the kernels' stream)
    if (s != CUDNN_STATUS_SUCCESS) {
        snprintf(dnn.why, sizeof dnn.why, "cudnnCreate: %s", dnn.cudnnGetErrorString(s));
        return;
    }
    dnn.st = DT_OK;
}

int dt_gpu_conv2d_ready(char *why, size_t n) {
    pthread_once(&dnn_once, dnn_load);
    if (dnn.st != DT_OK && n) snprintf(why, n, "%s", dnn.why);
    return dnn.st == DT_OK;
}

#define DT_DNN(call)                                                                                             \
    do {                                                                                                         \
        cudnnStatus_t dt_s_ = dnn.call;                                                                          \
        if (dt_s_ != CUDNN_STATUS_SUCCESS) {                                                                     \
            st = dt_error(DT_ERR_INTERNAL, "GPU: %s: %s", #call, dnn.cudnnGetErrorString(dt_s_));               \
            goto done;                                                                                           \
        }                                                                                                        \
    } while (0)

// A cuDNN call that queues work on the kernels' stream: not while a step's
// graph is replayed.
#define DT_DNN_RUN(call)                                                                                         \
    do {                                                                                                         \
        if (!dt_gpu_skipping) DT_DNN(call);                                                                      \
    } while (0)

// The algorithms: cuDNN's deterministic ones.
enum {
    FWD = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
    BWD_DATA = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
    BWD_FILTER = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
};

// A convolution's shape: the input [B, C, H, W], the filters [OC, C, K,
// K], the output [B, OC, OH, OW], the math. (No padding: compared with
// memcmp.)
typedef struct {
    size_t B;
    dt_im2col_t g;
    int OC, tf32;
} conv_key;

// Its descriptors (x, y the input and output, w the filters) and the
// algorithms' workspace bytes.
typedef struct {
    conv_key key;
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    size_t ws_fwd, ws_data, ws_filter;
} conv_shape;

static void shape_free(conv_shape *c) {
    if (c->x) dnn.cudnnDestroyTensorDescriptor(c->x);
    if (c->y) dnn.cudnnDestroyTensorDescriptor(c->y);
    if (c->w) dnn.cudnnDestroyFilterDescriptor(c->w);
    if (c->conv) dnn.cudnnDestroyConvolutionDescriptor(c->conv);
}

static dt_status shape_make(conv_shape *c, const conv_key *k) {
    dt_status st = DT_OK;
    const dt_im2col_t *g = &k->g;
    int B = (int)k->B;
    *c = conv_shape{};
    c->key = *k;
    DT_DNN(cudnnCreateTensorDescriptor(&c->x));
    DT_DNN(cudnnCreateTensorDescriptor(&c->y));
    DT_DNN(cudnnCreateFilterDescriptor(&c->w));
    DT_DNN(cudnnCreateConvolutionDescriptor(&c->conv));
    DT_DNN(cudnnSetTensor4dDescriptor(c->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, B, g->C, g->H, g->W));
    DT_DNN(cudnnSetTensor4dDescriptor(c->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, B, k->OC, g->OH, g->OW));
    DT_DNN(cudnnSetFilter4dDescriptor(c->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, k->OC, g->C, g->K, g->K));
    DT_DNN(cudnnSetConvolution2dDescriptor(c->conv, g->P, g->P, g->S, g->S, 1, 1, CUDNN_CROSS_CORRELATION,
                                           CUDNN_DATA_FLOAT));
    DT_DNN(cudnnSetConvolutionMathType(c->conv, k->tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
    DT_DNN(cudnnGetConvolutionForwardWorkspaceSize(dnn.handle, c->x, c->w, c->conv, c->y, FWD, &c->ws_fwd));
    DT_DNN(cudnnGetConvolutionBackwardDataWorkspaceSize(dnn.handle, c->w, c->y, c->conv, c->x, BWD_DATA, &c->ws_data));
    DT_DNN(cudnnGetConvolutionBackwardFilterWorkspaceSize(dnn.handle, c->x, c->y, c->conv, c->w, BWD_FILTER,
                                                          &c->ws_filter));
done:
    if (st != DT_OK) shape_free(c);
    return st;
}

// The shapes made so far, kept (a step's forward and backward, and every
// step, take the same ones); past CONV_CACHE a shape is made for its call
// alone, the way gemm.cu keeps cuBLASLt's algorithms.
enum { CONV_CACHE = 64 };
static conv_shape conv_cache[CONV_CACHE];
static int conv_cached;
static pthread_mutex_t conv_lock = PTHREAD_MUTEX_INITIALIZER;

// *out: the shape of a convolution of B samples, kept, or made into
// *spare (the caller frees it with shape_free when *out == spare).
static dt_status shape_of(size_t B, const dt_im2col_t *g, int OC, conv_shape *spare, const conv_shape **out) {
    int dev = -1;
    *out = NULL;
    if (!dt_gpu_conv2d_ready(NULL, 0)) return dt_error(DT_ERR_CONFIG, "GPU: convolutions need cuDNN: %s", dnn.why);
    if (cudaGetDevice(&dev) != cudaSuccess || dev != dnn.device)
        return dt_error(DT_ERR_INTERNAL, "GPU: cuDNN's handle is device %d's, the convolution's device %d", dnn.device,
                        dev);
    if (B > (size_t)INT32_MAX) return dt_error(DT_ERR_ARG, "GPU: a convolution of %zu samples", B);
    conv_key k;
    memset(&k, 0, sizeof k);
    k.B = B, k.g = *g, k.OC = OC, k.tf32 = dt_gpu_tf32();
    pthread_mutex_lock(&conv_lock);
    for (int i = 0; i < conv_cached && !*out; i++)
        if (!memcmp(&conv_cache[i].key, &k, sizeof k)) *out = &conv_cache[i];
    dt_status st = DT_OK;
    if (!*out) {
        conv_shape *c = conv_cached < CONV_CACHE ? &conv_cache[conv_cached] : spare;
        st = shape_make(c, &k);
        if (st == DT_OK && c != spare) conv_cached++;
        if (st == DT_OK) *out = c;
    }
    pthread_mutex_unlock(&conv_lock);
    return st;
}

// out[b, c, :] += bias[c]: a thread an element.
__global__ static void bias_nchw_kernel(float *out, const float *bias, size_t n, size_t hw, int OC) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] += bias[i / hw % (size_t)OC];
}

// db[c] += the sum of dout[b, c, :] over b and the positions: a block a
// channel, each thread a strided part of every sample's row in order, the
// parts then added in the block's fixed tree.
__global__ static void __launch_bounds__(DT_THREADS)
    bias_nchw_grad_kernel(float *db, const float *dout, size_t B, size_t hw, int OC) {
    __shared__ float sh[DT_THREADS];
    int c = blockIdx.x;
    float s = 0.0f;
    for (size_t b = 0; b < B; b++)
        for (size_t p = threadIdx.x; p < hw; p += DT_THREADS) s += dout[(b * OC + c) * hw + p];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) db[c] += s;
}

size_t dt_gpu_conv2d_scratch(size_t B, const dt_im2col_t *g, int OC) {
    conv_shape spare;
    const conv_shape *c;
    if (B == 0 || shape_of(B, g, OC, &spare, &c) != DT_OK) return 0;  // (the call says why)
    size_t n = c->ws_fwd > c->ws_data ? c->ws_fwd : c->ws_data;
    n = n > c->ws_filter ? n : c->ws_filter;
    if (c == &spare) shape_free(&spare);
    return n;
}

dt_status dt_gpu_conv2d_forward(float *out, const float *inp, const float *w, const float *b, size_t B,
                                const dt_im2col_t *g, int OC) {
    if (B == 0) return DT_OK;
    conv_shape spare;
    const conv_shape *c;
    dt_status st = shape_of(B, g, OC, &spare, &c);
    if (st != DT_OK) return st;
    size_t n = B * (size_t)OC * g->OH * g->OW;
    void *ws = NULL;
    const float one = 1.0f, zero = 0.0f;
    if (c->ws_fwd && (st = dt_gpu_scratch(&ws, c->ws_fwd)) != DT_OK) goto done;
    DT_DNN_RUN(cudnnConvolutionForward(dnn.handle, &one, c->x, inp, c->w, w, c->conv, FWD, ws, c->ws_fwd, &zero, c->y,
                                   out));
    if (b) {
        DT_RUN(bias_nchw_kernel, dt_launch_blocks(n, DT_THREADS), DT_THREADS, 0, out, b, n, (size_t)g->OH * g->OW, OC);
        st = dt_gpu_launched("bias_nchw_kernel");
    }
done:
    if (ws) dt_gpu_scratch_free(ws);
    if (c == &spare) shape_free(&spare);
    return st;
}

dt_status dt_gpu_conv2d_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                 const float *w, size_t B, const dt_im2col_t *g, int OC) {
    if (B == 0) return DT_OK;
    conv_shape spare;
    const conv_shape *c;
    dt_status st = shape_of(B, g, OC, &spare, &c);
    if (st != DT_OK) return st;
    size_t wd = dinp ? c->ws_data : 0, room = wd > c->ws_filter ? wd : c->ws_filter;
    void *ws = NULL;
    const float one = 1.0f;
    if (room && (st = dt_gpu_scratch(&ws, room)) != DT_OK) goto done;
    if (db) {
        DT_RUN(bias_nchw_grad_kernel, (unsigned)OC, DT_THREADS, 0, db, dout, B, (size_t)g->OH * g->OW, OC);
        if ((st = dt_gpu_launched("bias_nchw_grad_kernel")) != DT_OK) goto done;
    }
    // (beta 1: both gradients accumulate, as the CPU's backward does)
    DT_DNN_RUN(cudnnConvolutionBackwardFilter(dnn.handle, &one, c->x, inp, c->y, dout, c->conv, BWD_FILTER, ws,
                                         c->ws_filter, &one, c->w, dw));
    if (dinp)
        DT_DNN_RUN(cudnnConvolutionBackwardData(dnn.handle, &one, c->w, w, c->y, dout, c->conv, BWD_DATA, ws, wd, &one,
                                           c->x, dinp));
done:
    if (ws) dt_gpu_scratch_free(ws);
    if (c == &spare) shape_free(&spare);
    return st;
}
