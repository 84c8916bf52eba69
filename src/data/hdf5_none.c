/* HDF5 data in a build without libhdf5 (CMakeLists.txt: DTRAIN_HDF5):
 * every entry refuses by name, saying how to get it. */
#include "dtrain/data.h"

static dt_status missing(const char *path) {
    return dt_error(DT_ERR_ARG, "%s: HDF5 data needs libhdf5, which this build of dtrain lacks (install "
                    "libhdf5-dev and rebuild)", path ? path : "HDF5");
}

dt_status dt_hdf5_images_shape(const char *path, const char *images, int64_t *n, size_t *ss) {
    (void)images, (void)n, (void)ss;
    return missing(path);
}

dt_status dt_dataset_load_hdf5(dt_dataset *ds, const char *path, const char *images, const char *labels,
                               int classes, float mean, float std, int cache) {
    (void)ds, (void)images, (void)labels, (void)classes, (void)mean, (void)std, (void)cache;
    return missing(path);
}

dt_status dt_hdf5_from_idx(const char *dir, const char *path, int *max_label) {
    (void)dir, (void)max_label;
    return missing(path);
}

dt_status dt_dataset_load_hdf5_rows(dt_dataset *ds, const char *path, const char *images, const char *labels,
                                    int classes, float mean, float std, int cache, int first, int rows) {
    (void)ds, (void)images, (void)labels, (void)classes, (void)mean, (void)std, (void)cache, (void)first, (void)rows;
    return missing(path);
}
