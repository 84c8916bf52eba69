/* dt_sim_* (train.h): predicted step time of data-parallel training on
 * many CPU or GPU hosts, from a profiled run (its per-phase times) and an
 * alpha-beta model of the collectives (a message of S bytes costs alpha +
 * S / beta on a link). What `dtrain simulate` prints. */
#include "dtrain/train.h"

#include "obs/report.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// j's number `key` (key NULL: j itself); NaN when it is not one.
static double num(const cJSON *j, const char *key) {
    const cJSON *x = key ? cJSON_GetObjectItemCaseSensitive(j, key) : j;
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

// [parallel] bucket_kb of the run's resolved config.ini; def if absent
static double bucket_kb(const char *run_dir, double def) {
    char path[4096], line[256];
    snprintf(path, sizeof path, "%s/config.ini", run_dir);
    FILE *f = dt_fopen_read(path);
    if (!f) return def;
    int in_parallel = 0;
    double v = def;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '[') in_parallel = !strncmp(line, "[parallel]", 10);
        else if (in_parallel && sscanf(line, "bucket_kb = %lf", &v) == 1) break;
    }
    fclose(f);
    return v;
}

// summary.json's layer_times ([train] time_layers) per sample into p
// (p->layers 0 when absent, too many, negative or all zero).
static void layer_times(const cJSON *j, dt_sim_profile *p) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "layer_times");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "forward_seconds");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(t, "backward_seconds");
    double samples = num(t, "samples"), sum = 0;
    int L = cJSON_GetArraySize(f), ok = samples >= 1 && L >= 1 && L <= DT_SIM_MAX_LAYERS && cJSON_GetArraySize(b) == L;
    for (int l = 0; ok && l < L; l++) {
        double x = num(cJSON_GetArrayItem(f, l), NULL), y = num(cJSON_GetArrayItem(b, l), NULL);
        ok = x >= 0 && y >= 0;  // (NaN: not a number)
        p->layer_forward_s[l] = x / samples, p->layer_backward_s[l] = y / samples;
        sum += x + y;
    }
    p->layers = ok && sum > 0 ? L : 0;
}

dt_status dt_sim_profile_load(const char *run_dir, dt_sim_profile *out) {
    double med[7];
    dt_status st = dt_report_phase_medians(run_dir, med);
    if (st != DT_OK) return st;
    char path[4096];
    snprintf(path, sizeof path, "%s/summary.json", run_dir);
    uint8_t *buf = NULL;
    size_t len = 0;
    if ((st = dt_read_file_gz(path, 0, &buf, &len)) != DT_OK) return st;
    cJSON *j = cJSON_ParseWithLength((const char *)buf, len);
    free(buf);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return dt_error(DT_ERR_FORMAT, "%s: expected a JSON object", path);
    }
    double params = num(j, "params"), batch = num(j, "batch"), workers = num(j, "workers");
    const char *bad = !(params > 0) ? "params" : !(batch >= 1) ? "batch" : !(workers >= 1) ? "workers" : NULL;
    if (bad) {
        cJSON_Delete(j);
        return dt_error(DT_ERR_FORMAT, "%s: expected a positive number \"%s\"", path, bad);
    }
    double per_rank = batch / workers;
    *out = (dt_sim_profile){
        .data_s = med[0] / per_rank,
        .compute_s = (med[1] + med[2]) / per_rank,
        .backward_share = med[1] + med[2] > 0 ? med[2] / (med[1] + med[2]) : 0.67,
        .optimizer_s = med[5],
        .params = params,
        .batch = (int)batch,
        .workers = (int)workers,
        .bucket_bytes = bucket_kb(run_dir, 2048) * 1024,
    };
    if (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "gpu"))) {
        // the device's kernels run behind the host's launches: its phases
        // are launch times (the first wait holds what came before it), its
        // step (which waits for them) is not
        out->compute_s = med[6] / per_rank;
        out->backward_share = 2.0 / 3, out->data_s = 0, out->optimizer_s = 0, out->device = 1;
    } else {
        layer_times(j, out);
    }
    cJSON_Delete(j);
    if (out->device && out->workers > 1)
        return dt_error(DT_ERR_FORMAT, "%s: a run on the GPU of %d ranks: its exchange waits for the device's "
                        "backward, so the host's clocks cannot tell them apart; profile a run of one rank",
                        run_dir, out->workers);
    return DT_OK;
}

void dt_sim_profile_scale(dt_sim_profile *p, double params) {
    double r = params / p->params;
    p->compute_s *= r;
    p->optimizer_s *= r;
    p->params = params;
    p->layers = 0;  // (the other model's)
}

/* Between h hosts, S bytes allreduced: the best of ring, recursive halving
 * and doubling, and a binomial tree (reduce + broadcast). */
static double inter_allreduce(double S, int h, double a, double b, const char **algo) {
    if (h <= 1) {
        *algo = "none";
        return 0;
    }
    double lg = ceil(log2(h)), frac = 2.0 * (h - 1) / h * S / b;
    double ring = 2.0 * (h - 1) * a + frac, rhd = 2 * lg * a + frac, tree = 2 * lg * (a + S / b);
    double best = ring;
    *algo = "ring";
    if (rhd < best) best = rhd, *algo = "rhd";
    if (tree < best) best = tree, *algo = "tree";
    return best;
}

// The ranks on each host: a GPU each on GPU hosts.
int dt_sim_host_ranks(const dt_sim_params *s) {
    int R = s->gpus_per_host > 0 ? s->gpus_per_host : s->ranks_per_host;
    return R > 0 ? R : 1;
}

double dt_sim_allreduce(double bytes, const dt_sim_params *s, const char **algo) {
    int R = dt_sim_host_ranks(s), H = s->hosts > 0 ? s->hosts : 1;
    double intra, share = bytes;
    if (s->gpus_per_host > 0) {
        // NCCL's hierarchy: a ring reduce-scatter and allgather over NVLink,
        // each GPU's share allreduced between hosts over its own NIC
        share = bytes / R;
        intra = R > 1 ? 2 * (R - 1) * (s->nvlink_latency_s + share / s->nvlink_bytes_per_s) : 0;
    } else {  // hier: reduce to the leader and broadcast back, over shm
        intra = R > 1 ? 2 * (s->host_latency_s + bytes / s->host_bytes_per_s) : 0;
    }
    const char *a;
    double inter = inter_allreduce(share, H, s->link_latency_s, s->link_bytes_per_s, &a);
    if (algo) *algo = a;
    return intra + inter;
}

void dt_sim_predict(const dt_sim_profile *p, const dt_sim_params *s, dt_sim_point *o) {
    int H = s->hosts > 0 ? s->hosts : 1, N = H * dt_sim_host_ranks(s);
    double local = s->weak ? (double)p->batch / p->workers : (double)p->batch / N;
    double S = (s->grad_bytes > 0 ? s->grad_bytes : 4) * p->params;
    memset(o, 0, sizeof *o);
    o->ranks = N;
    o->local_batch = local;
    o->compute_s = local * (p->compute_s + p->data_s);
    double bwd = local * p->compute_s * p->backward_share;
    // one allreduce per bucket (each pays the latency terms), the buckets
    // cut in fp32 elements whatever the gradients' bytes on the wire (as
    // dtrain cuts them); buckets overlap backward, the last never does
    double nb = p->bucket_bytes > 0 ? ceil(4 * p->params / p->bucket_bytes) : 1;
    o->comm_s = nb * dt_sim_allreduce(S / nb, s, &o->algo);
    double last = o->comm_s / nb;
    double opt = p->optimizer_s;
    if (s->zero) {
        // reduce-scatter (overlapping backward) + allgather after the
        // optimizer (not overlapped); the same bytes, the optimizer on 1/N
        double rs = o->comm_s / 2, ag = o->comm_s / 2;
        o->exposed_s = fmax(rs - bwd, rs / nb) + ag;
        opt /= N;
    } else {
        o->exposed_s = fmax(o->comm_s - bwd, last);
    }
    o->step_s = o->compute_s + o->exposed_s + opt;
    o->samples_per_s = local * N / o->step_s;
}

dt_status dt_sim_html(const char *path, const char *title, const char *body_html, const char *xlabel,
                      const char *ylabel, const char *const *names, const double *x, const double *const *y, int ns,
                      int n) {
    return dt_report_chart_page(path, title, body_html, xlabel, ylabel, names, x, y, ns, n);
}
