/* cudnn_api.h - the part of cuDNN 9's API (its legacy convolutions,
 * cudnn_ops.h and cudnn_cnn.h) that conv.cu calls through dlsym, declared
 * here so that dtrain compiles where the CUDA toolkit lacks cuDNN's
 * headers. Values are cuDNN 9's own. */
#ifndef DT_GPU_CUDNN_API_H
#define DT_GPU_CUDNN_API_H

#include <stddef.h>

typedef struct cudnnContext *cudnnHandle_t;
typedef struct cudnnTensorStruct *cudnnTensorDescriptor_t;
typedef struct cudnnFilterStruct *cudnnFilterDescriptor_t;
typedef struct cudnnConvolutionStruct *cudnnConvolutionDescriptor_t;

typedef int cudnnStatus_t;  /* CUDNN_STATUS_SUCCESS = 0 */
enum {
    CUDNN_STATUS_SUCCESS = 0,
    CUDNN_TENSOR_NCHW = 0,                                /* cudnnTensorFormat_t */
    CUDNN_DATA_FLOAT = 0,                                 /* cudnnDataType_t */
    CUDNN_CROSS_CORRELATION = 1,                          /* cudnnConvolutionMode_t */
    CUDNN_DEFAULT_MATH = 0,                               /* cudnnMathType_t: TF32 allowed */
    CUDNN_FMA_MATH = 3,                                   /* ... FMA only: no TF32 */
    CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM = 1, /* the deterministic algorithms */
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 = 1,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 = 1,
};

typedef const char *(*cudnnGetErrorString_fn)(cudnnStatus_t);
typedef cudnnStatus_t (*cudnnCreate_fn)(cudnnHandle_t *);
typedef cudnnStatus_t (*cudnnSetStream_fn)(cudnnHandle_t, cudaStream_t);
typedef cudnnStatus_t (*cudnnCreateTensorDescriptor_fn)(cudnnTensorDescriptor_t *);
typedef cudnnStatus_t (*cudnnSetTensor4dDescriptor_fn)(cudnnTensorDescriptor_t, int format, int type, int n, int c,
                                                       int h, int w);
typedef cudnnStatus_t (*cudnnDestroyTensorDescriptor_fn)(cudnnTensorDescriptor_t);
typedef cudnnStatus_t (*cudnnCreateFilterDescriptor_fn)(cudnnFilterDescriptor_t *);
typedef cudnnStatus_t (*cudnnSetFilter4dDescriptor_fn)(cudnnFilterDescriptor_t, int type, int format, int k, int c,
                                                       int h, int w);
typedef cudnnStatus_t (*cudnnDestroyFilterDescriptor_fn)(cudnnFilterDescriptor_t);
typedef cudnnStatus_t (*cudnnCreateConvolutionDescriptor_fn)(cudnnConvolutionDescriptor_t *);
typedef cudnnStatus_t (*cudnnSetConvolution2dDescriptor_fn)(cudnnConvolutionDescriptor_t, int pad_h, int pad_w, int u,
                                                            int v, int dilation_h, int dilation_w, int mode,
                                                            int compute_type);
typedef cudnnStatus_t (*cudnnSetConvolutionMathType_fn)(cudnnConvolutionDescriptor_t, int math);
typedef cudnnStatus_t (*cudnnDestroyConvolutionDescriptor_fn)(cudnnConvolutionDescriptor_t);
typedef cudnnStatus_t (*cudnnGetConvolutionForwardWorkspaceSize_fn)(cudnnHandle_t, cudnnTensorDescriptor_t x,
                                                                    cudnnFilterDescriptor_t w,
                                                                    cudnnConvolutionDescriptor_t,
                                                                    cudnnTensorDescriptor_t y, int algo, size_t *);
typedef cudnnStatus_t (*cudnnConvolutionForward_fn)(cudnnHandle_t, const void *alpha, cudnnTensorDescriptor_t x,
                                                    const void *xp, cudnnFilterDescriptor_t w, const void *wp,
                                                    cudnnConvolutionDescriptor_t, int algo, void *ws, size_t ws_bytes,
                                                    const void *beta, cudnnTensorDescriptor_t y, void *yp);
typedef cudnnStatus_t (*cudnnGetConvolutionBackwardDataWorkspaceSize_fn)(cudnnHandle_t, cudnnFilterDescriptor_t w,
                                                                         cudnnTensorDescriptor_t dy,
                                                                         cudnnConvolutionDescriptor_t,
                                                                         cudnnTensorDescriptor_t dx, int algo,
                                                                         size_t *);
typedef cudnnStatus_t (*cudnnConvolutionBackwardData_fn)(cudnnHandle_t, const void *alpha, cudnnFilterDescriptor_t w,
                                                         const void *wp, cudnnTensorDescriptor_t dy, const void *dyp,
                                                         cudnnConvolutionDescriptor_t, int algo, void *ws,
                                                         size_t ws_bytes, const void *beta,
                                                         cudnnTensorDescriptor_t dx, void *dxp);
typedef cudnnStatus_t (*cudnnGetConvolutionBackwardFilterWorkspaceSize_fn)(cudnnHandle_t, cudnnTensorDescriptor_t x,
                                                                           cudnnTensorDescriptor_t dy,
                                                                           cudnnConvolutionDescriptor_t,
                                                                           cudnnFilterDescriptor_t dw, int algo,
                                                                           size_t *);
typedef cudnnStatus_t (*cudnnConvolutionBackwardFilter_fn)(cudnnHandle_t, const void *alpha,
                                                           cudnnTensorDescriptor_t x, const void *xp,
                                                           cudnnTensorDescriptor_t dy, const void *dyp,
                                                           cudnnConvolutionDescriptor_t, int algo, void *ws,
                                                           size_t ws_bytes, const void *beta,
                                                           cudnnFilterDescriptor_t dw, void *dwp);

#endif
