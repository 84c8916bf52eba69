/* dt_report_html (train.h): one self-contained HTML file from a run
 * directory's metrics logs, with inline SVG charts drawn here (no script,
 * no network): loss and accuracy, throughput, time per phase per rank, and
 * stragglers. */
#include "dtrain/train.h"

#include "obs/report.h"
#include "obs/straggler.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

// ----------------------------------------------------------------------------
// the run, as read from its logs

#define NPH 6  // data, forward, backward, comm exposed, comm hidden, optimizer
static const char *const ph_keys[NPH] = {"data_seconds", "forward_seconds", "backward_seconds",
                                         "comm_exposed_seconds", "comm_hidden_seconds", "optimizer_seconds"};
static const char *const ph_names[NPH] = {"data", "forward", "backward", "comm (exposed)", "comm (hidden)",
                                          "optimizer"};

typedef struct {  // a growable array of doubles
    double *v;
    int n, cap;
} vec;

typedef struct {
    vec step, time, loss, rate, trate, compute, ph[NPH], sent, recv, peak, secs;
    vec eval_step, eval_loss, eval_acc;
    cJSON *sched;  // the last "schedule" record (model parallel), or NULL
} rank_log;

typedef struct {
    int rank, step;
    char phase[32];
    double seconds, median;
} strag_event;

typedef struct {
    int nranks;
    rank_log *r;
    strag_event *ev;
    int nev;
    char name[128];
    double margin;
    int strag_steps;
} run_data;

static int push(vec *a, double x) {
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 256;
        double *v = realloc(a->v, sizeof *v * cap);
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

// The vectors with one entry per step record.
static int step_vecs(rank_log *r, vec **v) {
    vec *all[] = {&r->step, &r->time, &r->loss, &r->rate, &r->trate, &r->compute, &r->sent, &r->recv, &r->peak,
                  &r->secs};
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) v[n++] = all[i];
    for (int p = 0; p < NPH; p++) v[n++] = &r->ph[p];
    return n;
}

static void free_rank(rank_log *r) {
    vec *v[16];
    int n = step_vecs(r, v);
    for (int i = 0; i < n; i++) free(v[i]->v);
    free(r->eval_step.v);
    free(r->eval_loss.v);
    free(r->eval_acc.v);
    cJSON_Delete(r->sched);
}

// Forgets the last step record.
static void drop_last(rank_log *r) {
    vec *v[16];
    int n = step_vecs(r, v);
    for (int i = 0; i < n; i++) v[i]->n--;
}

static double get(const cJSON *j, const char *key, double def) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsNumber(x) ? x->valuedouble : def;
}

// A step record must have these; the others default to 0.
static const char *const required[] = {"step", "time", "loss"};

#define REPORT_MAX_LOG (1 << 30)

static dt_status read_log(const char *path, run_data *d, rank_log *r) {
    FILE *f = dt_fopen_read(path);
    if (!f) return DT_ERR_IO;  // (recorded)
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && sb.st_size > REPORT_MAX_LOG) {  // (a run of millions of steps logs less)
        fclose(f);
        return dt_error(DT_ERR_FORMAT, "%s: %lld bytes, more than the %d MiB a metrics log may have for report", path,
                        (long long)sb.st_size, REPORT_MAX_LOG >> 20);
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int ln = 0, oom = 0;
    dt_status st = DT_OK;
    while (st == DT_OK && (len = getline(&line, &cap, f)) >= 0) {
        ln++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) continue;
        cJSON *j = cJSON_Parse(line);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
        if (!cJSON_IsObject(j) || !cJSON_IsString(type)) {
            char got[4 * 60 + 1];  // the line's start, escaped: it came from a file
            st = dt_error(DT_ERR_FORMAT, "%s:%d: expected one JSON object with a \"type\" per line, got '%s%s'",
                          path, ln, dt_escape_text(got, sizeof got, line, len > 60 ? 60 : (size_t)len),
                          len > 60 ? "..." : "");
            cJSON_Delete(j);
            break;
        }
        const char *t = type->valuestring;
        if (!strcmp(t, "step")) {
            for (size_t k = 0; k < sizeof required / sizeof required[0]; k++)
                if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, required[k])))
                    st = dt_error(DT_ERR_FORMAT, "%s:%d: step record without a number \"%s\"", path, ln, required[k]);
            // A run resumed from a checkpoint repeats the steps after it:
            // the later records replace the earlier ones.
            double step = get(j, "step", 0);
            while (st == DT_OK && r->step.n > 0 && r->step.v[r->step.n - 1] >= step) drop_last(r);
            if (st == DT_OK) {
                double c = 0, ph[NPH];
                for (int p = 0; p < NPH; p++) ph[p] = get(j, ph_keys[p], 0);
                c = ph[0] + ph[1] + ph[2] + ph[5];
                oom |= push(&r->step, get(j, "step", 0)) | push(&r->time, get(j, "time", 0)) |
                       push(&r->loss, get(j, "loss", 0)) | push(&r->rate, get(j, "samples_per_sec", 0)) |
                       push(&r->trate, get(j, "tokens_per_sec", 0)) | push(&r->compute, c) |
                       push(&r->sent, get(j, "bytes_sent", 0)) | push(&r->recv, get(j, "bytes_recv", 0)) |
                       push(&r->peak, get(j, "peak_rss_bytes", 0)) | push(&r->secs, get(j, "step_seconds", 0));
                for (int p = 0; p < NPH; p++) oom |= push(&r->ph[p], ph[p]);
            }
        } else if (!strcmp(t, "eval")) {
            oom |= push(&r->eval_step, get(j, "step", 0)) | push(&r->eval_loss, get(j, "loss", NAN)) |
                   push(&r->eval_acc, get(j, "accuracy", NAN));
        } else if (!strcmp(t, "straggler")) {
            strag_event *e = realloc(d->ev, sizeof *e * (d->nev + 1));
            if (!e) oom = 1;
            else {
                d->ev = e;
                e += d->nev++;
                e->rank = (int)get(j, "rank", -1);
                e->step = (int)get(j, "step", 0);
                e->seconds = get(j, "step_seconds", 0);
                e->median = get(j, "median_seconds", 0);
                const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "phase");
                snprintf(e->phase, sizeof e->phase, "%s", cJSON_IsString(p) ? p->valuestring : "?");
            }
        } else if (!strcmp(t, "schedule")) {
            cJSON_Delete(r->sched);
            r->sched = cJSON_Duplicate(j, 1);
            oom |= !r->sched;
        } else if (!strcmp(t, "run")) {
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(j, "name");
            if (cJSON_IsString(n)) snprintf(d->name, sizeof d->name, "%s", n->valuestring);
            d->margin = get(j, "straggler_margin", d->margin);
            d->strag_steps = (int)get(j, "straggler_steps", d->strag_steps);
        }  // other types: from a newer dtrain; skipped
        cJSON_Delete(j);
        if (oom && st == DT_OK) st = dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    }
    free(line);
    if (st == DT_OK && ferror(f)) st = dt_error(DT_ERR_IO, "%s: read error", path);
    fclose(f);
    return st;
}

static dt_status read_run(const char *run_dir, run_data *d) {
    struct stat sb;
    if (stat(run_dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return dt_error(DT_ERR_IO, "%s: no such run directory", run_dir);
    char pat[4096];
    snprintf(pat, sizeof pat, "%s/metrics/rank-*.jsonl", run_dir);
    glob_t g;
    if (glob(pat, 0, NULL, &g) != 0 || g.gl_pathc == 0) {
        globfree(&g);
        return dt_error(DT_ERR_IO, "%s/metrics: no metrics logs (rank-*.jsonl) in this run directory", run_dir);
    }
    d->nranks = (int)g.gl_pathc;
    d->r = calloc(d->nranks, sizeof *d->r);
    d->margin = 0.2;
    dt_status st = d->r ? DT_OK : dt_error(DT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < d->nranks && st == DT_OK; i++) st = read_log(g.gl_pathv[i], d, &d->r[i]);
    if (st == DT_OK && d->r[0].step.n == 0)
        st = dt_error(DT_ERR_FORMAT, "%s: no step records (the run ended before its first step)", g.gl_pathv[0]);
    globfree(&g);
    return st;
}

// ----------------------------------------------------------------------------
// SVG charts

#define CW 760  // chart size
#define CH 280
#define ML 70   // margins of the plot area
#define MR 150
#define MT 34
#define MB 44

static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

typedef struct {
    const char *name;
    const double *x, *y;
    int n;
    const char *color;
    int dashed, dots, width;
} series;

typedef struct {
    double x0, x1, y0, y1;
} box;

static void html_text(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else fputc(*s, f);
    }
}

// A "nice" tick step (1, 2 or 5 x 10^k) for about n ticks over span.
static double nice_step(double span, int n) {
    double raw = span / n, mag = pow(10, floor(log10(raw))), r = raw / mag;
    return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * mag;
}

static void fmt_tick(char *b, size_t n, double v, double step) {
    if (fabs(v) < step * 1e-6) v = 0;  // (a sum of steps that lands near 0: never "-0.0")
    if (fabs(v) >= 1e6 || (fabs(v) < 1e-3 && v != 0)) snprintf(b, n, "%.2g", v);
    else if (step >= 1) snprintf(b, n, "%.0f", v);
    else snprintf(b, n, "%.*f", (int)ceil(-log10(step)), v);
}

static double px(const box *b, double x) { return ML + (x - b->x0) / (b->x1 - b->x0) * (CW - ML - MR); }
static double py(const box *b, double y) { return CH - MB - (y - b->y0) / (b->y1 - b->y0) * (CH - MT - MB); }

static void chart_open(FILE *f, const char *id, const char *title) {
    fprintf(f, "<svg class=\"chart\" id=\"%s\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" role=\"img\"><title>", id, CW, CH, CW, CH);
    html_text(f, title);
    fprintf(f, "</title><rect class=\"bg\" x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#fff\"/>"
               "<text x=\"%d\" y=\"20\" class=\"ct\">", CW, CH, ML);
    html_text(f, title);
    fputs("</text>\n", f);
}

// Axes with grid lines, tick labels and axis names.
static void axes(FILE *f, const box *b, const char *xl, const char *yl) {
    char t[32];
    double s = nice_step(b->y1 - b->y0, 5);
    for (double v = ceil(b->y0 / s) * s; v <= b->y1 + s * 1e-9; v += s) {
        fmt_tick(t, sizeof t, v, s);
        fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>"
                   "<text x=\"%d\" y=\"%.1f\" class=\"tl\" text-anchor=\"end\">%s</text>\n",
                ML, CW - MR, py(b, v), py(b, v), ML - 6, py(b, v) + 4, t);
    }
    s = nice_step(b->x1 - b->x0, 6);
    for (double v = ceil(b->x0 / s) * s; v <= b->x1 + s * 1e-9; v += s) {
        fmt_tick(t, sizeof t, v, s);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" class=\"tl\" text-anchor=\"middle\">%s</text>\n", px(b, v), CH - MB + 16, t);
    }
    fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" class=\"axis\"/>"
               "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" class=\"axis\"/>\n",
            ML, CW - MR, CH - MB, CH - MB, ML, ML, MT, CH - MB);
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"al\" text-anchor=\"middle\">", (ML + CW - MR) / 2, CH - 8);
    html_text(f, xl);
    fprintf(f, "</text><text x=\"14\" y=\"%d\" class=\"al\" text-anchor=\"middle\" transform=\"rotate(-90 14 %d)\">",
            (MT + CH - MB) / 2, (MT + CH - MB) / 2);
    html_text(f, yl);
    fputs("</text>\n", f);
}

static void legend(FILE *f, int i, const char *name, const char *color) {
    int y = MT + 6 + 18 * i;
    fprintf(f, "<rect class=\"key\" x=\"%d\" y=\"%d\" width=\"14\" height=\"10\" fill=\"%s\"/><text x=\"%d\" y=\"%d\" class=\"lg\">",
            CW - MR + 12, y, color, CW - MR + 32, y + 9);
    html_text(f, name);
    fputs("</text>\n", f);
}

// Draws the series; hline (if finite) is a dashed reference line.
static void line_chart(FILE *f, const char *id, const char *title, const char *xl, const char *yl, const series *s,
                       int ns, double hline, int y_from_zero) {
    box b = {INFINITY, -INFINITY, y_from_zero ? 0 : INFINITY, -INFINITY};
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n; i++)
            if (isfinite(s[k].x[i]) && isfinite(s[k].y[i])) {
                b.x0 = fmin(b.x0, s[k].x[i]);
                b.x1 = fmax(b.x1, s[k].x[i]);
                b.y0 = fmin(b.y0, s[k].y[i]);
                b.y1 = fmax(b.y1, s[k].y[i]);
            }
    if (isfinite(hline)) b.y0 = fmin(b.y0, hline), b.y1 = fmax(b.y1, hline);
    if (!isfinite(b.x0)) b = (box){0, 1, 0, 1};
    if (b.x1 - b.x0 < 1e-12) b.x0 -= 0.5, b.x1 += 0.5;
    if (b.y1 - b.y0 < 1e-12) b.y0 -= fabs(b.y0) * 0.1 + 0.5, b.y1 += fabs(b.y1) * 0.1 + 0.5;
    double pad = (b.y1 - b.y0) * 0.05;
    if (!y_from_zero || b.y0 < 0) b.y0 -= pad;
    b.y1 += pad;
    chart_open(f, id, title);
    axes(f, &b, xl, yl);
    if (isfinite(hline))
        fprintf(f, "<path class=\"ref\" d=\"M%d %.1fL%d %.1f\" stroke=\"#d62728\" stroke-dasharray=\"6 4\" fill=\"none\"/>\n",
                ML, py(&b, hline), CW - MR, py(&b, hline));
    for (int k = 0; k < ns; k++) {
        const series *e = &s[k];
        if (e->n > 1 && !e->dots) {
            fprintf(f, "<path class=\"line\" fill=\"none\" stroke=\"%s\" stroke-width=\"%d\"%s d=\"", e->color,
                    e->width ? e->width : 2, e->dashed ? " stroke-dasharray=\"5 3\"" : "");
            int first = 1;
            for (int i = 0; i < e->n; i++) {
                if (!isfinite(e->x[i]) || !isfinite(e->y[i])) continue;
                fprintf(f, "%c%.1f %.1f", first ? 'M' : 'L', px(&b, e->x[i]), py(&b, e->y[i]));
                first = 0;
            }
            fputs("\"/>\n", f);
        }
        if (e->dots || e->n == 1)
            for (int i = 0; i < e->n; i++)
                if (isfinite(e->x[i]) && isfinite(e->y[i]))
                    fprintf(f, "<circle class=\"dot\" cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/>\n", px(&b, e->x[i]),
                            py(&b, e->y[i]), e->color);
        legend(f, k, e->name, e->color);
    }
    fputs("</svg>\n", f);
}

// Averages of up to `bins` consecutive groups (long runs stay readable).
static int bin(const double *x, const double *y, int n, int bins, double *ox, double *oy) {
    if (n <= bins) {
        memcpy(ox, x, sizeof *x * n);
        memcpy(oy, y, sizeof *y * n);
        return n;
    }
    for (int b = 0; b < bins; b++) {
        int lo = (int)((long)n * b / bins), hi = (int)((long)n * (b + 1) / bins);
        double sx = 0, sy = 0;
        for (int i = lo; i < hi; i++) sx += x[i], sy += y[i];
        ox[b] = sx / (hi - lo);
        oy[b] = sy / (hi - lo);
    }
    return bins;
}

// Trailing moving average over w points.
static void smooth(const double *y, int n, int w, double *out) {
    double s = 0;
    for (int i = 0; i < n; i++) {
        s += y[i];
        if (i >= w) s -= y[i - w];
        out[i] = s / (i + 1 < w ? i + 1 : w);
    }
}

static double mean(const vec *v) {
    double s = 0;
    for (int i = 0; i < v->n; i++) s += v->v[i];
    return v->n ? s / v->n : 0;
}

static double sum(const vec *v) { return mean(v) * v->n; }

// Horizontal stacked bars: mean seconds per step (unit) in each phase, per rank.
static void breakdown_chart(FILE *f, const run_data *d, const char *unit) {
    int W = d->nranks, bh = W > 16 ? 8 : 22, stack[] = {0, 1, 2, 3, 5};
    double m[W][NPH], xmax = 0;
    for (int r = 0; r < W; r++) {
        double t = 0;
        for (int p = 0; p < NPH; p++) m[r][p] = mean(&d->r[r].ph[p]);
        for (int k = 0; k < 5; k++) t += m[r][stack[k]];
        xmax = fmax(xmax, t);
    }
    int h = MT + MB + W * (bh + 6);
    if (h < MT + 18 * 5 + MB) h = MT + 18 * 5 + MB;  // (the five phases' legend above the axis labels)
    box b = {0, xmax > 0 ? xmax * 1.05 : 1, 0, 1};
    fprintf(f, "<svg class=\"chart\" id=\"breakdown\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" role=\"img\"><title>Time per %s by phase</title>"
               "<rect class=\"bg\" x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#fff\"/>"
               "<text x=\"%d\" y=\"20\" class=\"ct\">Mean time per %s by phase, per rank</text>\n",
            CW, h, CW, h, unit, CW, h, ML, unit);
    double s = nice_step(b.x1, 6);
    char t[32];
    for (double v = 0; v <= b.x1 + 1e-12; v += s) {
        fmt_tick(t, sizeof t, v * 1e3, s * 1e3);
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" class=\"grid\"/>"
                   "<text x=\"%.1f\" y=\"%d\" class=\"tl\" text-anchor=\"middle\">%s</text>\n",
                px(&b, v), px(&b, v), MT, h - MB, px(&b, v), h - MB + 16, t);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"al\" text-anchor=\"middle\">milliseconds per %s</text>\n",
            (ML + CW - MR) / 2, h - 8, unit);
    for (int r = 0; r < W; r++) {
        double x = 0, y = MT + r * (bh + 6);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" class=\"tl\" text-anchor=\"end\">rank %d</text>\n", ML - 6,
                y + bh / 2.0 + 4, r);
        for (int k = 0; k < 5; k++) {
            double w = px(&b, x + m[r][stack[k]]) - px(&b, x);
            fprintf(f, "<rect class=\"bar\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%d\" fill=\"%s\">"
                       "<title>rank %d %s: %.3f ms</title></rect>\n",
                    px(&b, x), y, w, bh, palette[k], r, ph_names[stack[k]], m[r][stack[k]] * 1e3);
            x += m[r][stack[k]];
        }
    }
    for (int k = 0; k < 5; k++) legend(f, k, ph_names[stack[k]], palette[k]);
    fputs("</svg>\n", f);
}

// A federated run's clients (RUN_DIR/clients.json): one bar per client, its
// samples stacked by class. Nothing when the file is absent or unreadable.
static void clients_chart(FILE *f, const char *run_dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/clients.json", run_dir);
    FILE *s = dt_fopen_read(path);
    if (!s) return;
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    if (buf) {
        size_t got;
        while ((got = fread(buf + n, 1, cap - 1 - n, s)) > 0 && (n += got) < cap - 1) {}
        buf[n] = 0;
    }
    fclose(s);
    cJSON *j = buf ? cJSON_Parse(buf) : NULL;
    free(buf);
    const cJSON *cl = cJSON_GetObjectItem(j, "clients");
    int C = cJSON_GetArraySize(cl), K = (int)get(j, "classes", 10);
    if (!cJSON_IsArray(cl) || C == 0 || K < 1) {
        fputs("<p>clients.json could not be read; its chart is left out.</p>\n", f);
        cJSON_Delete(j);
        return;
    }
    double ymax = 1;
    const cJSON *e;
    cJSON_ArrayForEach(e, cl) ymax = fmax(ymax, get(e, "samples", 0));
    const cJSON *part = cJSON_GetObjectItem(j, "partition");
    char title[128];
    snprintf(title, sizeof title, "Samples per client by class (partition %s)",
             cJSON_IsString(part) ? part->valuestring : "?");
    fputs("<h2>Clients</h2>\n", f);
    chart_open(f, "clients", title);
    box b = {0, C, 0, ymax * 1.05};
    axes(f, &b, "client", "samples");
    double w = (px(&b, 1) - px(&b, 0)) * 0.85;
    int c = 0;
    cJSON_ArrayForEach(e, cl) {
        const cJSON *h = cJSON_GetObjectItem(e, "histogram"), *v;
        double y = 0;
        int k = 0;
        cJSON_ArrayForEach(v, h) {
            double x = cJSON_IsNumber(v) ? v->valuedouble : 0;
            if (x > 0)
                fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\">"
                           "<title>client %d class %d: %.0f</title></rect>\n",
                        px(&b, c), py(&b, y + x), w, py(&b, y) - py(&b, y + x), palette[k % 10], c, k, x);
            y += x;
            k++;
        }
        c++;
    }
    for (int k = 0; k < K && k < 10; k++) {
        char name[16];
        snprintf(name, sizeof name, "class %d", k);
        legend(f, k, name, palette[k]);
    }
    fputs("</svg>\n", f);
    cJSON_Delete(j);
}

// A parameter-server run's staleness histogram (summary.json's "ps"): one
// bar per staleness, the gradients server 0 applied at it, with the mode
// and the gradients dropped. Nothing for other runs.
static void staleness_chart(FILE *f, const char *run_dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/summary.json", run_dir);
    uint8_t *text = NULL;
    size_t len;
    if (dt_read_file_gz(path, 0, &text, &len) != DT_OK) return;
    cJSON *j = cJSON_ParseWithLength((const char *)text, len);
    free(text);
    const cJSON *ps = cJSON_GetObjectItem(j, "ps"), *h = cJSON_GetObjectItem(ps, "staleness_histogram"), *e;
    const cJSON *mode = cJSON_GetObjectItem(ps, "mode");
    int n = cJSON_GetArraySize(h);
    if (!cJSON_IsArray(h) || n == 0) {
        cJSON_Delete(j);
        return;
    }
    double ymax = 1;
    cJSON_ArrayForEach(e, h) ymax = fmax(ymax, cJSON_IsNumber(e) ? e->valuedouble : 0);
    char title[200], skipped[64] = "";
    if (cJSON_GetObjectItem(ps, "skipped")) snprintf(skipped, sizeof skipped, ", %.0f skipped", get(ps, "skipped", 0));
    snprintf(title, sizeof title, "Staleness of the applied gradients (server 0, mode %s; %.0f dropped%s)",
             cJSON_IsString(mode) ? mode->valuestring : "?", get(ps, "dropped", 0), skipped);
    fputs("<h2>Staleness</h2>\n", f);
    chart_open(f, "staleness", title);
    box b = {0, n, 0, ymax * 1.05};
    axes(f, &b, "staleness (updates between pull and apply)", "gradients");
    double w = (px(&b, 1) - px(&b, 0)) * 0.85;
    int k = 0;
    cJSON_ArrayForEach(e, h) {
        double x = cJSON_IsNumber(e) ? e->valuedouble : 0;
        if (x > 0)
            fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\">"
                       "<title>staleness %d: %.0f</title></rect>\n",
                    px(&b, k), py(&b, x), w, py(&b, 0) - py(&b, x), palette[0], k, x);
        k++;
    }
    fputs("</svg>\n", f);
    cJSON_Delete(j);
}

// ----------------------------------------------------------------------------
// the page

static const char style[] =
    "body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:800px;color:#222}"
    "h1{font-size:22px}h2{font-size:17px;margin-top:28px}"
    "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    "th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}"
    "svg.chart{display:block;border:1px solid #ddd;margin:8px 0}"
    ".ct{font-size:14px;font-weight:600}.tl,.lg{font-size:11px;fill:#444}.al{font-size:12px;fill:#222}"
    ".grid{stroke:#eee}.axis{stroke:#888}.flag{color:#b00;font-weight:600}";

static void summary_table(FILE *f, const char *run_dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/summary.json", run_dir);
    FILE *s = dt_fopen_read(path);
    if (!s) return;
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, s);
    fclose(s);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    if (!cJSON_IsObject(j)) {
        fprintf(f, "<p>summary.json is not valid JSON; its figures are left out.</p>\n");
        cJSON_Delete(j);
        return;
    }
    fputs("<table><tr><th>summary.json</th><th></th></tr>\n", f);
    const cJSON *e;
    cJSON_ArrayForEach(e, j) {
        if (!cJSON_IsNumber(e) && !cJSON_IsString(e)) continue;
        fputs("<tr><td>", f);
        html_text(f, e->string);
        fputs("</td><td>", f);
        if (cJSON_IsNumber(e)) fprintf(f, "%.6g", e->valuedouble);
        else html_text(f, e->valuestring);
        fputs("</td></tr>\n", f);
    }
    fputs("</table>\n", f);
    cJSON_Delete(j);
}

// A federated run logs one step record per round (docs/federated.md): its
// summary.json says "mode": "federated", and while it runs, before there is
// a summary, its clients.json marks it.
static int federated_run(const char *run_dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/summary.json", run_dir);
    FILE *s = dt_fopen_read(path);
    if (!s) {
        snprintf(path, sizeof path, "%s/clients.json", run_dir);
        struct stat sb;
        return stat(path, &sb) == 0;
    }
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, s);
    fclose(s);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    const cJSON *m = cJSON_GetObjectItem(j, "mode");
    int fed = cJSON_IsString(m) && !strcmp(m->valuestring, "federated");
    cJSON_Delete(j);
    return fed;
}

// A span of a schedule record: [forward?, micro-batch, chunk, start, end].
static int sched_span(const cJSON *e, double v[5]) {
    if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 5) return 0;
    for (int k = 0; k < 5; k++) {
        const cJSON *x = cJSON_GetArrayItem(e, k);
        if (!cJSON_IsNumber(x)) return 0;
        v[k] = x->valuedouble;
    }
    return v[4] >= v[3];
}

// Model parallel: the stages of data-parallel replica 0 (tensor rank 0) in
// rank 0's last recorded step, one row each, forwards and backwards as
// boxes numbered by micro-batch; each stage's idle share of the step beside
// the model (P-1)/(V M+P-1).
static void pipeline_chart(FILE *f, const run_data *d) {
    const cJSON *s0 = d->r[0].sched;
    if (!s0) return;
    double step = get(s0, "step", -1), P = get(s0, "stages", 1), V = get(s0, "virtual_stages", 1);
    double M = get(s0, "micro_batches", 1);
    int rows[64], nr = 0;
    double lo = INFINITY, hi = -INFINITY, v[5];
    for (int r = 0; r < d->nranks && nr < 64; r++) {
        const cJSON *sc = d->r[r].sched;
        if (!sc || get(sc, "step", -2) != step || get(sc, "tensor", 1) != 0 || get(sc, "replica", 1) != 0) continue;
        rows[nr++] = r;
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(sc, "spans")) if (sched_span(e, v)) {
            lo = fmin(lo, v[3]);
            hi = fmax(hi, v[4]);
        }
    }
    if (!nr || !(hi > lo)) return;
    int rh = 28, H = MT + nr * rh + MB, x0 = ML, x1 = CW - 20;
    fprintf(f, "<h2>Pipeline timeline</h2>\n<svg class=\"chart\" id=\"pipeline\" xmlns=\"http://www.w3.org/2000/svg\" "
               "width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n<text x=\"%d\" y=\"20\" font-size=\"14\">"
               "Step %.0f: forward (blue) and backward (orange) of each micro-batch, per stage</text>\n",
            CW, H, CW, H, ML, step);
    for (int i = 0; i < nr; i++) {
        const cJSON *sc = d->r[rows[i]].sched, *e;
        int y = MT + i * rh;
        fprintf(f, "<text x=\"4\" y=\"%d\" font-size=\"12\">stage %.0f</text>\n", y + rh / 2 + 4, get(sc, "stage", 0));
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(sc, "spans")) if (sched_span(e, v)) {
            double a = x0 + (v[3] - lo) / (hi - lo) * (x1 - x0), w = (v[4] - v[3]) / (hi - lo) * (x1 - x0);
            fprintf(f, "<rect class=\"%s\" x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\" "
                       "fill-opacity=\"%.2f\" stroke=\"#fff\" stroke-width=\"0.5\"/>\n",
                    v[0] ? "fwd" : "bwd", a, y + 2, w > 0.5 ? w : 0.5, rh - 4, v[0] ? palette[0] : palette[1],
                    1.0 - 0.35 * fmod(v[2], 2));
            if (w > 14)
                fprintf(f, "<text x=\"%.1f\" y=\"%d\" font-size=\"10\" fill=\"#fff\" text-anchor=\"middle\">%.0f</text>\n",
                        a + w / 2, y + rh / 2 + 3, v[1]);
        }
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\">0</text><text x=\"%d\" y=\"%d\" font-size=\"12\" "
               "text-anchor=\"end\">%.1f ms</text>\n</svg>\n",
            x0, H - MB + 16, x1, H - MB + 16, (hi - lo) * 1e3);
    fprintf(f, "<table><tr><th>stage</th><th>rank</th><th>busy, ms</th><th>idle in the step</th><th>model (P-1)/(%sM+P-1)</th></tr>\n",
            V > 1 ? "V" : "");
    for (int i = 0; i < nr; i++) {
        const cJSON *sc = d->r[rows[i]].sched, *e;
        double busy = 0;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(sc, "spans")) if (sched_span(e, v)) busy += v[4] - v[3];
        fprintf(f, "<tr><td>%.0f</td><td>%d</td><td>%.2f</td><td>%.1f%%</td><td>%.1f%%</td></tr>\n", get(sc, "stage", 0),
                rows[i], busy * 1e3, 100 * (1 - busy / (hi - lo)), 100 * (P - 1) / (V * M + P - 1));
    }
    fputs("</table>\n<p>Idle is the share of the step (first forward to last backward of all stages) in which "
          "the stage computes nothing: the bubble, plus waiting for slower stages and transfers.</p>\n", f);
}

static void write_page(FILE *f, const char *run_dir, const run_data *d) {
    const rank_log *r0 = &d->r[0];
    int W = d->nranks, n = r0->step.n, nb = n < 600 ? n : 600;
    const char *unit = federated_run(run_dir) ? "round" : "step";  // the x axis of the per-step charts
    double *bx = malloc(sizeof(double) * (n + 1) * 5), *by = bx + n + 1, *sm = by + n + 1, *sx = sm + n + 1,
           *sy = sx + n + 1;
    if (!bx) return;
    fputs("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>dtrain report: ", f);
    html_text(f, d->name);
    fprintf(f, "</title><style>%s</style></head><body>\n<h1>dtrain report: ", style);
    html_text(f, d->name);
    fputs("</h1>\n<p>Run directory <code>", f);
    html_text(f, run_dir);
    fprintf(f, "</code>: %d rank%s, %d %ss logged.</p>\n", W, W > 1 ? "s" : "", n, unit);
    summary_table(f, run_dir);

    // Loss: training (binned, thin), its moving average over a twentieth of
    // the run, and evaluation.
    fputs("<h2>Loss</h2>\n", f);
    int k = bin(r0->step.v, r0->loss.v, n, nb, bx, by);
    smooth(r0->loss.v, n, n / 20 + 1, sm);
    int ks = bin(r0->step.v, sm, n, nb, sx, sy);
    series ls[3] = {{"train", bx, by, k, "#9ecae1", 0, 0, 1},
                    {"train, smoothed", sx, sy, ks, palette[0], 0, 0, 2},
                    {"evaluation", r0->eval_step.v, r0->eval_loss.v, r0->eval_step.n, palette[1], 0, 1, 2}};
    line_chart(f, "loss", "Loss", unit, "loss", ls, r0->eval_step.n ? 3 : 2, NAN, 0);
    int has_acc = 0;
    for (int i = 0; i < r0->eval_acc.n; i++) has_acc |= isfinite(r0->eval_acc.v[i]);
    if (has_acc) {
        fputs("<h2>Accuracy</h2>\n", f);
        series as = {"evaluation", r0->eval_step.v, r0->eval_acc.v, r0->eval_acc.n, palette[2], 0, 0, 2};
        line_chart(f, "accuracy", "Evaluation accuracy", unit, "accuracy", &as, 1, NAN, 0);
    } else {
        fputs("<p>No accuracy: the run logged no evaluation with an accuracy (language models report a loss only).</p>\n", f);
    }

    clients_chart(f, run_dir);

    // Throughput over time (moving average of per-step figures).
    int tok = r0->trate.n && r0->trate.v[n - 1] > 0;
    const vec *rv = tok ? &r0->trate : &r0->rate;
    smooth(rv->v, n, n / 50 + 1, sm);
    k = bin(r0->time.v, sm, n, nb, bx, by);
    fputs("<h2>Throughput</h2>\n", f);
    series ts = {tok ? "tokens/s" : "samples/s", bx, by, k, palette[0], 0, 0, 2};
    line_chart(f, "throughput", tok ? "Training throughput (tokens/s)" : "Training throughput (samples/s)",
               "seconds since the start", tok ? "tokens per second" : "samples per second", &ts, 1, NAN, 1);

    // Time per phase, per rank.
    fputs("<h2>Where the time goes</h2>\n", f);
    breakdown_chart(f, d, unit);
    fprintf(f, "<table><tr><th>rank</th><th>%ss</th><th>%s time, ms</th><th>work, ms</th><th>comm exposed, ms</th>"
               "<th>comm hidden, ms</th><th>sent, MB</th><th>received, MB</th><th>peak memory, MB</th></tr>\n",
            unit, unit);
    for (int r = 0; r < W; r++) {
        const rank_log *g = &d->r[r];
        double step = 0;
        for (int p = 0; p < NPH; p++)
            if (p != 4) step += mean(&g->ph[p]);
        double peak = 0;
        for (int i = 0; i < g->peak.n; i++) peak = fmax(peak, g->peak.v[i]);
        fprintf(f, "<tr><td>%d</td><td>%d</td><td>%.2f</td><td>%.2f</td><td>%.2f</td><td>%.2f</td><td>%.1f</td>"
                   "<td>%.1f</td><td>%.0f</td></tr>\n",
                r, g->step.n, step * 1e3, mean(&g->compute) * 1e3, mean(&g->ph[3]) * 1e3, mean(&g->ph[4]) * 1e3,
                sum(&g->sent) / 1e6, sum(&g->recv) / 1e6, peak / 1e6);
    }
    fputs("</table>\n<p>Work is data wait + forward + backward + optimizer: a rank's own share of a step. "
          "Exposed communication is time spent waiting for it; hidden communication ran during backward.</p>\n", f);

    staleness_chart(f, run_dir);
    pipeline_chart(f, d);

    // Stragglers: each rank's work per step over the median of all ranks.
    fputs("<h2>Stragglers</h2>\n", f);
    int flagged[W];
    memset(flagged, 0, sizeof flagged);
    for (int i = 0; i < d->nev; i++)
        if (d->ev[i].rank >= 0 && d->ev[i].rank < W) flagged[d->ev[i].rank] = 1;
    int m = n;
    for (int r = 0; r < W; r++) m = d->r[r].step.n < m ? d->r[r].step.n : m;
    double *ratio = malloc(sizeof(double) * ((size_t)W * (m + 1) * 3 + m + W + 2));
    series *ss = malloc(sizeof *ss * W);
    char (*names)[32] = malloc(sizeof *names * W);
    if (ratio && ss && names && m > 0) {
        double *med = ratio + (size_t)W * (m + 1), *tmp = med + m + 1, *xs = tmp + W + 1, *ys = xs + (size_t)W * (m + 1);
        for (int i = 0; i < m; i++) {
            for (int r = 0; r < W; r++) tmp[r] = d->r[r].compute.v[i];
            med[i] = dt_median(tmp, W);
        }
        int mb = m < 400 ? m : 400;
        for (int r = 0; r < W; r++) {
            double *rr = ratio + (size_t)r * (m + 1);
            for (int i = 0; i < m; i++) rr[i] = med[i] > 0 ? d->r[r].compute.v[i] / med[i] : 1;
            int kk = bin(r0->step.v, rr, m, mb, xs + (size_t)r * (m + 1), ys + (size_t)r * (m + 1));
            snprintf(names[r], sizeof names[r], "rank %d%s", r, flagged[r] ? " (flagged)" : "");
            ss[r] = (series){names[r], xs + (size_t)r * (m + 1), ys + (size_t)r * (m + 1), kk,
                             palette[(r % 9) == 3 ? 9 : r % 9], 0, 0, flagged[r] ? 3 : 1};
        }
        char title[80];
        snprintf(title, sizeof title, "Each rank's work per %s / median of all ranks", unit);
        line_chart(f, "straggler", title, unit, "ratio to the median", ss, W, 1 + d->margin, 1);
    }
    free(ratio);
    free(ss);
    free(names);
    fprintf(f, "<p>The dashed line is 1 + straggler_margin (%.0f%%); a rank above it for straggler_steps (%d) "
               "steps in a row is reported.</p>\n", 100 * d->margin, d->strag_steps);
    if (!d->nev) fputs("<p>No straggler was reported.</p>\n", f);
    else {
        fputs("<table><tr><th>flagged rank</th><th>at step</th><th>slow phase</th><th>its time, ms</th>"
              "<th>median, ms</th></tr>\n", f);
        for (int i = 0; i < d->nev; i++) {
            fprintf(f, "<tr class=\"flag\"><td>rank %d</td><td>%d</td><td>", d->ev[i].rank, d->ev[i].step);
            html_text(f, d->ev[i].phase);
            fprintf(f, "</td><td>%.2f</td><td>%.2f</td></tr>\n", d->ev[i].seconds * 1e3, d->ev[i].median * 1e3);
        }
        fputs("</table>\n", f);
    }
    fputs("</body></html>\n", f);
    free(bx);
}

dt_status dt_report_html(const char *run_dir, const char *out_path) {
    run_data d = {0};
    snprintf(d.name, sizeof d.name, "run");
    dt_status st = read_run(run_dir, &d);
    if (st == DT_OK) {
        char *html = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&html, &len);
        if (!f) st = dt_error(DT_ERR_NOMEM, "report: out of memory");
        else {
            write_page(f, run_dir, &d);
            fclose(f);
            const void *parts[] = {html};
            st = dt_write_atomic(out_path, parts, &len, 1);
            free(html);
        }
    }
    for (int r = 0; d.r && r < d.nranks; r++) free_rank(&d.r[r]);
    free(d.r);
    free(d.ev);
    return st;
}

// ----------------------------------------------------------------------------
// for the simulator (report.h)

dt_status dt_report_phase_medians(const char *run_dir, double med[NPH + 1]) {
    run_data d = {0};
    dt_status st = read_run(run_dir, &d);
    if (st == DT_OK) {
        const rank_log *r0 = &d.r[0];
        int n = r0->step.n, skip = n >= 5 ? 2 : 0;
        double *v = malloc(sizeof *v * (size_t)n);
        if (!v) st = dt_error(DT_ERR_NOMEM, "out of memory");
        for (int p = 0; v && p <= NPH; p++) {
            int m = n - skip;
            memcpy(v, (p < NPH ? &r0->ph[p] : &r0->secs)->v + skip, sizeof *v * (size_t)m);
            med[p] = dt_median(v, m);
        }
        free(v);
    }
    for (int r = 0; d.r && r < d.nranks; r++) free_rank(&d.r[r]);
    free(d.r);
    free(d.ev);
    return st;
}

dt_status dt_report_chart_page(const char *path, const char *title, const char *body_html, const char *xl,
                               const char *yl, const char *const *names, const double *x, const double *const *y,
                               int ns, int n) {
    series s[10];
    if (ns > 10) ns = 10;
    for (int k = 0; k < ns; k++)
        s[k] = (series){.name = names[k], .x = x, .y = y[k], .n = n, .color = palette[k]};
    char *html = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&html, &len);
    if (!f) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    fputs("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>", f);
    html_text(f, title);
    fprintf(f, "</title><style>%s</style></head><body>\n<h1>", style);
    html_text(f, title);
    fprintf(f, "</h1>\n%s\n", body_html);
    line_chart(f, "chart", title, xl, yl, s, ns, NAN, 1);
    fputs("</body></html>\n", f);
    fclose(f);
    const void *parts[] = {html};
    dt_status st = dt_write_atomic(path, parts, &len, 1);
    free(html);
    return st;
}
