/* The fused attention in bf16 and fp16 (included by flash.cu, after
 * flash_tc.cuh): FlashAttention-2's scheme on the tensor cores' warp-level
 * products (mma.sync m16n8k16: 16-bit factors, fp32 sums): the forward at
 * heads of 64 or 128 columns, the backward at 64 (at 128 its sums outgrow
 * a lane's registers: flash_tc.cuh's there). A block is 4 warps and 64
 * rows of one head, a warp 16 of them; a warp's own rows' factors, its
 * scores, probabilities and sums stay in its registers, each lane holding
 * the elements PTX's fragment layouts give it (below), so that a row's
 * maximum and sum are two shuffles among the row's 4 lanes and the
 * probabilities (and the softmax's gradient), rounded to the 16-bit type,
 * are the next product's first factor as they are; only the other side's
 * tiles pass through shared memory, rounded as they are stored, by rows
 * and (as a product's second factor along its rows) transposed. The
 * arithmetic is flash_tc.cuh's: the same factors rounded, the scores
 * scaled and masked, each row's online maximum and sum of unrounded
 * exponentials; the sums are the tensor cores' and the row's 4 lanes'.
 *
 *   fa_forward_mma per key tile: S = Q K^T, the online softmax, O += P V.
 *   fa_kv_mma      a key tile's dK and dV over the query tiles from the
 *                  diagonal on: S^T = K Q^T, dP^T = V dY^T, P^T and dS^T,
 *                  dV += P^T dY, dK += dS^T Q.
 *   fa_q_mma       a query tile's dQ over the key tiles up to the
 *                  diagonal: S, dP, dS again, dQ += dS K.
 *
 * Fragments of mma.sync.aligned.m16n8k16 (lane = 4 g + c, PTX ISA
 * "Matrix Fragments for mma.m16n8k16 with floating point type"; a 32-bit
 * register holds two elements, the first in its low half):
 *   A (16 x 16, row-major), 4 registers: rows g, g + 8, g, g + 8; columns
 *     2 c, 2 c + 1 (the last two: + 8);
 *   B (16 x 8, by columns), 2 registers: rows (k) 2 c, 2 c + 1 (the second:
 *     + 8) of column g;
 *   C, D (16 x 8, fp32), 4 floats: row g columns 2 c, 2 c + 1, then row
 *     g + 8 the same columns.
 * An S tile's two 8-column fragments 2 j and 2 j + 1 are thus, packed in
 * pairs, the A fragment of the probabilities' columns 16 j .. 16 j + 15.
 * On the emulator (tests/gpu/cuda_emu.h) a product is an exchange of the
 * warp's fragments between two warp barriers, summed in k order. */

#define MMA_W 4     // warps a block
#define MMA_ROWS 64 // a block's rows, and a tile of the other side

// The shared memory at heads of HS: a tile by rows [64][HS + 8] (KS
// values), a tile transposed [HS][64 + 8] (VS), 16-bit values (rows padded
// so that a fragment's 8 row groups load from different banks); each
// kernel's bytes (the backward's key tile: the queries' statistics too).
template <int HS> struct mma_layout {
    static constexpr int KLD = HS + 8, VLD = MMA_ROWS + 8;
    static constexpr size_t KS = (size_t)MMA_ROWS * KLD, VS = (size_t)HS * VLD;
    static constexpr size_t FORWARD = 2 * (KS + VS), KV = 2 * (2 * KS + 2 * VS) + 2 * 4 * MMA_ROWS,
                            Q = 2 * (2 * KS + VS);
};

// Two values rounded to H's type, packed (lo in the low half).
template <int H> __device__ static inline uint32_t mma_pack(float lo, float hi) {
    return (uint32_t)narrow<H>(lo) | (uint32_t)narrow<H>(hi) << 16;
}

// d += A B, the warp's 16 x 16 and 16 x 8 fragments (H 1: bf16, 2: fp16).
template <int H> __device__ static inline void mma16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
#ifdef DT_CUDA_EMU
    dt_emu_mma16816(d, a, b, H);
#elif !TC_OLD
    if (H == 1)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// The B fragment of rows (k) k0 .. k0 + 15 of columns n0 .. n0 + 7 of a
// matrix stored by columns in shared memory (column n at s + n ld: a
// tile's rows for B = the tile^T, a transposed tile's for B = the tile).
__device__ static inline void mma_b(uint32_t b[2], const uint16_t *s, int ld, int n0, int k0) {
    int lane = threadIdx.x % 32;
    const uint16_t *p = s + (n0 + lane / 4) * ld + k0 + 2 * (lane % 4);
    b[0] = *(const uint32_t *)p, b[1] = *(const uint32_t *)(p + 8);
}

// The A fragments of the 16 rows r0 .. r0 + 15 of src (row stride
// `stride`, HS columns), rounded; rows past T zeros.
template <int H, int HS>
__device__ static void mma_a_rows(uint32_t a[HS / 16][4], const float *src, size_t stride, int r0, int T) {
    int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
    for (int kc = 0; kc < HS / 16; kc++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r = r0 + g + 8 * (i % 2), d = kc * 16 + 8 * (i / 2) + 2 * c;
            const float *x = src + (size_t)r * stride + d;
            a[kc][i] = r < T ? mma_pack<H>(x[0], x[1]) : 0u;
        }
}

// The A fragment of columns 16 kc .. 16 kc + 15 of a warp's 16 x 64 tile
// held as C fragments s (8 columns each), rounded.
template <int H> __device__ static inline void mma_a_of(uint32_t a[4], const float (*s)[4], int kc) {
    a[0] = mma_pack<H>(s[2 * kc][0], s[2 * kc][1]), a[1] = mma_pack<H>(s[2 * kc][2], s[2 * kc][3]);
    a[2] = mma_pack<H>(s[2 * kc + 1][0], s[2 * kc + 1][1]), a[3] = mma_pack<H>(s[2 * kc + 1][2], s[2 * kc + 1][3]);
}

// acc[n] (n < 8: 8 columns each) = A B over HS: A the warp's fragments a,
// B^T the 64 rows of tile s (by rows: s[row KLD + d]).
template <int H, int HS> __device__ static void mma_tile(float acc[8][4], const uint32_t a[HS / 16][4], const uint16_t *s) {
#pragma unroll
    for (int n = 0; n < 8; n++) {
        acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
        for (int kc = 0; kc < HS / 16; kc++) {
            uint32_t b[2];
            mma_b(b, s, mma_layout<HS>::KLD, n * 8, kc * 16);
            mma16816<H>(acc[n], a[kc], b);
        }
    }
}

// acc[n] (n < HS / 8) += P B: P the warp's 16 x 64 tile p as C fragments,
// B the 64 x HS tile transposed in t (t[d VLD + row]).
template <int H, int HS> __device__ static void mma_acc(float acc[HS / 8][4], const float (*p)[4], const uint16_t *t) {
#pragma unroll
    for (int kc = 0; kc < MMA_ROWS / 16; kc++) {
        uint32_t a[4];
        mma_a_of<H>(a, p, kc);
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            uint32_t b[2];
            mma_b(b, t, mma_layout<HS>::VLD, n * 8, kc * 16);
            mma16816<H>(acc[n], a, b);
        }
    }
}

// The 64 rows from r0 of src (row stride `stride`, HS columns) rounded
// into s by rows and into t transposed (either may be NULL); rows past T
// zeros. Where the rows are 16-byte aligned, 4 columns a load: a warp's
// 32 loads 16 rows x 8 columns, so that its 16-bit stores into t meet
// each bank at one word (two rows' halves of it) and its 8-byte stores
// into s meet a bank at most twice.
template <int H, int HS>
__device__ static void mma_load(uint16_t *s, uint16_t *t, const float *src, size_t stride, int r0, int T) {
    typedef mma_layout<HS> Y;
    if ((uintptr_t)src % 16 == 0 && stride % 4 == 0) {
        const int CH = HS / 4;  // (a row's 4-column pieces)
        for (int u = threadIdx.x; u < MMA_ROWS * CH; u += blockDim.x) {
            int j = u / (16 * CH) * 16 + u % 16, d = u / 16 % CH * 4;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r0 + j < T) v = *(const float4 *)(src + (size_t)(r0 + j) * stride + d);
            uint16_t e[4] = {narrow<H>(v.x), narrow<H>(v.y), narrow<H>(v.z), narrow<H>(v.w)};
            if (s) *(uint2 *)(s + j * Y::KLD + d) = make_uint2(e[0] | (uint32_t)e[1] << 16, e[2] | (uint32_t)e[3] << 16);
#pragma unroll
            for (int k = 0; t && k < 4; k++) t[(d + k) * Y::VLD + j] = e[k];
        }
        return;
    }
    for (int i = threadIdx.x; i < MMA_ROWS * HS; i += blockDim.x) {
        int j = i / HS, d = i % HS;
        uint16_t v = narrow<H>(r0 + j < T ? src[(size_t)(r0 + j) * stride + d] : 0.0f);
        if (s) s[j * Y::KLD + d] = v;
        if (t) t[d * Y::VLD + j] = v;
    }
}

// acc (a warp's 16 rows r0 .., HS columns as C fragments) written into
// the rows of dst (row stride `stride`) below T.
template <int HS>
__device__ static void mma_set_rows(float *dst, size_t stride, const float (*acc)[4], int r0, int T) {
    int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        int r = r0 + g + 8 * j;
        if (r >= T) continue;
        float *o = dst + (size_t)r * stride + 2 * c;
#pragma unroll
        for (int n = 0; n < HS / 8; n++) o[n * 8] = acc[n][2 * j], o[n * 8 + 1] = acc[n][2 * j + 1];
    }
}

// Where a block and a lane are: block blockIdx.x is head bh = (b, h) =
// blockIdx.x / tiles, a head's tiles one after another (they share its
// rows in the L2), its tile's first row r0 counted from the start or
// (from_end) from the end; the warp's first row w0, the lane's group g of
// 4 lanes and place c in it (PTX's fragments').
struct mma_at {
    size_t bh, b;
    int h, r0, w0, g, c;
};
__device__ static inline mma_at mma_where(int NH, unsigned tiles, bool from_end) {
    mma_at a;
    unsigned k = blockIdx.x % tiles;
    a.bh = blockIdx.x / tiles, a.b = a.bh / NH, a.h = (int)(a.bh % NH);
    a.r0 = (int)(from_end ? tiles - 1 - k : k) * MMA_ROWS, a.w0 = a.r0 + (int)threadIdx.x / 32 * 16;
    a.g = (int)threadIdx.x % 32 / 4, a.c = (int)threadIdx.x % 4;
    return a;
}

// A query tile (the longest first).
template <int H, int HS>
__global__ static void __launch_bounds__(MMA_W * 32)
    fa_forward_mma(float *out, uint16_t *out16, float *lse, const float *qkv, int T, int C, int NH, float scale,
                   unsigned tiles) {
#if TC_OLD
    __trap();
#else
    DT_DYN_SHARED __align__(128) float sm[];
    uint16_t *Ks = (uint16_t *)sm, *Vt = Ks + mma_layout<HS>::KS;
    mma_at a = mma_where(NH, tiles, true);
    size_t bh = a.bh, b = a.b, C3 = 3 * (size_t)C;
    int c = a.c, qe = min(T, a.r0 + MMA_ROWS), t[2] = {a.w0 + a.g, a.w0 + a.g + 8};  // (this lane's two rows)
    const float *x = qkv + b * T * C3 + (size_t)a.h * HS;
    uint32_t qa[HS / 16][4];  // the rows' query factors
    mma_a_rows<H, HS>(qa, x, C3, a.w0, T);
    float o[HS / 8][4], m[2] = {-FLT_MAX, -FLT_MAX}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < HS / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    for (int k0 = 0; k0 < qe; k0 += MMA_ROWS) {
        __syncthreads();  // (the last tiles read)
        mma_load<H, HS>(Ks, NULL, x + C, C3, k0, T);
        mma_load<H, HS>(NULL, Vt, x + 2 * C, C3, k0, T);
        __syncthreads();
        float s[8][4], mx[2] = {-FLT_MAX, -FLT_MAX}, mnew[2], sum[2] = {0.0f, 0.0f};
        mma_tile<H, HS>(s, qa, Ks);  // S = Q K^T
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int key = k0 + n * 8 + 2 * c + i % 2, r = t[i / 2];
                s[n][i] = __fmul_rn(s[n][i], scale);
                if (key <= r && r < T) mx[i / 2] = fmaxf(mx[i / 2], s[n][i]);
            }
#pragma unroll
        for (int j = 0; j < 2; j++) {
            mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 1));
            mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 2));
            mnew[j] = fmaxf(m[j], mx[j]);
        }
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int key = k0 + n * 8 + 2 * c + i % 2, r = t[i / 2];
                float e = key <= r && r < T ? dt_att_exp(s[n][i], mnew[i / 2]) : 0.0f;
                sum[i / 2] += e;
                s[n][i] = e;
            }
#pragma unroll
        for (int j = 0; j < 2; j++) {
            sum[j] += __shfl_xor_sync(0xffffffffu, sum[j], 1);
            sum[j] += __shfl_xor_sync(0xffffffffu, sum[j], 2);
            float corr = dt_att_exp(m[j], mnew[j]);
            l[j] = l[j] * corr + sum[j];
            m[j] = mnew[j];
#pragma unroll
            for (int n = 0; n < HS / 8; n++) o[n][2 * j] *= corr, o[n][2 * j + 1] *= corr;
        }
        mma_acc<H, HS>(o, s, Vt);  // O += P V
    }
#pragma unroll
    for (int j = 0; j < 2; j++) {
        if (t[j] >= T) continue;
        size_t at = (b * T + t[j]) * C + (size_t)a.h * HS + 2 * c;
        float inv = 1.0f / l[j];
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            float v0 = o[n][2 * j] * inv, v1 = o[n][2 * j + 1] * inv;
            if (out16) out16[at + n * 8] = narrow<H>(v0), out16[at + n * 8 + 1] = narrow<H>(v1);
            else out[at + n * 8] = v0, out[at + n * 8 + 1] = v1;
        }
        if (c == 0) lse[bh * T + t[j]] = m[j] + logf(l[j]);
    }
#endif
}

// A key tile (the longest first, from the start): dK and dV over the
// query tiles from the diagonal on.
template <int H, int HS>
__global__ static void __launch_bounds__(MMA_W * 32)
    fa_kv_mma(float *dqkv, const float *dout, const float *qkv, const float *lse, const float *D, int T, int C, int NH,
              float scale, unsigned tiles) {
#if TC_OLD
    __trap();
#else
    DT_DYN_SHARED __align__(128) float sm[];
    typedef mma_layout<HS> Y;
    uint16_t *Qs = (uint16_t *)sm, *dYs = Qs + Y::KS, *Qt = dYs + Y::KS, *dYt = Qt + Y::VS;
    float *Ls = (float *)(dYt + Y::VS), *Ds = Ls + MMA_ROWS;
    mma_at a = mma_where(NH, tiles, false);
    size_t bh = a.bh, C3 = 3 * (size_t)C;
    int g = a.g, c = a.c, k0 = a.r0, j0 = a.w0;
    const float *x = qkv + a.b * T * C3 + (size_t)a.h * HS, *dy = dout + a.b * T * C + (size_t)a.h * HS;
    uint32_t ka[HS / 16][4], va[HS / 16][4];  // the rows' key and value factors
    mma_a_rows<H, HS>(ka, x + C, C3, j0, T);
    mma_a_rows<H, HS>(va, x + 2 * C, C3, j0, T);
    float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) dk[n][i] = dv[n][i] = 0.0f;
    for (int q0 = k0; q0 < T; q0 += MMA_ROWS) {
        __syncthreads();  // (the last tiles read)
        mma_load<H, HS>(Qs, Qt, x, C3, q0, T);
        mma_load<H, HS>(dYs, dYt, dy, C, q0, T);
        if (threadIdx.x < MMA_ROWS) {
            int i = q0 + threadIdx.x;
            Ls[threadIdx.x] = i < T ? lse[bh * T + i] : 0.0f;
            Ds[threadIdx.x] = i < T ? D[bh * T + i] : 0.0f;
        }
        __syncthreads();
        float s[8][4], dp[8][4];
        mma_tile<H, HS>(s, ka, Qs);    // S^T: the warp's keys x the tile's queries
        mma_tile<H, HS>(dp, va, dYs);  // dP^T
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int q = n * 8 + 2 * c + i % 2, key = j0 + g + 8 * (i / 2);
                bool ok = q0 + q < T && key <= q0 + q;
                float e = ok ? dt_att_exp(__fmul_rn(s[n][i], scale), Ls[q]) : 0.0f;
                s[n][i] = e;
                dp[n][i] = ok ? dt_att_grad(e, dp[n][i], Ds[q], scale) : 0.0f;
            }
        mma_acc<H, HS>(dv, s, dYt);  // dV += P^T dY
        mma_acc<H, HS>(dk, dp, Qt);  // dK += dS^T Q
    }
    float *at = dqkv + a.b * T * C3 + (size_t)a.h * HS;
    mma_set_rows<HS>(at + C, C3, dk, j0, T);
    mma_set_rows<HS>(at + 2 * C, C3, dv, j0, T);
#endif
}

// A query tile (the longest first): dQ over the key tiles up to the
// diagonal.
template <int H, int HS>
__global__ static void __launch_bounds__(MMA_W * 32)
    fa_q_mma(float *dqkv, const float *dout, const float *qkv, const float *lse, const float *D, int T, int C, int NH,
             float scale, unsigned tiles) {
#if TC_OLD
    __trap();
#else
    DT_DYN_SHARED __align__(128) float sm[];
    typedef mma_layout<HS> Y;
    uint16_t *Ks = (uint16_t *)sm, *Vs = Ks + Y::KS, *Kt = Vs + Y::KS;
    mma_at a = mma_where(NH, tiles, true);
    size_t bh = a.bh, C3 = 3 * (size_t)C;
    int c = a.c, qe = min(T, a.r0 + MMA_ROWS), i0 = a.w0, t[2] = {i0 + a.g, i0 + a.g + 8};  // (this lane's two rows)
    const float *x = qkv + a.b * T * C3 + (size_t)a.h * HS, *dy = dout + a.b * T * C + (size_t)a.h * HS;
    float L[2], Dr[2];
#pragma unroll
    for (int j = 0; j < 2; j++) {
        L[j] = t[j] < T ? lse[bh * T + t[j]] : 0.0f;
        Dr[j] = t[j] < T ? D[bh * T + t[j]] : 0.0f;
    }
    uint32_t qa[HS / 16][4], ya[HS / 16][4];  // the rows' query and output-gradient factors
    mma_a_rows<H, HS>(qa, x, C3, i0, T);
    mma_a_rows<H, HS>(ya, dy, C, i0, T);
    float dq[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
    for (int k0 = 0; k0 < qe; k0 += MMA_ROWS) {
        __syncthreads();  // (the last tiles read)
        mma_load<H, HS>(Ks, Kt, x + C, C3, k0, T);
        mma_load<H, HS>(Vs, NULL, x + 2 * C, C3, k0, T);
        __syncthreads();
        float s[8][4], dp[8][4];
        mma_tile<H, HS>(s, qa, Ks);   // S
        mma_tile<H, HS>(dp, ya, Vs);  // dP
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int key = k0 + n * 8 + 2 * c + i % 2, r = t[i / 2];
                bool ok = r < T && key <= r;
                float e = ok ? dt_att_exp(__fmul_rn(s[n][i], scale), L[i / 2]) : 0.0f;
                dp[n][i] = ok ? dt_att_grad(e, dp[n][i], Dr[i / 2], scale) : 0.0f;
            }
        mma_acc<H, HS>(dq, dp, Kt);  // dQ += dS K
    }
    mma_set_rows<HS>(dqkv + a.b * T * C3 + (size_t)a.h * HS, C3, dq, i0, T);
#endif
}
