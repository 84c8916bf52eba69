/* Shared inside src/ckpt: building, opening and checking safetensors files. */
#ifndef DT_CKPT_ST_IMPL_H
#define DT_CKPT_ST_IMPL_H

#include "dtrain/ckpt.h"

/* *out = the tensor `name` of f if it has this dtype and shape; otherwise
 * `code` with a message naming path, the tensor, and both shapes. */
dt_status dt_st_expect(const dt_st_file *f, const char *path, const char *name, dt_dtype dtype, int ndim,
                       const int64_t *shape, dt_status code, const dt_st_tensor **out);

/* A view of tensors that lie in other files (a sharded checkpoint's
 * shards, gathered): metadata meta (a cJSON object; NULL: none), reading
 * kids[nkids] (both taken: freed with the view, also on failure; NULL when
 * out of memory, recorded). Tensors are added one at a time
 * (dt_st_compose_add: t's name, dtype, shape, nbytes), each followed by the
 * ranges of the kids' tensors that make it, in order (dt_st_compose_take:
 * elements [first, first + n) of kt, a tensor of kid); dt_st_compose_end
 * checks that every tensor is whole. The view reads through the kids'
 * descriptors: nothing is copied. */
struct cJSON;
dt_st_file *dt_st_compose(const char *what, struct cJSON *meta, dt_st_file **kids, int nkids);
dt_status dt_st_compose_add(dt_st_file *v, const dt_st_tensor *t);
/* The view's kid i (as given to dt_st_compose), or NULL. */
dt_st_file *dt_st_compose_kid(const dt_st_file *v, int i);
dt_status dt_st_compose_take(dt_st_file *v, const dt_st_file *kid, const dt_st_tensor *kt, size_t first, size_t n);
dt_status dt_st_compose_end(dt_st_file *v);

/* Metadata value for key, or for a checkpoint the value its weights file
 * had (the "key=value" lines of its weights_meta, copied into buf of n
 * bytes); NULL if neither. */
const char *dt_st_weights_meta_get(const dt_st_file *f, const char *key, char *buf, size_t n);

/* "[1024, 784]" */
void dt_st_format_shape(char *buf, size_t n, const int64_t *shape, int ndim);

#endif
