/* The GPU's causal attention as GEMMs and row passes (att_plan.h). */
#include "gpu/att_plan.h"
#include "gpu/dev.h"

#include <math.h>

// Bytes rounded up to 256: each copy in the work block starts where
// cuBLASLt's fastest kernels want it.
static size_t up256(size_t b) { return (b + 255) / 256 * 256; }

size_t dt_att_work_bytes(int B, int T, int C, int NH, dt_dtype t) {
    if (t == DT_F32 || B <= 0 || T <= 0 || C <= 0 || NH <= 0) return 0;
    size_t BT = (size_t)B * T;
    return up256(2 * BT * 3 * (size_t)C) + up256(2 * (size_t)B * NH * T * (size_t)T) + up256(2 * BT * (size_t)C);
}

static dt_att_choice g_choice;  // (per process: its runs' [train] attention)

void dt_att_choose(dt_att_choice c) { g_choice = c; }

static int fits(int C, int NH) { return NH > 0 && C > 0 && C % NH == 0 && C / NH <= DT_ATT_FUSED_HS; }

int dt_att_fused(int C, int NH) { return g_choice != DT_ATT_GEMM && fits(C, NH); }

dt_status dt_att_choice_check(int C, int NH) {
    if (g_choice != DT_ATT_FUSED || fits(C, NH)) return DT_OK;
    return dt_error(DT_ERR_CONFIG, "[train] attention = fused: heads of %d columns (n_embd %d / n_head %d); the fused "
                    "kernels take heads of up to %d: attention = auto (the GEMMs for larger heads) or gemm", C / NH, C,
                    NH, DT_ATT_FUSED_HS);
}

dt_att_room dt_att_room_of(int B, int T, int C, int NH, dt_dtype t) {
    size_t f = sizeof(float), rows = (size_t)B * NH * T;
    if (dt_att_fused(C, NH)) return (dt_att_room){f * rows, f * rows, 0};
    return (dt_att_room){f * rows * T, f * rows * T, dt_att_work_bytes(B, T, C, NH, t)};
}

dt_status dt_att_args(const char *what, int B, int T, int C, int NH, dt_dtype t) {
    if (B < 0 || T < 0 || C <= 0 || NH <= 0 || C % NH != 0)
        return dt_error(DT_ERR_ARG, "GPU attention %s: B %d, T %d, C %d, NH %d (NH must divide C)", what, B, T, C, NH);
    if (t != DT_F32 && t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_ARG, "GPU attention %s: products in type %s (F32, BF16 or F16 only)", what,
                        dt_dtype_name(t));
    return DT_OK;
}

static dt_status check(const char *what, int B, int T, int C, int NH, dt_dtype t, const void *work) {
    dt_status st = dt_att_args(what, B, T, C, NH, t);
    if (st != DT_OK) return st;
    if (t != DT_F32 && !work && B > 0 && T > 0)
        return dt_error(DT_ERR_ARG, "GPU attention %s: products in %s need a work block (dt_att_work_bytes)", what,
                        dt_dtype_name(t));
    return DT_OK;
}

// Element i of a block of type t.
static const void *at(const void *p, dt_dtype t, size_t i) { return (const char *)p + i * (t == DT_F32 ? 4 : 2); }

dt_status dt_att_forward(const dt_att_ops *x, float *out, float *att, const float *qkv, void *work, int B, int T,
                         int C, int NH, dt_dtype t) {
    dt_status st = check("forward", B, T, C, NH, t, work);
    if (st != DT_OK || B == 0 || T == 0) return st;
    int hs = C / NH, C3 = 3 * C;
    long long TT = (long long)T * T;
    size_t n3 = (size_t)B * T * C3, rows = (size_t)B * NH * T;
    const void *q = qkv;  // q, k and v in the products' type
    void *p16 = NULL;
    if (t != DT_F32) {
        p16 = (char *)work + up256(2 * n3);
        if ((st = x->round(work, qkv, n3, t)) != DT_OK) return st;
        q = work;
    }
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B && st == DT_OK; b++) {  // S = q k^T scale
        const void *qb = at(q, t, (size_t)b * T * C3);
        st = x->gemm(t, 0, 1, T, T, hs, scale, qb, C3, hs, at(qb, t, (size_t)C), C3, hs, 0.0f,
                     att + (size_t)b * NH * TT, T, TT, NH);
    }
    if (st == DT_OK) st = x->softmax(att, p16, rows, T, t);
    const void *p = t == DT_F32 ? (const void *)att : p16;
    for (int b = 0; b < B && st == DT_OK; b++)  // out = att v
        st = x->gemm(t, 0, 0, T, hs, T, 1.0f, at(p, t, (size_t)b * NH * TT), T, TT,
                     at(q, t, (size_t)b * T * C3 + 2 * (size_t)C), C3, hs, 0.0f, out + (size_t)b * T * C, C, hs, NH);
    return st;
}

dt_status dt_att_backward(const dt_att_ops *x, float *dqkv, float *datt, const float *dout, const float *qkv,
                          const float *att, void *work, int B, int T, int C, int NH, dt_dtype t) {
    dt_status st = check("backward", B, T, C, NH, t, work);
    if (st != DT_OK || B == 0 || T == 0) return st;
    int hs = C / NH, C3 = 3 * C;
    long long TT = (long long)T * T;
    size_t n3 = (size_t)B * T * C3, na = (size_t)B * NH * TT, rows = (size_t)B * NH * T;
    const void *q = qkv, *p = att, *dy = dout;  // the factors in the products' type
    void *d16 = NULL;
    if (t != DT_F32) {
        void *p16 = (char *)work + up256(2 * n3), *dy16 = (char *)p16 + up256(2 * na);
        if ((st = x->round(work, qkv, n3, t)) == DT_OK && (st = x->round(p16, att, na, t)) == DT_OK)
            st = x->round(dy16, dout, (size_t)B * T * C, t);
        if (st != DT_OK) return st;
        q = work, p = p16, dy = dy16;
        d16 = p16;  // (the softmax's gradient rounded where att's copy was, once dv has it)
    }
    for (int b = 0; b < B && st == DT_OK; b++) {  // dv = att^T dy, then datt = dy v^T
        size_t qo = (size_t)b * T * C3;
        const void *dyb = at(dy, t, (size_t)b * T * C);
        st = x->gemm(t, 1, 0, T, hs, T, 1.0f, at(p, t, (size_t)b * NH * TT), T, TT, dyb, C, hs, 0.0f,
                     dqkv + qo + 2 * (size_t)C, C3, hs, NH);
        if (st == DT_OK)
            st = x->gemm(t, 0, 1, T, T, hs, 1.0f, dyb, C, hs, at(q, t, qo + 2 * (size_t)C), C3, hs, 0.0f,
                         datt + (size_t)b * NH * TT, T, TT, NH);
    }
    if (st == DT_OK) st = x->softmax_backward(datt, att, d16, rows, T, 1.0f / sqrtf((float)hs), t);
    const void *d = t == DT_F32 ? (const void *)datt : d16;
    for (int b = 0; b < B && st == DT_OK; b++) {  // dq = datt k, dk = datt^T q
        size_t qo = (size_t)b * T * C3;
        const void *db = at(d, t, (size_t)b * NH * TT);
        st = x->gemm(t, 0, 0, T, hs, T, 1.0f, db, T, TT, at(q, t, qo + (size_t)C), C3, hs, 0.0f, dqkv + qo, C3,
                     hs, NH);
        if (st == DT_OK)
            st = x->gemm(t, 1, 0, T, hs, T, 1.0f, db, T, TT, at(q, t, qo), C3, hs, 0.0f,
                         dqkv + qo + (size_t)C, C3, hs, NH);
    }
    return st;
}
