/* The CNN's layers on the GPU (gpu.h): im2col and its inverse, a batched
 * transpose, max pooling and dropout, each output element's arithmetic
 * gpu/cnn_hd.h's (shared with the simulated GPU), a thread an element in
 * grid-stride loops (launch.h); dropout a thread a sample, its stream
 * drawn in order as the CPU's. No atomics: the same bits every run. Nothing
 * here has run on a GPU yet (docs/gpu.md): tests/test_gpu.c's `ops`
 * compares each with the CPU's. */
#include "gpu/cnn_hd.h"
#ifdef DT_CUDA_EMU
#include "cuda_emu.h"  // (tests/gpu: these kernels on CPU threads, test_gpu_emu)
#else
#include "gpu/cuda_check.h"
#endif
#include "gpu/gpu.h"
#include "gpu/launch.h"

#define EACH(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

__global__ static void im2col_kernel(float *col, const float *x, size_t B, dt_im2col_t g) {
    size_t ncol = B * g.OH * g.OW;
    EACH(i, (size_t)g.C * g.K * g.K * ncol) col[i] = dt_im2col_at(x, &g, i / ncol, i % ncol);
}

__global__ static void col2im_kernel(float *dx, const float *dcol, size_t B, dt_im2col_t g) {
    EACH(i, B * g.C * g.H * g.W) dx[i] += dt_col2im_at(dcol, &g, B, i);
}

__global__ static void transpose_kernel(float *out, const float *in, size_t n, size_t R, size_t C) {
    EACH(i, n) out[i] = in[dt_transpose_src(i, R, C)];
}

__global__ static void maxpool_forward_kernel(float *out, int32_t *arg, const float *x, size_t n, int H, int W, int K,
                                              int S) {
    EACH(i, n) out[i] = dt_maxpool_at(x, H, W, K, S, i, &arg[i]);
}

__global__ static void maxpool_backward_kernel(float *dx, const float *dout, const int32_t *arg, size_t n, int H, int W,
                                               int K, int S) {
    EACH(i, n) dx[i] += dt_maxpool_grad_at(dout, arg, H, W, K, S, i);
}

__global__ static void dropout_mask_kernel(float *mask, int B, size_t n, float p, uint64_t seed, uint64_t step,
                                           int64_t first, int layer, size_t skip) {
    EACH(j, (size_t)B) dt_dropout_mask(mask + j * n, n, p, seed, step, (uint64_t)(first + (int64_t)j), layer, skip);
}

__global__ static void mul_kernel(float *out, const float *x, const float *mask, size_t n, int add) {
    EACH(i, n) out[i] = add ? fmaf(x[i], mask[i], out[i]) : x[i] * mask[i];  // (0 + -0 is +0: not the CPU's bits)
}

#define LAUNCH(kernel, n, ...)                                                                                    \
    do {                                                                                                          \
        if ((n) == 0) return DT_OK;                                                                               \
        DT_RUN(kernel, dt_launch_blocks((n), DT_THREADS), DT_THREADS, 0, __VA_ARGS__);                            \
        DT_LAUNCHED(kernel);                                                                                      \
    } while (0)

dt_status dt_gpu_im2col(float *col, const float *x, size_t B, const dt_im2col_t *g) {
    LAUNCH(im2col_kernel, (size_t)g->C * g->K * g->K * B * g->OH * g->OW, col, x, B, *g);
    return DT_OK;
}

dt_status dt_gpu_col2im(float *dx, const float *dcol, size_t B, const dt_im2col_t *g) {
    LAUNCH(col2im_kernel, B * g->C * g->H * g->W, dx, dcol, B, *g);
    return DT_OK;
}

dt_status dt_gpu_transpose(float *out, const float *in, size_t nb, size_t R, size_t C) {
    LAUNCH(transpose_kernel, nb * R * C, out, in, nb * R * C, R, C);
    return DT_OK;
}

dt_status dt_gpu_maxpool_forward(float *out, int32_t *arg, const float *x, size_t images, int H, int W, int K, int S) {
    size_t n = images * (size_t)((H - K) / S + 1) * (size_t)((W - K) / S + 1);
    LAUNCH(maxpool_forward_kernel, n, out, arg, x, n, H, W, K, S);
    return DT_OK;
}

dt_status dt_gpu_maxpool_backward(float *dx, const float *dout, const int32_t *arg, size_t images, int H, int W, int K,
                                  int S) {
    LAUNCH(maxpool_backward_kernel, images * H * W, dx, dout, arg, images * H * W, H, W, K, S);
    return DT_OK;
}

dt_status dt_gpu_dropout_forward(float *out, float *mask, const float *x, int B, size_t n, float p, uint64_t seed,
                                 uint64_t step, int64_t first, int layer, size_t skip) {
    if (B <= 0 || n == 0) return DT_OK;
    DT_RUN(dropout_mask_kernel, dt_launch_blocks((size_t)B, DT_THREADS), DT_THREADS, 0, mask, B, n, p, seed, step,
           first, layer, skip);
    DT_LAUNCHED(dropout_mask_kernel);
    LAUNCH(mul_kernel, (size_t)B * n, out, x, mask, (size_t)B * n, 0);
    return DT_OK;
}

dt_status dt_gpu_dropout_backward(float *dx, const float *dout, const float *mask, size_t N) {
    LAUNCH(mul_kernel, N, dx, dout, mask, N, 1);
    return DT_OK;
}
