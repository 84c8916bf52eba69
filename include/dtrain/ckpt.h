/*
 * dtrain/ckpt.h - safetensors files and model weights.
 *
 * safetensors: 8-byte little-endian header length N, N bytes of JSON
 * ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
 *   "__metadata__": {"key": "value"}}), then the raw little-endian tensor
 * bytes. Other tools (Python's safetensors, PyTorch, llm.c converters) read
 * these files directly.
 */
#ifndef DTRAIN_CKPT_H
#define DTRAIN_CKPT_H

#include "dtrain/core.h"
#include "dtrain/nn.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *name;
    dt_dtype dtype;
    int ndim;
    int64_t shape[8];
    /* To write: nbytes of raw little-endian elements. A file's tensor
     * (dt_st_get, dt_st_find): NULL; its bytes stay in the file, read with
     * dt_st_read or dt_st_scan. */
    const void *data;
    size_t nbytes;
} dt_st_tensor;

typedef struct {
    const char *key;
    const char *value;
} dt_st_meta;

/* Writes tensors and string metadata to `path` atomically
 * (dt_write_atomic). Tensor names must be unique. */
DT_API dt_status dt_st_write(const char *path, const dt_st_tensor *tensors, int n,
                             const dt_st_meta *meta, int nmeta);

/* What dt_st_write writes before the data: the 8-byte length and the JSON
 * header of tensors[n] (their data is not read), padded so that the data
 * starts 8-byte aligned, into *hdr (malloc'd; the caller frees) of *hlen
 * bytes. The data that follows is the tensors' bytes in their order. */
DT_API dt_status dt_st_header(const char *path, const dt_st_tensor *tensors, int n, const dt_st_meta *meta,
                              int nmeta, char **hdr, size_t *hlen);

typedef struct dt_st_file dt_st_file;

/* Opens a file and validates its header: the 8-byte length (checked
 * against the file's size and DT_ST_MAX_HEADER before anything is
 * allocated), the JSON, dtypes, shapes against byte ranges, ranges inside
 * the file and not overlapping. Only the header is read: the file holds the
 * header and a descriptor, whatever the file's size; the data is read with
 * dt_st_read (ranges) and dt_st_scan (every byte once, in pieces). */
DT_API dt_status dt_st_open(dt_st_file **out, const char *path);
/* The same over a buffer, which is copied; `what` names it in errors. */
DT_API dt_status dt_st_parse(dt_st_file **out, const uint8_t *buf, size_t len,
                             const char *what);
#define DT_ST_MAX_HEADER ((uint64_t)100 << 20)
DT_API void dt_st_close(dt_st_file *f);
DT_API int dt_st_count(const dt_st_file *f);
DT_API const dt_st_tensor *dt_st_get(const dt_st_file *f, int i);
DT_API const dt_st_tensor *dt_st_find(const dt_st_file *f, const char *name);
/* Metadata value for key, or NULL. */
DT_API const char *dt_st_meta_get(const dt_st_file *f, const char *key);
/* Elements [first, first + n) of t (a tensor of f) into dst, as `as`: t's
 * own dtype (its bytes as stored), F32 from BF16 or F16, or BF16 / F16 from
 * F32 (rounded to nearest even). Reads only those bytes (pread); a
 * conversion goes through a buffer of 64 Ki elements. DT_ERR_ARG: a range
 * outside t, a tensor of another file, a conversion not listed; DT_ERR_IO: a
 * failed read (a file cut short since it was opened). */
DT_API dt_status dt_st_read(const dt_st_file *f, const dt_st_tensor *t, size_t first, size_t n, dt_dtype as,
                            void *dst);
/* The streaming pass: every tensor's bytes once, read DT_ST_PIECE bytes at
 * a time into one buffer (never the whole file), in the order order[]
 * (dt_st_count(f) tensors of f, each once; NULL: as they lie on disk);
 * fn(user, t, at, bytes, len) sees each piece (at: its byte offset in t; an
 * empty tensor gets one call with len 0; fn may be NULL), and a status other
 * than DT_OK from it stops the pass. The pass counts the NaN and Inf values
 * too, which dt_st_check_finite then reports without reading again. */
#define DT_ST_PIECE ((size_t)16 << 20)
typedef dt_status (*dt_st_piece_fn)(void *user, const dt_st_tensor *t, size_t at, const void *bytes, size_t len);
DT_API dt_status dt_st_scan(dt_st_file *f, const dt_st_tensor *const *order, dt_st_piece_fn fn, void *user);
/* How many of n values of type (F32, BF16, F16; others: 0) are NaN or Inf. */
DT_API size_t dt_count_nonfinite(const void *data, size_t n, dt_dtype type);
/* DT_ERR_NUMERIC naming the first tensor of f with a NaN or Inf and how
 * many f holds, else DT_OK: weights a checksum vouches for may still be
 * the result of a diverged run, which resume, export, eval and init_from
 * refuse (inspect says so). The count is the streaming pass's (dt_st_scan;
 * one is made when none was). */
DT_API dt_status dt_st_check_finite(dt_st_file *f, const char *path);
/* Bytes this process has read from the tensor data of safetensors files
 * (weights, checkpoints) since it started: summary.json's
 * io.ranks_read_bytes. */
DT_API uint64_t dt_st_bytes_read(void);

/* Saves every parameter tensor of m under its name (dt_model_tensor). */
DT_API dt_status dt_model_save(dt_model *m, const char *path, const dt_st_meta *meta, int nmeta);
/* Loads parameters saved by dt_model_save, or the weights of a checkpoint
 * (file or sharded directory), verified first like dt_ckpt_read verifies it;
 * every tensor of the model must be present with the same shape and dtype
 * F32, else DT_ERR_FORMAT naming it, and m is untouched. */
DT_API dt_status dt_model_load(dt_model *m, const char *path);


/* ---- training checkpoints (docs/checkpoints.md) --------------------------
 *
 * A checkpoint is one safetensors file: the weights under the model's tensor
 * names (so it opens as weights anywhere), the optimizer state as
 * "optimizer.state.0/1" (flat, parameter block order) and "optimizer.step",
 * and in the metadata: format "dtrain-checkpoint", format_version, step,
 * epoch, epoch_batch, the loop's RNG state, world_size, the resolved config
 * and its hash, fp16's loss scaler ("loss_scaler", in the checkpoints of
 * fp16 runs alone), and a CRC-32C over every tensor (name, dtype, shape, bytes)
 * and every metadata value, verified on load. */

#define DT_CKPT_VERSION 1

/* Where a training loop stands: enough to continue bit for bit. */
typedef struct {
    int64_t step;        /* optimizer steps taken */
    int64_t epoch;       /* epoch in progress (0-based) */
    int64_t epoch_batch; /* global batches of that epoch already trained */
    int64_t epoch_steps; /* steps summed in epoch_loss */
    double epoch_loss;   /* sum of this epoch's step losses (progress, summary) */
    dt_rng rng;          /* the loop's data generator (GPT windows) */
    int world;           /* workers of the run that wrote it */
    /* fp16's dynamic loss scaler (dt_loss_scaler): its scale (0: the run
     * has none; a checkpoint without one reads as 0), its clean steps in a
     * row and the steps it skipped. */
    float loss_scale;
    int64_t scale_clean, scale_skipped;
} dt_train_state;

/* What a checkpoint holds, as live buffers: writing reads them, loading
 * fills them. */
typedef struct {
    const dt_tensor_info *tensors; /* the weights: names, shapes, offsets */
    int ntensors;
    float *params;                 /* flat parameter block, nparams floats */
    size_t nparams;
    int nstates;                   /* optimizer state blocks (0..2) */
    float *states[2];              /* each nparams floats */
    int64_t *opt_step;             /* the optimizer's step count */
    const char *optimizer;         /* its name ("sgd", "adamw") */
    const char *config;            /* resolved config text (dt_config_format) */
    /* Called by the readers with the config text a checkpoint was written
     * with, when it differs from `config`, before any buffer is touched: a
     * status other than DT_OK refuses the checkpoint (with its message).
     * NULL: a warning with the stored config's hash. */
    dt_status (*config_check)(void *user, const char *path, const char *stored);
    void *config_user;
    /* The buffers stay as they are from a save until that write ends (the
     * caller waits for the writer before it changes them: a strategy's
     * staged slice): the background writer writes from them, with no
     * snapshot copy of its own. */
    int stable;
    /* The buffers (params, states) are not there: readers fill the training
     * state and opt_step alone, and the strategy reads and writes the
     * blocks itself, a piece at a time (dt_ckpt_read_range,
     * dt_ckpt_pieces); the background writer refuses to save it. */
    int state_only;
    /* The checkpoint a reader is given was verified by another reader of
     * the run, which chose it (dt_ckpt_open_chosen): dt_ckpt_read checks
     * what it says and reads this rank's ranges, with no pass of its own
     * over the whole checkpoint. */
    int verified;
    const dt_st_meta *weights_meta;/* metadata the weights file of this model
                                      carries (a GPT's shape), kept for export */
    int nweights_meta;
    /* The part of the state these buffers hold, for a strategy that shards
     * it: params[0] is element params_lo of the block and the buffer ends at
     * params_hi; each states[j] likewise for [states_lo, states_hi). A
     * replicated run holds all of both: 0 and nparams (or 0 and 0, the
     * zero-initialised default, which also means all). */
    size_t params_lo, params_hi, states_lo, states_hi;
    /* State beyond these blocks that this rank keeps across steps (a
     * gradient codec's, docs/compression.md), saved under its own names in
     * the rank's shard: at each save the writer calls extra(extra_user, t,
     * max), which puts up to max tensors in t (views of live buffers, which
     * the snapshot copies; t may be NULL when max is 0) and returns how many
     * there are, or -1 when out of memory (dt_error set). NULL: none. Since a
     * whole file is rank 0's alone, a model with extra state is written
     * sharded (dt_ckpt_write refuses it; the background writer of one rank
     * writes a sharded checkpoint of one shard). Readers of the model skip
     * these tensors; their owner reads them with dt_ckpt_open_part. */
    int (*extra)(void *user, dt_st_tensor *t, int max);
    void *extra_user;
    /* The extra tensors' buffers stay as they are from a save until its
     * write ends (as `stable` says of the blocks): the background writer
     * writes them from there, with no snapshot copy (a parameter server's
     * rows of the recommender's tables, which may be larger than memory
     * would hold twice). */
    int extra_stable;
} dt_ckpt_model;

/* At most this many extra tensors per rank. */
#define DT_CKPT_MAX_EXTRA 8

/* Sharded checkpoints are a directory DIR/step-N/ with one
 * shard-R-of-W.safetensors per rank (its slice of the parameter block and
 * of the optimizer state, with the same metadata), index.json (the model's
 * tensors and the slices) and COMPLETE, written last, once every shard is
 * durable. dt_ckpt_read and everything below read either kind (a rank
 * reads the ranges it holds, from a whole file or from the shards), so
 * either resumes on any number of workers. Rank r of
 * W holds dt_shard_range(n, r, W) of the n parameters (core.h). */

/* Writes a checkpoint atomically (temp file, fsync, rename, fsync dir). */
DT_API dt_status dt_ckpt_write(const char *path, const dt_ckpt_model *m, const dt_train_state *s);
/* Reads and verifies path, then fills m's buffers and *s. Nothing is
 * touched unless the whole file is valid. Errors: DT_ERR_IO / DT_ERR_FORMAT
 * for a damaged file (unreadable, truncated, checksum), DT_ERR_CONFIG for a
 * sound file that does not fit (another model, optimizer or format
 * version). */
DT_API dt_status dt_ckpt_read(const char *path, const dt_ckpt_model *m, dt_train_state *s);
/* One writer's file of checkpoint path, verified (its checksum) and open:
 * for a sharded checkpoint's directory its shard `part` (of *parts, the
 * ranks that wrote it), for a whole file the file itself (part 0 of 1).
 * Gives a rank's extra state (dt_ckpt_model.extra) back to it. Close *out
 * with dt_st_close. part = -1 opens nothing (out may be NULL): *parts
 * alone, from the index. */
DT_API dt_status dt_ckpt_open_part(const char *path, int part, dt_st_file **out, int *parts);
/* The one reader of weights and checkpoints: path is a file or a sharded
 * checkpoint's directory (every shard verified, then gathered as a view of
 * the shards, which reads through them); a file that carries a
 * checkpoint's metadata is verified (format version, checksum, every value
 * in range) before it is returned. A lone shard is DT_ERR_CONFIG.
 * *is_ckpt (may be NULL): whether it is a checkpoint rather than plain
 * weights. Close *out with dt_st_close. */
DT_API dt_status dt_ckpt_open(const char *path, dt_st_file **out, int *is_ckpt);
/* dt_ckpt_open (part < 0) or dt_ckpt_open_part (part >= 0) of a
 * checkpoint another reader of this run has verified (rank 0, which chose
 * it for every rank: dt_ckpt_load_newest): its structure and metadata are
 * checked, its bytes are not read again for the checksum and the
 * finite-values pass (a pass each rank would make over the whole
 * checkpoint). */
DT_API dt_status dt_ckpt_open_chosen(const char *path, int part, dt_st_file **out);
/* Elements [lo, hi) of checkpoint f's parameter block (j = -1: through
 * m's tensors, by name and offset) or of its optimizer state j, read into
 * dst (hi - lo floats); `what` names f in errors. DT_ERR_FORMAT when f
 * lacks a tensor of m's size. Only those bytes are read. */
DT_API dt_status dt_ckpt_read_range(const dt_st_file *f, const char *what, const dt_ckpt_model *m, int j, size_t lo,
                                    size_t hi, float *dst);
/* Prints a checkpoint's (or weights file's) metadata and tensors, and
 * whether its checksum holds; DT_ERR_FORMAT if it does not. */
DT_API dt_status dt_ckpt_inspect(const char *path, FILE *out);
/* Writes the weights alone (the same safetensors file the run's
 * model.safetensors is, for inference and `dtrain convert`). */
DT_API dt_status dt_ckpt_export_weights(const char *ckpt, const char *out);
/* The same with the weights converted to t: DT_F32 (as stored: a
 * checkpoint holds fp32 master weights whatever the run's precision),
 * DT_BF16 or DT_F16 (rounded to nearest even; inference weights for other
 * tools, half the bytes). */
DT_API dt_status dt_ckpt_export_weights_as(const char *ckpt, const char *out, dt_dtype t);

/* A rank's shard of a sharded checkpoint written a piece at a time, for a
 * rank that never holds its slice of the state whole (a model in parts,
 * assembled a piece at a time: docs/checkpoints.md "Staging"): the same
 * file write_shard's background writer writes, byte for byte, written
 * synchronously. m is the model (state_only: its blocks' buffers are not
 * read; opt_step, tensors, the extra state are), s the training state;
 * rank r of `world` writes DIR/step-N/shard-r-of-world, its range [begin,
 * end) = dt_shard_range(m->nparams, r, world).
 * Pieces come in the checksum's order: each optimizer state's range in
 * turn (j = 0, 1), then the parameters' (j = -1), each from its begin,
 * contiguous; anything else is DT_ERR_INTERNAL. commit writes the
 * checksum into the header and commits the file (temp file, fsync,
 * rename; an object: its upload); finish, once every rank's commit
 * succeeded (the caller's agreement: no rank waits for a shard that will
 * not come), waits on rank 0 up to `timeout` seconds for every other
 * shard, writes index.json and COMPLETE, and keeps the newest `keep`
 * checkpoints. finish and abort free w whatever they return; abort drops
 * an unfinished file. */
typedef struct dt_ckpt_pieces dt_ckpt_pieces;
DT_API dt_status dt_ckpt_pieces_open(dt_ckpt_pieces **w, const char *dir, const dt_ckpt_model *m,
                                     const dt_train_state *s, int rank, int world);
DT_API dt_status dt_ckpt_pieces_put(dt_ckpt_pieces *w, int j, size_t at, const float *x, size_t n);
DT_API dt_status dt_ckpt_pieces_commit(dt_ckpt_pieces *w);
DT_API dt_status dt_ckpt_pieces_finish(dt_ckpt_pieces *w, int keep, double timeout);
DT_API void dt_ckpt_pieces_abort(dt_ckpt_pieces *w);

/* Whether a checkpoint write that failed with st is given up rather than
 * stopping the run: a checkpoint in object storage (dir s3://...) whose
 * requests failed past the client's retries (DT_ERR_IO, DT_ERR_TIMEOUT: the
 * server gone, a shard that never came). Then the last error's message
 * becomes msg[n], "checkpoint at step N not written: WHY", said as a
 * warning ("training goes on, and the next checkpoint tries again"); the
 * checkpoint is not marked complete, resume skips it, and the newest
 * complete checkpoint goes on counting for keep. */
DT_API int dt_ckpt_give_up(const char *dir, dt_status st, int64_t step, char *msg, size_t n);

/* The checkpoints of a directory, newest step first:
 * DIR/step-NNNNNNNN.safetensors files and DIR/step-NNNNNNNN/ sharded ones.
 * *paths is malloc'd (free each and the array with free()). */
DT_API dt_status dt_ckpt_list(const char *dir, char ***paths, int *n);
/* Loads the newest valid checkpoint of dir (or dir itself when it is one: a
 * file or a sharded checkpoint's directory), skipping damaged ones with a
 * warning; an incompatible one is an
 * error. *found = 0 (and DT_OK) when dir holds none. `used` gets its path. */
DT_API dt_status dt_ckpt_load_newest(const char *dir, const dt_ckpt_model *m, dt_train_state *s,
                                     int *found, char *used, size_t nused);

/* Background writer: save() copies the buffers (the only pause training
 * sees) and a thread writes DIR/step-N.safetensors, then deletes all but the
 * newest `keep`. A save waits for the previous write first.
 *
 * Sharded (world > 1): each of the W ranks has a writer, snapshots only its
 * slice and writes its shard into DIR/step-N/; rank 0's writer then waits
 * (up to shard_timeout seconds) for every shard file to appear, and writes
 * index.json and COMPLETE. Every rank must save at the same steps.
 * world <= 1: one file, written by the one writer (rank 0's).
 *
 * In object storage (dir s3://..., docs/s3.md) a write that fails for
 * good after the client's retries (the server gone, a shard that never
 * came) is given up with a warning instead: the checkpoint is not marked
 * complete, training goes on, and the next save tries again;
 * dt_ckpt_writer_failed says whether the newest write was given up. */
typedef struct dt_ckpt_writer dt_ckpt_writer;
DT_API dt_status dt_ckpt_writer_create(dt_ckpt_writer **out, const char *dir, int keep,
                                       const dt_ckpt_model *m, int rank, int world,
                                       double shard_timeout);
/* The same for a rank restarted alone in a run that goes on (parameter
 * servers outside mode sync): rank 0's writer leaves the unfinished
 * checkpoints in place, since another rank's shard of the one being saved
 * may be among them (dt_ckpt_writer_create removes them: an earlier run's). */
DT_API dt_status dt_ckpt_writer_rejoin(dt_ckpt_writer **out, const char *dir, int keep,
                                       const dt_ckpt_model *m, int rank, int world,
                                       double shard_timeout);
DT_API dt_status dt_ckpt_writer_save(dt_ckpt_writer *w, const dt_train_state *s);
/* Parameter servers outside mode sync write the checkpoints; each worker's
 * own state (a gradient codec's residuals: dt_ckpt_model.extra) goes
 * beside the servers' shards, in DIR/step-N/worker-R-of-W.safetensors,
 * which the worker writes (dt_ckpt_write_own, atomically) before it asks
 * for the checkpoint. Server 0's writer then waits (shard_timeout) for
 * those `files` files too before it completes the checkpoint
 * (dt_ckpt_writer_expect_own; a directory even with one server). */
DT_API void dt_ckpt_writer_expect_own(dt_ckpt_writer *w, int files);
DT_API dt_status dt_ckpt_write_own(const char *dir, const dt_ckpt_model *m, const dt_train_state *s, int rank,
                                   int world);
/* Worker `part`'s own file of sharded checkpoint path, verified and open,
 * as dt_ckpt_open_part; *parts: how many workers wrote them (0: none, and
 * for a whole checkpoint). part = -1 opens nothing. */
DT_API dt_status dt_ckpt_open_own(const char *path, int part, dt_st_file **out, int *parts);
/* After a rank died and a spare took its place (--spares): waits for the
 * write in flight; a sharded one whose shards are not all there gives up
 * waiting for them (its directory stays without COMPLETE: resume skips it,
 * the next writer removes it), and an error of that write is logged as a
 * warning and forgotten, so that the next save goes on. */
DT_API void dt_ckpt_writer_abandon(dt_ckpt_writer *w);
/* Waits for the write in flight; returns the first failed write's status. */
DT_API dt_status dt_ckpt_writer_wait(dt_ckpt_writer *w);
/* 1 when the newest write was given up (object storage, above), its
 * message into msg[n]; 0 when it was written (or none was). */
DT_API int dt_ckpt_writer_failed(dt_ckpt_writer *w, char *msg, size_t n);
/* 1 when no save is waiting or being written (dt_ckpt_writer_wait would
 * return at once); never blocks. */
DT_API int dt_ckpt_writer_idle(dt_ckpt_writer *w);
/* Saves so far, the longest / total pause they caused training, and the
 * longest write (in the background), in seconds. */
DT_API void dt_ckpt_writer_stats(const dt_ckpt_writer *w, int *saves, double *max_pause,
                                 double *total_pause, double *max_write);
/* Finishes the write in flight (after a failure too: this rank's own file
 * is written); a sharded one on rank 0, its own shard written, waits up to
 * DT_CKPT_LINGER seconds more for the other ranks' shards, which their
 * writers are finishing the same way, before it leaves the checkpoint
 * without COMPLETE. */
#define DT_CKPT_LINGER 2.0
DT_API void dt_ckpt_writer_free(dt_ckpt_writer *w);

#ifdef __cplusplus
}
#endif
#endif
