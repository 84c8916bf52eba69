/* dtrain simulate: predicted step time and scaling efficiency on many
 * CPU or GPU hosts, from a profiled run or a model's figures (dt_sim_*,
 * train.h). */
#include "cli.h"
#include "dtrain/dtrain.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char help[] =
    "usage: dtrain simulate RUN_DIR [--hosts LIST] [--link BW,LATENCY] [--strategy dp,zero]\n"
    "                       [--ranks-per-host R] [--host-bw GBPS]\n"
    "                       [--gpus-per-host G] [--nvlink BW,LATENCY] [--grad-bytes 4|2]\n"
    "                       [--batch N] [--weak] [--compute-scale F] [--model-params N]\n"
    "                       [--bucket-kb K] [--html FILE]\n"
    "       dtrain simulate --params N --compute-ms-per-sample X [--optimizer-ms Y] --batch N [...]\n"
    "       dtrain simulate --allreduce SIZES [--hosts LIST] [--link BW,LATENCY] [--ranks-per-host R]\n"
    "                       [--gpus-per-host G] [--nvlink BW,LATENCY]\n"
    "\n"
    "Predicts the step time and scaling efficiency of data-parallel training on\n"
    "many hosts. The compute profile comes from RUN_DIR, a finished 'dtrain train'\n"
    "run of the model (rank 0's median forward, backward, data and optimizer\n"
    "times per step, summary.json's parameter count and batch; from a run on\n"
    "one GPU, whose phases are the host's launch times, its whole step, 2/3 of\n"
    "it backward), or from --params, --compute-ms-per-sample\n"
    "and --optimizer-ms; the gradient exchange from an alpha-beta model of the\n"
    "collectives, hidden behind backward except the last bucket:\n"
    "  CPU hosts (the default): shared memory inside a host (reduce to a leader,\n"
    "    broadcast back), the cheapest of ring, recursive halving-doubling and\n"
    "    tree between hosts on the host's link;\n"
    "  GPU hosts (--gpus-per-host G, a rank a GPU): NCCL's hierarchy, a ring\n"
    "    reduce-scatter and allgather over NVLink inside a host and each GPU's\n"
    "    1/G of the gradients allreduced between hosts (the cheapest of the\n"
    "    three) over the GPU's own NIC.\n"
    "Efficiency is samples/s on H hosts over H x samples/s on one host.\n"
    "\n"
    "options:\n"
    "  --hosts LIST      host counts: 1,2,4 or A..B (doubling; default 1..1024)\n"
    "  --link BW,LAT     each host's link (GPU hosts: each GPU's NIC): a rate\n"
    "                    (100gbit, 500mbit) and a one-way latency (5us, 0.1ms);\n"
    "                    default 10gbit,50us (GPU hosts: 400gbit,5us, InfiniBand\n"
    "                    NDR, a NIC a GPU as in a DGX H100)\n"
    "  --strategy LIST   dp (allreduce) and/or zero (reduce-scatter + allgather,\n"
    "                    optimizer on a shard); default dp\n"
    "  --ranks-per-host R  CPU hosts: ranks on each host (default 1)\n"
    "  --host-bw GBPS    CPU hosts: shared-memory bandwidth inside a host, GB/s\n"
    "                    (default 5)\n"
    "  --gpus-per-host G GPU hosts of G GPUs, a rank each (instead of the two\n"
    "                    above)\n"
    "  --nvlink BW,LAT   GPU hosts: each GPU's NVLink rate, one direction, and\n"
    "                    the latency of a ring step on it; default 3600gbit,1us\n"
    "                    (450 GB/s: H100/H200 SXM NVLink 4 as published; NCCL\n"
    "                    gets less, give it the bus bandwidth nccl-tests measure)\n"
    "  --grad-bytes B    bytes a gradient on the wire: 4 (fp32, default) or 2\n"
    "                    (bf16 or fp16)\n"
    "  --batch N         the global batch to scale, in samples (default: the\n"
    "                    profiled run's batch; needed with --params)\n"
    "  --weak            keep the batch per rank (weak scaling); default: keep\n"
    "                    the global batch (strong scaling)\n"
    "  --compute-scale F the hosts' compute (forward, backward, data, optimizer)\n"
    "                    takes F times the profile's: 2 = half as fast (default 1)\n"
    "  --model-params N  forecast a model of N parameters from the profiled one:\n"
    "                    compute per sample and optimizer times N / its parameters\n"
    "                    (6 N FLOPs a token; attention's term left out), N\n"
    "                    gradients exchanged\n"
    "  --params N        instead of RUN_DIR, a model of N parameters ...\n"
    "  --compute-ms-per-sample X  ... whose forward + backward takes X ms a sample\n"
    "                    (2/3 of it backward) ...\n"
    "  --optimizer-ms Y  ... and its optimizer Y ms a step (default 0)\n"
    "  --bucket-kb K     the gradient bucket, KiB (default: the run's [parallel]\n"
    "                    bucket_kb; 2048 with --params)\n"
    "  --html FILE       also write the table and a chart of the efficiency\n"
    "  --allreduce SIZES instead of a run: the model's time and bus bandwidth of\n"
    "                    one allreduce of each size (bytes, K/M/G = powers of\n"
    "                    1024, comma-separated) on each host count\n"
    "  -h, --help        this help\n";

#define MAXH 64

typedef struct {
    const char *dir, *html, *link, *nvlink, *strategies, *sizes;
    int hosts[MAXH], nh, weak;
    // the numeric options (NAN: not given)
    double rph, host_gbs, batch, scale, gpus, grad_bytes, model_params, params, sample_ms, optimizer_ms, bucket_kb;
} sim_args;

static const struct {
    const char *flag;
    double lo, hi;
    int whole;
    size_t off;
} numeric[] = {
    {"--ranks-per-host", 1, 4096, 1, offsetof(sim_args, rph)},
    {"--host-bw", 0.001, 1e6, 0, offsetof(sim_args, host_gbs)},
    {"--batch", 1, 1e9, 1, offsetof(sim_args, batch)},
    {"--compute-scale", 0.001, 1000, 0, offsetof(sim_args, scale)},
    {"--gpus-per-host", 1, 1024, 1, offsetof(sim_args, gpus)},
    {"--grad-bytes", 2, 4, 1, offsetof(sim_args, grad_bytes)},
    {"--model-params", 1, 1e15, 1, offsetof(sim_args, model_params)},
    {"--params", 1, 1e15, 1, offsetof(sim_args, params)},
    {"--compute-ms-per-sample", 1e-9, 1e9, 0, offsetof(sim_args, sample_ms)},
    {"--optimizer-ms", 0, 1e9, 0, offsetof(sim_args, optimizer_ms)},
    {"--bucket-kb", 4, 1 << 22, 1, offsetof(sim_args, bucket_kb)},
};

static int parse_hosts(const char *v, int *h) {
    int n = 0, a, b, len;
    if (sscanf(v, "%d..%d%n", &a, &b, &len) == 2 && !v[len]) {
        if (a < 1 || b < a || b > 1 << 20) return -1;
        for (long x = a; x <= b && n < MAXH; x *= 2) h[n++] = (int)x;
        return n;
    }
    const char *p = v;
    while (*p && n < MAXH) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 1 || x > 1 << 20 || (*end && *end != ',')) return -1;
        h[n++] = (int)x;
        p = *end ? end + 1 : end;
    }
    return *p ? -1 : n;
}

// The option s (value v, NULL when none) into a; 1 when it took v, 0 when
// not, -1 after printing the error.
static int parse_option(const char *s, const char *v, sim_args *a) {
    for (size_t k = 0; k < sizeof numeric / sizeof *numeric; k++)
        if (!strcmp(s, numeric[k].flag)) {
            double *x = (double *)((char *)a + numeric[k].off);
            return parse_number(s, v, numeric[k].lo, numeric[k].hi, numeric[k].whole, x) ? -1 : 1;
        }
    static const char *const strings[][2] = {
        {"--link", "BW,LATENCY (e.g. 100gbit,5us)"}, {"--nvlink", "BW,LATENCY (e.g. 3600gbit,1us)"},
        {"--strategy", "dp, zero or dp,zero"},       {"--allreduce", "sizes such as 1M,64M"},
        {"--html", "a file"},
    };
    const char **dst[] = {&a->link, &a->nvlink, &a->strategies, &a->sizes, &a->html};
    for (size_t k = 0; k < sizeof dst / sizeof *dst; k++)
        if (!strcmp(s, strings[k][0])) {
            if (!v || !*v) return cli_error("%s needs %s", s, strings[k][1]), -1;
            *dst[k] = v;
            return 1;
        }
    if (!strcmp(s, "--hosts")) {
        if (!v || (a->nh = parse_hosts(v, a->hosts)) <= 0)
            return cli_error("--hosts: expected host counts such as 1,2,4 or 1..1024, got '%s'", v ? v : ""), -1;
        return 1;
    }
    if (!strcmp(s, "--weak")) return a->weak = 1, 0;
    return cli_error("unknown option '%s' (see 'dtrain simulate --help')", s), -1;
}

// The options that go together, and the defaults of those not given; 0
// or an exit code.
static int check_args(sim_args *a) {
    int gpu = !isnan(a->gpus), model = !isnan(a->params) || !isnan(a->sample_ms) || !isnan(a->optimizer_ms);
    if (gpu && (!isnan(a->rph) || !isnan(a->host_gbs)))
        return cli_error("--gpus-per-host: a rank a GPU, over NVLink; --ranks-per-host and --host-bw are the CPU "
                         "hosts' (shared memory)"), EXIT_USAGE;
    if (!gpu && a->nvlink) return cli_error("--nvlink needs --gpus-per-host (GPU hosts)"), EXIT_USAGE;
    if (!isnan(a->grad_bytes) && a->grad_bytes == 3)
        return cli_error("--grad-bytes: expected 4 (fp32) or 2 (bf16, fp16), got 3"), EXIT_USAGE;
    if (a->sizes && (a->dir || model)) return cli_error("--allreduce takes no RUN_DIR and no model"), EXIT_USAGE;
    if (a->dir && model)
        return cli_error("--params, --compute-ms-per-sample and --optimizer-ms describe a model instead of a run: "
                         "not with RUN_DIR"), EXIT_USAGE;
    if (!a->dir && !a->sizes && !model)
        return cli_error("missing RUN_DIR, a finished 'dtrain train' run, or a model's --params, "
                         "--compute-ms-per-sample and --batch (see 'dtrain simulate --help')"), EXIT_USAGE;
    if (model && (isnan(a->params) || isnan(a->sample_ms) || isnan(a->batch)))
        return cli_error("a model instead of a run needs --params, --compute-ms-per-sample and --batch (missing %s)",
                         isnan(a->params) ? "--params" : isnan(a->sample_ms) ? "--compute-ms-per-sample" : "--batch"),
               EXIT_USAGE;
    if (!a->link) a->link = gpu ? "400gbit,5us" : "10gbit,50us";
    if (!a->nvlink) a->nvlink = "3600gbit,1us";
    double one[] = {1, 5, 1, 4, 0};  // rph, host_gbs, scale, grad_bytes, optimizer_ms
    double *x[] = {&a->rph, &a->host_gbs, &a->scale, &a->grad_bytes, &a->optimizer_ms};
    for (int k = 0; k < 5; k++)
        if (isnan(*x[k])) *x[k] = one[k];
    return 0;
}

// The model's hosts and links from a (checked); 0 or an exit code.
static int sim_params(const sim_args *a, dt_sim_params *sp) {
    *sp = (dt_sim_params){.ranks_per_host = (int)a->rph, .host_bytes_per_s = a->host_gbs * 1e9,
                          .gpus_per_host = isnan(a->gpus) ? 0 : (int)a->gpus, .grad_bytes = (int)a->grad_bytes,
                          .weak = a->weak};
    if (cli_parse_link("--link", a->link, &sp->link_bytes_per_s, &sp->link_latency_s)) return EXIT_USAGE;
    if (sp->gpus_per_host && cli_parse_link("--nvlink", a->nvlink, &sp->nvlink_bytes_per_s, &sp->nvlink_latency_s))
        return EXIT_USAGE;
    return 0;
}

// --allreduce: the model's time of each size on each host count
static int allreduce_table(const sim_args *a, dt_sim_params sp) {
    double sz[32];
    int n = 0;
    char list[512];
    snprintf(list, sizeof list, "%s", a->sizes);
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        size_t b;
        if (n == 32 || dt_mem_parse_size(t, &b) != DT_OK || b == 0)
            return cli_error("--allreduce: '%s': expected sizes such as 1M,64M (at most 32, each > 0)", t), EXIT_USAGE;
        sz[n++] = (double)b;
    }
    printf("%6s %6s %12s %12s %10s %6s\n", "hosts", "ranks", "bytes", "time us", "busbw GB/s", "algo");
    for (int i = 0; i < a->nh; i++)
        for (int k = 0; k < n; k++) {
            sp.hosts = a->hosts[i];
            const char *algo;
            double t = dt_sim_allreduce(sz[k], &sp, &algo);
            int N = a->hosts[i] * dt_sim_host_ranks(&sp);
            double busbw = t > 0 ? sz[k] / t * 2.0 * (N - 1) / N / 1e9 : 0;
            printf("%6d %6d %12.0f %12.1f %10.3f %6s\n", a->hosts[i], N, sz[k], t * 1e6, busbw, algo);
        }
    return 0;
}

// The profile: RUN_DIR's or the model's, with --batch, --compute-scale,
// --model-params and --bucket-kb; 0 or an exit code.
static int load_profile(const sim_args *a, dt_sim_profile *p) {
    if (!a->dir) {
        *p = (dt_sim_profile){.compute_s = a->sample_ms * 1e-3, .backward_share = 2.0 / 3,
                              .optimizer_s = a->optimizer_ms * 1e-3, .params = a->params, .workers = 1,
                              .bucket_bytes = 2048 * 1024};
    } else if (dt_sim_profile_load(a->dir, p) != DT_OK) {
        return cli_error("%s", dt_last_error()), EXIT_RUNTIME;
    }
    if (!isnan(a->batch)) {  // per-sample times stay; the batch to scale changes
        p->batch = (int)a->batch;
        p->workers = 1;
    }
    p->compute_s *= a->scale;
    p->data_s *= a->scale;
    p->optimizer_s *= a->scale;
    if (!isnan(a->bucket_kb)) p->bucket_bytes = a->bucket_kb * 1024;
    printf("profile %s: %.0f params, batch %d on %d rank(s): %.3f ms compute + %.3f ms data per sample, "
           "optimizer %.2f ms per step%s%s\n",
           a->dir ? a->dir : "(--params, no run)", p->params, p->batch, p->workers, 1e3 * p->compute_s,
           1e3 * p->data_s, 1e3 * p->optimizer_s, a->scale != 1 ? " (scaled by --compute-scale)" : "",
           p->device ? " (a GPU run: its whole step, optimizer and data in it, 2/3 backward)" : "");
    if (!isnan(a->model_params)) {
        double was = p->params;
        dt_sim_profile_scale(p, a->model_params);
        printf("forecast for %.0f params (--model-params): compute and optimizer x %.3f, the profile's params' "
               "ratio: %.3f ms compute per sample, optimizer %.2f ms per step\n",
               p->params, p->params / was, 1e3 * p->compute_s, 1e3 * p->optimizer_s);
    }
    return 0;
}

static void print_hosts(const sim_args *a, const dt_sim_params *sp, const dt_sim_profile *p) {
    if (sp->gpus_per_host)
        printf("GPU hosts: %d GPUs a host, NVLink %s (%.1f GB/s a direction, %.1f us a ring step), a NIC a GPU %s "
               "(%.2f GB/s, %.1f us)",
               sp->gpus_per_host, a->nvlink, sp->nvlink_bytes_per_s / 1e9, sp->nvlink_latency_s * 1e6, a->link,
               sp->link_bytes_per_s / 1e9, sp->link_latency_s * 1e6);
    else
        printf("links %s (%.2f GB/s, %.1f us), %d rank(s) per host, shm %.1f GB/s", a->link,
               sp->link_bytes_per_s / 1e9, sp->link_latency_s * 1e6, sp->ranks_per_host, a->host_gbs);
    printf("; %d-byte gradients in buckets of %.0f KiB, %s scaling\n", (int)a->grad_bytes, p->bucket_bytes / 1024,
           a->weak ? "weak (batch per rank kept)" : "strong (global batch kept)");
}

// One strategy's table (stdout and HTML into b) over the host counts; its
// efficiencies in eff[].
static void strategy_table(const sim_args *a, const dt_sim_profile *p, dt_sim_params sp, const char *name, FILE *b,
                           double *eff) {
    dt_sim_point one;
    sp.hosts = 1;
    dt_sim_predict(p, &sp, &one);
    printf("\n%s\n%6s %6s %9s %10s %10s %5s %10s %10s %12s %6s\n", name, "hosts", "ranks", "batch/rk", "compute ms",
           "comm ms", "algo", "exposed ms", "step ms", "samples/s", "eff");
    fprintf(b, "<h2>%s</h2><table><tr><th>hosts</th><th>ranks</th><th>batch per rank</th><th>compute ms</th>"
               "<th>comm ms</th><th>algorithm</th><th>exposed ms</th><th>step ms</th><th>samples/s</th>"
               "<th>efficiency</th></tr>\n", name);
    int bend = 0, H = a->hosts[a->nh - 1];
    for (int i = 0; i < a->nh; i++) {
        dt_sim_point o;
        sp.hosts = a->hosts[i];
        dt_sim_predict(p, &sp, &o);
        double e = o.samples_per_s / (a->hosts[i] * one.samples_per_s);
        eff[i] = 100 * e;
        const char *mark = o.local_batch < 1 ? " *" : "";
        printf("%6d %6d %9.2f %10.3f %10.3f %5s %10.3f %10.3f %12.1f %5.0f%%%s\n", a->hosts[i], o.ranks,
               o.local_batch, 1e3 * o.compute_s, 1e3 * o.comm_s, o.algo, 1e3 * o.exposed_s, 1e3 * o.step_s,
               o.samples_per_s, 100 * e, mark);
        fprintf(b, "<tr><td>%d</td><td>%d</td><td>%.2f%s</td><td>%.3f</td><td>%.3f</td><td>%s</td><td>%.3f</td>"
                   "<td>%.3f</td><td>%.1f</td><td>%.0f%%</td></tr>\n",
                a->hosts[i], o.ranks, o.local_batch, mark, 1e3 * o.compute_s, 1e3 * o.comm_s, o.algo,
                1e3 * o.exposed_s, 1e3 * o.step_s, o.samples_per_s, 100 * e);
        if (!bend && a->hosts[i] > 1 && e < 0.8) {
            bend = a->hosts[i];
            printf("       ^ efficiency below 80%% from here: the exposed exchange outgrows the compute\n");
        }
    }
    fputs("</table>\n", b);
    if (!a->weak && H * dt_sim_host_ranks(&sp) > p->batch)
        printf("  * fewer than one sample per rank: the global batch (%d) is too small for this many ranks\n",
               p->batch);
}

// The strategies' tables and, with --html, the page; 0 or an exit code.
static int tables(const sim_args *a, const dt_sim_profile *p, const dt_sim_params *sp, const int *zero_of, int ns) {
    double xs[MAXH], eff[2][MAXH];
    for (int i = 0; i < a->nh; i++) xs[i] = log2(a->hosts[i]);
    char *body = NULL;
    size_t blen = 0;
    FILE *b = open_memstream(&body, &blen);
    if (!b) return cli_error("out of memory"), EXIT_RUNTIME;
    fprintf(b, "<p>Profile <code>%s</code>; links %s, %d rank(s) per host, %s scaling.</p>\n",
            a->dir ? a->dir : "(--params)", a->link, dt_sim_host_ranks(sp), a->weak ? "weak" : "strong");
    const char *names[2];
    for (int k = 0; k < ns; k++) {
        dt_sim_params s = *sp;
        s.zero = zero_of[k];
        names[k] = zero_of[k] ? "zero" : "dp";
        strategy_table(a, p, s, names[k], b, eff[k]);
    }
    fclose(b);
    int rc = 0;
    const double *ys[2] = {eff[0], eff[1]};
    if (a->html && dt_sim_html(a->html, "dtrain simulate: scaling efficiency", body, "log2(hosts)", "efficiency %",
                               names, xs, ys, ns, a->nh) != DT_OK) {
        cli_error("%s", dt_last_error());
        rc = EXIT_RUNTIME;
    } else if (a->html) {
        printf("\nchart: %s\n", a->html);
    }
    free(body);
    return rc;
}

int cmd_simulate(int argc, char **argv) {
    sim_args a = {.strategies = "dp", .rph = NAN, .host_gbs = NAN, .batch = NAN, .scale = NAN, .gpus = NAN,
                  .grad_bytes = NAN, .model_params = NAN, .params = NAN, .sample_ms = NAN, .optimizer_ms = NAN,
                  .bucket_kb = NAN};
    a.nh = parse_hosts("1..1024", a.hosts);
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) return fputs(help, stdout), 0;
        if (s[0] == '-' && s[1]) {
            int took = parse_option(s, i + 1 < argc ? argv[i + 1] : NULL, &a);
            if (took < 0) return EXIT_USAGE;
            i += took;
        } else if (!a.dir) {
            a.dir = s;
        } else {
            return cli_error("unexpected argument '%s' (one RUN_DIR only)", s), EXIT_USAGE;
        }
    }
    dt_sim_params sp;
    int rc = check_args(&a);
    if (rc || (rc = sim_params(&a, &sp))) return rc;
    if (a.sizes) return allreduce_table(&a, sp);
    int zero_of[2], ns = 0;
    char sl[64];
    snprintf(sl, sizeof sl, "%s", a.strategies);
    for (char *save = NULL, *t = strtok_r(sl, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (strcmp(t, "dp") && strcmp(t, "zero"))
            return cli_error("--strategy: '%s': expected dp or zero (comma-separated)", t), EXIT_USAGE;
        if (ns < 2) zero_of[ns++] = !strcmp(t, "zero");
    }
    if (ns == 0) return cli_error("--strategy: expected dp or zero, got '%s'", a.strategies), EXIT_USAGE;
    dt_sim_profile p;
    if ((rc = load_profile(&a, &p))) return rc;
    print_hosts(&a, &sp, &p);
    return tables(&a, &p, &sp, zero_of, ns);
}
