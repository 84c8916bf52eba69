/* The fused attention on tensor cores (included by flash.cu): products in
 * bf16 or fp16 at heads of 64 or 128 columns (GPT-2's, Llama's), and in
 * fp32 with TF32 at heads of 64; the same scheme and contract as flash.cu's
 * kernels on the CUDA cores, each product a warp's 16 x 16 x k matrix
 * multiply-accumulates (nvcuda::wmma: 16-bit factors, k = 16; tf32
 * factors, k = 8; fp32 sums). A block is 4 warps and 64 rows of one head,
 * a warp 16 of them; the other side comes in tiles of 64 rows, its
 * factors rounded to the 16-bit type as they are loaded into shared memory
 * (tf32: kept as floats and rounded as they are loaded into fragments).
 *
 *   forward  (tf32; in 16 bits flash_mma.cuh's fa_forward_mma, the
 *            same arithmetic in registers)
 *            per key tile: S = Q K^T (a warp's 16 x 64 scores into its
 *            shared rows), the online softmax there (a lane half a row:
 *            the row's maximum and sum over the lane pair), the
 *            unnormalised probabilities kept as the factors are and the
 *            output's sums (kept in the warp's shared rows, rescaled by
 *            each row's correction) += P V.
 *   fa_kv_tc per query tile from the diagonal on: S^T = K Q^T and
 *            dP^T = V dY^T, then P and dS rounded, dV += P^T dY and
 *            dK += dS^T Q in fragments kept across the tiles.
 *   fa_q_tc  per key tile up to the diagonal: S, dP, dS again, dQ += dS K.
 *
 * The factors are those flash.cu's kernels round (q, k, v, dout, the
 * probabilities, the softmax's gradient); the sums are the tensor cores'
 * (fp32, in their own order): the CPU's numbers to rounding, the same bits
 * every run (no atomics). Every wmma pointer is 32-byte aligned (each
 * region a multiple of 32 bytes, tiles 16 rows of LD elements, LD a
 * multiple of 16 bytes). */
#ifndef DT_CUDA_EMU
#include <cuda_bf16.h>
#include <mma.h>
#endif
#include <type_traits>

using namespace nvcuda;

#define TC_W 4            // warps a block
#define TC_ROWS 64        // a block's rows, and a tile of the other side
#define TC_SUB 16         // wmma's tile
static_assert(TC_W * TC_SUB == TC_ROWS, "a warp's 16 rows of the block's 64");

// bf16 and tf32 fragments need compute capability 8.0: a build for an
// older GPU gets kernels that trap (TC_OLD), which flash.cu's tc_usable
// never launches there.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define TC_OLD 1
#else
#define TC_OLD 0
#endif

// The products' type H (1 bf16, 2 fp16, 3 tf32): the fragments' element
// type, the type kept in shared memory (16-bit values; tf32: floats,
// rounded as they are loaded into fragments), k a step, a row's padding.
template <int H> struct tc_t;
template <> struct tc_t<1> {
    typedef __nv_bfloat16 frag;
    typedef __nv_bfloat16 mem;
    typedef uint16_t elem;
    enum { K = 16, PAD = 8 };
};
template <> struct tc_t<2> {
    typedef __half frag;
    typedef __half mem;
    typedef uint16_t elem;
    enum { K = 16, PAD = 8 };
};
template <> struct tc_t<3> {
#if TC_OLD
    typedef float frag;  // (no tf32 before compute capability 8.0: never used, the kernels trap)
#else
    typedef wmma::precision::tf32 frag;
#endif
    typedef float mem;
    typedef float elem;
    enum { K = 8, PAD = 4 };
};

// x as the products' tiles keep it: rounded to 16 bits, or a float (tf32).
template <int H> __device__ static inline typename tc_t<H>::elem tc_put(float x) { return narrow<H>(x); }
template <> __device__ inline float tc_put<3>(float x) { return x; }

// The shared memory of head size HS: rows' strides (elements) and regions' bytes.
template <int HS, int H> struct tc_layout {
    typedef typename tc_t<H>::elem E;
    static constexpr int LD = HS + tc_t<H>::PAD;       // a tile's row
    static constexpr int SLD = TC_ROWS + 4;            // a warp's fp32 scores' row
    static constexpr int PLD = TC_ROWS + tc_t<H>::PAD; // a warp's products' row
    static constexpr int OLD = HS + 4;                 // a warp's fp32 sums' row
    static constexpr size_t TILE = sizeof(E) * TC_ROWS * LD, SW = 4 * TC_SUB * SLD, PW = sizeof(E) * TC_SUB * PLD,
                            OW = 4 * TC_SUB * OLD, STATS = 4 * 2 * TC_ROWS;
    static constexpr size_t FORWARD = 3 * TILE + TC_W * (SW + PW + OW);
    static constexpr size_t BACKWARD = 4 * TILE + STATS + TC_W * (2 * SW + 2 * PW + OW);
    static_assert(TILE % 32 == 0 && SW % 32 == 0 && PW % 32 == 0 && OW % 32 == 0 && STATS % 32 == 0,
                  "every region 32-byte aligned");
};

// Rows r0 .. r0 + 63 of one head's HS columns of src (row stride `stride`)
// as the products keep them into s (row stride LD); rows past T zeros.
template <int H, int HS>
__device__ static void tc_load(typename tc_t<H>::elem *s, const float *src, size_t stride, int r0, int T) {
    for (int i = threadIdx.x; i < TC_ROWS * HS; i += blockDim.x) {
        int r = i / HS, d = i % HS;
        s[r * tc_layout<HS, H>::LD + d] = tc_put<H>(r0 + r < T ? src[(size_t)(r0 + r) * stride + d] : 0.0f);
    }
}

// A warp's fp32 sums of a 16 x 16 tile, in steps of H's k.
template <int H> using tc_acc = wmma::fragment<wmma::accumulator, TC_SUB, TC_SUB, tc_t<H>::K, float>;

// A fragment's elements rounded to tf32 (H 3; the 16-bit types are
// rounded as they are kept).
template <int H, typename F> __device__ static inline void tc_round(F &f) {
    if (H == 3)
        for (int i = 0; i < f.num_elements; i++) f.x[i] = wmma::__float_to_tf32(f.x[i]);
}

// acc (+)= A B over `n` of the k dimension (a multiple of H's k): A's 16
// rows from a (row-major, stride lda), B from b: col_major (B[k][n] =
// b[n ldb + k], a transposed tile's rows) or row-major (b[k ldb + n]).
template <int H, typename BL>
__device__ static void tc_mma(tc_acc<H> &acc, const typename tc_t<H>::elem *a, int lda,
                              const typename tc_t<H>::elem *b, int ldb, int n) {
    typedef typename tc_t<H>::frag F;
    typedef const typename tc_t<H>::mem *M;
    const int K = tc_t<H>::K;
    for (int kk = 0; kk < n; kk += K) {
        wmma::fragment<wmma::matrix_a, TC_SUB, TC_SUB, K, F, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, TC_SUB, TC_SUB, K, F, BL> fb;
        wmma::load_matrix_sync(fa, (M)(a + kk), lda);
        wmma::load_matrix_sync(fb, (M)(std::is_same<BL, wmma::col_major>::value ? b + kk : b + (size_t)kk * ldb), ldb);
        tc_round<H>(fa);
        tc_round<H>(fb);
        wmma::mma_sync(acc, fa, fb, acc);
    }
}

// out[16 x 64] (fp32, stride SLD) = A B^T: A the warp's 16 rows of a
// (stride LD), B^T's columns the 64 rows of tile b (stride LD), over HS.
template <int H, int HS>
__device__ static void tc_scores(float *out, const typename tc_t<H>::elem *a, const typename tc_t<H>::elem *b) {
    typedef tc_layout<HS, H> Y;
    for (int n = 0; n < TC_ROWS / TC_SUB; n++) {
        tc_acc<H> acc;
        wmma::fill_fragment(acc, 0.0f);
        tc_mma<H, wmma::col_major>(acc, a, Y::LD, b + n * TC_SUB * Y::LD, Y::LD, HS);
        wmma::store_matrix_sync(out + n * TC_SUB, acc, Y::SLD, wmma::mem_row_major);
    }
    __syncwarp();  // (the lanes read each other's stores)
}

// The 16 x HS rows of fragments f[HS / 16] written into global rows
// dst + r stride (row r < n of the 16 this warp holds), through o (fp32,
// stride OLD).
template <int H, int HS>
__device__ static void tc_set_rows(float *o, tc_acc<H> *f, float *dst, size_t stride, int n) {
    typedef tc_layout<HS, H> Y;
#pragma unroll
    for (int nb = 0; nb < HS / TC_SUB; nb++) wmma::store_matrix_sync(o + nb * TC_SUB, f[nb], Y::OLD, wmma::mem_row_major);
    __syncwarp();
    int lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
    if (r < n)
        for (int d = half * (HS / 2); d < (half + 1) * (HS / 2); d++) dst[(size_t)r * stride + d] = o[r * Y::OLD + d];
    __syncwarp();
}

// The forward in TF32 (H 3: fp32 out; out16 unused, there for forward_on's
// launch; the 16-bit forwards are flash_mma.cuh's).
template <int H, int HS>
__global__ static void __launch_bounds__(TC_W * 32)
    fa_forward_tc(float *out, uint16_t *out16, float *lse, const float *qkv, int T, int C, int NH, float scale) {
    static_assert(H == 3, "fa_forward_tc: TF32 alone");
    (void)out16;
#if TC_OLD
    __trap();
#else
    DT_DYN_SHARED __align__(128) float sm[];  // (32-byte aligned regions)
    typedef tc_layout<HS, H> Y;
    typedef typename tc_t<H>::elem E;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, h = blockIdx.x % NH, r = lane / 2, half = lane % 2;
    size_t bh = blockIdx.x, b = bh / NH, C3 = 3 * (size_t)C;
    int q0 = (gridDim.y - 1 - blockIdx.y) * TC_ROWS, qe = min(T, q0 + TC_ROWS), t = q0 + warp * TC_SUB + r;
    char *base = (char *)sm, *mine = base + 3 * Y::TILE + warp * (Y::SW + Y::PW + Y::OW);
    E *Q = (E *)base, *K = (E *)(base + Y::TILE), *V = (E *)(base + 2 * Y::TILE), *P = (E *)(mine + Y::SW);
    float *S = (float *)mine, *O = (float *)(mine + Y::SW + Y::PW);
    const float *x = qkv + b * T * C3 + (size_t)h * HS;
    tc_load<H, HS>(Q, x, C3, q0, T);
    for (int i = lane; i < TC_SUB * Y::OLD; i += 32) O[i] = 0.0f;
    float m = -FLT_MAX, l = 0.0f;
    for (int k0 = 0; k0 < qe; k0 += TC_ROWS) {
        __syncthreads();  // (the last tile read)
        tc_load<H, HS>(K, x + C, C3, k0, T);
        tc_load<H, HS>(V, x + 2 * C, C3, k0, T);
        __syncthreads();
        tc_scores<H, HS>(S, Q + warp * TC_SUB * Y::LD, K);
        float mx = -FLT_MAX, sum = 0.0f, *s = S + r * Y::SLD;
        for (int c = half * 32; c < half * 32 + 32; c++) {
            s[c] = __fmul_rn(s[c], scale);
            if (k0 + c <= t && t < T) mx = fmaxf(mx, s[c]);
        }
        float mnew = fmaxf(m, fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1)));
        for (int c = half * 32; c < half * 32 + 32; c++) {
            float e = k0 + c <= t && t < T ? dt_att_exp(s[c], mnew) : 0.0f;
            sum += e;
            P[r * Y::PLD + c] = tc_put<H>(e);
        }
        float corr = dt_att_exp(m, mnew);
        l = l * corr + sum + __shfl_xor_sync(0xffffffffu, sum, 1);
        m = mnew;
        for (int d = half * (HS / 2); d < (half + 1) * (HS / 2); d++) O[r * Y::OLD + d] *= corr;
        __syncwarp();
        for (int nb = 0; nb < HS / TC_SUB; nb++) {  // O += P V
            tc_acc<H> acc;
            wmma::load_matrix_sync(acc, O + nb * TC_SUB, Y::OLD, wmma::mem_row_major);
            tc_mma<H, wmma::row_major>(acc, P, Y::PLD, V + nb * TC_SUB, Y::LD, TC_ROWS);
            wmma::store_matrix_sync(O + nb * TC_SUB, acc, Y::OLD, wmma::mem_row_major);
        }
        __syncwarp();
    }
    if (t < T) {
        size_t at = (b * T + t) * C + (size_t)h * HS;
        for (int d = half * (HS / 2); d < (half + 1) * (HS / 2); d++) {
            out[at + d] = O[r * Y::OLD + d] * (1.0f / l);
        }
        if (half == 0) lse[bh * T + t] = m + logf(l);
    }
#endif
}

// The backward kernels' shared memory (tc_layout's BACKWARD): four 16-bit
// tiles (t: the block's own two rows' factors, then the other side's
// two), the query tile's statistics (Ls, Ds: fa_kv_tc's), and this warp's
// rows: S and dP (fp32), P and dS (16-bit), O (fp32 sums).
template <int H> struct tc_back {
    typename tc_t<H>::elem *t[4], *P, *dS;
    float *Ls, *Ds, *S, *dP, *O;
};
template <int H, int HS> __device__ static tc_back<H> tc_back_of() {
    typedef tc_layout<HS, H> Y;
    typedef typename tc_t<H>::elem E;
    DT_DYN_SHARED __align__(128) float sm[];
    char *base = (char *)sm, *mine = base + 4 * Y::TILE + Y::STATS + threadIdx.x / 32 * (2 * Y::SW + 2 * Y::PW + Y::OW);
    tc_back<H> m;
    for (int k = 0; k < 4; k++) m.t[k] = (E *)(base + k * Y::TILE);
    m.Ls = (float *)(base + 4 * Y::TILE), m.Ds = m.Ls + TC_ROWS;
    m.S = (float *)mine, m.dP = (float *)(mine + Y::SW), m.O = (float *)(mine + 2 * Y::SW + 2 * Y::PW);
    m.P = (E *)(mine + 2 * Y::SW), m.dS = (E *)(mine + 2 * Y::SW + Y::PW);
    return m;
}

// The tile of 64 key rows blockIdx.y of head blockIdx.x: dK and dV over
// the query tiles from the diagonal on (a lane half a key row's queries).
template <int H, int HS>
__global__ static void __launch_bounds__(TC_W * 32)
    fa_kv_tc(float *dqkv, const float *dout, const float *qkv, const float *lse, const float *D, int T, int C, int NH,
             float scale) {
#if TC_OLD
    __trap();
#else
    typedef tc_layout<HS, H> Y;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, h = blockIdx.x % NH, r = lane / 2, half = lane % 2;
    size_t bh = blockIdx.x, b = bh / NH, C3 = 3 * (size_t)C;
    int k0 = blockIdx.y * TC_ROWS, j = k0 + warp * TC_SUB + r;
    tc_back<H> m = tc_back_of<H, HS>();
    typename tc_t<H>::elem *K = m.t[0], *V = m.t[1], *Q = m.t[2], *dY = m.t[3], *P = m.P, *dS = m.dS;
    float *Ls = m.Ls, *Ds = m.Ds, *S = m.S, *dP = m.dP, *O = m.O;
    const float *x = qkv + b * T * C3 + (size_t)h * HS, *dy = dout + b * T * C + (size_t)h * HS;
    tc_acc<H> dK[HS / TC_SUB], dV[HS / TC_SUB];  // (registers: every loop over them unrolled)
#pragma unroll
    for (int nb = 0; nb < HS / TC_SUB; nb++) wmma::fill_fragment(dK[nb], 0.0f), wmma::fill_fragment(dV[nb], 0.0f);
    tc_load<H, HS>(K, x + C, C3, k0, T);
    tc_load<H, HS>(V, x + 2 * C, C3, k0, T);
    for (int q0 = k0; q0 < T; q0 += TC_ROWS) {
        __syncthreads();
        tc_load<H, HS>(Q, x, C3, q0, T);
        tc_load<H, HS>(dY, dy, C, q0, T);
        if (threadIdx.x < TC_ROWS) {
            int i = q0 + threadIdx.x;
            Ls[threadIdx.x] = i < T ? lse[bh * T + i] : 0.0f;
            Ds[threadIdx.x] = i < T ? D[bh * T + i] : 0.0f;
        }
        __syncthreads();
        tc_scores<H, HS>(S, K + warp * TC_SUB * Y::LD, Q);    // S^T: the warp's keys x the tile's queries
        tc_scores<H, HS>(dP, V + warp * TC_SUB * Y::LD, dY);  // dP^T
        for (int c = half * 32; c < half * 32 + 32; c++) {
            bool ok = q0 + c < T && j <= q0 + c;
            float e = ok ? dt_att_exp(__fmul_rn(S[r * Y::SLD + c], scale), Ls[c]) : 0.0f;
            P[r * Y::PLD + c] = tc_put<H>(e);
            dS[r * Y::PLD + c] = tc_put<H>(ok ? dt_att_grad(e, dP[r * Y::SLD + c], Ds[c], scale) : 0.0f);
        }
        __syncwarp();
#pragma unroll
        for (int nb = 0; nb < HS / TC_SUB; nb++) {
            tc_mma<H, wmma::row_major>(dV[nb], P, Y::PLD, dY + nb * TC_SUB, Y::LD, TC_ROWS);
            tc_mma<H, wmma::row_major>(dK[nb], dS, Y::PLD, Q + nb * TC_SUB, Y::LD, TC_ROWS);
        }
    }
    int n = min(TC_SUB, T - (k0 + warp * TC_SUB));
    float *g = dqkv + (b * T + k0 + warp * TC_SUB) * C3 + (size_t)h * HS;
    tc_set_rows<H, HS>(O, dK, g + C, C3, n);
    tc_set_rows<H, HS>(O, dV, g + 2 * C, C3, n);
#endif
}

// The tile of 64 query rows (the longest first) of head blockIdx.x: dQ
// over the key tiles up to the diagonal (a lane half a query row's keys).
template <int H, int HS>
__global__ static void __launch_bounds__(TC_W * 32)
    fa_q_tc(float *dqkv, const float *dout, const float *qkv, const float *lse, const float *D, int T, int C, int NH,
            float scale) {
#if TC_OLD
    __trap();
#else
    typedef tc_layout<HS, H> Y;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, h = blockIdx.x % NH, r = lane / 2, half = lane % 2;
    size_t bh = blockIdx.x, b = bh / NH, C3 = 3 * (size_t)C;
    int q0 = (gridDim.y - 1 - blockIdx.y) * TC_ROWS, qe = min(T, q0 + TC_ROWS), i = q0 + warp * TC_SUB + r;
    tc_back<H> m = tc_back_of<H, HS>();
    typename tc_t<H>::elem *Q = m.t[0], *dY = m.t[1], *K = m.t[2], *V = m.t[3], *dS = m.dS;
    float *S = m.S, *dP = m.dP, *O = m.O;
    const float *x = qkv + b * T * C3 + (size_t)h * HS, *dy = dout + b * T * C + (size_t)h * HS;
    float Li = i < T ? lse[bh * T + i] : 0.0f, Di = i < T ? D[bh * T + i] : 0.0f;
    tc_acc<H> dQ[HS / TC_SUB];  // (registers: every loop over them unrolled)
#pragma unroll
    for (int nb = 0; nb < HS / TC_SUB; nb++) wmma::fill_fragment(dQ[nb], 0.0f);
    tc_load<H, HS>(Q, x, C3, q0, T);
    tc_load<H, HS>(dY, dy, C, q0, T);
    for (int k0 = 0; k0 < qe; k0 += TC_ROWS) {
        __syncthreads();
        tc_load<H, HS>(K, x + C, C3, k0, T);
        tc_load<H, HS>(V, x + 2 * C, C3, k0, T);
        __syncthreads();
        tc_scores<H, HS>(S, Q + warp * TC_SUB * Y::LD, K);
        tc_scores<H, HS>(dP, dY + warp * TC_SUB * Y::LD, V);
        for (int c = half * 32; c < half * 32 + 32; c++) {
            bool ok = i < T && k0 + c <= i;
            float e = ok ? dt_att_exp(__fmul_rn(S[r * Y::SLD + c], scale), Li) : 0.0f;
            dS[r * Y::PLD + c] = tc_put<H>(ok ? dt_att_grad(e, dP[r * Y::SLD + c], Di, scale) : 0.0f);
        }
        __syncwarp();
#pragma unroll
        for (int nb = 0; nb < HS / TC_SUB; nb++)
            tc_mma<H, wmma::row_major>(dQ[nb], dS, Y::PLD, K + nb * TC_SUB, Y::LD, TC_ROWS);
    }
    int n = min(TC_SUB, T - (q0 + warp * TC_SUB));
    tc_set_rows<H, HS>(O, dQ, dqkv + (b * T + q0 + warp * TC_SUB) * C3 + (size_t)h * HS, C3, n);
#endif
}
