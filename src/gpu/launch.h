/* The kernels' launch configurations: plain C, in every build, so that
 * tests/test_gpu_host.c checks them without a GPU (sizes 0, 1, the edges of
 * a block, past 2^31 elements and past the grid's limit).
 *
 * Two shapes: a grid-stride loop over n elements (blocks of DT_THREADS,
 * `for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i
 * += (size_t)gridDim.x * blockDim.x)`), and one block per row (a row's
 * sums reduced in the block; `for (size_t r = blockIdx.x; r < rows; r +=
 * gridDim.x)` covers rows past the grid's limit). A count of 0 gives 0
 * blocks: the caller launches nothing (a grid of 0 is an error in CUDA). */
#ifndef DT_GPU_LAUNCH_H
#define DT_GPU_LAUNCH_H

#include "core/hd.h"
#include "dtrain/core.h"
#include "optim/elem.h"

#include <stddef.h>

#define DT_THREADS 256              // threads a block; a power of two (the row kernels' tree reductions)
#define DT_MAX_BLOCKS 0x7fffffffu   // gridDim.x's limit (2^31 - 1)

/* Blocks of `threads` over n elements: ceil(n / threads), at most
 * DT_MAX_BLOCKS; 0 for n = 0. */
static inline unsigned dt_launch_blocks(size_t n, unsigned threads) {
    size_t b = n / threads + (n % threads != 0);
    return (unsigned)(b > DT_MAX_BLOCKS ? DT_MAX_BLOCKS : b);
}

/* One block per row: rows, at most DT_MAX_BLOCKS; 0 for none. */
static inline unsigned dt_launch_rows(size_t rows) {
    return (unsigned)(rows > DT_MAX_BLOCKS ? DT_MAX_BLOCKS : rows);
}

/* An op's 16-bit output out16 of type t as its kernels' template argument
 * H (block.h's narrow; dt_with_h16 launches them): 0 where there is none
 * (out16 NULL), 1 bf16, 2 fp16; -1 for any other type, DT_ERR_ARG's
 * error set naming `what` (the simulated GPU's ops ask the same). */
static inline int dt_launch_h16(const char *what, const void *out16, dt_dtype t) {
    if (!out16) return 0;
    if (t == DT_BF16 || t == DT_F16) return t == DT_BF16 ? 1 : 2;
    dt_error(DT_ERR_ARG, "%s: a 16-bit output of type %s (BF16 or F16 only)", what, dt_dtype_name(t));
    return -1;
}

/* One warp per row (block.h's EACH_ROW): blocks of DT_THREADS / 32 rows. */
static inline unsigned dt_launch_warp_rows(size_t rows) { return dt_launch_blocks(rows, DT_THREADS / 32); }

/* Column sums over N rows of C columns (the bias's and layernorm's weight
 * gradients): the rows cut into chunks of dt_colsum_rows(N) (DT_COLSUM_ROWS,
 * or more where N would need more chunks than the grid's DT_MAX_GRID_Y),
 * a block of 32 columns x DT_THREADS / 32 row lanes for each (column tile,
 * chunk): each lane sums its rows of the chunk in order, then the lanes
 * are added in order, into partial sums [chunk][C]; a thread a column then
 * adds the chunks in order. A fixed order: the same bits every run. */
#define DT_COLSUM_ROWS 256
#define DT_MAX_GRID_Y 65535u
static inline size_t dt_colsum_rows(size_t N) {
    size_t r = N / DT_MAX_GRID_Y + (N % DT_MAX_GRID_Y != 0);
    return r > DT_COLSUM_ROWS ? r : DT_COLSUM_ROWS;
}
static inline unsigned dt_colsum_chunks(size_t N) {
    size_t r = dt_colsum_rows(N);
    return (unsigned)(N / r + (N % r != 0));
}

/* The sum of squares (dt_gpu_sumsq): dt_sum_squares's blocks of
 * DT_SUMSQ_BLOCK elements (optim/elem.h), a thread each, into partial
 * sums; then a block's thread 0 sums those in order (block.h's
 * ordered_sum). */
static inline size_t dt_sumsq_chunks(size_t n) { return n / DT_SUMSQ_BLOCK + (n % DT_SUMSQ_BLOCK != 0); }

/* The scratch (bytes) these ops ask of the device's buffer (dt_gpu_scratch):
 * the column sums' partial sums [chunks][C] (layernorm's: two sets), room
 * for min(ceil(N / DT_COLSUM_ROWS), DT_MAX_GRID_Y) chunks, which is
 * dt_colsum_chunks(N) or more and never less for more rows (the chunks
 * themselves are fewer just past DT_COLSUM_ROWS x DT_MAX_GRID_Y rows, so a
 * plan at the largest batch covers every smaller one); the sum of squares'
 * [chunks] doubles; the embedding's backward's three int32 arrays of n
 * positions (64-aligned) before the sort's own room. */
static inline size_t dt_colsum_scratch(size_t N, int C, int layernorm) {
    size_t chunks = N / DT_COLSUM_ROWS + (N % DT_COLSUM_ROWS != 0);
    chunks = chunks < DT_MAX_GRID_Y ? chunks : DT_MAX_GRID_Y;
    return C <= 0 ? 0 : sizeof(float) * chunks * (size_t)C * (layernorm ? 2 : 1);
}
static inline size_t dt_sumsq_scratch(size_t n) { return sizeof(double) * dt_sumsq_chunks(n); }
static inline size_t dt_encoder_scratch_ints(size_t n) { return (3 * n + 63) / 64 * 64; }

#endif
