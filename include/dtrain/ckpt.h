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

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *name;
    dt_dtype dtype;
    int ndim;
    int64_t shape[8];
    const void *data;  /* nbytes of raw little-endian elements */
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

typedef struct dt_st_file dt_st_file;

/* Reads and validates a whole file: header length, JSON, dtypes, shapes
 * against byte ranges, ranges inside the file and not overlapping. */
DT_API dt_status dt_st_open(dt_st_file **out, const char *path);
/* The same from a buffer, which is copied; `what` names it in errors. */
DT_API dt_status dt_st_parse(dt_st_file **out, const uint8_t *buf, size_t len,
                             const char *what);
DT_API void dt_st_close(dt_st_file *f);
DT_API int dt_st_count(const dt_st_file *f);
DT_API const dt_st_tensor *dt_st_get(const dt_st_file *f, int i);
DT_API const dt_st_tensor *dt_st_find(const dt_st_file *f, const char *name);
/* Metadata value for key, or NULL. */
DT_API const char *dt_st_meta_get(const dt_st_file *f, const char *key);

/* Saves every parameter tensor of m under its name (dt_model_tensor). */
DT_API dt_status dt_model_save(dt_model *m, const char *path, const dt_st_meta *meta, int nmeta);
/* Loads parameters saved by dt_model_save; every tensor of the model must be
 * present with the same shape and dtype F32, else DT_ERR_FORMAT naming it. */
DT_API dt_status dt_model_load(dt_model *m, const char *path);

#ifdef __cplusplus
}
#endif
#endif
