/* HDF5 datasets through libhdf5 (data.h): a classifier's images and labels
 * from named datasets of one file, and the writer behind `dtrain
 * convert-data`. What the file holds under each name is described first
 * (dt_hdf5_desc) and checked by dt_hdf5_check before anything is read.
 * libhdf5 (Debian's serial build) is not thread-safe: only the calling
 * thread uses it, while the data loads; the loader threads see decoded
 * memory alone. Files and objects (s3://) alike are read by ranges through
 * a file driver of dtrain's (below): a rank's shard of the samples reads
 * their bytes and the metadata alone. */
#include "dtrain/data.h"
#include "data/data_io.h"

#include <errno.h>
#include <H5FDpublic.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// the file driver: libhdf5 reads a file or an object (s3://) by ranges,
// through dt_rfile (an object's small reads, the metadata's, come from a
// 16 KiB read-ahead block; a dataset's rows are one large read, fetched in
// pieces). Read-only; every byte read counts in dt_data_bytes_read.

#define RF_BLOCK ((size_t)16 << 10)

typedef struct {
    H5FD_t pub;  // (libhdf5's part, first)
    dt_rfile *f;
    haddr_t eoa, eof;
} rf_file;

static dt_status rf_err;  // the last open's or read's failure (its message recorded): libhdf5 says only that it failed

static H5FD_t *rf_open(const char *name, unsigned flags, hid_t fapl, haddr_t maxaddr) {
    (void)fapl, (void)maxaddr;
    rf_file *r = calloc(1, sizeof *r);
    if ((flags & (H5F_ACC_RDWR | H5F_ACC_TRUNC | H5F_ACC_CREAT | H5F_ACC_EXCL)) || !r) {
        free(r);
        rf_err = dt_error(DT_ERR_INTERNAL, "%s: the data files' driver reads, and was asked to write", name);
        return NULL;
    }
    if ((rf_err = dt_rfile_open(&r->f, name)) != DT_OK) {
        free(r);
        return NULL;
    }
    dt_rfile_set_block(r->f, RF_BLOCK);
    r->eof = (haddr_t)dt_rfile_size(r->f);
    return &r->pub;
}

static herr_t rf_close(H5FD_t *f) {
    rf_file *r = (rf_file *)f;
    dt_rfile_close(r->f);
    free(r);
    return 0;
}

static int rf_cmp(const H5FD_t *a, const H5FD_t *b) { return a < b ? -1 : a > b; }  // (each open its own file)

static herr_t rf_query(const H5FD_t *f, unsigned long *flags) {
    (void)f;
    *flags = H5FD_FEAT_DATA_SIEVE | H5FD_FEAT_ACCUMULATE_METADATA;
    return 0;
}

static haddr_t rf_get_eoa(const H5FD_t *f, H5FD_mem_t type) {
    (void)type;
    return ((const rf_file *)f)->eoa;
}

static herr_t rf_set_eoa(H5FD_t *f, H5FD_mem_t type, haddr_t addr) {
    (void)type;
    ((rf_file *)f)->eoa = addr;
    return 0;
}

static haddr_t rf_get_eof(const H5FD_t *f, H5FD_mem_t type) {
    (void)type;
    return ((const rf_file *)f)->eof;
}

// Bytes past the end read as zeros, as libhdf5's own drivers give them.
static herr_t rf_read(H5FD_t *f, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size, void *buf) {
    (void)type, (void)dxpl;
    rf_file *r = (rf_file *)f;
    size_t n = addr >= r->eof ? 0 : r->eof - addr < size ? (size_t)(r->eof - addr) : size;
    if (n && (rf_err = dt_rfile_read(r->f, addr, buf, n)) != DT_OK) return -1;
    memset((uint8_t *)buf + n, 0, size - n);
    dt_data_read_count(n);
    return 0;
}

static herr_t rf_write(H5FD_t *f, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size, const void *buf) {
    (void)f, (void)type, (void)dxpl, (void)addr, (void)size, (void)buf;
    return -1;
}

static herr_t rf_flush(H5FD_t *f, hid_t dxpl, hbool_t closing) {
    (void)f, (void)dxpl, (void)closing;
    return 0;
}

static const H5FD_class_t rf_class = {
#if H5_VERSION_GE(1, 13, 2)  // (the class's version and value, from libhdf5 1.14 on; built and tested with 1.10)
    .version = H5FD_CLASS_VERSION,
    .value = (H5FD_class_value_t)511,
#endif
    .name = "dtrain-rfile",
    .maxaddr = ((haddr_t)1 << 62) - 1,
    .fc_degree = H5F_CLOSE_WEAK,
    .open = rf_open,
    .close = rf_close,
    .cmp = rf_cmp,
    .query = rf_query,
    .get_eoa = rf_get_eoa,
    .set_eoa = rf_set_eoa,
    .get_eof = rf_get_eof,
    .read = rf_read,
    .write = rf_write,
    .flush = rf_flush,
    .fl_map = H5FD_FLMAP_DICHOTOMY,
};

// A file access list with the driver above (registered once).
static hid_t rf_fapl(void) {
    static hid_t id = -1;
    if (id < 0 || H5Iis_valid(id) <= 0) id = H5FDregister(&rf_class);
    hid_t fapl = id >= 0 ? H5Pcreate(H5P_FILE_ACCESS) : -1;
    if (fapl >= 0 && H5Pset_driver(fapl, id, NULL) < 0) {
        H5Pclose(fapl);
        fapl = -1;
    }
    return fapl;
}

static dt_status open_file(const char *path, hid_t *f) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);  // errors come back as statuses, not printed
    *f = -1;
    hid_t fapl = rf_fapl();
    if (fapl < 0) return dt_error(DT_ERR_INTERNAL, "%s: libhdf5 does not take dtrain's file driver", path);
    rf_err = DT_OK;
    *f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    H5Pclose(fapl);
    if (*f < 0 && rf_err != DT_OK) return rf_err;  // (cannot open or read it: the message says why)
    if (*f < 0)
        return dt_error(DT_ERR_FORMAT, "%s: not an HDF5 file (or a damaged one): libhdf5 cannot open it", path);
    return DT_OK;
}

// What `name` is in f: *d filled; the dataset open in *ds (or -1).
static void describe(hid_t f, const char *name, dt_hdf5_desc *d, hid_t *ds) {
    memset(d, 0, sizeof *d);
    d->name = name;
    *ds = -1;
    // Every link on the way must exist before H5Lexists may be asked about
    // the next (it fails on a missing group).
    char path[1024];
    size_t len = strlen(name);
    if (len == 0 || len >= sizeof path) return;
    memcpy(path, name, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (path[i] != '/' && path[i] != 0) continue;
        char c = path[i];
        path[i] = 0;
        int ok = H5Lexists(f, path, H5P_DEFAULT) > 0;
        path[i] = c;
        if (!ok) return;
    }
    // H5Oopen and H5Iget_type: the same calls in every libhdf5 since 1.8
    // (H5Oget_info's signature changed in 1.12).
    hid_t o = H5Oopen(f, name, H5P_DEFAULT);
    if (o < 0) return;
    d->found = 1;
    int is_ds = H5Iget_type(o) == H5I_DATASET;
    H5Oclose(o);
    if (!is_ds || (*ds = H5Dopen2(f, name, H5P_DEFAULT)) < 0) return;
    d->is_dataset = 1;
    hid_t t = H5Dget_type(*ds), sp = H5Dget_space(*ds);
    H5T_class_t cls = H5Tget_class(t);
    d->type_class = cls == H5T_INTEGER ? 0 : cls == H5T_FLOAT ? 1 : 2;
    d->type_size = (int)H5Tget_size(t);
    d->is_signed = cls == H5T_INTEGER && H5Tget_sign(t) == H5T_SGN_2;
    int nd = H5Sget_simple_extent_ndims(sp);
    d->ndim = nd;
    if (nd > 0 && nd <= H5S_MAX_RANK) {
        hsize_t dims[H5S_MAX_RANK];
        H5Sget_simple_extent_dims(sp, dims, NULL);
        for (int i = 0; i < nd && i < 8; i++) d->dims[i] = dims[i] > INT64_MAX ? INT64_MAX : (int64_t)dims[i];
    }
    hid_t dcpl = H5Dget_create_plist(*ds);
    d->external = dcpl < 0 || H5Pget_external_count(dcpl) != 0 || H5Pget_layout(dcpl) == H5D_VIRTUAL;
    if (dcpl >= 0) H5Pclose(dcpl);
    hsize_t stored = H5Dget_storage_size(*ds);  // (0 where none is allocated: a claim with no data)
    d->stored = stored > INT64_MAX ? INT64_MAX : (int64_t)stored;
    H5Tclose(t);
    H5Sclose(sp);
}

// The file's images and labels, described, checked and open.
static dt_status open_pair(const char *path, const char *images, const char *labels, hid_t *f, hid_t *di,
                           hid_t *dl, int shape[3], int64_t *n) {
    dt_hdf5_desc im, lb;
    *di = *dl = -1;
    dt_status st = open_file(path, f);
    if (st != DT_OK) return st;
    describe(*f, images, &im, di);
    describe(*f, labels, &lb, dl);
    return dt_hdf5_check(path, &im, &lb, shape, n);
}

static void close_all(hid_t f, hid_t di, hid_t dl) {
    if (di >= 0) H5Dclose(di);
    if (dl >= 0) H5Dclose(dl);
    if (f >= 0) H5Fclose(f);
}

dt_status dt_hdf5_images_shape(const char *path, const char *images, int64_t *n, size_t *ss) {
    hid_t f, di = -1;
    dt_status st = open_file(path, &f);
    if (st != DT_OK) return st;
    dt_hdf5_desc im;
    describe(f, images, &im, &di);
    // Checked against a stand-in for labels that fits whatever the images are.
    dt_hdf5_desc lb = {.name = "", .found = 1, .is_dataset = 1, .type_size = 1, .ndim = 1, .dims = {im.dims[0]},
                       .stored = -1};
    int shape[3];
    st = dt_hdf5_check(path, &im, &lb, shape, n);
    *ss = st == DT_OK ? (size_t)shape[0] * shape[1] * shape[2] : 0;
    close_all(f, di, -1);
    return st;
}

// Rows [first, first + rows) of dataset d (all of them: rows < 0) into buf
// as type (the images' bytes, the labels as int64).
static int read_rows(hid_t d, hid_t type, int64_t first, int64_t rows, void *buf) {
    if (rows < 0) return H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0;
    hid_t fs = H5Dget_space(d);
    hsize_t start[H5S_MAX_RANK] = {0}, count[H5S_MAX_RANK];
    int nd = fs >= 0 ? H5Sget_simple_extent_dims(fs, count, NULL) : -1;
    start[0] = (hsize_t)first;
    count[0] = (hsize_t)rows;
    hid_t ms = nd > 0 ? H5Screate_simple(nd, count, NULL) : -1;
    int ok = ms >= 0 && H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) >= 0 &&
             H5Dread(d, type, ms, fs, H5P_DEFAULT, buf) >= 0;
    if (ms >= 0) H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
    return ok;
}

// Samples [first, first + rows) (rows < 0: all) of the file's images and
// labels.
static dt_status load_hdf5(dt_dataset *ds, const char *path, const char *images, const char *labels, int classes,
                           float mean, float std, int cache, int64_t first, int64_t rows) {
    memset(ds, 0, sizeof *ds);
    hid_t f, di, dl;
    int shape[3];
    int64_t n;
    uint8_t *px = NULL;
    int64_t *y = NULL;
    dt_status st = open_pair(path, images, labels, &f, &di, &dl, shape, &n);
    if (st != DT_OK) goto done;
    if (n > 0x7fffffff) {
        st = dt_error(DT_ERR_FORMAT, "%s: dataset '%s': %lld samples, at most 2^31 - 1 are read", path, images, (long long)n);
        goto done;
    }
    if (rows >= 0 && first + rows > n) {
        st = dt_error(DT_ERR_ARG, "%s: dataset '%s': samples [%lld, %lld) of %lld", path, images, (long long)first,
                      (long long)(first + rows), (long long)n);
        goto done;
    }
    int64_t m = rows < 0 ? n : rows;
    size_t bytes = (size_t)m * shape[0] * shape[1] * shape[2];
    px = malloc(bytes ? bytes : 1);
    y = malloc(sizeof *y * (size_t)(m ? m : 1));
    if (!px || !y) {
        st = dt_error(DT_ERR_NOMEM, "%s: dataset '%s': out of memory for %zu bytes", path, images, bytes);
        goto done;
    }
    const char *bad = !read_rows(di, H5T_NATIVE_UINT8, first, rows, px) ? images
                    : !read_rows(dl, H5T_NATIVE_INT64, first, rows, y)  ? labels : NULL;
    if (bad) {
        char why[1024];
        snprintf(why, sizeof why, "%s", rf_err != DT_OK ? dt_last_error() : "");
        st = rf_err != DT_OK ? dt_error(rf_err, "%s: dataset '%s': %s", path, bad, why)
                             : dt_error(DT_ERR_FORMAT, "%s: dataset '%s': libhdf5 cannot read it (damaged file?)", path, bad);
        goto done;
    }
    char what[1200];
    snprintf(what, sizeof what, "%s: dataset '%s'", path, labels);
    st = dt_dataset_from_u8(ds, px, y, (int)m, shape, classes, mean, std, cache, what);
    if (st == DT_OK) {
        ds->first = rows < 0 ? 0 : (int)first;
        ds->total = (int)n;
    }
done:
    close_all(f, di, dl);
    free(px);
    free(y);
    return st;
}

dt_status dt_dataset_load_hdf5(dt_dataset *ds, const char *path, const char *images, const char *labels,
                               int classes, float mean, float std, int cache) {
    return load_hdf5(ds, path, images, labels, classes, mean, std, cache, 0, -1);
}

dt_status dt_dataset_load_hdf5_rows(dt_dataset *ds, const char *path, const char *images, const char *labels,
                                    int classes, float mean, float std, int cache, int first, int rows) {
    if (first < 0 || rows < 0) return dt_error(DT_ERR_ARG, "%s: samples [%d, %d)", path, first, first + rows);
    return load_hdf5(ds, path, images, labels, classes, mean, std, cache, first, rows);
}

// ----------------------------------------------------------------------------
// writing

static int write_u8(hid_t f, const char *name, const uint8_t *data, int ndim, const int32_t *dims) {
    hsize_t d[4];
    for (int i = 0; i < ndim; i++) d[i] = (hsize_t)dims[i];
    hid_t sp = H5Screate_simple(ndim, d, NULL);
    hid_t ds = sp < 0 ? -1 : H5Dcreate2(f, name, H5T_STD_U8LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int ok = ds >= 0 && H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0;
    if (ds >= 0) H5Dclose(ds);
    if (sp >= 0) H5Sclose(sp);
    return ok;
}

dt_status dt_hdf5_from_idx(const char *dir, const char *path, int *max_label) {
    *max_label = 0;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    // The file is built in memory (the core driver, no backing store) and
    // written with dt_write_atomic.
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_core(fapl, 1 << 20, 0);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    if (f < 0) return dt_error(DT_ERR_INTERNAL, "%s: libhdf5 cannot create the file in memory", path);
    const char *splits[2][2] = {{"train", "train"}, {"t10k", "test"}};
    dt_status st = DT_OK;
    void *image = NULL;
    for (int s = 0; s < 2 && st == DT_OK; s++) {
        char img[1024], lab[1024], name[64];
        uint8_t *ib = NULL, *lb = NULL;
        dt_idx ii, li;
        st = dt_idx_find_split(dir, splits[s][0], img, lab, sizeof img);
        if (st == DT_OK) st = dt_idx_read(img, &ib, &ii);
        if (st == DT_OK) st = dt_idx_read(lab, &lb, &li);
        if (st == DT_OK && (ii.ndim != 3 || li.ndim != 1 || li.dims[0] != ii.dims[0]))
            st = dt_error(DT_ERR_FORMAT, "%s, %s: expected images (N, H, W) and N labels, got %d-D and %d-D", img, lab,
                          ii.ndim, li.ndim);
        hid_t g = st == DT_OK ? H5Gcreate2(f, splits[s][1], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT) : -1;
        if (g >= 0) H5Gclose(g);
        snprintf(name, sizeof name, "%s/images", splits[s][1]);
        int ok = st == DT_OK && g >= 0 && write_u8(f, name, ii.data, 3, ii.dims);
        snprintf(name, sizeof name, "%s/labels", splits[s][1]);
        ok = ok && write_u8(f, name, li.data, 1, li.dims);
        for (size_t i = 0; ok && i < li.count; i++) *max_label = li.data[i] > *max_label ? li.data[i] : *max_label;
        if (st == DT_OK && !ok) st = dt_error(DT_ERR_INTERNAL, "%s: libhdf5 cannot write the %s split", path, splits[s][1]);
        free(ib);
        free(lb);
    }
    ssize_t size = st == DT_OK && H5Fflush(f, H5F_SCOPE_GLOBAL) >= 0 ? H5Fget_file_image(f, NULL, 0) : -1;
    if (st == DT_OK && (size <= 0 || !(image = malloc((size_t)size)) || H5Fget_file_image(f, image, (size_t)size) != size))
        st = dt_error(DT_ERR_INTERNAL, "%s: libhdf5 cannot give the file's bytes", path);
    H5Fclose(f);
    if (st == DT_OK) {
        const void *parts[] = {image};
        size_t sizes[] = {(size_t)size};
        st = dt_write_atomic(path, parts, sizes, 1);
    }
    free(image);
    return st;
}
