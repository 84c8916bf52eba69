/* CUDA kernels on CPU threads, for tests on machines without a GPU
 * (tests/gpu/test_gpu_emu.c): a kernel source compiled as C++ with
 * DT_CUDA_EMU defined includes this header in place of gpu/cuda_check.h.
 * A launch (DT_RUN) runs the grid's blocks one after another, each on
 * blockDim.x threads that are fibers of the launching thread:
 * each runs until it waits at a barrier or ends, then the first in order
 * that can run (from thread 0, or from the last: dt_emu_reversed), so a
 * block's first warp goes as far as it can before the next. They share one block of shared memory (`extern __shared__
 * ... sm[]`, the launch's bytes of it filled with NaNs before each block,
 * and so are the kernels' fixed-size __shared__ arrays, so a read of a
 * value no thread of the block wrote shows); __syncthreads and __syncwarp
 * are barriers over the block's and the warp's threads, a shuffle an
 * exchange through the warp's slots between two warp barriers. A barrier
 * some thread never reaches (a __syncthreads or a shuffle in divergent
 * code) is named and the process aborted, at once. Since a thread runs to
 * its next barrier before the next starts, a thread that reads what a
 * later thread writes without a barrier between reads it unwritten (NaN
 * in shared memory), and one that reads what an earlier thread overwrites
 * reads the new value; the other way round shows with the threads taken
 * from the last (dt_emu_reversed: test_gpu_emu's `reversed` run), so the
 * two orders between them catch a missing barrier between any two of a
 * block's threads where it changes the results (racecheck on a GPU names
 * the rest). Nothing about the GPU's own arithmetic (libm's expf
 * is not CUDA's). A thread that spins waiting for another's write with no
 * barrier would spin for ever here (dtrain's kernels have none). */
#ifndef DT_TESTS_CUDA_EMU_H
#define DT_TESTS_CUDA_EMU_H

#include "dtrain/core.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>  // (host versions of the conversions; host_defines.h: __device__ and the rest empty)
#include <functional>
#include <stdint.h>
#include <string.h>
#include <type_traits>
#include <vector_functions.h>
#include <vector_types.h>

#define __launch_bounds__(...)

extern dim3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
extern float sm[];  // the block's dynamic shared memory (blocks run one at a time)
#define DT_EMU_SHARED_FLOATS (1u << 16)
#define DT_EMU_SHARED_SECTION "dt_emu_shared"  // (the kernels' fixed-size __shared__ arrays: emu_host.h)

void __syncthreads();
int __syncthreads_count(int predicate);  // (the block's threads with predicate non-zero)
void __syncwarp(unsigned mask = 0xffffffffu);
float __shfl_sync(unsigned mask, float v, int lane);
float __shfl_xor_sync(unsigned mask, float v, int lane_mask);
/* mma.sync.aligned.m16n8k16.row.col.f32 on 16-bit factors (h 1: bf16, 2:
 * fp16; src/gpu/flash_mma.cuh): each lane gives its fragments of A and B in
 * PTX's layouts, the warp's are exchanged between two warp barriers (as a
 * shuffle), and each lane's four elements of D get A B added, the products
 * summed in k order in fp32. */
void dt_emu_mma16816(float d[4], const uint32_t a[4], const uint32_t b[2], int h);
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline int min(int a, int b) { return a < b ? a : b; }

/* Runs fn as the kernel of grid g, blocks of b.x threads (a multiple of 32,
 * or one thread, which has no warp; b.y = b.z = 1), `shared` bytes of
 * dynamic shared memory. */
void dt_emu_launch(dim3 g, dim3 b, size_t shared, const std::function<void()> &fn);

void dt_emu_wmma_check(const void *p, unsigned ldm, size_t elem);

/* nvcuda::wmma's 16 x 16 x 16 fragments, each lane holding the whole
 * tile in fp32 (the values of its 16-bit elements exactly): a load reads
 * it all, mma_sync computes it all (sums in k order, fp32), a store is
 * lane 0's after a warp barrier (every lane done with what it loaded
 * before, as on a GPU, where the warp runs them together) and before none
 * (the kernel's own __syncwarp must come before other lanes read it).
 * Every lane of the warp must call them. A pointer into shared memory not
 * 32-byte aligned, or a stride (ldm) not a multiple of 16 bytes, aborts,
 * as wmma requires. */
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision {
struct tf32 {};
}  // namespace precision
enum layout_t { mem_row_major, mem_col_major };
// The tile's rows and columns: matrix_a M x K, matrix_b K x N, accumulator M x N.
template <typename Use, int M, int N, int K> struct dims {
    enum { R = std::is_same<Use, matrix_b>::value ? K : M, C = std::is_same<Use, matrix_a>::value ? K : N };
};
template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    enum { R = dims<Use, M, N, K>::R, CC = dims<Use, M, N, K>::C, num_elements = R * CC };
    float v[R][CC];
    float *const x = &v[0][0];  // (elementwise access: the whole tile, each lane's own copy)
    fragment() {}
    fragment(const fragment &o) { *this = o; }
    fragment &operator=(const fragment &o) {
        for (int i = 0; i < num_elements; i++) x[i] = o.x[i];
        return *this;
    }
};
// TF32: the value rounded to 10 bits of mantissa (to nearest, ties away), as a float.
static inline float __float_to_tf32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
    memcpy(&f, &u, 4);
    return f;
}
static inline float as_float(float x) { return x; }
static inline float as_float(__half x) { return __half2float(x); }
static inline float as_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename Use, int K, typename T, typename Layout>
void fill_fragment(fragment<Use, 16, 16, K, T, Layout> &f, float x) {
    for (int i = 0; i < f.num_elements; i++) f.x[i] = x;
}
// (a tf32 fragment is loaded from floats)
template <typename T> struct stored {
    typedef T t;
};
template <> struct stored<precision::tf32> {
    typedef float t;
};
template <typename Use, int K, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, K, T, Layout> &f, const typename stored<T>::t *p, unsigned ldm) {
    dt_emu_wmma_check(p, ldm, sizeof *p);
    bool rows = std::is_same<Layout, row_major>::value;
    for (int r = 0; r < f.R; r++)
        for (int c = 0; c < f.CC; c++) f.v[r][c] = as_float(rows ? p[r * ldm + c] : p[c * ldm + r]);
}
template <int K>
void load_matrix_sync(fragment<accumulator, 16, 16, K, float> &f, const float *p, unsigned ldm, layout_t l) {
    dt_emu_wmma_check(p, ldm, sizeof(float));
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.v[r][c] = l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}
template <int K>
void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, K, float> &f, unsigned ldm, layout_t l) {
    dt_emu_wmma_check(p, ldm, sizeof(float));
    __syncwarp();
    if (threadIdx.x % 32 == 0)
        for (int r = 0; r < 16; r++)
            for (int c = 0; c < 16; c++) (l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.v[r][c];
}
template <int K, typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, K, float> &d, const fragment<matrix_a, 16, 16, K, T, LA> &a,
              const fragment<matrix_b, 16, 16, K, T, LB> &b, const fragment<accumulator, 16, 16, K, float> &c) {
    float out[16][16];
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) {
            float s = c.v[r][n];
            for (int k = 0; k < K; k++) s += a.v[r][k] * b.v[k][n];
            out[r][n] = s;
        }
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) d.v[r][n] = out[r][n];
}
}  // namespace wmma
}  // namespace nvcuda

#define DT_RUN(k, g, b, sh, ...) dt_emu_launch(g, b, sh, [=] { k(__VA_ARGS__); })
#define DT_LAUNCHED(kernel) ((void)0)
static inline dt_status dt_gpu_launched(const char *kernel) { return (void)kernel, DT_OK; }
#define DT_CUDA(call) ((void)0)
/* The dynamic shared memory a block may ask for: the emulator's, or less
 * (a test's, for a kernel's path where a GPU has less). */
extern "C" size_t dt_emu_optin;
/* Non-zero: a block's threads run in turn from the last, not from thread 0
 * (the other order of each pair of threads: above). */
extern "C" int dt_emu_reversed;
static inline size_t dt_shared_optin(void) { return dt_emu_optin; }
template <typename K> static inline dt_status dt_shared_bytes(K, size_t) { return DT_OK; }
#define DT_DYN_SHARED extern  // (sm[], above)

#endif
