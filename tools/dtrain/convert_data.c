/* dtrain convert-data: a classifier's IDX data set into one HDF5 file. */
#include "cli.h"
#include "dtrain/dtrain.h"

#include <stdio.h>
#include <string.h>

static const char help[] =
    "usage: dtrain convert-data --from idx DIR --to FILE.h5\n"
    "\n"
    "Writes both splits of the IDX data set in DIR (train-images-idx3-ubyte,\n"
    "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte,\n"
    "each plain or .gz) to one HDF5 file: datasets train/images, train/labels,\n"
    "test/images and test/labels, the bytes as the IDX files hold them\n"
    "(images uint8 N x H x W, labels uint8 N). A config then reads it with\n"
    "\n"
    "  [data]\n"
    "  dataset = hdf5\n"
    "  file = FILE.h5\n"
    "\n"
    "and trains on the same samples bit for bit (docs/data.md). The file is\n"
    "written atomically (a temporary file, then renamed).\n"
    "\n"
    "example:\n"
    "  dtrain convert-data --from idx /usr/share/datasets/fashion-mnist --to fashion.h5\n";

int cmd_convert_data(int argc, char **argv) {
    const char *from, *in, *out;
    int rc = cli_from_to(argc, argv, help, "DIR", "FILE.h5", &from, &in, &out);
    if (rc >= 0) return rc;
    if (strcmp(from, "idx")) return cli_error("--from '%s': expected idx", from), EXIT_USAGE;
    int top;
    if (dt_hdf5_from_idx(in, out, &top) != DT_OK) return cli_error("%s", dt_last_error()), EXIT_RUNTIME;
    int64_t n[2];
    size_t ss;
    const char *names[2] = {"train/images", "test/images"};
    for (int s = 0; s < 2; s++)
        if (dt_hdf5_images_shape(out, names[s], &n[s], &ss) != DT_OK) return cli_error("%s", dt_last_error()), EXIT_RUNTIME;
    printf("%s -> %s: %lld train and %lld test samples of %zu bytes, labels 0 to %d (a model reading it needs %d "
           "outputs or more: the reader refuses a label past its last)\n", in, out, (long long)n[0], (long long)n[1], ss,
           top, top + 1);
    return 0;
}
