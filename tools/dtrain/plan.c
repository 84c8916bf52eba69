/* dtrain plan: the fastest layout of a run that fits (dt_plan_*, train.h),
 * from the model's profile on this machine (a short calibration run, kept
 * in a cache file), its train lines, and --verify: the top layouts run for
 * a few steps each, predicted against measured. Also dtrain train --plan
 * auto (cli_plan_best, cli_plan_record). */
#include "cli.h"
#include "dtrain/dtrain.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_SETS 256

static const char help[] =
    "usage: dtrain plan CONFIG --workers N [--hosts H --link BW,LATENCY] [--memory-limit SIZE]\n"
    "                   [--set SECTION.KEY=VALUE]... [--lossy] [--top K] [--verify K [--steps S]]\n"
    "                   [--run-dir DIR] [--recalibrate]\n"
    "\n"
    "Finds the fastest layout of CONFIG's run on N workers that fits in memory:\n"
    "every layout the strategies accept (data parallel, ZeRO stages 0-3, tensor\n"
    "parallel T, pipeline P with 1, 2 or 4 micro-batches a stage and the gpipe or\n"
    "1f1b schedule, a GPT's recompute, the gradient bucket, lossy codecs with\n"
    "--lossy) is sized by the formula the start check uses and timed by the\n"
    "simulator from the model's time per sample and each layer's on this\n"
    "machine, measured once by a short calibration run (plain data parallel on\n"
    "the N / H workers of one host, or one worker where that cannot run) and\n"
    "kept in $XDG_CACHE_HOME/dtrain (default ~/.cache/dtrain), keyed by the\n"
    "model's shape, batch, precision, optimizer, CPU, workers and threads.\n"
    "Prints the fastest K that fit, each with its predicted step time, memory\n"
    "per worker and the 'dtrain train' line that runs it (docs/plan.md).\n"
    "\n"
    "options:\n"
    "  --workers N     the workers (ranks) to plan for (required)\n"
    "  --hosts H       ... spread over H hosts like this one, N / H on each\n"
    "                  (default 1: this machine)\n"
    "  --link BW,LAT   each host's link: a rate (10gbit, 500mbit) and a one-way\n"
    "                  latency (50us, 0.1ms); default 10gbit,50us\n"
    "  --memory-limit SIZE  each worker's memory (2G, 512M; K/M/G/T = powers of\n"
    "                  1024): layouts that need more are left out; when none\n"
    "                  fits, the smallest is named (exit 2). Memory available\n"
    "                  on this machine is always a limit\n"
    "  --set S.K=V     override a config field, as for dtrain train (repeatable)\n"
    "  --lossy         also try the lossy gradient codecs fp16, bf16 and int8\n"
    "                  (data parallel); default: none\n"
    "  --top K         layouts to print (default 5)\n"
    "  --verify K      train the fastest K for --steps steps each and print the\n"
    "                  predicted against the measured step time (median after\n"
    "                  two warm-up steps) and peak memory (the largest rank's)\n"
    "  --steps S       steps of each --verify run (default 12)\n"
    "  --run-dir DIR   where the --verify runs go (default runs/plan-TIMESTAMP)\n"
    "  --recalibrate   measure the model again even when the cache has it\n"
    "  -h, --help      this help\n"
    "\n"
    "'dtrain train CONFIG --workers N --plan auto' plans the same way and trains\n"
    "the fastest layout that fits.\n";

typedef struct {
    const char *config, *run_dir, *link, *limit;
    const char *sets[MAX_SETS];
    int nsets, workers, hosts, lossy, top, verify, steps, recalibrate;
} plan_args;

// ---- child runs ----

// Runs argv (this program) and waits for it, up to `limit` seconds (then
// kills it); its exit code, or -1.
static int run_child(char **argv, double limit) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    int status;
    double end = dt_now() + limit;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (dt_now() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            cli_error("%s %s: still running after %.0f s; stopped", argv[0], argv[1], limit);
            return -1;
        }
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// `dtrain train CONFIG --set ...` with the user's sets, then `extra`
// (" --set a=b --set c=d"-style words, split at spaces) and more words.
static int train_run(const plan_args *a, const char *extra, const char *run_dir, int workers, const char *more,
                     int capped) {
    char *argv[2 * MAX_SETS + 64], words[4096], nw[32];
    int k = 0;
    argv[k++] = "dtrain";
    argv[k++] = "train";
    argv[k++] = (char *)a->config;
    for (int i = 0; i < a->nsets; i++) argv[k++] = "--set", argv[k++] = (char *)a->sets[i];
    snprintf(words, sizeof words, "%s %s", extra, more);
    for (char *save = NULL, *t = strtok_r(words, " ", &save); t && k < 2 * MAX_SETS + 50; t = strtok_r(NULL, " ", &save))
        argv[k++] = t;
    snprintf(nw, sizeof nw, "%d", workers);
    argv[k++] = "--workers", argv[k++] = nw, argv[k++] = "--run-dir", argv[k++] = (char *)run_dir;
    argv[k++] = "--quiet";
    if (capped && a->limit) argv[k++] = "--memory-limit", argv[k++] = (char *)a->limit;
    argv[k] = NULL;
    return run_child(argv, 1800);
}

// ---- the profile: measured once, cached ----

static double measured_peak(const char *run_dir);
static double measured_step(const char *run_dir);

// What the measured times depend on, as text: the model's shape, the
// batch, precision, optimizer, the CPU, the workers and their threads.
static void profile_key(const dt_config *c, int workers, int threads, char *key, size_t len) {
    const dt_cpu *cpu = dt_cpu_get();
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    size_t o = (size_t)snprintf(key, len,
                                "v3 cpu=%s/%d/%d isa=%d cores=%ld workers=%d threads=%d batch=%d precision=%d optim=%d",
                                cpu->name, cpu->family, cpu->model, (int)cpu->isa, cores, workers, threads, c->batch,
                                (int)c->precision, (int)c->optim.kind);
    if (c->gpt)
        snprintf(key + o, len - o, " gpt=%d/%d/%d/%d/%d/%d seq=%d", c->n_layer, c->n_head, c->n_embd, c->block_size,
                 c->vocab_size, c->padded_vocab_size, c->seq_len);
    else {
        o += (size_t)snprintf(key + o, len - o, " input=%dx%dx%d", c->input[0], c->input[1], c->input[2]);
        for (int i = 0; i < c->nlayers && o < len; i++) {
            const dt_layer_spec *l = &c->layers[i];
            o += (size_t)snprintf(key + o, len - o, " %s/%d/%d/%d/%d", dt_layer_kind_name(l->kind), l->out, l->kernel,
                                  l->stride, l->pad);
        }
    }
}

static unsigned long long fnv1a(const char *s) {
    unsigned long long h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static void cache_path(const char *key, char *path, size_t len) {
    const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[2048];
    if (x && *x) snprintf(dir, sizeof dir, "%s/dtrain", x);
    else snprintf(dir, sizeof dir, "%s/.cache/dtrain", home && *home ? home : "/tmp");
    snprintf(path, len, "%s/profile-%016llx.json", dir, fnv1a(key));
}

static double jnum(const cJSON *j, const char *k) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

// The model's profile, the calibration run's peak resident memory and its
// median step.
typedef struct {
    dt_sim_profile p;
    double peak, step_s;
} profile_t;

// The profile's per-layer times per sample from the cache file's arrays
// (none where they are absent or do not pair up).
static void cache_layers(const cJSON *j, dt_sim_profile *p) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, "layer_forward_s");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "layer_backward_s");
    int L = cJSON_GetArraySize(f), ok = L <= DT_SIM_MAX_LAYERS && cJSON_GetArraySize(b) == L;
    for (int l = 0; ok && l < L; l++) {
        const cJSON *x = cJSON_GetArrayItem(f, l), *y = cJSON_GetArrayItem(b, l);
        ok = cJSON_IsNumber(x) && cJSON_IsNumber(y) && x->valuedouble >= 0 && y->valuedouble >= 0;
        p->layer_forward_s[l] = ok ? x->valuedouble : 0;
        p->layer_backward_s[l] = ok ? y->valuedouble : 0;
    }
    p->layers = ok ? L : 0;
}

// The cached profile for key; 0 when there, -1 when not (or not this key's).
static int cache_read(const char *path, const char *key, profile_t *pr) {
    dt_sim_profile *p = &pr->p;
    char *text = NULL;
    size_t n = 0;
    if (dt_read_file_gz(path, 1 << 20, (uint8_t **)&text, &n) != DT_OK) return -1;
    cJSON *j = cJSON_ParseWithLength(text, n);
    free(text);
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(j, "key");
    int ok = cJSON_IsString(k) && !strcmp(k->valuestring, key);
    if (ok) {
        *p = (dt_sim_profile){.compute_s = jnum(j, "compute_s"), .backward_share = jnum(j, "backward_share"),
                              .data_s = jnum(j, "data_s"), .optimizer_s = jnum(j, "optimizer_s"),
                              .params = jnum(j, "params"), .batch = (int)jnum(j, "batch"),
                              .workers = (int)jnum(j, "workers")};
        cache_layers(j, p);
        pr->peak = jnum(j, "peak_bytes");
        pr->step_s = jnum(j, "step_s");
        ok = pr->peak > 0 && p->compute_s > 0 && p->params > 0 && p->data_s >= 0 && p->optimizer_s >= 0 &&
             p->workers >= 1 && pr->step_s > 0;
    }
    cJSON_Delete(j);
    return ok ? 0 : -1;
}

static void cache_write(const char *path, const char *key, const profile_t *pr) {
    const dt_sim_profile *p = &pr->p;
    char dir[2200];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = 0;
    if (dt_make_dirs(dir) != DT_OK) {
        dt_log(DT_LOG_WARN, "plan: cannot keep the profile in %s: %s", dir, dt_last_error());
        return;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "key", key);
    const char *names[] = {"compute_s", "backward_share", "data_s", "optimizer_s", "params", "batch", "workers",
                           "peak_bytes", "step_s"};
    double v[] = {p->compute_s, p->backward_share, p->data_s, p->optimizer_s, p->params, p->batch, p->workers,
                  pr->peak, pr->step_s};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) cJSON_AddNumberToObject(j, names[i], v[i]);
    if (p->layers > 0) {  // (seconds per sample of each layer alone, [train] time_layers)
        cJSON_AddItemToObject(j, "layer_forward_s", cJSON_CreateDoubleArray(p->layer_forward_s, p->layers));
        cJSON_AddItemToObject(j, "layer_backward_s", cJSON_CreateDoubleArray(p->layer_backward_s, p->layers));
    }
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    const void *parts[2] = {text, "\n"};
    size_t sizes[2] = {text ? strlen(text) : 0, 1};
    if (!text || dt_write_atomic(path, parts, sizes, 2) != DT_OK)
        dt_log(DT_LOG_WARN, "plan: cannot keep the profile: %s", text ? dt_last_error() : "out of memory");
    free(text);
}

// A short run of the model as plain data parallel on `workers` workers of
// `threads` threads measures its profile (the compute of a rank among as
// many as the layouts will run, sharing the cores as they will; the
// memory a process holds beside the formula, shared-memory buffers
// included); 0 or an exit code.
static int calibrate(const plan_args *a, int workers, int threads, const char *dir, profile_t *pr) {
    char extra[512];
    snprintf(extra, sizeof extra,
             "--set parallel.zero=0 --set parallel.tensor=1 --set parallel.pipeline=1 --set compression.method=none "
             "--set train.recompute=none --set checkpoint.every_steps=0 --set checkpoint.every_seconds=0 "
             "--set train.max_steps=12 --set train.epochs=1000000 --set train.threads=%d --set train.time_layers=true",
             threads);
    dt_log(DT_LOG_INFO, "plan: measuring the model on %d worker%s x %d thread%s (12 steps, into %s)", workers,
           workers > 1 ? "s" : "", threads, threads > 1 ? "s" : "", dir);
    int rc = train_run(a, extra, dir, workers, "", 0);
    if (rc != 0) return cli_error("plan: the calibration run (%s) failed with exit code %d", dir, rc), EXIT_RUNTIME;
    if (dt_sim_profile_load(dir, &pr->p) != DT_OK) return cli_error("plan: %s", dt_last_error()), EXIT_RUNTIME;
    pr->peak = measured_peak(dir);
    pr->step_s = measured_step(dir);
    if (!(pr->step_s > 0)) return cli_error("plan: the calibration run (%s) recorded no step time", dir), EXIT_RUNTIME;
    return 0;
}

// The model's profile on `workers` x `threads`: from the cache, else
// measured into dir and kept; said where it has no per-layer times (a
// model without stages to time them by, a GPU run): the planner then
// splits the step by the layers' FLOPs.
static int profile_for(const plan_args *a, const dt_config *c, int workers, int threads, const char *dir,
                       profile_t *p) {
    char key[4096], path[2200];
    profile_key(c, workers, threads, key, sizeof key);
    cache_path(key, path, sizeof path);
    if (!a->recalibrate && cache_read(path, key, p) == 0) {
        dt_log(DT_LOG_INFO, "plan: the model's profile from %s", path);
    } else {
        int rc = calibrate(a, workers, threads, dir, p);
        if (rc) return rc;
        cache_write(path, key, p);
    }
    if (p->p.layers != (c->gpt ? c->n_layer : c->nlayers))
        dt_log(DT_LOG_INFO, "plan: the profile has no per-layer times; the layers' shares of the step are their "
                            "forward FLOPs");
    return 0;
}

// 1536 -> "1.5 KiB"
static const char *short_size(double b, char *out, size_t len) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) b /= 1024, i++;
    snprintf(out, len, i ? "%.1f %s" : "%.0f %s", b, u[i]);
    return out;
}

// ---- planning ----

typedef struct {
    dt_config c;
    dt_plan_params s;
    dt_plan_row *rows;
    int n, nfit;
    size_t limit, machine_share;  // the worker's own limit (0: none); this machine's free memory a rank
    double step_scale;            // the calibration run's measured step over the model's (0: times not scaled)
} plan_t;

static int load(const plan_args *a, dt_config *c) {
    if (access(a->config, F_OK) != 0)
        return cli_error("%s: no such config file (see 'dtrain plan --help')", a->config), EXIT_USAGE;
    if (dt_config_load(c, a->config, a->sets, a->nsets) != DT_OK) {
        cli_error("%s", dt_last_error());
        return strncmp(dt_last_error(), "--set", 5) == 0 ? EXIT_USAGE : EXIT_RUNTIME;
    }
    return 0;
}

// The calibration run's layout: plain data parallel, nothing sharded.
static dt_layout calibration_layout(const dt_config *c) {
    return (dt_layout){.tensor = 1, .pipeline = 1, .micro_batches = c->micro_batches,
                       .schedule = c->pipeline_schedule, .bucket_kb = c->bucket_kb};
}

// The calibration run's config.
static dt_config calibration_config(const dt_config *c) {
    dt_config one = *c;
    dt_layout l = calibration_layout(c);
    dt_plan_apply(&one, &l);
    return one;
}

// The workers the calibration runs on: the ranks of one host (R) when
// plain data parallel runs on R, else one.
static int calibration_workers(const dt_config *c, int R) {
    dt_config one = calibration_config(c);
    return R > 1 && dt_train_check(&one, R) == DT_OK ? R : 1;
}

// The worker counts nearest W that some layout runs on, as "; layouts run
// on 6, 8 or 4 workers".
static void counts_that_run(const dt_config *c, const dt_sim_profile *p, const dt_plan_params *s, char *out,
                            size_t len) {
    int found = 0;
    size_t o = 0;
    out[0] = 0;
    for (int d = 1; d < 2048 && found < 3; d++)
        for (int sign = -1; sign <= 1 && found < 3; sign += 2) {
            int w = s->workers + sign * d;
            if (w < 1 || w > 1024) continue;
            dt_plan_params t = *s;
            t.workers = w;
            t.hosts = w % s->hosts ? 1 : s->hosts;
            dt_plan_row *rows = NULL;
            int n, nf;
            if (dt_plan_rank(c, p, &t, 0, &rows, &n, &nf) != DT_OK) continue;
            free(rows);
            o += (size_t)snprintf(out + o, len > o ? len - o : 0, "%s%d", found ? ", " : "; layouts run on ", w);
            found++;
        }
    if (found) snprintf(out + o, len > o ? len - o : 0, " workers");
}

// Nothing fits: the smallest layout, the memory that would do (rounded up
// to a whole MiB) and its train line; exit 2.
static int nothing_fits(const plan_args *a, const plan_t *pl) {
    const dt_plan_row *m = &pl->rows[0];  // (the smallest, of those that do not fit)
    char what[256], sets[1024], b[64], l[64];
    dt_plan_describe(&m->l, what, sizeof what);
    dt_plan_sets(&pl->c, &m->l, sets, sizeof sets);
    size_t mib = (m->memory + ((size_t)1 << 20) - 1) >> 20;  // (rounded up: a limit that passes)
    return cli_error("no layout of %s on %d workers fits in %s a worker (%d layouts tried); the smallest, %s, "
                     "needs %s: give --memory-limit %zuM or more%s (dtrain train %s --workers %d%s)",
                     a->config, a->workers,
                     pl->limit ? short_size((double)pl->limit, l, sizeof l) : "the memory available", pl->n, what,
                     short_size((double)m->memory, b, sizeof b), mib,
                     pl->limit && m->memory <= pl->machine_share ? "" : " (more than this machine has free)",
                     a->config, a->workers, sets),
           EXIT_USAGE;
}

// What the model leaves out (an oversubscribed rank's waits for the
// others, the loop's own work) scales every predicted time by the
// calibration run's measured step over the model's step for it (the same
// layout on the same ranks): pl->step_scale, printed with the plan. Where
// the plan spans hosts, or the calibration ran on fewer workers than a host's
// ranks, the times stay the model's.
static void scale_to_calibration(plan_t *pl, const dt_config *one, int cw, double measured) {
    int R = pl->s.workers / pl->s.hosts;
    if (cw != R || pl->s.hosts > 1) return;
    dt_layout l = calibration_layout(one);
    for (int i = 0; i < pl->n; i++)
        if (!memcmp(&pl->rows[i].l, &l, sizeof l) && pl->rows[i].step_s > 0) {
            pl->step_scale = measured / pl->rows[i].step_s;
            break;
        }
    for (int i = 0; pl->step_scale > 0 && i < pl->n; i++) {
        dt_plan_row *r = &pl->rows[i];
        r->step_s *= pl->step_scale, r->compute_s *= pl->step_scale, r->exposed_s *= pl->step_scale;
    }
}

// The ranking of a's config on its workers; 0 or an exit code (the
// refusals: nothing runs on W workers, nothing fits the limit).
static int rank_layouts(const plan_args *a, plan_t *pl, const char *calib_dir) {
    int rc = load(a, &pl->c);
    if (rc) return rc;
    pl->s = dt_plan_default_params(a->workers);
    pl->s.hosts = a->hosts;
    pl->s.lossy = a->lossy;
    int R = a->workers / a->hosts;
    pl->s.threads = pl->s.cores / R > 1 ? pl->s.cores / R : 1;
    if (pl->c.threads > 0) pl->s.threads = pl->c.threads;
    if (cli_parse_link("--link", a->link, &pl->s.link_bytes_per_s, &pl->s.link_latency_s)) return EXIT_USAGE;
    pl->limit = dt_mem_limit(NULL);
    pl->machine_share = dt_mem_machine(NULL) / (size_t)R;
    profile_t p;
    // (nothing accepted on W workers: said before anything is measured)
    dt_plan_row *probe;
    dt_sim_profile unit = {.compute_s = 1e-3, .backward_share = 0.67, .params = 1, .batch = 1, .workers = 1};
    if (dt_plan_rank(&pl->c, &unit, &pl->s, 0, &probe, &pl->n, &pl->nfit) != DT_OK) {
        char err[1024], near[256];
        snprintf(err, sizeof err, "%s", dt_last_error());
        counts_that_run(&pl->c, &unit, &pl->s, near, sizeof near);
        return cli_error("--workers %d: %s%s", a->workers, err, near), EXIT_USAGE;
    }
    free(probe);
    int cw = calibration_workers(&pl->c, R);
    if ((rc = profile_for(a, &pl->c, cw, pl->s.threads, calib_dir, &p))) return rc;
    dt_config one = calibration_config(&pl->c);
    pl->s.memory_extra = p.peak - (double)dt_memory_worker(&one, cw, NULL);
    if (dt_plan_rank(&pl->c, &p.p, &pl->s, pl->limit, &pl->rows, &pl->n, &pl->nfit) != DT_OK)
        return cli_error("%s", dt_last_error()), EXIT_USAGE;
    scale_to_calibration(pl, &one, cw, p.step_s);
    return pl->nfit ? 0 : nothing_fits(a, pl);
}

static void print_rows(const plan_args *a, const plan_t *pl, int k) {
    char mem[64];
    printf("%d of %d layouts fit%s; the fastest %d on %d worker%s (%d host%s, %d thread%s a worker):\n", pl->nfit,
           pl->n, pl->limit ? " the limit" : "", k, a->workers, a->workers > 1 ? "s" : "", a->hosts,
           a->hosts > 1 ? "s" : "", pl->s.threads, pl->s.threads > 1 ? "s" : "");
    if (pl->step_scale > 0)
        printf("(times: the model's x %.2f, the calibration run's measured step over the model's step for it)\n",
               pl->step_scale);
    printf("%3s %10s %10s %10s %12s  %s\n", "#", "step ms", "compute", "exposed", "memory/rank", "layout");
    for (int i = 0; i < k; i++) {
        const dt_plan_row *r = &pl->rows[i];
        char what[256], sets[1024];
        dt_plan_describe(&r->l, what, sizeof what);
        dt_plan_sets(&pl->c, &r->l, sets, sizeof sets);
        printf("%3d %10.3f %10.3f %10.3f %12s  %s\n", i + 1, 1e3 * r->step_s, 1e3 * r->compute_s, 1e3 * r->exposed_s,
               short_size((double)r->memory, mem, sizeof mem), what);
        printf("    dtrain train %s --workers %d", a->config, a->workers);
        for (int j = 0; j < a->nsets; j++) printf(" --set %s", a->sets[j]);
        printf("%s%s%s\n", sets, a->limit ? " --memory-limit " : "", a->limit ? a->limit : "");
    }
}

// ---- --verify ----

// Rank 0's median step_seconds after two warm-up steps (of 5 or more).
static double measured_step(const char *run_dir) {
    char path[2200], line[4096];
    snprintf(path, sizeof path, "%s/metrics/rank-00000.jsonl", run_dir);
    FILE *f = fopen(path, "r");
    double v[4096];
    int n = 0;
    while (f && fgets(line, sizeof line, f) && n < 4096) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
        if (cJSON_IsString(t) && !strcmp(t->valuestring, "step") && jnum(j, "step_seconds") >= 0)
            v[n++] = jnum(j, "step_seconds");
        cJSON_Delete(j);
    }
    if (f) fclose(f);
    int skip = n >= 5 ? 2 : 0;
    return n > skip ? dt_median(v + skip, n - skip) : NAN;
}

// The largest rank's peak resident memory from summary.json (0: none).
static double measured_peak(const char *run_dir) {
    char path[2200];
    snprintf(path, sizeof path, "%s/summary.json", run_dir);
    uint8_t *buf = NULL;
    size_t len = 0;
    if (dt_read_file_gz(path, 1 << 24, &buf, &len) != DT_OK) return 0;
    cJSON *j = cJSON_ParseWithLength((const char *)buf, len);
    free(buf);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "memory"), *x;
    double peak = jnum(m, "peak_rss_bytes");
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(m, "ranks_peak_rss_bytes")) {
        if (cJSON_IsNumber(x) && x->valuedouble > peak) peak = x->valuedouble;
    }
    cJSON_Delete(j);
    return isfinite(peak) ? peak : 0;
}

static double pct(double got, double want) { return want > 0 ? 100 * (got / want - 1) : NAN; }

// Runs the fastest k for a->steps steps each; prints predicted against
// measured. 0, or 1 when a run failed.
static int verify(const plan_args *a, const plan_t *pl, int k, const char *dir) {
    double step[64], peak[64];
    int failed = 0;
    char more[128];
    snprintf(more, sizeof more, "--set train.max_steps=%d --set train.epochs=1000000", a->steps);
    for (int i = 0; i < k; i++) {
        char sets[1024], run[2200];
        dt_plan_sets(&pl->c, &pl->rows[i].l, sets, sizeof sets);
        snprintf(run, sizeof run, "%s/verify-%d", dir, i + 1);
        dt_log(DT_LOG_INFO, "plan: verifying #%d (%s)", i + 1, run);
        int rc = train_run(a, sets, run, a->workers, more, 1);
        step[i] = rc == 0 ? measured_step(run) : NAN;
        peak[i] = rc == 0 ? measured_peak(run) : 0;
        if (rc != 0) failed = 1, cli_error("plan: #%d failed (exit %d); its run directory is %s", i + 1, rc, run);
    }
    printf("\nverified (%d steps each, median step after two warm-up steps; memory: the largest rank's peak):\n",
           a->steps);
    printf("%3s %12s %12s %7s %14s %14s %7s\n", "#", "predicted ms", "measured ms", "error", "predicted MiB",
           "measured MiB", "error");
    int best = -1;
    for (int i = 0; i < k; i++) {
        const dt_plan_row *r = &pl->rows[i];
        printf("%3d %12.3f %12.3f %6.0f%% %14.1f %14.1f %6.0f%%\n", i + 1, 1e3 * r->step_s, 1e3 * step[i],
               pct(step[i], r->step_s), r->memory / 1048576.0, peak[i] / 1048576.0, pct(peak[i], (double)r->memory));
        if (isfinite(step[i]) && (best < 0 || step[i] < step[best])) best = i;
    }
    if (best >= 0 && isfinite(step[0]))
        printf("measured fastest: #%d (%.3f ms); the predicted fastest, #1, measured %.3f ms (%+.0f%%)\n", best + 1,
               1e3 * step[best], 1e3 * step[0], pct(step[0], step[best]));
    return failed ? EXIT_RUNTIME : 0;
}

// ---- the commands ----

static int parse(int argc, char **argv, plan_args *a) {
    memset(a, 0, sizeof *a);
    a->hosts = 1, a->top = 5, a->steps = 12, a->link = "10gbit,50us";
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x;
        struct { const char *flag; int *to; double lo, hi; } nums[] = {
            {"--workers", &a->workers, 1, 1024}, {"--hosts", &a->hosts, 1, 1024}, {"--top", &a->top, 1, 1000},
            {"--verify", &a->verify, 1, 64},     {"--steps", &a->steps, 5, 1e6},
        };
        int k = 0;
        while (k < 5 && strcmp(s, nums[k].flag)) k++;
        if (k < 5) {
            if (parse_number(s, v, nums[k].lo, nums[k].hi, 1, &x)) return EXIT_USAGE;
            *nums[k].to = (int)x;
            i++;
        } else if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            fputs(help, stdout);
            return -1;
        } else if (!strcmp(s, "--link") || !strcmp(s, "--memory-limit") || !strcmp(s, "--set") ||
                   !strcmp(s, "--run-dir")) {
            if (!v || !*v) return cli_error("%s needs a value (see 'dtrain plan --help')", s), EXIT_USAGE;
            if (!strcmp(s, "--memory-limit") && cli_memory_limit(v)) return EXIT_USAGE;
            if (!strcmp(s, "--set") && a->nsets == MAX_SETS) return cli_error("too many --set options"), EXIT_USAGE;
            if (!strcmp(s, "--set")) a->sets[a->nsets++] = v;
            else *(s[2] == 'l' ? &a->link : s[2] == 'm' ? &a->limit : &a->run_dir) = v;
            i++;
        } else if (!strcmp(s, "--lossy") || !strcmp(s, "--recalibrate")) {
            *(s[2] == 'l' ? &a->lossy : &a->recalibrate) = 1;
        } else if (s[0] == '-' && s[1]) {
            return cli_error("unknown option '%s' (see 'dtrain plan --help')", s), EXIT_USAGE;
        } else if (!a->config) {
            a->config = s;
        } else {
            return cli_error("unexpected argument '%s' (one CONFIG only)", s), EXIT_USAGE;
        }
    }
    if (!a->config) return cli_error("missing CONFIG (see 'dtrain plan --help')"), EXIT_USAGE;
    if (!a->workers) return cli_error("missing --workers N, the workers to plan for"), EXIT_USAGE;
    if (a->workers % a->hosts)
        return cli_error("--hosts %d: the %d workers cannot be spread evenly over them (N / H workers a host)",
                         a->hosts, a->workers), EXIT_USAGE;
    if (a->verify && a->hosts > 1)
        return cli_error("--verify runs on this machine alone; with --hosts %d it would not measure what was "
                         "predicted (scripts/cluster.sh runs pretend hosts)", a->hosts), EXIT_USAGE;
    return 0;
}

static void default_dir(const char *given, char *dir, size_t len) {
    char ts[32];
    time_t t = time(NULL);
    strftime(ts, sizeof ts, "%Y%m%d-%H%M%S", localtime(&t));
    if (given) snprintf(dir, len, "%s", given);
    else snprintf(dir, len, "runs/plan-%s", ts);
}

int cmd_plan(int argc, char **argv) {
    plan_args a;
    int rc = parse(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    char dir[2048], calib[2200];
    default_dir(a.run_dir, dir, sizeof dir);
    snprintf(calib, sizeof calib, "%s/calibration", dir);
    plan_t pl = {0};
    if ((rc = rank_layouts(&a, &pl, calib))) {
        free(pl.rows);
        return rc;
    }
    int k = a.top > a.verify ? a.top : a.verify;
    if (k > pl.nfit) k = pl.nfit;
    print_rows(&a, &pl, k);
    if (a.verify) rc = verify(&a, &pl, a.verify < pl.nfit ? a.verify : pl.nfit, dir);
    free(pl.rows);
    return rc;
}

// dtrain train --plan auto: the choice, for the run's summary.json.
static struct {
    int made;
    dt_plan_row row;
    char what[256], sets[1024];
} g_choice;

int cli_plan_best(const char *config, const char *const *sets, int nsets, int workers, const char *run_dir,
                  char *sets_out, size_t len) {
    plan_args a = {.config = config, .workers = workers > 0 ? workers : 1, .hosts = 1, .link = "10gbit,50us"};
    a.nsets = nsets < MAX_SETS ? nsets : MAX_SETS;
    for (int i = 0; i < a.nsets; i++) a.sets[i] = sets[i];
    char calib[2200];
    snprintf(calib, sizeof calib, "%s/plan-calibration", run_dir);
    plan_t pl = {0};
    int rc = rank_layouts(&a, &pl, calib);
    if (rc == 0) {
        g_choice.made = 1;
        g_choice.row = pl.rows[0];
        dt_plan_describe(&pl.rows[0].l, g_choice.what, sizeof g_choice.what);
        dt_plan_sets(&pl.c, &pl.rows[0].l, g_choice.sets, sizeof g_choice.sets);
        snprintf(sets_out, len, "%s", g_choice.sets);
        char mem[64];
        dt_log(DT_LOG_INFO, "plan: %s (of %d layouts that fit, %d in all): predicted step %.3f ms, %s a worker;%s",
               g_choice.what, pl.nfit, pl.n, 1e3 * g_choice.row.step_s,
               dt_mem_format(g_choice.row.memory, mem, sizeof mem), g_choice.sets[0] ? g_choice.sets : " as configured");
    }
    free(pl.rows);
    return rc;
}

void cli_plan_record(const char *run_dir) {
    if (!g_choice.made) return;
    char path[2200];
    snprintf(path, sizeof path, "%s/summary.json", run_dir);
    uint8_t *buf = NULL;
    size_t len = 0;
    if (dt_read_file_gz(path, 1 << 24, &buf, &len) != DT_OK) return;
    cJSON *j = cJSON_ParseWithLength((const char *)buf, len), *p = cJSON_CreateObject();
    free(buf);
    const dt_layout *l = &g_choice.row.l;
    cJSON_AddStringToObject(p, "layout", g_choice.what);
    cJSON_AddStringToObject(p, "sets", g_choice.sets);
    cJSON_AddNumberToObject(p, "zero", l->zero);
    cJSON_AddNumberToObject(p, "tensor", l->tensor);
    cJSON_AddNumberToObject(p, "pipeline", l->pipeline);
    cJSON_AddNumberToObject(p, "predicted_step_seconds", g_choice.row.step_s);
    cJSON_AddNumberToObject(p, "predicted_memory_bytes", (double)g_choice.row.memory);
    cJSON_AddNumberToObject(p, "measured_step_seconds", measured_step(run_dir));
    cJSON_AddItemToObject(j, "plan", p);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return;
    const void *parts[1] = {text};
    size_t sizes[1] = {strlen(text)};
    if (dt_write_atomic(path, parts, sizes, 1) != DT_OK) dt_log(DT_LOG_WARN, "plan: %s", dt_last_error());
    free(text);
}
