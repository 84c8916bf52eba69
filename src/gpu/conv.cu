/* The CNN's convolutions on the GPU by cuDNN (gpu.h's dt_gpu_conv2d_*):
 * cuDNN's convolutions in NCHW fp32 through its legacy API (declared in
 * cudnn_api.h: no cuDNN header needed to build), loaded at the first use (dt_gpu_lib_open, dl.c: libcudnn.so.9), with the deterministic
 * algorithms only (forward IMPLICIT_PRECOMP_GEMM, backward data and filter
 * ALGO_1: no atomics, the same bits every run), TF32 tensor cores where
 * dt_gpu_set_tf32 says (else FMA math: no TF32); the bias and its gradient
 * our own kernels (a thread an element; a block a channel's sum, in a
 * fixed order). One device: the handle is the device's current at the
 * first use. The workspace comes from
 * the stream's pool. Where cuDNN cannot be loaded dt_gpu_conv2d_ready says
 * why, and the device model keeps im2col and a GEMM (cnn.cu). */
#include "gpu/block.h"
#include "gpu/cuda_check.h"
#include "gpu/cudnn_api.h"
#include "gpu/gpu.h"
#include "gpu/launch.h"

#include <pthread.h>
#include <stdio.h>

#define DNN_FUNCS(X)                                                                                             \
    X(cudnnGetErrorString) X(cudnnCreate) X(cudnnCreateTensorDescriptor) X(cudnnSetTensor4dDescriptor)          \
    X(cudnnDestroyTensorDescriptor) X(cudnnCreateFilterDescriptor) X(cudnnSetFilter4dDescriptor)                \
    X(cudnnDestroyFilterDescriptor) X(cudnnCreateConvolutionDescriptor) X(cudnnSetConvolution2dDescriptor)      \
    X(cudnnSetConvolutionMathType) X(cudnnDestroyConvolutionDescriptor)                                         \
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

// One convolution's descriptors: the input x [B, C, H, W], the filters
// [OC, C, K, K], the output y [B, OC, OH, OW].
typedef struct {
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
} descs;

static void descs_free(descs *d) {
    if (d->x) dnn.cudnnDestroyTensorDescriptor(d->x);
    if (d->y) dnn.cudnnDestroyTensorDescriptor(d->y);
    if (d->w) dnn.cudnnDestroyFilterDescriptor(d->w);
    if (d->conv) dnn.cudnnDestroyConvolutionDescriptor(d->conv);
}

static dt_status descs_make(descs *d, size_t B, const dt_im2col_t *g, int OC) {
    dt_status st = DT_OK;
    *d = descs{};
    int dev = -1;
    if (!dt_gpu_conv2d_ready(NULL, 0)) return dt_error(DT_ERR_CONFIG, "GPU: convolutions need cuDNN: %s", dnn.why);
    if (cudaGetDevice(&dev) != cudaSuccess || dev != dnn.device)
        return dt_error(DT_ERR_INTERNAL, "GPU: cuDNN's handle is device %d's, the convolution's device %d", dnn.device,
                        dev);
    if (B > (size_t)INT32_MAX) return dt_error(DT_ERR_ARG, "GPU: a convolution of %zu samples", B);
    DT_DNN(cudnnCreateTensorDescriptor(&d->x));
    DT_DNN(cudnnCreateTensorDescriptor(&d->y));
    DT_DNN(cudnnCreateFilterDescriptor(&d->w));
    DT_DNN(cudnnCreateConvolutionDescriptor(&d->conv));
    DT_DNN(cudnnSetTensor4dDescriptor(d->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)B, g->C, g->H, g->W));
    DT_DNN(cudnnSetTensor4dDescriptor(d->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)B, OC, g->OH, g->OW));
    DT_DNN(cudnnSetFilter4dDescriptor(d->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, OC, g->C, g->K, g->K));
    DT_DNN(cudnnSetConvolution2dDescriptor(d->conv, g->P, g->P, g->S, g->S, 1, 1, CUDNN_CROSS_CORRELATION,
                                           CUDNN_DATA_FLOAT));
    DT_DNN(cudnnSetConvolutionMathType(d->conv, dt_gpu_tf32() ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
done:
    if (st != DT_OK) descs_free(d);
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

dt_status dt_gpu_conv2d_forward(float *out, const float *inp, const float *w, const float *b, size_t B,
                                const dt_im2col_t *g, int OC) {
    if (B == 0) return DT_OK;
    descs d;
    dt_status st = descs_make(&d, B, g, OC);
    if (st != DT_OK) return st;
    const int algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
    size_t ws_bytes = 0, n = B * (size_t)OC * g->OH * g->OW;
    void *ws = NULL;
    const float one = 1.0f, zero = 0.0f;
    DT_DNN(cudnnGetConvolutionForwardWorkspaceSize(dnn.handle, d.x, d.w, d.conv, d.y, algo, &ws_bytes));
    if (ws_bytes && (st = dt_gpu_scratch(&ws, ws_bytes)) != DT_OK) goto done;
    DT_DNN(cudnnConvolutionForward(dnn.handle, &one, d.x, inp, d.w, w, d.conv, algo, ws, ws_bytes, &zero, d.y, out));
    if (b) {
        bias_nchw_kernel<<<dt_launch_blocks(n, DT_THREADS), DT_THREADS>>>(out, b, n, (size_t)g->OH * g->OW, OC);
        st = dt_gpu_launched("bias_nchw_kernel");
    }
done:
    if (ws) dt_gpu_scratch_free(ws);
    descs_free(&d);
    return st;
}

dt_status dt_gpu_conv2d_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                 const float *w, size_t B, const dt_im2col_t *g, int OC) {
    if (B == 0) return DT_OK;
    descs d;
    dt_status st = descs_make(&d, B, g, OC);
    if (st != DT_OK) return st;
    const int da = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, fa = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
    size_t wd = 0, wf = 0;
    void *ws = NULL;
    const float one = 1.0f;
    DT_DNN(cudnnGetConvolutionBackwardFilterWorkspaceSize(dnn.handle, d.x, d.y, d.conv, d.w, fa, &wf));
    if (dinp) DT_DNN(cudnnGetConvolutionBackwardDataWorkspaceSize(dnn.handle, d.w, d.y, d.conv, d.x, da, &wd));
    if ((wd > wf ? wd : wf) && (st = dt_gpu_scratch(&ws, wd > wf ? wd : wf)) != DT_OK) goto done;
    if (db) {
        bias_nchw_grad_kernel<<<(unsigned)OC, DT_THREADS>>>(db, dout, B, (size_t)g->OH * g->OW, OC);
        if ((st = dt_gpu_launched("bias_nchw_grad_kernel")) != DT_OK) goto done;
    }
    // (beta 1: both gradients accumulate, as the CPU's backward does)
    DT_DNN(cudnnConvolutionBackwardFilter(dnn.handle, &one, d.x, inp, d.y, dout, d.conv, fa, ws, wf, &one, d.w, dw));
    if (dinp)
        DT_DNN(cudnnConvolutionBackwardData(dnn.handle, &one, d.w, w, d.y, dout, d.conv, da, ws, wd, &one, d.x, dinp));
done:
    if (ws) dt_gpu_scratch_free(ws);
    descs_free(&d);
    return st;
}
