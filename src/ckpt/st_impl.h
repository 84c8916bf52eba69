/* Shared inside src/ckpt: checking a tensor of a safetensors file. */
#ifndef DT_CKPT_ST_IMPL_H
#define DT_CKPT_ST_IMPL_H

#include "dtrain/ckpt.h"

/* *out = the tensor `name` of f if it has this dtype and shape; otherwise
 * `code` with a message naming path, the tensor, and both shapes. */
dt_status dt_st_expect(const dt_st_file *f, const char *path, const char *name, dt_dtype dtype, int ndim,
                       const int64_t *shape, dt_status code, const dt_st_tensor **out);

/* "[1024, 784]" */
void dt_st_format_shape(char *buf, size_t n, const int64_t *shape, int ndim);

#endif
