/* HDF5 datasets through libhdf5 (data.h): a classifier's images and labels
 * from named datasets of one file, and the writer behind `dtrain
 * convert-data`. What the file holds under each name is described first
 * (dt_hdf5_desc) and checked by dt_hdf5_check before anything is read.
 * libhdf5 (Debian's serial build) is not thread-safe: only the calling
 * thread uses it, while the data loads; the loader threads see decoded
 * memory alone. */
#include "dtrain/data.h"

#include <errno.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// An object (s3://) read whole into memory and opened as a file image
// (libhdf5's core driver): the data set is read into memory anyway.
static dt_status open_object(const char *path, hid_t *f) {
    dt_rfile *r;
    dt_status st = dt_rfile_open(&r, path);
    if (st != DT_OK) return st;
    uint64_t n = dt_rfile_size(r);
    void *buf = n && n <= ((uint64_t)1 << 32) ? malloc(n) : NULL;
    if (!buf) st = n ? dt_error(DT_ERR_NOMEM, "%s: out of memory for its %llu bytes", path, (unsigned long long)n)
                     : dt_error(DT_ERR_FORMAT, "%s: not an HDF5 file (empty)", path);
    if (st == DT_OK) st = dt_rfile_read(r, 0, buf, n);
    dt_rfile_close(r);
    hid_t fapl = st == DT_OK ? H5Pcreate(H5P_FILE_ACCESS) : -1;
    if (fapl >= 0 && H5Pset_fapl_core(fapl, 1 << 20, 0) >= 0 && H5Pset_file_image(fapl, buf, n) >= 0)
        *f = H5Fopen(path, H5F_ACC_RDONLY, fapl);  // (the image is copied: buf goes)
    if (fapl >= 0) H5Pclose(fapl);
    free(buf);
    return st;
}

static dt_status open_file(const char *path, hid_t *f) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);  // errors come back as statuses, not printed
    *f = -1;
    if (dt_path_remote(path)) {
        dt_status st = open_object(path, f);
        if (st != DT_OK) return st;
    } else {
        int fd;  // (a FIFO or a device would block libhdf5's open)
        if (dt_open_read(path, &fd) != DT_OK) return DT_ERR_IO;
        close(fd);
        *f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    }
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

dt_status dt_dataset_load_hdf5(dt_dataset *ds, const char *path, const char *images, const char *labels,
                               int classes, float mean, float std, int cache) {
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
    size_t bytes = (size_t)n * shape[0] * shape[1] * shape[2];
    px = malloc(bytes ? bytes : 1);
    y = malloc(sizeof *y * (size_t)n);
    if (!px || !y) {
        st = dt_error(DT_ERR_NOMEM, "%s: dataset '%s': out of memory for %zu bytes", path, images, bytes);
        goto done;
    }
    if (H5Dread(di, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, px) < 0) {
        st = dt_error(DT_ERR_FORMAT, "%s: dataset '%s': libhdf5 cannot read it (damaged file?)", path, images);
        goto done;
    }
    if (H5Dread(dl, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, y) < 0) {
        st = dt_error(DT_ERR_FORMAT, "%s: dataset '%s': libhdf5 cannot read it (damaged file?)", path, labels);
        goto done;
    }
    char what[1200];
    snprintf(what, sizeof what, "%s: dataset '%s'", path, labels);
    st = dt_dataset_from_u8(ds, px, y, (int)n, shape, classes, mean, std, cache, what);
done:
    close_all(f, di, dl);
    free(px);
    free(y);
    return st;
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
