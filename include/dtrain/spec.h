/*
 * dtrain/spec.h - what describes a model and its training, as plain data:
 * layer specs, GPT shapes and presets, optimizer and schedule parameters,
 * with their names, defaults and checks.
 *
 * The config reader (config.h) fills these from an INI file, and the model,
 * GPT and optimizer code (nn.h, gpt.h, optim.h) take them; neither needs the
 * other. Nothing here allocates or computes beyond a check.
 */
#ifndef DTRAIN_SPEC_H
#define DTRAIN_SPEC_H

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- layers of sequential models (nn.h) ---------------------------------- */

typedef enum {
    DT_LAYER_LINEAR,
    DT_LAYER_CONV2D,
    DT_LAYER_MAXPOOL,
    DT_LAYER_RELU,
    DT_LAYER_GELU,
    DT_LAYER_LAYERNORM,
    DT_LAYER_DROPOUT,
    DT_LAYER_FLATTEN,
    DT_LAYER_BATCHNORM, /* per channel over batch x H x W (BatchNorm2d; on a flat input BatchNorm1d) */
    DT_LAYER_BLOCK,     /* ResNet basic block: conv3x3(stride)-bn-relu-conv3x3-bn, plus the input (or a 1x1
                           conv(stride)-bn projection of it when the shape changes), then relu */
    DT_LAYER_AVGPOOL,   /* global average pooling: [C,H,W] -> [C,1,1] */
} dt_layer_kind;

/* One layer of a sequential model. Fields a kind does not use are ignored. */
typedef struct {
    dt_layer_kind kind;
    int out;      /* linear: output features; conv2d, block: output channels */
    int kernel;   /* conv2d, maxpool: window size */
    int stride;   /* conv2d, block (default 1), maxpool (default = kernel); 0 = default */
    int pad;      /* conv2d: zero padding on each side */
    float p;      /* dropout: probability of zeroing */
    float eps;    /* layernorm, batchnorm: epsilon (0 = 1e-5) */
    int nobias;   /* conv2d: no bias (bias=false; before a batchnorm) */
    float momentum; /* batchnorm: of the running statistics (0 = 0.1, PyTorch's) */
} dt_layer_spec;

/* Name of a layer kind as used in configs ("linear", "conv2d", ...). */
DT_API const char *dt_layer_kind_name(dt_layer_kind k);

/* ---- recommender shapes (recsys.h) ---------------------------------------- */

#define DT_DLRM_MAX_TABLES 32
#define DT_DLRM_MAX_MLP 8

/* A DLRM-style click model: ntables embedding tables of `dim` columns,
 * looked up by one id each per record; a bottom MLP over the ndense dense
 * features (widths bottom[], each layer followed by a relu, then a last
 * layer of `dim` outputs and its relu); the interaction (the bottom
 * output, then the dot product of every pair of the ntables + 1 vectors);
 * a top MLP (widths top[], relus between, a last layer of one output) and
 * the logistic loss. */
typedef struct {
    int ntables;
    int64_t rows[DT_DLRM_MAX_TABLES];
    int dim;
    int ndense;
    int nbottom, bottom[DT_DLRM_MAX_MLP];
    int ntop, top[DT_DLRM_MAX_MLP];
} dt_dlrm_spec;

/* Checks the spec (sizes in range); errors (DT_ERR_CONFIG) name the field
 * after `what`. */
DT_API dt_status dt_dlrm_spec_check(const dt_dlrm_spec *s, const char *what);

/* ---- GPT shapes (gpt.h) --------------------------------------------------- */

typedef struct {
    int n_layer;            /* L */
    int n_head;             /* NH; n_embd must be a multiple of it */
    int n_embd;             /* C */
    int block_size;         /* maxT: the longest context (rows of wpe) */
    int vocab_size;         /* V */
    int padded_vocab_size;  /* Vp >= V: rows of wte */
} dt_gpt_config;

/* Fills *c from a preset name: "gpt-tiny" (L2 C64 H4 T256 V256),
 * "gpt-small" (L6 C384 H6 T256 V256), "gpt2-124m" (L12 C768 H12 T1024
 * V50257 Vp50304). DT_ERR_ARG for another name. */
DT_API dt_status dt_gpt_preset(const char *name, dt_gpt_config *c);
/* Vocabulary padded as llm.c does: up to a multiple of 128. */
DT_API int dt_gpt_pad_vocab(int V);
/* Checks the sizes (all positive, C % NH == 0, Vp >= V, ...); `what` names
 * the source in the message. */
DT_API dt_status dt_gpt_config_check(const dt_gpt_config *c, const char *what);
/* Whether a GPT of config c splits over ntp tensor-parallel ranks: ntp
 * must divide the heads, the hidden size and the (padded) vocabulary.
 * DT_ERR_ARG names `what` (the setting, e.g. "[parallel] tensor") and the
 * numbers otherwise. */
DT_API dt_status dt_gpt_tensor_parallel_check(const dt_gpt_config *c, int ntp, const char *what);

/* ---- optimizers and schedules (optim.h) ------------------------------------ */

typedef enum { DT_OPTIM_SGD, DT_OPTIM_ADAMW } dt_optim_kind;

typedef struct {
    dt_optim_kind kind;
    float lr;            /* base learning rate (schedules scale it) */
    float weight_decay;  /* SGD: L2 added to the gradient; AdamW: decoupled */
    float momentum;      /* SGD */
    int nesterov;        /* SGD */
    float beta1, beta2;  /* AdamW */
    float eps;           /* AdamW */
    float clip_norm;     /* clip gradients to this global L2 norm; 0 = off */
} dt_optim_params;

/* Defaults: SGD lr 0.01, momentum 0; AdamW lr 1e-3, betas 0.9/0.999,
 * eps 1e-8, weight decay 0.01 (PyTorch's defaults). */
DT_API dt_optim_params dt_optim_default_params(dt_optim_kind kind);
DT_API const char *dt_optim_kind_name(dt_optim_kind kind);

typedef enum { DT_SCHED_CONSTANT, DT_SCHED_COSINE, DT_SCHED_LINEAR } dt_sched_kind;
DT_API const char *dt_sched_kind_name(dt_sched_kind kind);

#ifdef __cplusplus
}
#endif
#endif
