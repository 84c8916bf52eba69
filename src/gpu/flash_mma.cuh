/* The fused attention's forward in bf16 and fp16 (included by flash.cu,
 * after flash_tc.cuh): FlashAttention-2's scheme on the tensor cores'
 * warp-level products (mma.sync m16n8k16: 16-bit factors, fp32 sums), at
 * heads of 64 or 128 columns. A block is 4 warps and 64 query rows of one
 * head, a warp 16 of them; a warp's query factors, scores, probabilities
 * and output sums stay in its registers, each lane holding the elements
 * PTX's fragment layouts give it (below), so that a row's maximum and sum
 * are two shuffles among the row's 4 lanes and the probabilities, rounded
 * to the 16-bit type, are the next product's first factor as they are;
 * only the key tile (64 rows) and the value tile (transposed) pass through
 * shared memory, rounded as they are stored. The arithmetic is
 * fa_forward_tc's (flash_tc.cuh): the same factors rounded, the scores
 * scaled and masked and each row's online maximum and sum of unrounded
 * exponentials; the sums are the tensor cores' and the row's 4 lanes'.
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
#define MMA_ROWS 64 // a block's query rows, and a key tile

// The shared memory at heads of HS: the key tile [64][HS + 8] and the
// value tile transposed [HS][64 + 8], 16-bit values (rows padded so that
// the 8 row groups of a fragment's loads fall in different banks).
template <int HS> struct mma_layout {
    static constexpr int KLD = HS + 8, VLD = MMA_ROWS + 8;
    static constexpr size_t KS = (size_t)MMA_ROWS * KLD, FORWARD = 2 * (KS + (size_t)HS * VLD);
};

// Two values rounded to H's type, packed (lo in the low half).
template <int H> __device__ static inline uint32_t mma_pack(float lo, float hi) {
    return (uint32_t)narrow<H>(lo) | (uint32_t)narrow<H>(hi) << 16;
}

// Two 16-bit values from shared memory (4-byte aligned).
__device__ static inline uint32_t mma_ld(const uint16_t *p) { return *(const uint32_t *)p; }

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

// The 64 key rows from k0 into Ks and the value rows transposed into Vt,
// rounded; rows past T zeros.
template <int H, int HS>
__device__ static void mma_load_kv(uint16_t *Ks, uint16_t *Vt, const float *x, size_t C3, int C, int k0, int T) {
    typedef mma_layout<HS> Y;
    for (int i = threadIdx.x; i < MMA_ROWS * HS; i += blockDim.x) {
        int j = i / HS, d = i % HS;
        const float *row = x + (size_t)(k0 + j) * C3;
        int in = k0 + j < T;
        Ks[j * Y::KLD + d] = narrow<H>(in ? row[C + d] : 0.0f);
        Vt[d * Y::VLD + j] = narrow<H>(in ? row[2 * C + d] : 0.0f);
    }
}

// Block blockIdx.x: head blockIdx.x / tiles, its query tile from the end
// (the longest first), a head's tiles one after another (they share its
// keys and values in the L2).
template <int H, int HS>
__global__ static void __launch_bounds__(MMA_W * 32)
    fa_forward_mma(float *out, uint16_t *out16, float *lse, const float *qkv, int T, int C, int NH, float scale,
                   unsigned tiles) {
#if TC_OLD
    __trap();
#else
    DT_DYN_SHARED __align__(128) float sm[];
    typedef mma_layout<HS> Y;
    uint16_t *Ks = (uint16_t *)sm, *Vt = Ks + Y::KS;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    size_t bh = blockIdx.x / tiles, b = bh / NH, C3 = 3 * (size_t)C;
    int h = (int)(bh % NH), q0 = (int)(tiles - 1 - blockIdx.x % tiles) * MMA_ROWS, qe = min(T, q0 + MMA_ROWS);
    int t[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};  // this lane's two rows
    const float *x = qkv + b * T * C3 + (size_t)h * HS;
    uint32_t qa[HS / 16][4];  // the rows' query factors, A fragments
#pragma unroll
    for (int kc = 0; kc < HS / 16; kc++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r = t[i % 2], d = kc * 16 + (i / 2) * 8 + 2 * c;
            const float *q = x + (size_t)r * C3 + d;
            qa[kc][i] = r < T ? mma_pack<H>(q[0], q[1]) : 0u;
        }
    float o[HS / 8][4], m[2] = {-FLT_MAX, -FLT_MAX}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < HS / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    for (int k0 = 0; k0 < qe; k0 += MMA_ROWS) {
        __syncthreads();  // (the last tiles read)
        mma_load_kv<H, HS>(Ks, Vt, x, C3, C, k0, T);
        __syncthreads();
        float s[MMA_ROWS / 8][4], mx[2] = {-FLT_MAX, -FLT_MAX};
#pragma unroll
        for (int n = 0; n < MMA_ROWS / 8; n++) {  // S = Q K^T, 8 keys a fragment
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int kc = 0; kc < HS / 16; kc++) {
                const uint16_t *k = Ks + (n * 8 + g) * Y::KLD + kc * 16 + 2 * c;
                uint32_t kb[2] = {mma_ld(k), mma_ld(k + 8)};
                mma16816<H>(s[n], qa[kc], kb);
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int key = k0 + n * 8 + 2 * c + i % 2, r = t[i / 2];
                s[n][i] = __fmul_rn(s[n][i], scale);
                if (key <= r && r < T) mx[i / 2] = fmaxf(mx[i / 2], s[n][i]);
            }
        }
        float mnew[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < 2; j++) {
            mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 1));
            mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 2));
            mnew[j] = fmaxf(m[j], mx[j]);
        }
#pragma unroll
        for (int n = 0; n < MMA_ROWS / 8; n++)
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
#pragma unroll
        for (int kc = 0; kc < MMA_ROWS / 16; kc++) {  // O += P V, 16 keys a step
            uint32_t pa[4] = {mma_pack<H>(s[2 * kc][0], s[2 * kc][1]), mma_pack<H>(s[2 * kc][2], s[2 * kc][3]),
                              mma_pack<H>(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                              mma_pack<H>(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
            for (int n = 0; n < HS / 8; n++) {
                const uint16_t *v = Vt + (n * 8 + g) * Y::VLD + kc * 16 + 2 * c;
                uint32_t vb[2] = {mma_ld(v), mma_ld(v + 8)};
                mma16816<H>(o[n], pa, vb);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < 2; j++) {
        if (t[j] >= T) continue;
        size_t at = (b * T + t[j]) * C + (size_t)h * HS + 2 * c;
        float inv = 1.0f / l[j];
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            float v0 = o[n][2 * j] * inv, v1 = o[n][2 * j + 1] * inv;
            if (out16) *(uint32_t *)(out16 + at + n * 8) = (uint32_t)narrow<H>(v0) | (uint32_t)narrow<H>(v1) << 16;
            else out[at + n * 8] = v0, out[at + n * 8 + 1] = v1;
        }
        if (c == 0) lse[bh * T + t[j]] = m[j] + logf(l[j]);
    }
#endif
}
