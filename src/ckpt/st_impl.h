/* Shared inside src/ckpt: building, opening and checking safetensors files. */
#ifndef DT_CKPT_ST_IMPL_H
#define DT_CKPT_ST_IMPL_H

#include "dtrain/ckpt.h"

/* *out = the tensor `name` of f if it has this dtype and shape; otherwise
 * `code` with a message naming path, the tensor, and both shapes. */
dt_status dt_st_expect(const dt_st_file *f, const char *path, const char *name, dt_dtype dtype, int ndim,
                       const int64_t *shape, dt_status code, const dt_st_tensor **out);

/* A safetensors file built in memory, as dt_st_write would write it, and
 * parsed back (`what` names it in errors). */
dt_status dt_st_build(dt_st_file **out, const dt_st_tensor *tensors, int n, const dt_st_meta *meta, int nmeta,
                      const char *what);

/* The one reader of weights and checkpoints (checkpoint.c): path is a file
 * or a sharded checkpoint's directory (gathered whole in memory, every shard
 * verified); a file that carries a checkpoint's metadata is verified (format
 * version, checksum, every value in range) before it is returned. A lone
 * shard is DT_ERR_CONFIG. *is_ckpt (may be NULL): whether it is a
 * checkpoint rather than plain weights. */
dt_status dt_ckpt_open(const char *path, dt_st_file **out, int *is_ckpt);

/* Metadata value for key, or for a checkpoint the value its weights file
 * had (the "key=value" lines of its weights_meta, copied into buf of n
 * bytes); NULL if neither. */
const char *dt_st_weights_meta_get(const dt_st_file *f, const char *key, char *buf, size_t n);

/* "[1024, 784]" */
void dt_st_format_shape(char *buf, size_t n, const int64_t *shape, int ndim);

#endif
