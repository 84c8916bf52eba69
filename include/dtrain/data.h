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

/* Reads and parses a whole IDX file (plain or gzip), inflating no more than
 * its header announces (at most 4 GiB): *buf is malloc'ed (caller frees),
 * out->data points into it. */
DT_API dt_status dt_idx_read(const char *path, uint8_t **buf, dt_idx *out);
/* Reads rows [first, first + rows) of an IDX file along its first
 * dimension (*total of them in the file) and nothing else but its header:
 * a plain file (or object) by ranges, its length checked against the
 * header; a gzip file inflated from its start up to the rows' end (its
 * compressed bytes before them are read too), trailing data looked for
 * when the rows reach the end. out describes what was read (dims[0] =
 * rows, count its bytes, data in *buf, caller frees). */
DT_API dt_status dt_idx_read_rows(const char *path, int64_t first, int64_t rows, int64_t *total, uint8_t **buf,
                                  dt_idx *out);

/* The image and label files of one split of an IDX data set in dir, named
 * the MNIST family's way: DIR/PREFIX-images-idx3-ubyte and
 * DIR/PREFIX-labels-idx1-ubyte (PREFIX "train" or "t10k"), each found as
 * NAME.gz or, when that is absent, NAME (a plain file under either name
 * reads as well). Writes the paths (n bytes each); DT_ERR_IO naming both
 * names when neither exists. */
DT_API dt_status dt_idx_find_split(const char *dir, const char *prefix, char *images, char *labels, size_t n);

/* Bytes this process has read from data files (token, IDX and HDF5 files:
 * their bytes as stored, compressed or not, headers included) since it
 * started: summary.json's io.ranks_data_read_bytes. */
DT_API uint64_t dt_data_bytes_read(void);

/* ---- in-memory datasets ------------------------------------------------------ */

typedef struct {
    int n;              /* samples held: the file's [first, first + n) */
    int first;          /* the file's index of the first sample held (0 unless a shard: dt_loader_shard) */
    int total;          /* samples in the file (n unless a shard) */
    int shape[3];       /* per-sample shape {C, H, W} */
    int classes;
    float *x;           /* n * C*H*W decoded floats (the cache), or NULL when
                           the samples are kept as the file's bytes in raw */
    int32_t *y;         /* n labels in [0, classes) */
    uint8_t *raw;       /* n * C*H*W bytes, when x is NULL ([data] cache = false) */
    float scale, shift; /* a byte v decodes to v * scale + shift */
} dt_dataset;

/* Loads an image/label IDX pair (e.g. train-images-idx3-ubyte.gz and
 * train-labels-idx1-ubyte.gz), scales pixels to [0,1] and then applies
 * (x - mean) / std. Checks that counts match and labels are < classes.
 * cache as for dt_dataset_from_u8. */
DT_API dt_status dt_dataset_load_idx(dt_dataset *ds, const char *images, const char *labels,
                                     int classes, float mean, float std, int cache);
/* The same for samples [first, first + rows) alone (a rank's shard,
 * dt_loader_shard), read by dt_idx_read_rows; ds->first and ds->total say
 * where they lie in the files. */
DT_API dt_status dt_dataset_load_idx_rows(dt_dataset *ds, const char *images, const char *labels, int classes,
                                          float mean, float std, int cache, int first, int rows);
/* A dataset from n samples of shape[3] bytes each (pixels[n * C*H*W],
 * copied) and their labels[n]: a byte v decodes to (v / 255 - mean) / std.
 * cache = 1 decodes every sample now and keeps the floats (ds->x); cache =
 * 0 keeps the bytes (ds->raw) and dt_dataset_sample decodes on each use.
 * Labels outside [0, classes) are refused, the message naming `what`
 * (the labels' file and dataset) and the sample. */
DT_API dt_status dt_dataset_from_u8(dt_dataset *ds, const uint8_t *pixels, const int64_t *labels, int n,
                                    const int shape[3], int classes, float mean, float std, int cache,
                                    const char *what);
DT_API void dt_dataset_free(dt_dataset *ds);
DT_API size_t dt_dataset_sample_size(const dt_dataset *ds);
/* Sample j's dt_dataset_sample_size(ds) floats into out, decoded (j: the
 * file's index, first <= j < first + n). */
DT_API void dt_dataset_sample(const dt_dataset *ds, int j, float *out);

/* ---- HDF5 datasets (libhdf5) ------------------------------------------------- */

/* Loads images and labels from the HDF5 file at path: `images` names a
 * dataset of unsigned bytes shaped (N, H, W) or (N, C, H, W), `labels` one
 * of N integers (any width) in [0, classes); decoded as
 * dt_dataset_from_u8 does. Errors name the file and the dataset. */
DT_API dt_status dt_dataset_load_hdf5(dt_dataset *ds, const char *path, const char *images, const char *labels,
                                      int classes, float mean, float std, int cache);
/* The same for samples [first, first + rows) alone (a rank's shard,
 * dt_loader_shard): libhdf5 reads those rows of each dataset (a hyperslab:
 * a contiguous dataset's bytes of them, a chunked one's chunks that hold
 * them), through a driver that reads the file or object by ranges. */
DT_API dt_status dt_dataset_load_hdf5_rows(dt_dataset *ds, const char *path, const char *images, const char *labels,
                                           int classes, float mean, float std, int cache, int first, int rows);
/* The shape of the images dataset `images` of the HDF5 file at path, checked
 * as dt_dataset_load_hdf5 checks it: *n samples of *ss bytes each. */
DT_API dt_status dt_hdf5_images_shape(const char *path, const char *images, int64_t *n, size_t *ss);
/* Writes both splits of the IDX data set in dir (dt_idx_find_split's
 * "train" and "t10k") to a new HDF5 file at path, atomically: datasets
 * train/images, train/labels, test/images, test/labels, the bytes as the
 * IDX files hold them. *max_label: the largest label of either split (a
 * model reading the file needs more outputs than that). */
DT_API dt_status dt_hdf5_from_idx(const char *dir, const char *path, int *max_label);

/* What the HDF5 reader found for one dataset name, checked by
 * dt_hdf5_check before anything is read (no libhdf5 in it, so that a
 * fuzzer can drive it). */
typedef struct {
    const char *name;   /* the dataset's path in the file */
    int found;          /* the path exists */
    int is_dataset;     /* ... and is a dataset (not a group) */
    int type_class;     /* 0 integer, 1 float, 2 other */
    int type_size;      /* bytes per element */
    int is_signed;
    int ndim;
    int64_t dims[8];    /* the first min(ndim, 8) */
    int64_t stored;     /* bytes the file stores for it (compressed or not); -1 unknown */
    int external;       /* its data lies outside the file (external raw storage, a virtual dataset) */
} dt_hdf5_desc;

/* Checks an images and a labels description of the file `file`: both exist
 * and are datasets, images of unsigned bytes with 3 or 4 dimensions (none
 * zero, at most 4 GiB in all, the limit of a data file), labels of
 * integers of at most 8 bytes with one dimension as long as the images'
 * first; each stores enough to hold what its shape claims (at most 1100
 * bytes for one stored: deflate expands 1032-fold at most), so a small
 * file claiming millions of samples is refused before anything is
 * allocated; neither keeps its data outside the file (external raw storage
 * or a virtual dataset could name any file on the machine). Fills shape[3] (C, H, W)
 * and *n. The message names the file and the dataset. */
DT_API dt_status dt_hdf5_check(const char *file, const dt_hdf5_desc *images, const dt_hdf5_desc *labels,
                               int shape[3], int64_t *n);

/* ---- augmentation ------------------------------------------------------------ */

/* The hooks the loader can apply to a training sample after it is decoded,
 * in the order given: each changes x[C*H*W] in place, drawing from r, which
 * is seeded by (seed, epoch, the sample's position in the epoch's order)
 * alone, so a batch is the same for any number of ranks or loader threads.
 * fill is the decoded value of a zero byte (the padding). */
typedef struct {
    int crop_pad;       /* crop: pixels of padding on each side */
} dt_augment_params;

typedef void (*dt_augment_fn)(float *x, const int shape[3], float fill, const dt_augment_params *p, dt_rng *r);

typedef struct {
    const char *name;   /* as [data] augment lists it */
    dt_augment_fn fn;
} dt_augment_op;

#define DT_MAX_AUGMENT 8
/* The table: "crop" (a random H x W window of the image padded by
 * crop_pad on each side), "flip" (left-right with probability 1/2). */
DT_API const dt_augment_op *dt_augment_ops(int *n);
/* Parses a list of hook names separated by commas or blanks ("crop, flip")
 * into indices of the table: *n of them (at most DT_MAX_AUGMENT). DT_ERR_ARG
 * naming an unknown hook and the known ones. */
DT_API dt_status dt_augment_parse(const char *text, int *ids, int *n);

/* ---- loader -------------------------------------------------------------------- */

typedef enum { DT_SAMPLER_SHUFFLED = 0, DT_SAMPLER_BALANCED = 1 } dt_sampler;

typedef struct {
    int batch;        /* global batch size (all ranks together) */
    int shuffle;      /* reshuffle each epoch */
    int sampler;      /* dt_sampler: balanced draws each batch's classes evenly
                         (each class reshuffled, and cycled when it runs out) */
    int drop_last;    /* drop the last partial global batch (else it is smaller) */
    int prefetch;     /* assemble the next batch in the background */
    int threads;      /* loader threads assembling a batch, each a part of its samples */
    uint64_t seed;    /* epoch e's order is a function of (seed, e) alone */
    int rank, world;  /* this rank takes its share of every global batch */
    int augment[DT_MAX_AUGMENT], naugment;   /* hooks of dt_augment_ops, in order */
    dt_augment_params aug;
    int max_share;    /* the largest share dt_loader_set_shares may give (0: the even split's) */
    int shard;        /* the sharded order ([data] shard = ranks, docs/data.md): each epoch rank r's shares of
                         the global batches come from its shard of the file alone (dt_loader_shard), shuffled
                         within it; the dataset holds that shard. Not with the balanced sampler, nor moving
                         shares (dt_loader_set_shares) or another rank's part (dt_loader_seek) */
} dt_loader_params;

DT_API dt_loader_params dt_loader_default_params(void);

/* Rank `rank`'s shard of n samples in the sharded order: samples [*first,
 * *first + *count) of the file, as many as the even split of an epoch's
 * global batches of `batch` gives the rank (its share of each, the last,
 * partial one too), after the shards of ranks 0 .. rank-1. Together the
 * world's shards are the file, each read by one rank alone. */
DT_API void dt_loader_shard(int n, int batch, int world, int rank, int *first, int *count);

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
/* Positions the loader at global batch k of the current epoch, whose part
 * `part` of the even split (0 <= part < world) the next dt_loader_next
 * fetches instead of this rank's (parameter servers' dynamic sharing: any
 * worker may train any part); nothing is prefetched until the next
 * dt_loader_start_epoch. part < 0: this rank's part again. */
DT_API void dt_loader_seek(dt_loader *l, int64_t k, int part);
/* Fetches the next global batch's share for this rank into *b. Returns 1,
 * or 0 when the epoch is over. */
DT_API int dt_loader_next(dt_loader *l, dt_batch *b);
/* Seconds the caller spent waiting in dt_loader_next since the last call to
 * this function (the part of data loading that prefetch did not hide). */
DT_API double dt_loader_wait_seconds(dt_loader *l);
/* Splits the global batches assembled from now on unevenly: each is cut
 * into nunits equal pieces (piece j: samples [gb * j / nunits, gb * (j + 1)
 * / nunits)), and rank r takes units[r] consecutive pieces after those of
 * ranks 0..r-1 (units[world], summing to nunits). NULL: the even split
 * again. DT_ERR_ARG when a share would pass max_share. */
DT_API dt_status dt_loader_set_shares(dt_loader *l, const int *units, int nunits);

#ifdef __cplusplus
}
#endif
#endif
