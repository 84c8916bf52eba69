/*
 * dtrain/data.h - datasets, IDX files, and a sharded, prefetching loader.
 */
#ifndef DTRAIN_DATA_H
#define DTRAIN_DATA_H

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- IDX files (MNIST / Fashion-MNIST), plain or gzip ----------------------- */

/* A parsed IDX array of unsigned bytes (type 0x08): dims[0..ndim), data
 * points into the buffer that was parsed. */
typedef struct {
    int ndim;
    int32_t dims[4];
    const uint8_t *data;
    size_t count;   /* product of dims */
} dt_idx;

/* Parses an IDX buffer; checks the magic, the element type, the dimension
 * count and that the buffer holds exactly the data its header announces.
 * `what` names the source in error messages. */
DT_API dt_status dt_idx_parse(const uint8_t *buf, size_t len, const char *what, dt_idx *out);

/* Reads only the header of an IDX file (plain or gzip): fills ndim, dims and
 * count, data NULL. Checks as dt_idx_parse does, but not the data's length. */
DT_API dt_status dt_idx_read_header(const char *path, dt_idx *out);

/* The image and label files of one split of an IDX data set in dir, named
 * the MNIST family's way: DIR/PREFIX-images-idx3-ubyte and
 * DIR/PREFIX-labels-idx1-ubyte (PREFIX "train" or "t10k"), each found as
 * NAME.gz or, when that is absent, NAME (a plain file under either name
 * reads as well). Writes the paths (n bytes each); DT_ERR_IO naming both
 * names when neither exists. */
DT_API dt_status dt_idx_find_split(const char *dir, const char *prefix, char *images, char *labels, size_t n);

/* ---- in-memory datasets ------------------------------------------------------ */

typedef struct {
    int n;              /* samples */
    int shape[3];       /* per-sample shape {C, H, W} */
    int classes;
    float *x;           /* n * C*H*W floats */
    int32_t *y;         /* n labels in [0, classes) */
} dt_dataset;

/* Loads an image/label IDX pair (e.g. train-images-idx3-ubyte.gz and
 * train-labels-idx1-ubyte.gz), scales pixels to [0,1] and then applies
 * (x - mean) / std. Checks that counts match and labels are < classes. */
DT_API dt_status dt_dataset_load_idx(dt_dataset *ds, const char *images, const char *labels,
                                     int classes, float mean, float std);
DT_API void dt_dataset_free(dt_dataset *ds);
DT_API size_t dt_dataset_sample_size(const dt_dataset *ds);

/* ---- loader -------------------------------------------------------------------- */

typedef struct {
    int batch;        /* global batch size (all ranks together) */
    int shuffle;      /* reshuffle each epoch */
    int drop_last;    /* drop the last partial global batch (else it is smaller) */
    int prefetch;     /* assemble the next batch on a background thread */
    uint64_t seed;    /* epoch e's order is a function of (seed, e) alone */
    int rank, world;  /* this rank takes its share of every global batch */
} dt_loader_params;

DT_API dt_loader_params dt_loader_default_params(void);

typedef struct dt_loader dt_loader;

typedef struct {
    const float *x;     /* B * sample_size floats, valid until the next call */
    const int32_t *y;   /* B labels */
    int B;              /* this rank's samples (0 when a short last global
                           batch has fewer samples than there are ranks) */
    int global_B;       /* samples in the whole global batch */
    int first;          /* position of this rank's first sample in it */
} dt_batch;

/* The loader keeps a pointer to ds, which must outlive it. */
DT_API dt_status dt_loader_create(dt_loader **out, const dt_dataset *ds,
                                  const dt_loader_params *p);
DT_API void dt_loader_free(dt_loader *l);
/* Global batches in one epoch. */
DT_API int64_t dt_loader_steps_per_epoch(const dt_loader *l);
/* Starts epoch `epoch` at global batch `start` (0 normally; a later batch
 * when resuming mid-epoch). */
DT_API void dt_loader_start_epoch(dt_loader *l, int64_t epoch, int64_t start);
/* Fetches the next global batch's share for this rank into *b. Returns 1,
 * or 0 when the epoch is over. */
DT_API int dt_loader_next(dt_loader *l, dt_batch *b);
/* Seconds the caller spent waiting in dt_loader_next since the last call to
 * this function (the part of data loading that prefetch did not hide). */
DT_API double dt_loader_wait_seconds(dt_loader *l);

#ifdef __cplusplus
}
#endif
#endif
