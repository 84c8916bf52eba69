/*
 * dtrain/llama.h - a Llama-style decoder: its layers, the model, and
 * weights in Hugging Face's Llama layout.
 *
 * The model is Llama's decoder: a token embedding, L blocks of
 *
 *   x = x + attn(rmsnorm1(x))   causal grouped-query attention, rotary
 *                               position embeddings on q and k
 *   x = x + mlp(rmsnorm2(x))    SwiGLU: down(silu(gate(x)) * up(x))
 *
 * a final RMSNorm and an output head of its own (untied); no biases. The
 * n_head query heads share n_kv_head key/value heads (n_kv_head divides
 * n_head; n_head / n_kv_head queries a group). All parameters live in ONE
 * contiguous block, the per-layer tensors stacked over the L layers, as the
 * GPT's (dtrain/gpt.h), in this order:
 *
 *   tok_embeddings [V,C]  attn_norm [L,C]  wq [L,C,C]  wk [L,KC,C]
 *   wv [L,KC,C]  wo [L,C,C]  mlp_norm [L,C]  w_gate [L,F,C]  w_up [L,F,C]
 *   w_down [L,C,F]  norm [C]  lm_head [V,C]
 *
 * (hs = C / n_head, KC = n_kv_head hs, F = ffn_hidden.) Rotary embeddings
 * rotate the pairs (2i, 2i+1) of each head's channels by position t times
 * rope_theta^(-2i/hs) (Meta's layout); Hugging Face's files store wq and wk
 * with the rows permuted for its rotate_half form, which dt_llama_load_hf
 * and dt_llama_save_hf undo and redo.
 *
 *   dt_llama_config cfg;
 *   dt_llama_preset("llama-tiny", &cfg);
 *   dt_llama *m;
 *   dt_llama_create(&m, &cfg, B, T);
 *   dt_llama_init(m, seed);
 *   dt_llama_zero_grad(m);
 *   dt_llama_forward(m, inputs, targets, B, T, &loss);
 *   dt_llama_backward(m);
 */
#ifndef DTRAIN_LLAMA_H
#define DTRAIN_LLAMA_H

#include "dtrain/core.h"
#include "dtrain/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- layer kernels (outputs first; backward accumulates with +=) -------- */

/* RMSNorm of rows x[N,C]: out = x rstd w, rstd[N] = 1 / sqrt(mean(x^2) + eps). */
DT_API void dt_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps);
/* dx[N,C] += ..., dw[C] += sum over rows of dout x rstd. */
DT_API void dt_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                                const float *rstd, int N, int C);
/* Rotary embedding in place on x[B,T,nh*hs] (hs even): the pair (2i, 2i+1)
 * of each head at position t rotated by t theta^(-2i/hs); dir = -1 rotates
 * back, which is also the backward of dir = 1 (applied to the gradient). */
DT_API void dt_rope(float *x, int B, int T, int nh, int hs, float theta, int dir);
/* SwiGLU's product: h[N] = silu(g) u, silu(g) = g / (1 + exp(-g)). */
DT_API void dt_swiglu_forward(float *h, const float *g, const float *u, size_t N);
/* dg[N] += dh u silu'(g), du[N] += dh silu(g). */
DT_API void dt_swiglu_backward(float *dg, float *du, const float *dh, const float *g, const float *u, size_t N);
/* Causal grouped-query attention: q[B,T,NH*hs], k and v [B,T,KV*hs]
 * (query head h reads key/value head h / (NH/KV)); out[B,T,NH*hs] =
 * softmax(q k^T / sqrt(hs), causal) v; att[B,NH,T,T] keeps the
 * probabilities (zeros right of the diagonal) for backward. */
DT_API void dt_gqa_forward(float *out, float *att, const float *q, const float *k, const float *v, int B, int T,
                           int NH, int KV, int hs);
/* dq, dk, dv += the gradients; datt[B,NH,T,T] is scratch. */
DT_API void dt_gqa_backward(float *dq, float *dk, float *dv, float *datt, const float *dout, const float *q,
                            const float *k, const float *v, const float *att, int B, int T, int NH, int KV, int hs);

/* ---- the model ----------------------------------------------------------- */

typedef struct {
    int n_layer, n_head, n_kv_head, n_embd, ffn_hidden, block_size, vocab_size;
    float rope_theta, norm_eps;
} dt_llama_config;

/* llama-tiny (L2 C64 H4 KV2 F176, vocab 256, T 128), llama-small (L6 C256
 * H8 KV4 F704, vocab 256, T 256), llama2-7b (L32 C4096 H32 KV32 F11008,
 * vocab 32000, T 4096); rope_theta 10000, norm_eps 1e-5. DT_ERR_ARG for
 * another name. */
DT_API dt_status dt_llama_preset(const char *name, dt_llama_config *c);
/* DT_ERR_ARG naming the numbers: sizes < 1, n_embd not a multiple of
 * n_head, an odd head size, n_kv_head not dividing n_head, rope_theta
 * outside [1, 1e9], norm_eps outside (0, 1e-1]. `what` prefixes the message. */
DT_API dt_status dt_llama_config_check(const dt_llama_config *c, const char *what);
DT_API size_t dt_llama_config_num_params(const dt_llama_config *c);
/* Shapes and block offsets of the 12 tensors (names as above). */
#define DT_LLAMA_NTENSORS 12
DT_API void dt_llama_param_shapes(const dt_llama_config *c, dt_tensor_info t[DT_LLAMA_NTENSORS]);

typedef struct dt_llama dt_llama;

/* A model with activations for batches of up to B x T tokens (B = T = 0:
 * none, the forward refuses). Parameters are zero until dt_llama_init or a
 * load. */
DT_API dt_status dt_llama_create(dt_llama **out, const dt_llama_config *c, int B, int T);
DT_API void dt_llama_free(dt_llama *m);
/* Bytes of the activations and backward scratch dt_llama_create(c, B, T)
 * allocates beside the parameter and gradient blocks. */
DT_API size_t dt_llama_activation_bytes(const dt_llama_config *c, int B, int T);
DT_API const dt_llama_config *dt_llama_get_config(const dt_llama *m);
/* Weights normal(0, 0.02), wo and w_down normal(0, 0.02/sqrt(2L)), norm
 * weights 1, drawn in block order from one stream; _range sets elements
 * [lo, hi) of the block alone (a ZeRO-3 rank's slice), the same values. */
DT_API dt_status dt_llama_init(dt_llama *m, uint64_t seed);
DT_API dt_status dt_llama_init_range(dt_llama *m, uint64_t seed, size_t lo, size_t hi);
DT_API size_t dt_llama_num_params(const dt_llama *m);
DT_API float *dt_llama_params(dt_llama *m);
DT_API float *dt_llama_grads(dt_llama *m);
DT_API void dt_llama_zero_grad(dt_llama *m);
DT_API const dt_tensor_info *dt_llama_tensor(const dt_llama *m, int i);
/* Forward over inputs[B,T]; with targets the mean cross-entropy into
 * *loss. DT_ERR_ARG for a shape beyond the create's or a token outside the
 * vocabulary; DT_ERR_NUMERIC for a loss that is not finite. */
DT_API dt_status dt_llama_forward(dt_llama *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                                  float *loss);
/* Logits [B,T,V] of the last forward, valid until the next backward. */
DT_API const float *dt_llama_logits(const dt_llama *m);
/* Backward of the last forward with targets: ACCUMULATES into the
 * gradient block, times the loss scale. */
DT_API dt_status dt_llama_backward(dt_llama *m);
DT_API void dt_llama_set_loss_scale(dt_llama *m, float s);
/* The gradient order: tok_embeddings, then layer by layer the slices [l]
 * of attn_norm ... w_down (9 a layer), then norm, lm_head (*n = 9 L + 3
 * ranges, which partition the block); backward finishes it from its end. */
DT_API const dt_grad_range *dt_llama_grad_order(const dt_llama *m, int *n);
/* Called in backward with positions in the order, decreasing, the last 0:
 * the gradients from pos on are final (as dt_gpt_set_grad_hook). */
DT_API void dt_llama_set_grad_hook(dt_llama *m, dt_grad_ready_fn fn, void *user);
/* Called before each stage's forward and backward: -1 the embedding,
 * 0..L-1 the blocks, L the head (norm, lm_head); phase 0 forward, 1
 * backward. A status other than DT_OK stops the pass. fn NULL: none. */
typedef dt_status (*dt_llama_layer_fn)(int layer, int phase, void *user);
DT_API void dt_llama_set_layer_hook(dt_llama *m, dt_llama_layer_fn fn, void *user);

/* ---- activation sets and stages (micro-batches, pipeline stages) --------
 *
 * As the GPT's (dtrain/gpt.h): a dt_llama_acts holds what one forward of
 * one micro-batch through layers [l0, l1) saves for its backward (the
 * embedding's token ids when l0 = 0, the head's when l1 = L), and the
 * stage calls run and backpropagate the parts on the residual stream
 * [B,T,C]; dt_llama_forward/backward are the composition over the
 * model's own set. Sets share the model's parameters, gradients and
 * backward scratch (calls on one model must not run concurrently). */
typedef struct dt_llama_acts dt_llama_acts;
/* A set for micro-batches of up to B x T tokens through layers [l0, l1)
 * of a model (or of a shard of ntp: its heads' and hidden units' parts). */
DT_API dt_status dt_llama_acts_create(dt_llama_acts **out, const dt_llama_config *c, int B, int T, int l0, int l1,
                                      int ntp);
DT_API void dt_llama_acts_free(dt_llama_acts *a);
/* The model's own set (NULL when created with B = T = 0). */
DT_API dt_llama_acts *dt_llama_default_acts(dt_llama *m);
/* The next forward's shape (at most the create's); forgets what was saved. */
DT_API dt_status dt_llama_acts_set_shape(dt_llama_acts *a, int B, int T);
/* The stream [B,T,C] before layer l (l1: after the last), l0 <= l <= l1;
 * a fixed place whatever the shape. NULL otherwise. */
DT_API float *dt_llama_acts_resid(dt_llama_acts *a, int l);
DT_API const float *dt_llama_acts_logits(const dt_llama_acts *a);
DT_API dt_status dt_llama_embed_forward(dt_llama *m, dt_llama_acts *a, const int32_t *inputs, float *resid_out);
DT_API dt_status dt_llama_forward_range(dt_llama *m, dt_llama_acts *a, int l0, int l1, const float *resid_in,
                                        float *resid_out);
/* Final norm and head; with targets the mean cross-entropy into *loss. */
DT_API dt_status dt_llama_head_forward(dt_llama *m, dt_llama_acts *a, const float *resid_in, const int32_t *targets,
                                       float *loss);
/* WRITES dresid, the loss's gradient with respect to the head's resid_in. */
DT_API dt_status dt_llama_head_backward(dt_llama *m, dt_llama_acts *a, const float *resid_in, float *dresid);
/* dresid: the gradient after block l1-1, turned in place into the one
 * before block l0. */
DT_API dt_status dt_llama_backward_range(dt_llama *m, dt_llama_acts *a, int l0, int l1, const float *resid_in,
                                         float *dresid);
DT_API dt_status dt_llama_embed_backward(dt_llama *m, dt_llama_acts *a, const float *dresid);

/* ---- tensor parallel and kept layers -------------------------------------
 *
 * Shard tp of ntp holds, Megatron-style, its n_head / ntp query heads and
 * n_kv_head / ntp key/value heads (the rows of wq, wk and wv: a group's
 * queries stay with their key/value head), wo's matching input columns
 * (row-parallel), its ffn_hidden / ntp rows of w_gate and w_up and w_down's
 * matching columns; the embedding, the head and the norms are whole on
 * every shard. The partial outputs of wo and w_down are summed over the
 * shards in forward, and the partial input gradients of the column-parallel
 * linears in backward: 2 + 2 sums a layer, through the reduce function. */
typedef dt_status (*dt_llama_reduce_fn)(float *buf, size_t n, void *user);  /* sum over the shards, in place */
/* DT_ERR_ARG naming the numbers when ntp does not divide n_head, n_kv_head
 * or ffn_hidden. */
DT_API dt_status dt_llama_tensor_parallel_check(const dt_llama_config *c, int ntp, const char *what);
/* dt_llama_create for shard tp of ntp (its own set for B x T, or none). */
DT_API dt_status dt_llama_create_shard(dt_llama **out, const dt_llama_config *c, int B, int T, int tp, int ntp);
DT_API void dt_llama_set_reduce(dt_llama *m, dt_llama_reduce_fn fn, void *user);
/* Whether tensor i is divided among the shards. */
DT_API int dt_llama_tensor_split(int i);
/* Keeps only the blocks held[l] says (NULL: all), the embedding with block
 * 0 and the final norm and head with the last (a pipeline stage's); the
 * rest of the blocks is never touched. Before dt_llama_init. */
DT_API dt_status dt_llama_set_held(dt_llama *m, const unsigned char *held);
/* The ranges of its block the model keeps, in block order. Owned by m. */
DT_API const dt_grad_range *dt_llama_held_ranges(const dt_llama *m, int *n);
/* The elements of [lo, hi) of the whole model's block that m (a shard, or
 * a model keeping some blocks) holds, from its block `local` into buf[0,
 * hi - lo) (a tensor every shard holds whole: shard 0's alone); take: the
 * other way. */
DT_API void dt_llama_part_fill(const dt_llama *m, const float *local, size_t lo, size_t hi, float *buf);
DT_API void dt_llama_part_take(const dt_llama *m, float *local, size_t lo, size_t hi, const float *buf);

/* ---- weights ----------------------------------------------------------- */

/* Hugging Face's LlamaForCausalLM tensor names and layout, one fp32 tensor
 * a layer's weight (model.embed_tokens.weight,
 * model.layers.N.self_attn.{q,k,v,o}_proj.weight,
 * model.layers.N.mlp.{gate,up,down}_proj.weight,
 * model.layers.N.{input,post_attention}_layernorm.weight, model.norm.weight,
 * lm_head.weight), q_proj and k_proj with their rows permuted for
 * rotate_half. Save writes the config's sizes as metadata. Load reads F32,
 * BF16 or F16 tensors of a file of exactly those tensors and shapes (a
 * missing, extra or mis-shaped tensor is refused naming it). */
DT_API dt_status dt_llama_save_hf(const dt_llama *m, const char *path);
DT_API dt_status dt_llama_load_hf(dt_llama *m, const char *path);
/* Reads weights into m from a training run's weights file (metadata
 * format dtrain-llama: the block's stacked tensors under dt_llama_tensor's
 * names, the sizes as metadata, checked against m's), one of its
 * checkpoints (verified first), or Hugging Face's layout (as
 * dt_llama_load_hf). A wrong size, a missing or mis-shaped tensor is
 * refused naming it; non-finite values are refused. */
DT_API dt_status dt_llama_load(dt_llama *m, const char *path);

#ifdef __cplusplus
}
#endif
#endif
