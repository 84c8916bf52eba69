/* The loader alone: samples/s that dt_loader_next delivers on Fashion-MNIST
 * (IDX or HDF5), with no training behind it, so that its rate can be put
 * beside the model's (bench/loader.py).
 *
 *   bench_loader [--dir DIR | --hdf5 FILE] [--augment LIST] [--crop-pad P] [--cache 0|1]
 *                [--threads T] [--prefetch 0|1] [--sampler shuffled|balanced] [--batch B]
 *                [--epochs E] [--json]
 *
 * --threads 1 --prefetch 0 (the default) is one thread: the caller's own. */
#include "dtrain/dtrain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    const char *dir = "/usr/share/datasets/fashion-mnist", *h5 = NULL, *augment = "";
    int cache = 1, threads = 1, prefetch = 0, batch = 64, epochs = 2, json = 0, balanced = 0, pad = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) json = 1;
        else if (!v) goto usage;
        else if (!strcmp(a, "--dir")) dir = argv[++i];
        else if (!strcmp(a, "--hdf5")) h5 = argv[++i];
        else if (!strcmp(a, "--augment")) augment = argv[++i];
        else if (!strcmp(a, "--crop-pad")) pad = atoi(argv[++i]);
        else if (!strcmp(a, "--cache")) cache = atoi(argv[++i]);
        else if (!strcmp(a, "--threads")) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--prefetch")) prefetch = atoi(argv[++i]);
        else if (!strcmp(a, "--sampler")) balanced = !strcmp(argv[++i], "balanced");
        else if (!strcmp(a, "--batch")) batch = atoi(argv[++i]);
        else if (!strcmp(a, "--epochs")) epochs = atoi(argv[++i]);
        else goto usage;
    }
    dt_dataset ds;
    char img[1024], lab[1024];
    double t0 = dt_now();
    dt_status st = h5 ? dt_dataset_load_hdf5(&ds, h5, "train/images", "train/labels", 10, 0.2860f, 0.3530f, cache)
                      : dt_idx_find_split(dir, "train", img, lab, sizeof img);
    if (st == DT_OK && !h5) st = dt_dataset_load_idx(&ds, img, lab, 10, 0.2860f, 0.3530f, cache);
    double load = dt_now() - t0;
    dt_loader_params p = dt_loader_default_params();
    p.batch = batch;
    p.threads = threads;
    p.prefetch = prefetch;
    p.sampler = balanced ? DT_SAMPLER_BALANCED : DT_SAMPLER_SHUFFLED;
    p.aug.crop_pad = pad;
    dt_loader *l = NULL;
    if (st == DT_OK) st = dt_augment_parse(augment, p.augment, &p.naugment);
    if (st == DT_OK) st = dt_loader_create(&l, &ds, &p);
    if (st != DT_OK) {
        fprintf(stderr, "bench_loader: %s\n", dt_last_error());
        return 1;
    }
    long samples = 0;
    double sum = 0;  // touch what was delivered
    t0 = dt_now();
    for (int e = 0; e < epochs; e++) {
        dt_loader_start_epoch(l, e, 0);
        dt_batch b;
        while (dt_loader_next(l, &b)) {
            samples += b.B;
            sum += b.x[0] + b.y[b.B - 1];
        }
    }
    double dt = dt_now() - t0;
    if (json)
        printf("{\"samples\": %ld, \"seconds\": %.6f, \"samples_per_sec\": %.1f, \"load_seconds\": %.3f, \"check\": %g}\n",
               samples, dt, samples / dt, load, sum);
    else
        printf("%ld samples in %.3f s: %.0f samples/s (data loaded in %.2f s)\n", samples, dt, samples / dt, load);
    dt_loader_free(l);
    dt_dataset_free(&ds);
    return 0;
usage:
    fprintf(stderr, "usage: bench_loader [--dir DIR | --hdf5 FILE] [--augment LIST] [--crop-pad P] [--cache 0|1] "
                    "[--threads T] [--prefetch 0|1] [--sampler shuffled|balanced] [--batch B] [--epochs E] [--json]\n");
    return 2;
}
