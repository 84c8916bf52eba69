/*
 * allreduce.c - allreduce bandwidth and latency, nccl-tests style.
 *
 *   dtrain run -n 2 -- allreduce_bench                 dtrain (shm backend)
 *   mpirun -np 2 allreduce_bench                       dtrain over MPI (auto backend)
 *   mpirun -np 2 allreduce_bench --impl mpi            Open MPI's own MPI_Allreduce
 *   mpirun -np 2 allreduce_bench --impl shift          no allreduce: each rank sends the
 *                                                      buffer to the next rank while it
 *                                                      receives the previous one's (MPI
 *                                                      point to point): the links' rate
 *   allreduce_bench --impl memcpy                      one core copying the same
 *                                                      sizes: the machine's yardstick
 *
 * options: --min BYTES (4096) --max BYTES (256M) --dtype f32|bf16|f16
 *          --iters N (auto: ~0.25 s per size) --repeat R (report the best of
 *          R timed runs; for noisy machines) --hugepages (transparent huge
 *          pages for the buffer) --json --check
 *
 * For each size: warm-up, then N in-place allreduces (sum) timed on every
 * rank; the reported time is the slowest rank's mean. Like nccl-tests:
 *   algbw = bytes / time
 *   busbw = algbw * 2 (n-1) / n   (the traffic a ring allreduce puts on each
 *                                  link, so numbers compare across rank counts)
 * For --impl shift, busbw = algbw = bytes / time: the rate of one stream
 * each way on every rank's link, all at once (what a ring's step gets); its
 * time at a small size is the step's latency. bench/cluster.py gives both
 * to `dtrain simulate --link` as the links' measured rate and latency.
 * bench/allreduce_compare.py runs all implementations plus PyTorch Gloo in one
 * go and prints ratios.
 */
#include "dtrain/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#ifdef DTRAIN_HAVE_MPI
#include <mpi.h>
#endif

typedef struct {
    int rank, size;
    dt_comm_t comm;
    int mpi_raw;
    int shift; /* --impl shift */
    char *copy_dst; /* --impl memcpy: the reference, one core copying */
} bench;

#ifdef DTRAIN_HAVE_MPI
/* --impl shift: bytes of buf to the next rank while as many come from the
 * previous one. In 60 KiB messages (under Open MPI's TCP eager limit), all
 * posted at once, as dtrain's own exchanges send them (src/comm/mpi/mpi.c):
 * larger ones would wait for the peer's reply behind the other direction's
 * data. The wait tests and sleeps 20 us, as dtrain's waits do (wait.c),
 * instead of spinning in MPI_Waitall: on shared cores a spinning rank takes
 * the time its peer and the kernel's network work need. */
#define SHIFT_MSG ((size_t)60 << 10)
static void shift(bench *b, char *buf, size_t bytes) {
    static char *in;
    static MPI_Request *rq;
    static size_t have; /* messages that in and rq have room for */
    size_t n = bytes ? (bytes + SHIFT_MSG - 1) / SHIFT_MSG : 1;
    if (n > have) {
        free(in);
        free(rq);
        in = malloc(n * SHIFT_MSG);
        rq = malloc(2 * n * sizeof *rq);
        if (!in || !rq) exit(1);
        have = n;
    }
    int to = (b->rank + 1) % b->size, from = (b->rank + b->size - 1) % b->size, done = 0;
    for (size_t k = 0; k < n; k++) {
        size_t at = k * SHIFT_MSG, len = bytes - at < SHIFT_MSG ? bytes - at : SHIFT_MSG;
        MPI_Irecv(in + at, (int)len, MPI_BYTE, from, 0, MPI_COMM_WORLD, &rq[2 * k]);
        MPI_Isend(buf + at, (int)len, MPI_BYTE, to, 0, MPI_COMM_WORLD, &rq[2 * k + 1]);
    }
    while (MPI_Testall((int)(2 * n), rq, &done, MPI_STATUSES_IGNORE) == MPI_SUCCESS && !done) {
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
}
#endif

static void run_op(bench *b, void *buf, size_t count, dt_dtype t) {
    if (b->copy_dst) {
        memcpy(b->copy_dst, buf, count * dt_dtype_size(t));
        return;
    }
#ifdef DTRAIN_HAVE_MPI
    if (b->shift) {
        shift(b, buf, count * dt_dtype_size(t));
        return;
    }
    if (b->mpi_raw) {
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        return;
    }
#endif
    if (dt_allreduce(buf, buf, count, t, DT_SUM, b->comm) != DT_OK) {
        fprintf(stderr, "allreduce_bench: rank %d: %s\n", b->rank, dt_last_error());
        exit(1);
    }
}

static double max_over_ranks(bench *b, double v) {
    if (b->copy_dst) return v;
#ifdef DTRAIN_HAVE_MPI
    if (b->mpi_raw) {
        MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        return v;
    }
#endif
    float f = (float)v;
    dt_allreduce(&f, &f, 1, DT_F32, DT_MAX, b->comm);
    return f;
}

static void barrier(bench *b) {
    if (b->copy_dst) return;
#ifdef DTRAIN_HAVE_MPI
    if (b->mpi_raw) {
        MPI_Barrier(MPI_COMM_WORLD);
        return;
    }
#endif
    dt_barrier(b->comm);
}

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k') v *= 1024;
    else if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
    else if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
    return (size_t)v;
}

int main(int argc, char **argv) {
    size_t minb = 4096, maxb = 256u << 20;
    int json = 0, iters_fixed = 0, check = 0, repeat = 1, huge = 0;
    dt_dtype t = DT_F32;
    bench b = {0};
    const char *impl = "dtrain";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--min") && i + 1 < argc) minb = parse_size(argv[++i]);
        else if (!strcmp(argv[i], "--max") && i + 1 < argc) maxb = parse_size(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters_fixed = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--hugepages")) huge = 1;
        else if (!strcmp(argv[i], "--check")) check = 1;
        else if (!strcmp(argv[i], "--impl") && i + 1 < argc) impl = argv[++i];
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            const char *d = argv[++i];
            t = !strcmp(d, "bf16") ? DT_BF16 : !strcmp(d, "f16") ? DT_F16 : DT_F32;
        } else {
            fprintf(stderr, "usage: allreduce_bench [--impl dtrain|mpi|shift|memcpy] [--min B] [--max B] "
                            "[--iters N] [--repeat R] [--dtype f32|bf16|f16] [--hugepages] [--json] "
                            "[--check]\n");
            return 2;
        }
    }
    if (!strcmp(impl, "memcpy")) {
        b.size = 2; /* report busbw as for 2 ranks: equal to the copy rate */
        b.copy_dst = dt_alloc(maxb);
        if (!b.copy_dst) return 1;
        memset(b.copy_dst, 0, maxb);
    } else if (!strcmp(impl, "mpi") || !strcmp(impl, "shift")) {
#ifdef DTRAIN_HAVE_MPI
        MPI_Init(&argc, &argv);
        MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
        MPI_Comm_size(MPI_COMM_WORLD, &b.size);
        b.mpi_raw = 1;
        b.shift = !strcmp(impl, "shift");
        t = DT_F32;
#else
        fprintf(stderr, "allreduce_bench: built without MPI\n");
        return 2;
#endif
    } else {
        if (dt_comm_init_env(&b.comm) != DT_OK) {
            fprintf(stderr, "allreduce_bench: %s\n", dt_last_error());
            return 1;
        }
        dt_comm_set_check(b.comm, check);
        b.rank = dt_comm_rank(b.comm);
        b.size = dt_comm_size(b.comm);
    }
    const char *backend = b.copy_dst ? "memcpy" : b.shift ? "MPI_Isend/MPI_Irecv" : b.mpi_raw ? "MPI_Allreduce"
                        : dt_comm_backend(b.comm);
    size_t es = dt_dtype_size(t);
    /* --hugepages: back the buffer with transparent huge pages, as a
     * training job's gradient block can be; fewer TLB misses on big sweeps */
    char *buf = NULL;
    if (huge) {
        size_t len = (maxb + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
        if (posix_memalign((void **)&buf, 2u << 20, len) == 0) madvise(buf, len, MADV_HUGEPAGE);
        else buf = NULL;
    } else {
        buf = dt_alloc(maxb);
    }
    if (!buf) return 1;
    memset(buf, 0, maxb);
    if (repeat < 1) repeat = 1;
    if (b.rank == 0) {
        if (json)
            printf("{\"impl\": \"%s\", \"backend\": \"%s\", \"ranks\": %d, \"dtype\": \"%s\", "
                   "\"hugepages\": %d, \"results\": [\n",
                   impl, backend, b.size, dt_dtype_name(t), huge);
        else if (b.copy_dst)
            printf("# memcpy, one core, out of place (the yardstick)\n"
                   "# %12s %10s %10s %10s %8s\n",
                   "bytes", "count", "time(us)", "GB/s", "GB/s");
        else
            printf("# %s, %s (%s), %d ranks, %s%s\n"
                   "# %12s %10s %10s %10s %8s\n",
                   b.shift ? "to the next rank" : "allreduce", impl, backend, b.size, dt_dtype_name(t),
                   b.shift ? "" : ", in place, sum", "bytes", "count", "time(us)", "algbw(GB/s)", "busbw");
    }
    int first = 1;
    for (size_t bytes = minb; bytes <= maxb; bytes *= 2) {
        size_t count = bytes / es;
        /* warm-up (a fixed count on every rank), then an iteration count
         * for ~0.25 s from the slowest rank's warm-up time */
        int iters = iters_fixed;
        barrier(&b);
        double t0 = dt_now();
        int w = bytes <= (1u << 20) ? 20 : 3;
        for (int i = 0; i < w; i++) run_op(&b, buf, count, t);
        double per = max_over_ranks(&b, (dt_now() - t0) / w);
        if (!iters) {
            iters = (int)(0.25 / repeat / (per > 1e-7 ? per : 1e-7));
            if (iters < 5) iters = 5;
            if (iters > 50000) iters = 50000;
        }
        double el = 1e30;
        for (int r = 0; r < repeat; r++) { /* best of `repeat` timed runs */
            barrier(&b);
            t0 = dt_now();
            for (int i = 0; i < iters; i++) run_op(&b, buf, count, t);
            double e = max_over_ranks(&b, (dt_now() - t0) / iters);
            if (e < el) el = e;
        }
        double algbw = (double)bytes / el / 1e9;
        double busbw = b.shift ? algbw : algbw * 2.0 * (b.size - 1) / b.size;
        if (b.rank == 0) {
            if (json)
                printf("%s  {\"bytes\": %zu, \"time_us\": %.3f, \"algbw\": %.3f, \"busbw\": %.3f, "
                       "\"iters\": %d}",
                       first ? "" : ",\n", bytes, el * 1e6, algbw, busbw, iters);
            else
                printf("  %12zu %10zu %10.2f %10.2f %8.2f\n", bytes, count, el * 1e6, algbw, busbw);
            fflush(stdout);
        }
        first = 0;
    }
    if (b.rank == 0 && json) printf("\n]}\n");
    if (huge) free(buf);
    else dt_free(buf);
    if (b.mpi_raw) {
#ifdef DTRAIN_HAVE_MPI
        MPI_Finalize();
#endif
    } else if (b.copy_dst) {
        dt_free(b.copy_dst);
    } else {
        dt_comm_destroy(b.comm);
    }
    return 0;
}
