/*
 * dtrain/gpt.h - a GPT-2 style language model, its layers, token files and
 * llm.c-compatible weights.
 *
 * The model is GPT-2's decoder: token + position embedding, L blocks of
 *
 *   x = x + attn(layernorm1(x))      causal multi-head self-attention
 *   x = x + mlp(layernorm2(x))       C -> 4C, GELU (tanh), 4C -> C
 *
 * a final layernorm, and an output head tied to the token embedding
 * (logits = x @ wte^T). All parameters live in ONE contiguous block in
 * llm.c's order (wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w,
 * ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb), each per-layer tensor
 * stacked over the L layers, so the block is byte for byte the payload of an
 * llm.c checkpoint. The token embedding has padded_vocab_size rows (llm.c
 * pads 50257 to 50304 for faster GEMMs); rows past vocab_size are never
 * read by the head and get no gradient.
 *
 *   dt_gpt_config cfg;
 *   dt_gpt_preset("gpt-tiny", &cfg);         // L2 C64 H4, vocab 256
 *   dt_gpt *m;
 *   dt_gpt_create(&m, &cfg, B, T);            // activations for B x T tokens
 *   dt_gpt_init(m, seed);
 *   dt_gpt_zero_grad(m);
 *   dt_gpt_forward(m, inputs, targets, B, T, &loss);   // int32 [B,T] each
 *   dt_gpt_backward(m);                        // grads into dt_gpt_grads(m)
 *
 * Those calls use activations the model owns. For several micro-batches in
 * flight (pipeline parallel) or one stage of the layers, the activations
 * are separate objects and the model runs in stages, each with a backward
 * twin taking and returning the gradient of the residual stream [B,T,C]:
 *
 *   dt_gpt_acts *a;                            // one per micro-batch in flight
 *   dt_gpt_acts_create(&a, &cfg, B, T);
 *   int L = cfg.n_layer;
 *   float *x0 = dt_gpt_acts_resid(a, 0), *xL = dt_gpt_acts_resid(a, L);
 *   dt_gpt_embed_forward(m, a, inputs, x0);
 *   dt_gpt_forward_range(m, a, 0, L, x0, xL);  // or [0,k) then [k,L)
 *   dt_gpt_head_forward(m, a, xL, targets, &loss);
 *   dt_gpt_head_backward(m, a, xL, d);         // d[B,T,C] = dloss/dxL
 *   dt_gpt_backward_range(m, a, 0, L, x0, d);  // d becomes dloss/dx0
 *   dt_gpt_embed_backward(m, a, d);
 *
 * dt_gpt_forward/backward are exactly this sequence over the default set.
 * Layer kernels follow dtrain/nn.h's convention (outputs first; backward
 * accumulates with +=; shapes in brackets, row-major fp32).
 */
#ifndef DTRAIN_GPT_H
#define DTRAIN_GPT_H

#include "dtrain/ckpt.h"
#include "dtrain/core.h"
#include "dtrain/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- layer kernels ------------------------------------------------------- */

/* out[B,T,C] = wte[inp[b,t]] + wpe[t]. inp values must be valid rows of wte
 * (the model checks them; the kernel does not). */
DT_API void dt_encoder_forward(float *out, const int32_t *inp, const float *wte,
                               const float *wpe, int B, int T, int C);
/* dwte[inp[b,t]] += dout[b,t]; dwpe[t] += sum_b dout[b,t]. */
DT_API void dt_encoder_backward(float *dwte, float *dwpe, const float *dout,
                                const int32_t *inp, int B, int T, int C);

/* Vocabulary parallel (a tensor-parallel shard holding wte's rows [v0,
 * v0 + V) as its rows 0..V-1): forward out[b,t] = wte[inp - v0] + wpe[t]
 * where the shard holds the token, else zeros (the shards' outputs summed
 * are the whole embedding); backward dwte[inp - v0] += dout for those
 * tokens (positions in order), dwpe as dt_encoder_backward's (every
 * token). */
DT_API void dt_encoder_split_forward(float *out, const int32_t *inp, const float *wte, const float *wpe, int B, int T,
                                     int C, int v0, int V);
DT_API void dt_encoder_split_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B, int T,
                                      int C, int v0, int V);
/* Softmax cross-entropy over logits [N, V] that the shards hold in columns
 * (targets shifted to this shard's: outside 0..V-1 another's), in three
 * parts with a collective over the shards after each of the first two:
 * max: mx[N] the rows' maxima (then maxed over the shards); exp: probs =
 * exp(l - mx), sums[N] their sums (each row's in double, in order, as a
 * float) and sums[N + i] the target's logit or 0 (the 2N then summed);
 * finish: probs /= sums, row_loss[N] (doubles), returned: their mean (in
 * order). */
DT_API void dt_ce_split_max(float *mx, const float *logits, int N, int V);
DT_API void dt_ce_split_exp(float *probs, float *sums, const float *logits, const float *mx, const int32_t *targets,
                            int N, int V);
DT_API float dt_ce_split_finish(float *probs, double *row_loss, const float *mx, const float *sums, int N, int V);

/* out[N] = a[N] + b[N];  backward: da += dout, db += dout. */
DT_API void dt_residual_forward(float *out, const float *a, const float *b, size_t N);
DT_API void dt_residual_backward(float *da, float *db, const float *dout, size_t N);

/* Causal multi-head self-attention over qkv[B,T,3C] (the query, key and
 * value projections side by side, head h at channels h*hs..(h+1)*hs of each
 * third, hs = C/NH): out[B,T,C] = softmax(q k^T / sqrt(hs), causal) v.
 * The softmax is computed in place on the score matrix and saved as
 * att[B,NH,T,T] (row t holds the probabilities over positions 0..t, zeros
 * after); backward needs it and nothing else. The (batch, head) pairs are
 * spread over the threads; each is GEMMs over row blocks that skip the
 * masked upper triangle, with a fused row softmax between them. */
DT_API void dt_attention_forward(float *out, float *att, const float *qkv, int B, int T,
                                 int C, int NH);
/* dqkv[B,T,3C] += gradient of the attention; datt[B,NH,T,T] is scratch. */
DT_API void dt_attention_backward(float *dqkv, float *datt, const float *dout,
                                  const float *qkv, const float *att, int B, int T, int C,
                                  int NH);

/* ---- the model ------------------------------------------------------------- */



typedef struct dt_gpt dt_gpt;

/* Builds a model with a default set of activations (dt_gpt_acts) for
 * batches of up to B sequences of up to T tokens (T <= block_size), used by
 * dt_gpt_forward/backward/logits. B = T = 0 builds the parameters and
 * gradients only (a pipeline stage or a ZeRO-3 shard brings its own
 * dt_gpt_acts); the calls that need the default set then fail with
 * DT_ERR_ARG. Parameters are zero until dt_gpt_init or a load. The caller
 * frees *out with dt_gpt_free(). */
DT_API dt_status dt_gpt_create(dt_gpt **out, const dt_gpt_config *c, int B, int T);
DT_API void dt_gpt_free(dt_gpt *m);

/* What a set of activations (dt_gpt_acts, below) is made for: batches of up
 * to B x T tokens (T <= block_size); layers [l0, l1) (0 <= l0 <= l1 <=
 * n_layer), with the embedding's when l0 = 0 and the head's when l1 =
 * n_layer; the parts of a tensor-parallel shard of ntp (1: the whole model;
 * a shard keeps 1/ntp of the qkv, attention, MLP and logit activations:
 * its heads, hidden units and vocabulary rows); recompute = 1 keeps only
 * the residual stream before each block and one block's activations, which
 * backward makes again block by block from the stream (the same kernels on
 * the same input: results bitwise those without recomputation, for one more
 * forward of the blocks); seq = 1 (sequence parallel, ntp > 1) divides
 * the rest along the tokens: the shard keeps rows [tp R, (tp + 1) R), R =
 * B T / ntp, of the residual stream, the layernorms' outputs and their
 * statistics (B T must be a multiple of ntp), where without it every shard
 * keeps all B T rows; forward_only = 1 makes a set for forwards alone (an
 * evaluation's): the residual stream in two buffers that the blocks write
 * in turn (dt_gpt_acts_resid(a, l) is buffer (l - l0) % 2) and one
 * block's activations, the same results to the bit as a whole set's;
 * every backward call refuses it. */
typedef struct {
    int B, T, l0, l1, ntp, recompute;
    int seq;
    int forward_only;
} dt_gpt_acts_params;
/* {B, T, 0, n_layer, 1, 0, 0}: the whole model's, every activation kept. */
DT_API dt_gpt_acts_params dt_gpt_acts_whole(const dt_gpt_config *c, int B, int T);
/* Bytes of the activation buffers (saved activations, backward scratch,
 * inputs and targets) of a model running sets of p beside its parameter and
 * gradient blocks (2 x dt_gpt_config_num_params floats, whole). */
DT_API size_t dt_gpt_activation_bytes(const dt_gpt_config *c, const dt_gpt_acts_params *p);
DT_API const dt_gpt_config *dt_gpt_get_config(const dt_gpt *m);

/* GPT-2's initialisation from `seed`: weights normal(0, 0.02), the two
 * residual projections (attprojw, fcprojw) normal(0, 0.02/sqrt(2L)), biases
 * 0, layernorm weights 1; wte's padding rows 0. The values are drawn in
 * block order from one stream; a tensor-parallel shard keeps its parts of
 * the whole model's (bitwise the same numbers) and never holds the rest. */
DT_API dt_status dt_gpt_init(dt_gpt *m, uint64_t seed);
/* dt_gpt_init of the parameter block's elements [lo, hi) alone, the rest
 * left untouched (not even its pages: a ZeRO-3 rank's slice). The values
 * are those dt_gpt_init gives them, bitwise. */
DT_API dt_status dt_gpt_init_range(dt_gpt *m, uint64_t seed, size_t lo, size_t hi);

DT_API size_t dt_gpt_num_params(const dt_gpt *m);
DT_API float *dt_gpt_params(dt_gpt *m);
DT_API float *dt_gpt_grads(dt_gpt *m);
DT_API void dt_gpt_zero_grad(dt_gpt *m);
/* The 16 parameter tensors in block order, named as in llm.c ("wte",
 * "qkvw", ...); per-layer tensors have a leading dimension L. */
DT_API int dt_gpt_num_tensors(const dt_gpt *m);
DT_API const dt_tensor_info *dt_gpt_tensor(const dt_gpt *m, int i);

/* Forward pass over inputs[B,T] into the default activations (embedding,
 * all blocks, head; see below). With targets[B,T] also computes the mean
 * cross-entropy into *loss (targets may be NULL, then loss is not touched).
 * Fails with DT_ERR_ARG when B or T exceed what the model was created for,
 * T exceeds block_size, or a token id is outside [0, vocab_size). */
DT_API dt_status dt_gpt_forward(dt_gpt *m, const int32_t *inputs, const int32_t *targets,
                                int B, int T, float *loss);
/* Logits [B,T,V] of the last forward; valid until the next backward. */
DT_API const float *dt_gpt_logits(const dt_gpt *m);
/* Backward of the last dt_gpt_forward (which must have had targets):
 * ACCUMULATES into the gradient block. */
DT_API dt_status dt_gpt_backward(dt_gpt *m);
/* Multiplies the gradient of the loss by s in later backwards (default 1):
 * a micro-batch's share of a larger batch, as dt_model_set_loss_scale. */
DT_API void dt_gpt_set_loss_scale(dt_gpt *m, float s);
/* The order in which backward finishes the gradient block. The per-layer
 * tensors are stacked over the layers (qkvw [L,3C,C], ...), so layer l's
 * gradients are 12 slices spread over the block; the order lists them layer
 * by layer: wte, wpe, then for l = 0..L-1 the slices [l] of ln1w, ln1b, qkvw,
 * ..., fcprojb, then lnfw, lnfb (*n = 12 L + 4 ranges, which partition the
 * block). Backward finishes this sequence from its end. Owned by m. */
DT_API const dt_grad_range *dt_gpt_grad_order(const dt_gpt *m, int *n);
/* Called during backward with positions in the gradient order, decreasing,
 * the last 0: the gradients at positions >= pos of the order are final for
 * this pass (see dt_model_set_grad_hook). It is called after lnf, after each
 * of the six linear or layernorm backwards of every layer (each finishes
 * two slices: a weight and its bias), and with 0 after the embedding; the
 * stage backwards (below) call it at the same points of their part.
 * fn NULL: none. */
DT_API void dt_gpt_set_grad_hook(dt_gpt *m, dt_grad_ready_fn fn, void *user);

/* ---- activations and stages (micro-batches, pipeline stages) -------------
 *
 * A dt_gpt_acts holds what one forward over one micro-batch saves for its
 * backward: for layers [l0, l1) of the model, the residual stream before
 * each of them and after the last (dt_gpt_acts_resid), each layer's
 * layernorm, qkv, attention and MLP activations, plus the token ids when
 * l0 = 0 (the embedding) and the final layernorm, logits and probabilities
 * when l1 = L (the head). Any number can exist at once; they share the
 * model's parameters, gradients and backward scratch, so calls on one model
 * must not run concurrently. Backward reads the activations its forward
 * saved (and the residual stream passed to that forward, which the caller
 * must leave unchanged in between); it overwrites only the logits. */

typedef struct dt_gpt_acts dt_gpt_acts;

/* A set as p says (above). The current shape starts as p's B x T. Free
 * *out with dt_gpt_acts_free. */
DT_API dt_status dt_gpt_acts_create_with(dt_gpt_acts **out, const dt_gpt_config *c, const dt_gpt_acts_params *p);
/* The whole model's set (dt_gpt_acts_whole). */
DT_API dt_status dt_gpt_acts_create(dt_gpt_acts **out, const dt_gpt_config *c, int B, int T);
DT_API void dt_gpt_acts_free(dt_gpt_acts *a);
/* The model's default set (NULL if it was created with B = T = 0). Owned by m. */
DT_API dt_gpt_acts *dt_gpt_default_acts(dt_gpt *m);
/* Sets the shape of the next forward, at most the B x T of the create
 * (DT_ERR_ARG otherwise). Forgets what the set held: backward needs a new
 * forward. */
DT_API dt_status dt_gpt_acts_set_shape(dt_gpt_acts *a, int B, int T);
/* The residual stream [B,T,C] before layer l (l1: after the last layer),
 * for l0 <= l <= l1; NULL otherwise. (A sequence-parallel set's: the
 * shard's rows of it, [B*T/ntp, C]; the stage calls below then take and
 * give the stream and its gradient as those rows.) Where it lies depends on the current
 * shape: ask after dt_gpt_acts_set_shape, not before. The stage calls may use these as
 * resid_in/resid_out (the whole-model calls do: no copies), or any other
 * buffers of B*T*C floats (B*T*C/ntp sequence-parallel). */
DT_API float *dt_gpt_acts_resid(dt_gpt_acts *a, int l);
/* Logits [B,T,V] of the last head forward, valid until the head backward;
 * NULL without a head. */
DT_API const float *dt_gpt_acts_logits(const dt_gpt_acts *a);
/* dt_gpt_forward over the whole model into set a instead of the default
 * set (a set of every layer: a forward-only one for an evaluation); its
 * logits are then dt_gpt_acts_logits(a). */
DT_API dt_status dt_gpt_forward_with(dt_gpt *m, dt_gpt_acts *a, const int32_t *inputs, const int32_t *targets,
                                     int B, int T, float *loss);
/* Bytes allocated for the set; dt_gpt_acts_size: the bytes a set for
 * (c, p) would take, without allocating (arguments as above, unchecked), in the kernels' precision at the call. A set made while the
 * kernels run bf16 or fp16 (kernels.h) keeps each layer's four matmul
 * inputs (ln1, the attention's output, ln2, the GELU's output) in that
 * type, 2 bytes an element, and must run in it (else forward_range fails
 * with DT_ERR_ARG); dt_gpt_acts_saved: the bytes that saves against fp32
 * (0 for a set made in fp32). */
DT_API size_t dt_gpt_acts_bytes(const dt_gpt_acts *a);
DT_API size_t dt_gpt_acts_size(const dt_gpt_config *c, const dt_gpt_acts_params *p);
DT_API size_t dt_gpt_acts_saved(const dt_gpt_acts *a);

/* Stage forwards, over the set's current shape B x T. Each fails with
 * DT_ERR_ARG when a was made for another config, or lacks the layers or
 * the part asked for; then nothing is computed.
 * Embedding: resid_out[B,T,C] = wte[inputs] + wpe; checks the ids as
 * dt_gpt_forward does and keeps a copy for the backward. */
DT_API dt_status dt_gpt_embed_forward(dt_gpt *m, dt_gpt_acts *a, const int32_t *inputs,
                                      float *resid_out);
/* Blocks l0..l1-1 (l0 < l1, within a's layers): resid_out[B,T,C] is the
 * stream after block l1-1 given resid_in[B,T,C] before block l0. The two
 * must not be the same buffer. */
DT_API dt_status dt_gpt_forward_range(dt_gpt *m, dt_gpt_acts *a, int l0, int l1,
                                      const float *resid_in, float *resid_out);
/* Final layernorm and tied head on resid_in[B,T,C] (the stream after the
 * last layer): logits, and with targets[B,T] the mean cross-entropy into
 * *loss (targets NULL: logits only, *loss untouched, no backward possible).
 * DT_ERR_NUMERIC if the loss is not finite. */
DT_API dt_status dt_gpt_head_forward(dt_gpt *m, dt_gpt_acts *a, const float *resid_in,
                                     const int32_t *targets, float *loss);
/* Backward twins, in the reverse order. Parameter gradients ACCUMULATE into
 * the gradient block (times the loss scale); the grad hook and the layer
 * hook fire as in dt_gpt_backward.
 * Head: WRITES dresid[B,T,C], the gradient of the loss with respect to the
 * head's resid_in (the same buffer as its forward's). Needs a head forward
 * with targets since the last head backward. */
DT_API dt_status dt_gpt_head_backward(dt_gpt *m, dt_gpt_acts *a, const float *resid_in,
                                      float *dresid);
/* Blocks l1-1 down to l0: dresid[B,T,C] holds the gradient with respect to
 * the stream after block l1-1 and is turned, in place, into the gradient
 * with respect to resid_in (the forward's input before block l0). Each
 * block must have been run forward since the last set_shape. */
DT_API dt_status dt_gpt_backward_range(dt_gpt *m, dt_gpt_acts *a, int l0, int l1,
                                       const float *resid_in, float *dresid);
/* Embedding: gradients of wte and wpe from dresid[B,T,C]. */
DT_API dt_status dt_gpt_embed_backward(dt_gpt *m, dt_gpt_acts *a, const float *dresid);

/* The layer hook: called before each stage's forward and before its
 * backward, with the layer whose parameters it is about to use (-1 =
 * DT_GPT_EMBED, the embedding: wte, wpe; 0..L-1 the blocks; L the head:
 * lnfw, lnfb and wte) and the phase. A whole forward calls it for layers
 * -1, 0, ..., L ascending, a whole backward for L, ..., 0, -1 descending;
 * range calls for their layers only. A status other than DT_OK stops the
 * stage before it computes anything, and the call returns that status (the
 * hook sets the message with dt_error). Meant for gathering a layer's
 * parameters on demand (ZeRO-3). fn NULL: none. */
#define DT_GPT_EMBED (-1)
typedef enum { DT_GPT_FORWARD = 0, DT_GPT_BACKWARD = 1 } dt_gpt_phase;
typedef dt_status (*dt_gpt_layer_fn)(int layer, dt_gpt_phase phase, void *user);
DT_API void dt_gpt_set_layer_hook(dt_gpt *m, dt_gpt_layer_fn fn, void *user);

/* ---- tensor parallel ------------------------------------------------------
 *
 * A shard holds rank tp's part of the model among ntp ranks, as Megatron-LM
 * lays it out: each layer's qkv linear column-parallel (n_head / ntp heads:
 * those heads' columns of each of q, k and v), the attention projection
 * row-parallel (the same channels of its input), the MLP's first linear
 * column-parallel and its second row-parallel (4C / ntp hidden units), the
 * token embedding and the tied head vocab-parallel (padded_vocab_size / ntp
 * rows of wte each); layernorms, wpe and the row-parallel linears' biases
 * are whole on every rank. Activations between the blocks are whole on
 * every rank (but with sequence parallelism, below); the model sums its partial results over the shards through
 * the reduce function: after each row-parallel linear in forward and after
 * each column-parallel linear's input gradient in backward (one sum per
 * attention and per MLP block each way, 2 + 2 a layer), the embedding's
 * rows in forward, and in the head a row maximum and the softmax's sums
 * forward (a cross-entropy over the shards' logit columns: no rank holds a
 * whole row of logits) and the layernorm's input gradient backward. The
 * shards' calls must run in the same order on every rank. The shard's
 * logits (dt_gpt_logits) are its columns [BT, its rows of wte below
 * vocab_size].
 *
 * Sequence parallel (Megatron-LM's; acts->seq = 1): the stream between the
 * blocks, the layernorms and the residual adds are divided along the B*T
 * tokens, each shard holding its rows [tp R, (tp + 1) R), R = B*T / ntp.
 * An allgather of the layernorm's rows enters each column-parallel part
 * (qkv, fc, the head's logits) and a reduce-scatter of the partial outputs
 * leaves each row-parallel one (the projections; the embedding's rows);
 * backward gathers the output gradient before the row-parallel linears and
 * the layernorm's rows again before the column-parallel weight gradients,
 * and reduce-scatters the column-parallel input gradients. The layernorm
 * weights' gradients (from the shard's rows) are summed over the shards
 * once a layer (ln1, ln2 together) and once in the head (lnf), so that the
 * whole tensors' gradients are the same on every shard again. */

/* The collectives over the ntp shards, every shard calling the same in
 * the same order:
 *   DT_GPT_SUM, DT_GPT_MAX: recv[n] = the sum (max) of the shards' send[n]
 *     (send == recv: in place); every shard gets the same result;
 *   DT_GPT_REDUCE_SCATTER: send[ntp n] summed over the shards, shard t
 *     getting block t of the sum in recv[n] (recv == send: at its start);
 *   DT_GPT_ALLGATHER: recv[ntp n] = the shards' send[n] in shard order.
 * The last two serve sequence parallelism only. */
typedef enum { DT_GPT_SUM, DT_GPT_MAX, DT_GPT_REDUCE_SCATTER, DT_GPT_ALLGATHER } dt_gpt_coll;
typedef dt_status (*dt_gpt_reduce_fn)(dt_gpt_coll op, const float *send, float *recv, size_t n, void *user);
/* dt_gpt_create for shard tp of acts->ntp (dt_gpt_create: 0 of 1), its
 * default set of activations made as acts says (every layer, whatever
 * acts->l0 and l1 are; acts->B = T = 0: none); sequence parallel where
 * acts->seq is (its sets must be too; DT_ERR_ARG with ntp = 1). The parameter and gradient
 * blocks hold the shard's tensors, named as the whole model's and shaped as
 * above (dt_gpt_tensor). DT_ERR_ARG when ntp does not divide the heads, the
 * hidden size or the padded vocabulary (dt_gpt_tensor_parallel_check). */
DT_API dt_status dt_gpt_create_shard(dt_gpt **out, const dt_gpt_config *c, const dt_gpt_acts_params *acts,
                                     int tp);
/* The shard's rank; *ntp the number of shards (1: a whole model). A shard
 * cannot be saved (dt_gpt_save: copy its part into a whole block instead,
 * dt_gpt_part_fill); dt_gpt_load gives it its part. */
DT_API int dt_gpt_shard(const dt_gpt *m, int *ntp);
/* 1 where the shard runs sequence parallel (acts->seq), else 0. */
DT_API int dt_gpt_seq(const dt_gpt *m);
/* The head's vocabulary on m's shard: *v0 its first row of wte, returned
 * how many of its rows are below vocab_size (the whole model: 0 and
 * vocab_size). */
DT_API int dt_gpt_head_vocab(const dt_gpt *m, int *v0);
/* The elements [lo, hi) of a whole model's block that model m (a shard,
 * or a model that keeps some blocks: dt_gpt_set_held) holds in its block
 * `local` (its parameters, gradients, or an optimizer state laid out as
 * them), into buf[0, hi - lo); the others are left as they are. The tensors
 * every shard holds whole count as shard 0's alone and the tied wte as the
 * embedding's, so that each element has one model that fills it. */
DT_API void dt_gpt_part_fill(const dt_gpt *m, const float *local, size_t lo, size_t hi, float *buf);
/* The elements of m's block `local` that lie in [lo, hi) of the whole
 * model's block, from buf[0, hi - lo) (every one m holds). */
DT_API void dt_gpt_part_take(const dt_gpt *m, float *local, size_t lo, size_t hi, const float *buf);
/* Where m's part lies: fn(user, local, whole, n) for each run of n floats
 * it holds at offset `local` of its block and `whole` of the whole model's,
 * every element it holds once (the tensors every shard holds whole
 * included), tensor by tensor in block order, increasing in both. */
typedef void (*dt_gpt_run_fn)(void *user, size_t local, size_t whole, size_t n);
DT_API void dt_gpt_part_runs(const dt_gpt *m, dt_gpt_run_fn fn, void *user);
/* Keeps only the blocks held[l] says (l < n_layer; NULL: all), with the
 * embedding where it keeps block 0 and the final layernorm and the tied
 * wte where it keeps the last: the parameters and gradients of the rest
 * are never touched (their pages of the blocks are never made), by
 * dt_gpt_init, dt_gpt_zero_grad, dt_gpt_part_fill and _take; the caller
 * runs stages of its blocks only (a pipeline stage's). Before dt_gpt_init.
 * DT_ERR_ARG when it keeps none. */
DT_API dt_status dt_gpt_set_held(dt_gpt *m, const unsigned char *held);
/* The ranges of the block the model keeps, in block order (*n of them;
 * the whole block, as one range, unless dt_gpt_set_held said otherwise).
 * Owned by m. */
DT_API const dt_grad_range *dt_gpt_held_ranges(const dt_gpt *m, int *n);
/* Parameters of a shard of ntp (dt_gpt_config_num_params: of 1). */
DT_API size_t dt_gpt_shard_num_params(const dt_gpt_config *c, int ntp);
/* The reduce function a shard calls (ntp > 1 needs one). */
DT_API void dt_gpt_set_reduce(dt_gpt *m, dt_gpt_reduce_fn fn, void *user);
/* Whether tensor i (block order) is divided among the shards (else every
 * shard holds it whole and computes the same gradient for it). */
DT_API int dt_gpt_tensor_split(int i);
/* ---- weights ------------------------------------------------------------ */

/* safetensors with the 16 llm.c-named tensors and the sizes as metadata
 * (n_layer, n_head, n_embd, block_size, vocab_size, padded_vocab_size). */
DT_API dt_status dt_gpt_save(const dt_gpt *m, const char *path);
/* That metadata: the six sizes (written into vals) and format "dtrain-gpt";
 * returns the entries in meta (7). */
DT_API int dt_gpt_weights_meta(const dt_gpt_config *c, char vals[6][16], dt_st_meta meta[7]);
/* Loads weights saved by dt_gpt_save, or an llm.c checkpoint (told apart by
 * its magic number); their sizes must equal the model's. The sizes a file
 * claims are checked against its bytes, and every tensor's shape, before
 * anything is copied or allocated; a safetensors file that is a checkpoint
 * is verified first (dt_model_load), and values NaN or Inf are refused
 * (dt_gpt_weights_open: a pass over the whole file, a piece at a time).
 * Then only what m keeps is read, straight into its block, by ranges
 * (dt_gpt_part_runs: a stage's blocks, a tensor-parallel shard's part of
 * each tensor), with no buffer: the same values as dt_gpt_part_take of
 * the whole block. */
DT_API dt_status dt_gpt_load(dt_gpt *m, const char *path);
/* dt_gpt_load of the elements [lo, hi) of the model's own block alone (a
 * ZeRO-3 rank's slice), the rest left untouched. */
DT_API dt_status dt_gpt_load_range(dt_gpt *m, const char *path, size_t lo, size_t hi);
/* The same without a model: writes a parameter block of config c, and reads
 * one (either format) into *params (dt_alloc'ed; free with dt_free) and *c. */
DT_API dt_status dt_gpt_weights_save(const char *path, const dt_gpt_config *c, const float *params);
DT_API dt_status dt_gpt_weights_load(const char *path, dt_gpt_config *c, float **params);
/* GPT weights open for reading ranges of their block (either format; a
 * safetensors checkpoint, file or sharded directory, is verified): the
 * header is read, the values are streamed once in pieces of DT_ST_PIECE
 * bytes (their NaN and Inf refused: DT_ERR_NUMERIC) and left on disk; *c
 * gets the sizes. dt_gpt_weights_read reads elements [lo, hi) of the whole
 * block into dst. Memory: the headers, and the pieces. */
typedef struct dt_gpt_weights dt_gpt_weights;
DT_API dt_status dt_gpt_weights_open(dt_gpt_weights **out, const char *path, dt_gpt_config *c);
DT_API dt_status dt_gpt_weights_read(const dt_gpt_weights *w, size_t lo, size_t hi, float *dst);
DT_API void dt_gpt_weights_close(dt_gpt_weights *w);
/* `dtrain convert`: the weights of `in` written to `out` as an llm.c file
 * (to_llmc) or as safetensors, the same bytes dt_llmc_write and
 * dt_gpt_weights_save write, a piece of DT_ST_PIECE bytes at a time (no
 * whole block); *c gets the sizes. */
DT_API dt_status dt_gpt_weights_convert(const char *in, const char *out, int to_llmc, dt_gpt_config *c);
/* Shapes and block offsets of the 16 tensors of a config (names as above). */
DT_API void dt_gpt_param_shapes(const dt_gpt_config *c, dt_tensor_info t[16]);
/* Reads only the sizes of a weights file (safetensors or llm.c). */
DT_API dt_status dt_gpt_read_config(const char *path, dt_gpt_config *c);

/* llm.c's checkpoint format (gpt2_124M.bin and what its trainer writes): a
 * header of 256 int32 {20240326, 3, maxT, V, L, NH, C, Vp, 0...} then the
 * fp32 parameter block. Parses `len` bytes (`what` names them in errors);
 * on success *params points INTO buf. Checks magic, version, sizes and that
 * the length is exactly header + parameters. */
#define DT_LLMC_MAGIC 20240326
#define DT_LLMC_VERSION 3
DT_API dt_status dt_llmc_parse(const uint8_t *buf, size_t len, const char *what,
                               dt_gpt_config *c, const float **params);
/* Writes an llm.c checkpoint atomically. */
DT_API dt_status dt_llmc_write(const char *path, const dt_gpt_config *c, const float *params);
/* Number of floats in the parameter block of a config. */
DT_API size_t dt_gpt_config_num_params(const dt_gpt_config *c);

/* ---- token files --------------------------------------------------------- */

/* llm.c's token format: a header of 256 int32 {20240520, 1, ntok, 0...} and
 * ntok little-endian uint16 tokens. */
#define DT_TOKENS_MAGIC 20240520
#define DT_TOKENS_VERSION 1

typedef struct {
    const uint16_t *tokens;  /* the tokens held: the file's [first, first + n) */
    size_t n;
    void *map;          /* internal: the bytes read into memory */
    size_t map_len;
    size_t total;       /* tokens in the file */
    size_t first;       /* the file's index of tokens[0] */
    int shard, nshards; /* dt_shard_range(total, shard, nshards) held (0 of 1: the whole file) */
} dt_tokens;

/* Checks a token-file buffer (magic, version, length = header + 2*ntok and
 * every id < vocab). `what` names it in errors. On success *tokens points
 * into buf. */
DT_API dt_status dt_tokens_parse(const uint8_t *buf, size_t len, const char *what, int vocab,
                                 const uint16_t **tokens, size_t *n);
/* Reads a token file into memory and checks it (as dt_tokens_parse). It is
 * read, not memory-mapped, so that a file truncated or replaced during a
 * run cannot stop it with SIGBUS: the run goes on with what it read. */
DT_API dt_status dt_tokens_open(dt_tokens *t, const char *path, int vocab);
/* Reads shard `shard` of nshards of a token file: its tokens
 * dt_shard_range(ntok, shard, nshards) alone (with the header: ranged reads
 * of a file, ranged GETs of an object, 8 MiB pieces four in flight),
 * checked as dt_tokens_open checks the file (the header, the file's length
 * against it, every id it reads < vocab). Shard 0 of 1 is dt_tokens_open. */
DT_API dt_status dt_tokens_open_shard(dt_tokens *t, const char *path, int vocab, int shard, int nshards);
DT_API void dt_tokens_close(dt_tokens *t);
/* Writes tokens to path atomically in the format above. */
DT_API dt_status dt_tokens_write(const char *path, const uint16_t *tokens, size_t n);
/* The same written piece by piece, in bounded memory: open makes a
 * temporary file beside path, put appends tokens (more than the format's
 * int32 count is refused), close(commit = 1) writes the count into the
 * header and makes the file path; close(commit = 0) removes it. close
 * frees w either way (NULL: nothing to do). */
typedef struct dt_tokens_writer dt_tokens_writer;
DT_API dt_status dt_tokens_writer_open(dt_tokens_writer **w, const char *path);
DT_API dt_status dt_tokens_writer_put(dt_tokens_writer *w, const uint16_t *tokens, size_t n);
DT_API size_t dt_tokens_writer_count(const dt_tokens_writer *w);
DT_API dt_status dt_tokens_writer_close(dt_tokens_writer *w, int commit);
/* B random windows of T+1 tokens: inputs[b,t] = tok[s_b + t],
 * targets[b,t] = tok[s_b + t + 1], starts s_b drawn from rng. The file must
 * hold at least T+1 tokens (DT_ERR_ARG otherwise). Of a shard (nshards =
 * W > 1): window b is the rank's that trains it (windows [B r / W, B (r +
 * 1) / W) are rank r's, as the tasks split a batch) and starts in that
 * rank's shard, each shard at least T+1 tokens; every window's start is
 * drawn (rng moves as on every rank), and the windows of other shards are
 * left as they are. One shard of one draws what the whole file does. */
DT_API dt_status dt_tokens_sample(const dt_tokens *t, dt_rng *rng, int B, int T,
                                  int32_t *inputs, int32_t *targets);
/* Batch i of consecutive windows (for validation): window j = i*B + b starts
 * at j*T, wrapping at the end of the file. */
DT_API dt_status dt_tokens_window(const dt_tokens *t, int64_t i, int B, int T, int32_t *inputs,
                                  int32_t *targets);

#ifdef __cplusplus
}
#endif
#endif
