/* 2-D convolution on oneDNN's convolution primitives (forward, backward
 * data, backward weights). Their direct kernels work in blocked layouts
 * (nChw16c activations, OIhw16i16o weights on AVX-512), which skip im2col
 * and col2im altogether; the caller keeps plain NCHW/OIHW tensors and the
 * reorders between the two happen here, in oneDNN's own reorder kernels.
 *
 * A plan holds the primitives of one shape at one thread count. It is made
 * on first use and kept for the life of the process (a model needs one per
 * convolution and batch size). Plans never change after creation and keep
 * no tensors of their own: everything a call writes lives in the caller's
 * areas, so calls are reentrant. `save` holds the one thing forward leaves
 * for backward, the input in the primitives' layout; the rest (the weights'
 * and the output gradient's copies, results in the primitives' layouts) is
 * `scratch`, free again when a call returns, so that one scratch serves all
 * the convolutions of a model in turn. When the caller offers room
 * (out_room), the tensors of the output's size go there instead: the
 * forward's output in the primitive's layout in `room` (a buffer free until
 * the backward), and backward's copies of the output gradient and its input
 * gradient in the primitive's layout in the forward's output buffer. Those
 * copies are what takes the most where the primitives' layouts are not the
 * caller's (on AMX, oneDNN's bf16 convolutions run channels-last, nhwc, and
 * the model's activations stay NCHW).
 * oneDNN's own scratchpad is in `scratch` too (scratchpad mode "user"): in
 * its default mode a primitive's scratchpad is one buffer per primitive,
 * shared by concurrent calls, and for some implementations (the GEMM-based
 * convolutions, "gemm:jit") a buffer of the thread that made the primitive,
 * which another thread running it does not have: two threads running the
 * same plan crashed inside oneDNN.
 *
 * Where oneDNN chose its reference implementation ("ref:any") for any of a
 * plan's three passes, the plan runs on the portable path instead
 * (conv_portable.c, im2col and GEMMs): the reference kernels run the whole
 * convolution in scalar loops, hundreds of times slower on the CNN's shapes
 * (docs/model-parallel.md). Where only backward weights is on a reference
 * kernel and forward saves the input plain (NCHW, which the portable path
 * reads), that pass alone goes portable (DT_CONV_MIXED): oneDNN's forward
 * and backward data are 2-3 times faster than the portable ones. Such a
 * plan's primitives are made all the same, so that the sizes cover both
 * paths.
 *
 * In a low precision (kernels.h) the primitives take the input, the weights
 * and the output gradient in bf16 where oneDNN has bf16 kernels on this CPU
 * (the reorders from the caller's fp32 convert them; outputs and weight
 * gradients stay fp32); elsewhere, or for a shape without such a kernel,
 * they stay fp32 and those three are rounded in their copies; the saved
 * input is then kept in 16 bits (exact: it holds rounded values) and
 * widened into scratch for backward weights, so that it takes the same two
 * bytes an element on every CPU. */
#include "kernels/kernels.h"

#ifndef DTRAIN_HAVE_ONEDNN
// Built without oneDNN: every convolution on the portable path.
void dt_conv_set_routing(int on) { (void)on; }
void dt_conv_size(const dt_conv_shape *s, size_t *save, size_t *scratch) { dt_conv_portable_size(s, save, scratch); }
void dt_conv_prefers_blocked(const dt_conv_shape *s, int *src, int *dst) { (void)s, *src = *dst = 0; }
int dt_conv_path(const dt_conv_shape *s, const char **impls) {
    (void)s;
    if (impls) *impls = "no oneDNN in this build";
    return DT_CONV_PORTABLE;
}
void dt_conv_forward(float *out, float *room, float *save, float *scratch, const float *inp, const float *w,
                     const float *b, const dt_conv_shape *s) {
    (void)room;
    dt_conv_portable_forward(out, save, scratch, inp, w, b, s);
}
void dt_conv_backward(float *dinp, float *dw, float *db, float *scratch, float *out, const float *dout,
                      const float *save, const float *w, const dt_conv_shape *s, int set_dinp) {
    dt_conv_portable_backward(dinp, dw, db, scratch, out, dout, save, w, s, set_dinp);
}
#else
#include "kernels/onednn.h"

#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// A tensor in the layout a primitive wants: where it sits in the caller's
// scratch (in floats) and the reorders from the plain layout (`in`) or back
// to it (`out`, which adds into the plain tensor, and `set`, which
// overwrites it). A reorder is NULL when the two layouts are the same.
typedef struct {
    dnnl_memory_desc_t md;
    dnnl_primitive_t in, out, set;
    size_t off;
    int room;  // off is into the caller's room (out_room; forward: room, backward: out), else the area named
} view;

typedef struct plan {
    struct plan *next;
    int key[18];
    int src16, dst16;  // the forward's own layouts are blocked
    dt_dtype round;    // the operands' copies are rounded to this (DT_F32: not)
    int path;          // DT_CONV_ONEDNN, _PORTABLE (oneDNN's choice was a reference kernel) or _MIXED
    char impls[192];   // oneDNN's implementations of the three passes (dt_conv_path)
    dnnl_memory_desc_t plain_src, plain_wei, plain_dst, bias_md;
    dnnl_primitive_t fwd, bwd_data, bwd_weights;
    // In `save`: the input as backward weights reads it (round == DT_F32),
    // or its 16-bit copy (keep_n elements in `round`; then src is the
    // forward's fp32 copy in scratch or room, and wsrc where backward
    // widens it: in scratch, or with wsrc_dinp in dinp, backward weights
    // then running before backward data overwrites dinp).
    // In `scratch`, forward: the weights, the output in the primitive's
    // layout and (when b is NULL) a zero bias; backward: the rest.
    view src, fwei, fdst;
    size_t zero_bias, save_size, keep_n, wsrc;
    int wsrc_dinp;
    view ddst, bwei, dsrc, wddst, dwei;
    size_t dbias, scratch_size;
    size_t fpad, dpad, wpad;  // oneDNN's scratchpad in forward, backward data, backward weights
} plan;

static pthread_mutex_t g_plans_lock = PTHREAD_MUTEX_INITIALIZER;
static plan *g_plans;
static _Atomic int g_routing = 1;  // dt_conv_set_routing

void dt_conv_set_routing(int on) { g_routing = on != 0; }

// Attributes with the scratchpad in the caller's memory and, optionally, a
// post-op: sum (accumulate into the destination) or relu.
static dnnl_primitive_attr_t make_attr(int sum, int relu) {
    dnnl_primitive_attr_t attr;
    dt_onednn_check(dnnl_primitive_attr_create(&attr), "attr");
    dt_onednn_check(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "scratchpad mode");
    if (sum || relu) {
        dnnl_post_ops_t ops;
        dt_onednn_check(dnnl_post_ops_create(&ops), "post-ops");
        if (sum) dt_onednn_check(dnnl_post_ops_append_sum(ops, 1.0f), "sum post-op");
        if (relu) dt_onednn_check(dnnl_post_ops_append_eltwise(ops, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f), "relu post-op");
        dt_onednn_check(dnnl_primitive_attr_set_post_ops(attr, ops), "attr post-ops");
        dnnl_post_ops_destroy(ops);
    }
    return attr;
}

static dnnl_primitive_t make_reorder(const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to,
                                     int accumulate) {
    dnnl_primitive_attr_t attr = make_attr(accumulate, 0);
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t p;
    dt_onednn_check(dnnl_reorder_primitive_desc_create(&pd, from, dt_onednn_engine(), to, dt_onednn_engine(), attr), "reorder");
    dt_onednn_check(dnnl_primitive_create(&p, pd), "reorder primitive");
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_attr_destroy(attr);
    return p;
}

static size_t floats(const dnnl_memory_desc_t *md) {
    return (dnnl_memory_desc_get_size(md) / sizeof(float) + 15) & ~(size_t)15;
}

// Places a primitive's tensor at *top of a scratch area (advancing *top),
// with reorders from/to the plain layout as `dir` asks (1 in, 2 out, 3 both).
// A tensor in the plain layout needs no room and no reorder unless
// `always` (forward's input, which backward needs after the caller's buffer
// may have changed).
static void place(view *v, const_dnnl_primitive_desc_t pd, dnnl_query_t q,
                  const dnnl_memory_desc_t *plain, int dir, int always, size_t *top) {
    v->md = *dnnl_primitive_desc_query_md(pd, q, 0);
    v->in = v->out = v->set = NULL;
    v->off = (size_t)-1;
    if (!always && dnnl_memory_desc_equal(&v->md, plain) && dir != 2) return;
    v->off = *top;
    *top += floats(&v->md);
    if (dir & 1) v->in = make_reorder(plain, &v->md, 0);
    if (dir & 2) {
        v->out = make_reorder(&v->md, plain, 1);
        v->set = make_reorder(&v->md, plain, 0);
    }
}

// As place, for a tensor of the output's size or less: in the caller's
// room (`cap` floats, 0: not offered) from *rtop when it fits.
static void place_room(view *v, const_dnnl_primitive_desc_t pd, dnnl_query_t q, const dnnl_memory_desc_t *plain,
                       int dir, int always, size_t *top, size_t *rtop, size_t cap) {
    size_t t = 0;
    place(v, pd, q, plain, dir, always, &t);
    v->room = 0;
    if (v->off == (size_t)-1) return;
    if (*rtop + dnnl_memory_desc_get_size(&v->md) / sizeof(float) <= cap) {
        v->off = *rtop;
        *rtop += t;
        v->room = 1;
    } else {
        v->off = *top;
        *top += t;
    }
}

// NULL when oneDNN has no implementation (a low precision on some shapes).
static dnnl_primitive_desc_t conv_pd(const dnnl_convolution_desc_t *d,
                                     const_dnnl_primitive_desc_t hint, int relu) {
    dnnl_primitive_attr_t attr = make_attr(0, relu);
    dnnl_primitive_desc_t pd;
    dnnl_status_t st = dnnl_primitive_desc_create(&pd, d, attr, dt_onednn_engine(), hint);
    dnnl_primitive_attr_destroy(attr);
    if (st == dnnl_unimplemented) return NULL;
    dt_onednn_check(st, "convolution");
    return pd;
}

static dnnl_primitive_t primitive(const_dnnl_primitive_desc_t pd) {
    dnnl_primitive_t p;
    dt_onednn_check(dnnl_primitive_create(&p, pd), "convolution primitive");
    return p;
}

// "forward X, backward data Y, backward weights Z" (oneDNN's names) into
// buf; which of the three are reference implementations (1, 2, 4).
static int name_impls(char *buf, size_t n, const_dnnl_primitive_desc_t f, const_dnnl_primitive_desc_t d,
                      const_dnnl_primitive_desc_t w) {
    const char *a = "?", *b = "?", *c = "?";
    dnnl_primitive_desc_query(f, dnnl_query_impl_info_str, 0, &a);
    dnnl_primitive_desc_query(d, dnnl_query_impl_info_str, 0, &b);
    dnnl_primitive_desc_query(w, dnnl_query_impl_info_str, 0, &c);
    snprintf(buf, n, "forward %s, backward data %s, backward weights %s", a, b, c);
    return (strncmp(a, "ref", 3) ? 0 : 1) | (strncmp(b, "ref", 3) ? 0 : 2) | (strncmp(c, "ref", 3) ? 0 : 4);
}

static size_t pad_size(dnnl_primitive_t prim) {
    const_dnnl_primitive_desc_t pd;
    if (!prim) return 0;
    dt_onednn_check(dnnl_primitive_get_primitive_desc(prim, &pd), "primitive descriptor");
    return dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0));
}

// The floats of the largest scratchpad of one pass's primitive and its
// reorders (n views).
static size_t pad_floats(dnnl_primitive_t prim, const view *const *vs, int n) {
    size_t m = pad_size(prim);
    for (int i = 0; i < n; i++) {
        dnnl_primitive_t r[3] = {vs[i]->in, vs[i]->out, vs[i]->set};
        for (int k = 0; k < 3; k++)
            if (pad_size(r[k]) > m) m = pad_size(r[k]);
    }
    return (m / sizeof(float) + 15) & ~(size_t)15;
}

// Places each pass's scratchpad after the tensors that pass has in scratch
// (ftop, dtop, wtop floats): the passes run one after another, so a
// pass's scratchpad may take the room of another pass's tensors (one
// implementation's scratchpad is large where another's tensors are).
static void place_pads(plan *p, size_t ftop, size_t dtop, size_t wtop) {
    const view *f[] = {&p->src, &p->fwei, &p->fdst}, *d[] = {&p->ddst, &p->bwei, &p->dsrc},
               *w[] = {&p->wddst, &p->dwei};
    p->fpad = ftop, p->dpad = dtop, p->wpad = wtop;
    size_t ends[3] = {ftop + pad_floats(p->fwd, f, 3), dtop + pad_floats(p->bwd_data, d, 3),
                      wtop + pad_floats(p->bwd_weights, w, 2)};
    p->scratch_size = 0;
    for (int i = 0; i < 3; i++)
        if (ends[i] > p->scratch_size) p->scratch_size = ends[i];
}

// lt: the type of the operands the primitives take (dnnl_f32, or bf16
// where native); NULL when oneDNN has no implementation for it.
static plan *make_plan(const dt_conv_shape *s, const int key[18], dnnl_data_type_t lt) {
    plan *p = calloc(1, sizeof *p);
    if (!p) dt_onednn_check(dnnl_out_of_memory, "plan");
    memcpy(p->key, key, sizeof p->key);
    p->round = lt == dnnl_f32 ? (dt_dtype)key[12] : DT_F32;
    int always = p->round != DT_F32;  // copies to round even when the layout is the caller's
    int OH = (s->H + 2 * s->P - s->K) / s->S + 1, OW = (s->W + 2 * s->P - s->K) / s->S + 1;
    dnnl_dims_t sd = {s->B, s->IC, s->H, s->W}, wd = {s->OC, s->IC, s->K, s->K},
                dd = {s->B, s->OC, OH, OW}, bd = {s->OC};
    dnnl_dims_t strides = {s->S, s->S}, pad = {s->P, s->P};
    // The caller's layouts ("plain", even when blocked), and the ones the
    // primitives are asked for: the caller's if blocked, else their choice.
    dnnl_format_tag_t stag = s->src_blocked ? dnnl_nChw16c : dnnl_nchw,
                      dtag = s->dst_blocked ? dnnl_nChw16c : dnnl_nchw;
    dt_onednn_check(dnnl_memory_desc_init_by_tag(&p->plain_src, 4, sd, dnnl_f32, stag), "md");
    dt_onednn_check(dnnl_memory_desc_init_by_tag(&p->plain_wei, 4, wd, dnnl_f32, dnnl_oihw), "md");
    dt_onednn_check(dnnl_memory_desc_init_by_tag(&p->plain_dst, 4, dd, dnnl_f32, dtag), "md");
    dt_onednn_check(dnnl_memory_desc_init_by_tag(&p->bias_md, 1, bd, dnnl_f32, dnnl_x), "md");
    // src, wei, ddst: the operands (lt); dsrc, dwei, dst: results (f32).
    dnnl_memory_desc_t src, wei, dst, dsrc, dwei, ddst, src16, dst16;
    dnnl_format_tag_t sany = s->src_blocked ? stag : dnnl_format_tag_any,
                      dany = s->dst_blocked ? dtag : dnnl_format_tag_any;
    dt_onednn_check(dnnl_memory_desc_init_by_tag(&src, 4, sd, lt, sany), "md");
    dt_onednn_check(dnnl_memory_desc_init_by_tag(&dsrc, 4, sd, dnnl_f32, sany), "md");
    dt_onednn_check(dnnl_memory_desc_init_by_tag(&wei, 4, wd, lt, dnnl_format_tag_any), "md");
    dt_onednn_check(dnnl_memory_desc_init_by_tag(&dwei, 4, wd, dnnl_f32, dnnl_format_tag_any), "md");
    dt_onednn_check(dnnl_memory_desc_init_by_tag(&dst, 4, dd, dnnl_f32, dany), "md");
    dt_onednn_check(dnnl_memory_desc_init_by_tag(&ddst, 4, dd, lt, dany), "md");
    dt_onednn_check(dnnl_memory_desc_init_by_tag(&src16, 4, sd, lt, dnnl_nChw16c), "md");
    dt_onednn_check(dnnl_memory_desc_init_by_tag(&dst16, 4, dd, dnnl_f32, dnnl_nChw16c), "md");

    dnnl_convolution_desc_t fd, bdd, bwd;
    dt_onednn_check(dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct,
                                             &src, &wei, &p->bias_md, &dst, strides, pad, pad),
          "forward descriptor");
    dnnl_primitive_desc_t fpd = conv_pd(&fd, NULL, s->relu), bdpd = NULL, bwpd = NULL;
    if (fpd) {
        dt_onednn_check(dnnl_convolution_backward_data_desc_init(&bdd, dnnl_convolution_direct, &dsrc, &wei, &ddst,
                                                                 strides, pad, pad),
                        "backward data descriptor");
        bdpd = conv_pd(&bdd, fpd, 0);
        // Backward weights reads the input in the layout forward saved it in.
        const dnnl_memory_desc_t *fsrc = dnnl_primitive_desc_query_md(fpd, dnnl_query_src_md, 0);
        dt_onednn_check(dnnl_convolution_backward_weights_desc_init(&bwd, dnnl_convolution_direct, fsrc, &dwei,
                                                                    &p->bias_md, &ddst, strides, pad, pad),
                        "backward weights descriptor");
        bwpd = conv_pd(&bwd, fpd, 0);
    }
    // Backward weights alone on a reference kernel, reading an input saved
    // plain (NCHW, as the portable path saves it): that pass alone goes
    // portable. Any other reference kernel: the whole plan.
    int refs = fpd && bdpd && bwpd && key[17] ? name_impls(p->impls, sizeof p->impls, fpd, bdpd, bwpd) : 0;
    p->path = !refs ? DT_CONV_ONEDNN
              : refs == 4 && dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(fpd, dnnl_query_src_md, 0),
                                                    &p->plain_src) && !s->src_blocked
                  ? DT_CONV_MIXED
                  : DT_CONV_PORTABLE;
    if (fpd && bdpd && bwpd && !key[17]) name_impls(p->impls, sizeof p->impls, fpd, bdpd, bwpd);
    // Only a low precision can lack an implementation; a native one on a
    // reference kernel gives way to fp32's (rounded operands).
    if (!fpd || !bdpd || !bwpd || (refs && lt != dnnl_f32)) {
        if (lt == dnnl_f32) dt_onednn_check(dnnl_unimplemented, "convolution");
        if (fpd) dnnl_primitive_desc_destroy(fpd);
        if (bdpd) dnnl_primitive_desc_destroy(bdpd);
        if (bwpd) dnnl_primitive_desc_destroy(bwpd);
        free(p);
        return NULL;
    }

    p->src16 = dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(fpd, dnnl_query_src_md, 0), &src16);
    p->dst16 = dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(fpd, dnnl_query_dst_md, 0), &dst16);
    // scratch (and the room), forward: the output's copy first in the room
    // (the larger), then the input's when it is rounded
    size_t top = 0, ftop = 0, rtop = 0;
    size_t cap = s->out_room ? dnnl_memory_desc_get_size(&p->plain_dst) / sizeof(float) : 0;
    place(&p->fwei, fpd, dnnl_query_weights_md, &p->plain_wei, 1, always, &ftop);
    place_room(&p->fdst, fpd, dnnl_query_dst_md, &p->plain_dst, 0, 0, &ftop, &rtop, cap);
    if (p->fdst.off != (size_t)-1) p->fdst.out = make_reorder(&p->fdst.md, &p->plain_dst, 0);
    p->zero_bias = ftop;
    ftop += floats(&p->bias_md);
    // save: the input backward weights reads (in 16 bits when rounded)
    int k16 = p->round != DT_F32 && !s->keep32;
    if (k16) place_room(&p->src, fpd, dnnl_query_src_md, &p->plain_src, 1, 1, &ftop, &rtop, cap);
    else place(&p->src, fpd, dnnl_query_src_md, &p->plain_src, 1, 1, &top);
    p->keep_n = k16 ? dnnl_memory_desc_get_size(&p->src.md) / sizeof(float) : 0;
    p->save_size = k16 ? ((p->keep_n + 1) / 2 + 15) & ~(size_t)15 : top;

    // scratch (and the output's room), backward
    rtop = 0;
    top = 0;
    memset(&p->ddst, 0, sizeof p->ddst);
    memset(&p->bwei, 0, sizeof p->bwei);
    memset(&p->dsrc, 0, sizeof p->dsrc);
    p->ddst.off = p->bwei.off = p->dsrc.off = (size_t)-1;
    if (!s->no_dinp) {
        place_room(&p->ddst, bdpd, dnnl_query_diff_dst_md, &p->plain_dst, 1, always, &top, &rtop, cap);
        place(&p->bwei, bdpd, dnnl_query_weights_md, &p->plain_wei, 1, always, &top);
        // With out_room backward overwrites dinp: in the plain layout, in place.
        if (s->out_room && dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(bdpd, dnnl_query_diff_src_md, 0),
                                                  &p->plain_src))
            p->dsrc.md = p->plain_src;
        else
            place_room(&p->dsrc, bdpd, dnnl_query_diff_src_md, &p->plain_src, 2, 0, &top, &rtop, cap);
    }
    // Backward weights runs when backward data is done (or before it
    // starts, wsrc_dinp), so its tensors take backward data's room again,
    // all but the output gradient's copy:
    // when it has the layout of backward data's, backward weights reads
    // that copy (with dinp; without it that copy is not made).
    size_t dtop = top;
    top = 0;
    rtop = 0;
    place_room(&p->wddst, bwpd, dnnl_query_diff_dst_md, &p->plain_dst, 1, always, &top, &rtop, cap);
    if (p->ddst.off != (size_t)-1 && p->wddst.off != (size_t)-1 && dnnl_memory_desc_equal(&p->wddst.md, &p->ddst.md)) {
        p->wddst.off = p->ddst.off;  // ddst is the first in its area
        p->wddst.room = p->ddst.room;
        top = p->ddst.room ? 0 : floats(&p->ddst.md);
    }
    place(&p->dwei, bwpd, dnnl_query_diff_weights_md, &p->plain_wei, 2, 0, &top);
    p->dbias = top;
    top += floats(&p->bias_md);
    // The widened input in dinp where backward overwrites it in place (it
    // is free until backward data runs; backward weights, run first, must
    // then make no copy where backward data's is), else in scratch.
    p->wsrc_dinp = p->keep_n && p->path == DT_CONV_ONEDNN && !s->no_dinp && p->dsrc.off == (size_t)-1 &&
                   dnnl_memory_desc_get_size(&p->src.md) <= dnnl_memory_desc_get_size(&p->plain_src) &&
                   (p->ddst.off == (size_t)-1 || dnnl_memory_desc_equal(&p->wddst.md, &p->ddst.md));
    if (p->keep_n && !p->wsrc_dinp) {
        p->wsrc = top;
        top += floats(&p->src.md);
    }

    p->fwd = primitive(fpd);
    p->bwd_data = primitive(bdpd);
    p->bwd_weights = primitive(bwpd);
    dnnl_primitive_desc_destroy(fpd);
    dnnl_primitive_desc_destroy(bdpd);
    dnnl_primitive_desc_destroy(bwpd);
    // oneDNN's scratchpads after the rest; the sizes cover the portable path too
    place_pads(p, ftop, dtop, top);
    size_t psave, pscratch;
    dt_conv_portable_size(s, &psave, &pscratch);
    if (psave > p->save_size) p->save_size = psave;
    if (pscratch > p->scratch_size) p->scratch_size = pscratch;
    return p;
}

// The plan for shape s at the current thread count (oneDNN sizes its work
// split and its reductions by the thread count when a primitive is made).
static plan *get_plan(const dt_conv_shape *s) {
    int native;
    dt_dtype t = dt_onednn_precision(&native);
    int key[18] = {s->B, s->IC, s->H, s->W, s->OC, s->K, s->S, s->P, omp_get_max_threads(),
                   s->src_blocked, s->dst_blocked, s->relu, (int)t, native, s->no_dinp, s->out_room, s->keep32,
                   g_routing};
    pthread_mutex_lock(&g_plans_lock);
    plan *p = g_plans;
    while (p && memcmp(p->key, key, sizeof key)) p = p->next;
    if (!p) {
        p = native ? make_plan(s, key, dnnl_bf16) : NULL;
        if (!p) p = make_plan(s, key, dnnl_f32);
        p->next = g_plans;
        g_plans = p;
    }
    pthread_mutex_unlock(&g_plans_lock);
    return p;
}

// ----------------------------------------------------------------------------
// execution

// A call's stream and oneDNN's scratchpad (in the caller's scratch).
typedef struct {
    dnnl_stream_t st;
    float *pad;
} exec;

static void run(dnnl_primitive_t prim, const exec *ex, int n, const dnnl_exec_arg_t *args) {
    const_dnnl_primitive_desc_t pd;
    dt_onednn_check(dnnl_primitive_get_primitive_desc(prim, &pd), "primitive descriptor");
    const dnnl_memory_desc_t *pmd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    dnnl_exec_arg_t all[8];
    memcpy(all, args, sizeof *args * n);
    dnnl_memory_t pad = NULL;
    if (dnnl_memory_desc_get_size(pmd)) {
        pad = dt_onednn_memory(pmd, ex->pad);
        all[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, pad};
    }
    dt_onednn_check(dnnl_primitive_execute(prim, ex->st, n, all), "execute");
    if (pad) {  // (its memory object goes once the primitive has run)
        dt_onednn_check(dnnl_stream_wait(ex->st), "stream wait");
        dnnl_memory_destroy(pad);
    }
}

// Reorders between a plain tensor and its place in scratch (to_view: plain
// -> view; otherwise view -> plain, adding).
static void reorder(dnnl_primitive_t r, const exec *ex, const dnnl_memory_desc_t *from_md,
                    const void *from, const dnnl_memory_desc_t *to_md, void *to) {
    dnnl_memory_t a = dt_onednn_memory(from_md, from), b = dt_onednn_memory(to_md, to);
    dnnl_exec_arg_t args[] = {{DNNL_ARG_FROM, a}, {DNNL_ARG_TO, b}};
    run(r, ex, 2, args);
    dnnl_memory_destroy(a);
    dnnl_memory_destroy(b);
}

// Where the primitive reads tensor v: the plain tensor itself, or its copy
// in the primitive's layout (made first when v has a reorder in, and then
// rounded to the plan's precision when the primitive is fp32), in `area`
// or, for a view placed there, in the output's room.
static const float *bring_in(const plan *p, const view *v, const exec *ex, const dnnl_memory_desc_t *plain,
                             const float *x, float *area, float *room) {
    if (v->off == (size_t)-1) return x;
    if (v->room) area = room;
    if (v->in) {
        reorder(v->in, ex, plain, x, &v->md, area + v->off);
        if (p->round != DT_F32) {
            dt_onednn_check(dnnl_stream_wait(ex->st), "stream wait");
            float *c = area + v->off;
            size_t n = dnnl_memory_desc_get_size(&v->md) / sizeof(float);
#pragma omp parallel for schedule(static) if (n > 65536)
            for (size_t i = 0; i < n; i += 4096) dt_round_f32(c + i, c + i, n - i < 4096 ? n - i : 4096, p->round);
        }
    }
    return area + v->off;
}

void dt_conv_size(const dt_conv_shape *s, size_t *save, size_t *scratch) {
    plan *p = get_plan(s);
    *save = p->save_size;
    *scratch = p->scratch_size;
}

void dt_conv_prefers_blocked(const dt_conv_shape *s, int *src, int *dst) {
    dt_conv_shape own = *s;
    own.src_blocked = own.dst_blocked = own.relu = own.no_dinp = own.out_room = own.keep32 = 0;
    plan *p = get_plan(&own);
    *src = p->path != DT_CONV_PORTABLE && p->src16;
    *dst = p->path != DT_CONV_PORTABLE && p->dst16;
}

int dt_conv_path(const dt_conv_shape *s, const char **impls) {
    plan *p = get_plan(s);
    if (impls) *impls = p->impls;
    return p->path;
}

// The saved input between 16 bits (save) and fp32 (x), n elements: to16
// keeps x (rounded values: exact), else widens it.
static void keep16(uint16_t *save, float *x, size_t n, dt_dtype t, int to16) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i += 4096) {
        size_t k = n - i < 4096 ? n - i : 4096;
        if (to16) dt_from_f32(save + i, x + i, k, t);
        else dt_to_f32(x + i, save + i, k, t);
    }
}

void dt_conv_forward(float *out, float *room, float *save, float *scratch, const float *inp, const float *w,
                     const float *b, const dt_conv_shape *s) {
    plan *p = get_plan(s);
    if (s->out_room && !room) dt_onednn_check(dnnl_invalid_arguments, "convolution forward");
    if (p->path == DT_CONV_PORTABLE) {
        dt_conv_portable_forward(out, save, scratch, inp, w, b, s);
        return;
    }
    exec ex = {NULL, scratch + p->fpad};
    dt_onednn_check(dnnl_stream_create(&ex.st, dt_onednn_engine(), dnnl_stream_default_flags), "stream");
    const float *src = bring_in(p, &p->src, &ex, &p->plain_src, inp, p->keep_n ? scratch : save, room);
    if (p->keep_n) keep16((uint16_t *)save, (float *)src, p->keep_n, p->round, 1);
    const float *wei = bring_in(p, &p->fwei, &ex, &p->plain_wei, w, scratch, NULL);
    if (!b) {
        memset(scratch + p->zero_bias, 0, sizeof(float) * s->OC);
        b = scratch + p->zero_bias;
    }
    float *dst = p->fdst.off == (size_t)-1 ? out : (p->fdst.room ? room : scratch) + p->fdst.off;
    dnnl_memory_t ms = dt_onednn_memory(&p->src.md, src), mw = dt_onednn_memory(&p->fwei.md, wei), mb = dt_onednn_memory(&p->bias_md, b),
                  md = dt_onednn_memory(&p->fdst.md, dst);
    dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_BIAS, mb},
                              {DNNL_ARG_DST, md}};
    run(p->fwd, &ex, 4, args);
    if (p->fdst.out) reorder(p->fdst.out, &ex, &p->fdst.md, dst, &p->plain_dst, out);
    dt_onednn_check(dnnl_stream_wait(ex.st), "stream wait");
    dnnl_memory_destroy(ms);
    dnnl_memory_destroy(mw);
    dnnl_memory_destroy(mb);
    dnnl_memory_destroy(md);
    dnnl_stream_destroy(ex.st);
}

// Backward data into dinp from dd, the output gradient's copy.
static void backward_data(const plan *p, exec *ex, float *dinp, const float *dd, const float *w, float *scratch,
                          float *out, int set_dinp) {
    ex->pad = scratch + p->dpad;
    const float *wei = bring_in(p, &p->bwei, ex, &p->plain_wei, w, scratch, NULL);
    // Overwriting a tensor already in the primitive's layout: in place.
    int direct = set_dinp && dnnl_memory_desc_equal(&p->dsrc.md, &p->plain_src);
    float *ds = direct ? dinp : (p->dsrc.room ? out : scratch) + p->dsrc.off;
    dnnl_memory_t mdd = dt_onednn_memory(&p->ddst.md, dd), mw = dt_onednn_memory(&p->bwei.md, wei),
                  mds = dt_onednn_memory(&p->dsrc.md, ds);
    dnnl_exec_arg_t args[] = {{DNNL_ARG_DIFF_DST, mdd}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DIFF_SRC, mds}};
    run(p->bwd_data, ex, 3, args);
    if (!direct) reorder(set_dinp ? p->dsrc.set : p->dsrc.out, ex, &p->dsrc.md, ds, &p->plain_src, dinp);
    dt_onednn_check(dnnl_stream_wait(ex->st), "stream wait");
    dnnl_memory_destroy(mdd);
    dnnl_memory_destroy(mw);
    dnnl_memory_destroy(mds);
}

// Backward weights; dd: backward data's copy of the output gradient (NULL:
// none made), wsrc: where the 16-bit saved input is widened.
static void backward_weights(const plan *p, exec *ex, float *dw, float *db, const float *dd, const float *dout,
                             const float *save, float *scratch, float *out, float *wsrc, int OC) {
    ex->pad = scratch + p->wpad;  // (where backward data's tensors are)
    // The same layout as backward data's diff_dst reuses that copy.
    if (!dd || !dnnl_memory_desc_equal(&p->wddst.md, &p->ddst.md))
        dd = bring_in(p, &p->wddst, ex, &p->plain_dst, dout, scratch, out);
    float *dbias = scratch + p->dbias;
    const float *src = save + p->src.off;
    if (p->keep_n) {
        dt_onednn_check(dnnl_stream_wait(ex->st), "stream wait");
        keep16((uint16_t *)save, wsrc, p->keep_n, p->round, 0);
        src = wsrc;
    }
    dnnl_memory_t ms = dt_onednn_memory(&p->src.md, src), mdd = dt_onednn_memory(&p->wddst.md, dd),
                  mdw = dt_onednn_memory(&p->dwei.md, scratch + p->dwei.off), mdb = dt_onednn_memory(&p->bias_md, dbias);
    dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, ms}, {DNNL_ARG_DIFF_DST, mdd},
                              {DNNL_ARG_DIFF_WEIGHTS, mdw}, {DNNL_ARG_DIFF_BIAS, mdb}};
    run(p->bwd_weights, ex, 4, args);
    if (dw) reorder(p->dwei.out, ex, &p->dwei.md, scratch + p->dwei.off, &p->plain_wei, dw);
    dt_onednn_check(dnnl_stream_wait(ex->st), "stream wait");
    if (db)
        for (int o = 0; o < OC; o++) db[o] += dbias[o];
    dnnl_memory_destroy(ms);
    dnnl_memory_destroy(mdd);
    dnnl_memory_destroy(mdw);
    dnnl_memory_destroy(mdb);
}

void dt_conv_backward(float *dinp, float *dw, float *db, float *scratch, float *out, const float *dout,
                      const float *save, const float *w, const dt_conv_shape *s, int set_dinp) {
    plan *p = get_plan(s);
    if ((dinp && s->no_dinp) || (s->out_room && (!out || (dinp && !set_dinp))) ||
        (p->wsrc_dinp && !dinp && (dw || db)))
        dt_onednn_check(dnnl_invalid_arguments, "convolution backward");
    if (p->path == DT_CONV_PORTABLE) {
        dt_conv_portable_backward(dinp, dw, db, scratch, out, dout, save, w, s, set_dinp);
        return;
    }
    exec ex = {NULL, scratch + p->dpad};
    dt_onednn_check(dnnl_stream_create(&ex.st, dt_onednn_engine(), dnnl_stream_default_flags), "stream");
    // The output gradient's copy first: both passes may read it.
    const float *dd = dinp ? bring_in(p, &p->ddst, &ex, &p->plain_dst, dout, scratch, out) : NULL;
    // Backward weights before backward data when it widens the input in
    // dinp (the results are the same: neither pass reads the other's).
    int wfirst = p->wsrc_dinp && (dw || db);
    if (wfirst) backward_weights(p, &ex, dw, db, dd, dout, save, scratch, out, dinp, s->OC);
    if (dinp) backward_data(p, &ex, dinp, dd, w, scratch, out, set_dinp);
    if ((dw || db) && p->path == DT_CONV_MIXED) {  // (from the input forward saved plain)
        dt_conv_portable_backward(NULL, dw, db, scratch, out, dout, save, w, s, 0);
    } else if ((dw || db) && !wfirst) {
        backward_weights(p, &ex, dw, db, dd, dout, save, scratch, out, scratch + p->wsrc, s->OC);
    }
    dt_onednn_check(dnnl_stream_wait(ex.st), "stream wait");
    dnnl_stream_destroy(ex.st);
}
#endif
