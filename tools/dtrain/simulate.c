/* dtrain simulate: predicted step time and scaling efficiency on many
 * hosts, from a profiled run (dt_sim_*, train.h). */
#include "cli.h"
#include "dtrain/dtrain.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char help[] =
    "usage: dtrain simulate RUN_DIR [--hosts LIST] [--link BW,LATENCY] [--ranks-per-host R]\n"
    "                       [--strategy dp,zero] [--host-bw GBPS] [--batch N] [--weak]\n"
    "                       [--compute-scale F] [--html FILE]\n"
    "       dtrain simulate --allreduce SIZES [--hosts LIST] [--link BW,LATENCY] [--ranks-per-host R]\n"
    "\n"
    "Predicts the step time and scaling efficiency of data-parallel training on\n"
    "many hosts. The compute profile comes from RUN_DIR, a finished 'dtrain train'\n"
    "run of the model (rank 0's median forward, backward, data and optimizer\n"
    "times per step, summary.json's parameter count and batch); the gradient\n"
    "exchange from an alpha-beta model of the collectives: shared memory inside\n"
    "a host, the cheapest of ring, recursive halving-doubling and tree between\n"
    "hosts, hidden behind backward except the last bucket. Efficiency is\n"
    "samples/s on H hosts over H x samples/s on one host.\n"
    "\n"
    "options:\n"
    "  --hosts LIST      host counts: 1,2,4 or A..B (doubling; default 1..1024)\n"
    "  --link BW,LAT     each host's link: a rate (100gbit, 500mbit) and a one-way\n"
    "                    latency (5us, 0.1ms); default 10gbit,50us\n"
    "  --ranks-per-host R  ranks on each host (default 1)\n"
    "  --strategy LIST   dp (allreduce) and/or zero (reduce-scatter + allgather,\n"
    "                    optimizer on a shard); default dp\n"
    "  --host-bw GBPS    shared-memory bandwidth inside a host, GB/s (default 5)\n"
    "  --batch N         the global batch to scale, in the run's samples (default:\n"
    "                    the profiled run's batch)\n"
    "  --weak            keep the profiled run's batch per rank (weak scaling);\n"
    "                    default: keep its global batch (strong scaling)\n"
    "  --compute-scale F the hosts' compute (forward, backward, data, optimizer)\n"
    "                    takes F times the profiled run's: 2 = cores half as fast\n"
    "                    (default 1)\n"
    "  --html FILE       also write the table and a chart of the efficiency\n"
    "  --allreduce SIZES instead of a run: the model's time and bus bandwidth of\n"
    "                    one allreduce of each size (bytes, K/M/G = powers of\n"
    "                    1024, comma-separated) on each host count\n"
    "  -h, --help        this help\n";

#define MAXH 64

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

// --allreduce: the model's time of each size on each host count
static int allreduce_table(const char *sizes, const int *hosts, int nh, int rph, double bw, double lat,
                           double host_gbs) {
    double sz[32];
    int n = 0;
    char list[512];
    snprintf(list, sizeof list, "%s", sizes);
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        size_t b;
        if (n == 32 || dt_mem_parse_size(t, &b) != DT_OK || b == 0)
            return cli_error("--allreduce: '%s': expected sizes such as 1M,64M (at most 32, each > 0)", t), EXIT_USAGE;
        sz[n++] = (double)b;
    }
    printf("%6s %6s %12s %12s %10s %6s\n", "hosts", "ranks", "bytes", "time us", "busbw GB/s", "algo");
    for (int i = 0; i < nh; i++)
        for (int k = 0; k < n; k++) {
            dt_sim_params sp = {.hosts = hosts[i], .ranks_per_host = rph, .link_bytes_per_s = bw,
                                .link_latency_s = lat, .host_bytes_per_s = host_gbs * 1e9};
            const char *algo;
            double t = dt_sim_allreduce(sz[k], &sp, &algo);
            int N = hosts[i] * rph;
            double busbw = t > 0 ? sz[k] / t * 2.0 * (N - 1) / N / 1e9 : 0;
            printf("%6d %6d %12.0f %12.1f %10.3f %6s\n", hosts[i], N, sz[k], t * 1e6, busbw, algo);
        }
    return 0;
}

int cmd_simulate(int argc, char **argv) {
    const char *dir = NULL, *html = NULL, *link = "10gbit,50us", *strategies = "dp", *sizes = NULL;
    int hosts[MAXH], nh = parse_hosts("1..1024", hosts), weak = 0;
    double rph = 1, host_gbs = 5, batch = 0, scale = 1;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            fputs(help, stdout);
            return 0;
        } else if (!strcmp(s, "--hosts")) {
            if (!v || (nh = parse_hosts(v, hosts)) <= 0)
                return cli_error("--hosts: expected host counts such as 1,2,4 or 1..1024, got '%s'", v ? v : ""),
                       EXIT_USAGE;
            i++;
        } else if (!strcmp(s, "--link")) {
            if (!v) return cli_error("--link needs BW,LATENCY (e.g. 100gbit,5us)"), EXIT_USAGE;
            link = argv[++i];
        } else if (!strcmp(s, "--strategy")) {
            if (!v) return cli_error("--strategy needs dp, zero or dp,zero"), EXIT_USAGE;
            strategies = argv[++i];
        } else if (!strcmp(s, "--ranks-per-host")) {
            if (parse_number(s, v, 1, 4096, 1, &rph)) return EXIT_USAGE;
            i++;
        } else if (!strcmp(s, "--host-bw")) {
            if (parse_number(s, v, 0.001, 1e6, 0, &host_gbs)) return EXIT_USAGE;
            i++;
        } else if (!strcmp(s, "--allreduce")) {
            if (!v || !*v) return cli_error("--allreduce needs sizes such as 1M,64M"), EXIT_USAGE;
            sizes = argv[++i];
        } else if (!strcmp(s, "--batch")) {
            if (parse_number(s, v, 1, 1e9, 1, &batch)) return EXIT_USAGE;
            i++;
        } else if (!strcmp(s, "--compute-scale")) {
            if (parse_number(s, v, 0.001, 1000, 0, &scale)) return EXIT_USAGE;
            i++;
        } else if (!strcmp(s, "--weak")) {
            weak = 1;
        } else if (!strcmp(s, "--html")) {
            if (!v || !*v) return cli_error("--html needs a file"), EXIT_USAGE;
            html = argv[++i];
        } else if (s[0] == '-' && s[1]) {
            return cli_error("unknown option '%s' (see 'dtrain simulate --help')", s), EXIT_USAGE;
        } else if (!dir) {
            dir = s;
        } else {
            return cli_error("unexpected argument '%s' (one RUN_DIR only)", s), EXIT_USAGE;
        }
    }
    if (!dir && !sizes)
        return cli_error("missing RUN_DIR, a finished 'dtrain train' run (see 'dtrain simulate --help')"), EXIT_USAGE;
    if (dir && sizes) return cli_error("--allreduce takes no RUN_DIR"), EXIT_USAGE;
    double bw, lat;
    if (cli_parse_link(link, &bw, &lat)) return EXIT_USAGE;
    if (sizes) return allreduce_table(sizes, hosts, nh, (int)rph, bw, lat, host_gbs);
    int zero_of[2], ns = 0;
    char sl[64];
    snprintf(sl, sizeof sl, "%s", strategies);
    for (char *save = NULL, *t = strtok_r(sl, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (strcmp(t, "dp") && strcmp(t, "zero"))
            return cli_error("--strategy: '%s': expected dp or zero (comma-separated)", t), EXIT_USAGE;
        if (ns < 2) zero_of[ns++] = !strcmp(t, "zero");
    }
    if (ns == 0) return cli_error("--strategy: expected dp or zero, got '%s'", strategies), EXIT_USAGE;

    dt_sim_profile p;
    if (dt_sim_profile_load(dir, &p) != DT_OK) return cli_error("%s", dt_last_error()), EXIT_RUNTIME;
    if (batch > 0) {  // per-sample times stay; the batch to scale changes
        p.batch = (int)batch;
        p.workers = 1;
    }
    p.compute_s *= scale;
    p.data_s *= scale;
    p.optimizer_s *= scale;
    printf("profile %s: %.0f params, batch %d on %d rank(s): %.3f ms compute + %.3f ms data per sample, "
           "optimizer %.2f ms per step%s\n",
           dir, p.params, p.batch, p.workers, 1e3 * p.compute_s, 1e3 * p.data_s, 1e3 * p.optimizer_s,
           scale != 1 ? " (the run's, scaled by --compute-scale)" : "");
    printf("links %s (%.2f GB/s, %.1f us), %d rank(s) per host, shm %.1f GB/s, %s scaling\n", link, bw / 1e9,
           lat * 1e6, (int)rph, host_gbs, weak ? "weak (batch per rank kept)" : "strong (global batch kept)");

    double xs[MAXH], eff[2][MAXH];
    char *body = NULL;
    size_t blen = 0;
    FILE *b = open_memstream(&body, &blen);
    if (!b) return cli_error("out of memory"), EXIT_RUNTIME;
    fprintf(b, "<p>Profile <code>%s</code>; links %s, %d rank(s) per host, %s scaling.</p>\n", dir, link, (int)rph,
            weak ? "weak" : "strong");
    for (int k = 0; k < ns; k++) {
        const char *name = zero_of[k] ? "zero" : "dp";
        dt_sim_params sp = {.ranks_per_host = (int)rph, .link_bytes_per_s = bw, .link_latency_s = lat,
                            .host_bytes_per_s = host_gbs * 1e9, .zero = zero_of[k], .weak = weak};
        dt_sim_point one;
        sp.hosts = 1;
        dt_sim_predict(&p, &sp, &one);
        printf("\n%s\n%6s %6s %9s %10s %10s %5s %10s %10s %12s %6s\n", name, "hosts", "ranks", "batch/rk",
               "compute ms", "comm ms", "algo", "exposed ms", "step ms", "samples/s", "eff");
        fprintf(b, "<h2>%s</h2><table><tr><th>hosts</th><th>ranks</th><th>batch per rank</th><th>compute ms</th>"
                   "<th>comm ms</th><th>algorithm</th><th>exposed ms</th><th>step ms</th><th>samples/s</th>"
                   "<th>efficiency</th></tr>\n", name);
        int bend = 0;
        for (int i = 0; i < nh; i++) {
            dt_sim_point o;
            sp.hosts = hosts[i];
            dt_sim_predict(&p, &sp, &o);
            double e = o.samples_per_s / (hosts[i] * one.samples_per_s);
            xs[i] = log2(hosts[i]);
            eff[k][i] = 100 * e;
            const char *mark = o.local_batch < 1 ? " *" : "";
            printf("%6d %6d %9.2f %10.3f %10.3f %5s %10.3f %10.3f %12.1f %5.0f%%%s\n", hosts[i], o.ranks,
                   o.local_batch, 1e3 * o.compute_s, 1e3 * o.comm_s, o.algo, 1e3 * o.exposed_s, 1e3 * o.step_s,
                   o.samples_per_s, 100 * e, mark);
            fprintf(b, "<tr><td>%d</td><td>%d</td><td>%.2f%s</td><td>%.3f</td><td>%.3f</td><td>%s</td><td>%.3f</td>"
                       "<td>%.3f</td><td>%.1f</td><td>%.0f%%</td></tr>\n",
                    hosts[i], o.ranks, o.local_batch, mark, 1e3 * o.compute_s, 1e3 * o.comm_s, o.algo,
                    1e3 * o.exposed_s, 1e3 * o.step_s, o.samples_per_s, 100 * e);
            if (!bend && hosts[i] > 1 && e < 0.8) {
                bend = hosts[i];
                printf("       ^ efficiency below 80%% from here: the exposed exchange outgrows the compute\n");
            }
        }
        fputs("</table>\n", b);
        if (!weak && hosts[nh - 1] * (int)rph > p.batch)
            printf("  * fewer than one sample per rank: the global batch (%d) is too small for this many ranks\n",
                   p.batch);
    }
    fclose(b);
    int rc = 0;
    if (html) {
        const char *names[2] = {zero_of[0] ? "zero" : "dp", ns > 1 && zero_of[1] ? "zero" : "dp"};
        const double *ys[2] = {eff[0], eff[1]};
        if (dt_sim_html(html, "dtrain simulate: scaling efficiency", body, "log2(hosts)",
                                 "efficiency %", names, xs, ys, ns, nh) != DT_OK) {
            cli_error("%s", dt_last_error());
            rc = EXIT_RUNTIME;
        } else {
            printf("\nchart: %s\n", html);
        }
    }
    free(body);
    return rc;
}
