/* dtrain train / dtrain eval */
#include "cli.h"
#include "dtrain/comm.h"
#include "dtrain/dtrain.h"
#include "dtrain/launch.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_SETS 256

static const char train_help[] =
    "usage: dtrain train CONFIG [--workers N] [--set SECTION.KEY=VALUE]... [--run-dir DIR]\n"
    "                    [--log-format text|json] [--metrics-port P] [--trace FILE]\n"
    "\n"
    "Trains the model CONFIG describes and writes into the run directory:\n"
    "  config.ini          the resolved config (every field, presets expanded)\n"
    "  model.safetensors   the final weights\n"
    "  summary.json        steps, final train loss, test_loss, test_accuracy,\n"
    "                      wall_seconds, samples_per_sec\n"
    "  metrics/rank-N.jsonl  every worker: one JSON object per step (loss, lr,\n"
    "                      grad norm, throughput, time per phase, bytes sent and\n"
    "                      received, peak memory) and per evaluation\n"
    "\n"
    "options:\n"
    "  --set S.K=V     override a config field, e.g. --set train.epochs=2\n"
    "                  --set optim.lr=0.05 --set train.threads=1 (repeatable)\n"
    "  --run-dir DIR   where to write (default runs/NAME-YYYYmmdd-HHMMSS)\n"
    "  --workers N     data parallel: N local worker processes over shared\n"
    "                  memory, each training on its share of every global batch\n"
    "                  of train.batch samples; threads per worker default to\n"
    "                  cores / N. Under mpirun or srun, every rank is a worker\n"
    "                  and --workers is not needed.\n"
    "  --deterministic bitwise identical results for any number of workers\n"
    "                  (parallel.deterministic = true)\n"
    "  --log-format F  text (default): a live line on a terminal, plain lines\n"
    "                  otherwise; json: one JSON object per progress line and\n"
    "                  the final result on stdout (logs stay on stderr)\n"
    "  --metrics-port P  serve Prometheus metrics at http://ADDR:P/metrics\n"
    "                  while training (obs.metrics_port)\n"
    "  --metrics-addr A  the address to listen on (default 127.0.0.1)\n"
    "  --trace FILE    write a Chrome trace (Perfetto, chrome://tracing) of\n"
    "                  every worker's phases and collectives (obs.trace)\n"
    "  -q, --quiet     print only errors and the final result\n"
    "  -h, --help      this help\n"
    "\n"
    "Progress is one live line on a terminal, plain lines every\n"
    "train.log_every steps otherwise. 'dtrain report RUN_DIR' turns a run\n"
    "directory into an HTML report (docs/observability.md). The config format is in docs/config.md;\n"
    "configs/fashion-cnn.ini and configs/fashion-mlp.ini are examples;\n"
    "configs/gpt-fortunes.ini trains a GPT language model (docs/gpt.md).\n";

static const char eval_help[] =
    "usage: dtrain eval CONFIG --checkpoint WEIGHTS [--set SECTION.KEY=VALUE]...\n"
    "\n"
    "Evaluates weights (a model.safetensors written by 'dtrain train' for the\n"
    "same model) on the test split of the config's dataset and prints the loss\n"
    "and accuracy.\n";

typedef struct {
    int tty, quiet, log_every, json;
    int live;          // a live line is on screen
    double last;       // time of the last live update
} progress_state;

static void on_progress(const dt_progress *p, void *user) {
    progress_state *s = user;
    char line[512];
    if (s->json) {
        if (s->quiet || !(p->is_eval || p->step % s->log_every == 0 || p->step == 1 || p->step == p->total_steps))
            return;
        dt_progress_format_json(p, line, sizeof line);
        printf("%s\n", line);
        fflush(stdout);
        return;
    }
    dt_progress_format(p, line, sizeof line);
    if (p->is_eval) {
        if (s->live) fputs("\r\033[K", stderr);
        s->live = 0;
        if (!s->quiet) fprintf(stderr, "%s\n", line);
        return;
    }
    if (s->quiet) return;
    if (s->tty) {
        double now = dt_now();
        if (now - s->last < 0.1 && p->step != p->total_steps) return;
        s->last = now;
        fprintf(stderr, "\r\033[K%s", line);
        s->live = 1;
    } else if (p->step % s->log_every == 0 || p->step == 1) {
        fprintf(stderr, "%s\n", line);
    }
}

// Parses CONFIG and the common --set options; returns 0, or an exit code.
typedef struct {
    const char *config, *run_dir, *checkpoint;
    const char *sets[MAX_SETS];
    int nsets, quiet, workers, json;
    char obs_sets[3][600];  // --metrics-port, --metrics-addr, --trace as --set values
} args_t;

// Adds "section.key=value" to the --set list (the flags that are config
// fields, so that workers and config.ini see them like any other).
static int add_set(args_t *a, char *buf, const char *key, const char *v) {
    if (a->nsets == MAX_SETS) return cli_error("too many --set options"), EXIT_USAGE;
    snprintf(buf, sizeof a->obs_sets[0], "%s=%s", key, v);
    a->sets[a->nsets++] = buf;
    return 0;
}

// The value of option `name` given as "--name V" or "--name=V", or NULL.
static const char *opt_value(int argc, char **argv, int *i, const char *name) {
    size_t n = strlen(name);
    const char *s = argv[*i];
    if (strncmp(s, name, n)) return NULL;
    if (s[n] == '=') return s + n + 1;
    if (s[n] || *i + 1 >= argc) return NULL;
    return argv[++*i];
}

static int parse_args(int argc, char **argv, args_t *a, const char *help, int is_eval) {
    memset(a, 0, sizeof *a);
    int rc;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            fputs(help, stdout);
            return -1;
        } else if (!strcmp(s, "--set") || !strncmp(s, "--set=", 6)) {
            const char *v = s[5] == '=' ? s + 6 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v) return cli_error("--set needs SECTION.KEY=VALUE"), EXIT_USAGE;
            if (a->nsets == MAX_SETS) return cli_error("too many --set options"), EXIT_USAGE;
            a->sets[a->nsets++] = v;
        } else if (!is_eval && (!strcmp(s, "--run-dir") || !strncmp(s, "--run-dir=", 10))) {
            a->run_dir = s[9] == '=' ? s + 10 : (i + 1 < argc ? argv[++i] : NULL);
            if (!a->run_dir || !*a->run_dir) return cli_error("--run-dir needs a directory"), EXIT_USAGE;
        } else if (is_eval && (!strcmp(s, "--checkpoint") || !strncmp(s, "--checkpoint=", 13))) {
            a->checkpoint = s[12] == '=' ? s + 13 : (i + 1 < argc ? argv[++i] : NULL);
            if (!a->checkpoint) return cli_error("--checkpoint needs a file"), EXIT_USAGE;
        } else if (!is_eval && (!strcmp(s, "--workers") || !strncmp(s, "--workers=", 10))) {
            const char *v = s[9] == '=' ? s + 10 : (i + 1 < argc ? argv[++i] : NULL);
            char *end;
            long n = v ? strtol(v, &end, 10) : 0;
            if (!v || *end || n < 1 || n > 1024) return cli_error("--workers needs a number from 1 to 1024"), EXIT_USAGE;
            a->workers = (int)n;
        } else if (!is_eval && !strcmp(s, "--deterministic")) {
            if (a->nsets == MAX_SETS) return cli_error("too many --set options"), EXIT_USAGE;
            a->sets[a->nsets++] = "parallel.deterministic=true";
        } else if (!is_eval && (!strcmp(s, "--log-format") || !strncmp(s, "--log-format=", 13))) {
            const char *v = opt_value(argc, argv, &i, "--log-format");
            if (!v || (strcmp(v, "text") && strcmp(v, "json")))
                return cli_error("--log-format needs text or json"), EXIT_USAGE;
            a->json = !strcmp(v, "json");
        } else if (!is_eval && (!strcmp(s, "--metrics-port") || !strncmp(s, "--metrics-port=", 15))) {
            const char *v = opt_value(argc, argv, &i, "--metrics-port");
            char *end;
            long n = v ? strtol(v, &end, 10) : 0;
            if (!v || *end || n < 1 || n > 65535) return cli_error("--metrics-port needs a port from 1 to 65535"), EXIT_USAGE;
            if ((rc = add_set(a, a->obs_sets[0], "obs.metrics_port", v))) return rc;
        } else if (!is_eval && (!strcmp(s, "--metrics-addr") || !strncmp(s, "--metrics-addr=", 15))) {
            const char *v = opt_value(argc, argv, &i, "--metrics-addr");
            if (!v || !*v) return cli_error("--metrics-addr needs an address"), EXIT_USAGE;
            if ((rc = add_set(a, a->obs_sets[1], "obs.metrics_addr", v))) return rc;
        } else if (!is_eval && (!strcmp(s, "--trace") || !strncmp(s, "--trace=", 8))) {
            const char *v = opt_value(argc, argv, &i, "--trace");
            if (!v || !*v) return cli_error("--trace needs a file"), EXIT_USAGE;
            if ((rc = add_set(a, a->obs_sets[2], "obs.trace", v))) return rc;
        } else if (!strcmp(s, "-q") || !strcmp(s, "--quiet")) {
            a->quiet = 1;
        } else if (s[0] == '-' && s[1]) {
            cli_error("unknown option '%s' (see 'dtrain %s --help')", s, argv[0]);
            return EXIT_USAGE;
        } else if (!a->config) {
            a->config = s;
        } else {
            cli_error("unexpected argument '%s' (one CONFIG only)", s);
            return EXIT_USAGE;
        }
    }
    if (!a->config) {
        cli_error("missing CONFIG (see 'dtrain %s --help')", argv[0]);
        return EXIT_USAGE;
    }
    if (is_eval && !a->checkpoint) {
        cli_error("missing --checkpoint WEIGHTS (see 'dtrain eval --help')");
        return EXIT_USAGE;
    }
    return 0;
}

// A config error is the user's input: usage-class exit code 2 for flags
// (--set), 1 for a bad file, as for any other runtime input error.
static int load_config(const args_t *a, dt_config *c) {
    dt_status st = dt_config_load(c, a->config, a->sets, a->nsets);
    if (st != DT_OK) {
        cli_error("%s", dt_last_error());
        return strncmp(dt_last_error(), "--set", 5) == 0 ? EXIT_USAGE : EXIT_RUNTIME;
    }
    return 0;
}

// --log-format json: the final result as one JSON line on stdout.
static void print_result_json(const dt_config *c, const dt_train_result *r, const char *run_dir) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "type", "result");
    cJSON_AddNumberToObject(j, "steps", (double)r->steps);
    cJSON_AddNumberToObject(j, "wall_seconds", r->wall_seconds);
    cJSON_AddNumberToObject(j, "samples_per_sec", r->samples_per_sec);
    if (c->gpt) cJSON_AddNumberToObject(j, "tokens_per_sec", r->samples_per_sec * c->seq_len);
    cJSON_AddNumberToObject(j, "final_train_loss", r->final_train_loss);
    if (r->test_loss >= 0) cJSON_AddNumberToObject(j, c->gpt ? "val_loss" : "test_loss", r->test_loss);
    if (r->test_accuracy >= 0) cJSON_AddNumberToObject(j, "test_accuracy", r->test_accuracy);
    cJSON_AddNumberToObject(j, "workers", r->workers);
    cJSON_AddStringToObject(j, "run_dir", run_dir);
    char *s = cJSON_PrintUnformatted(j);
    if (s) printf("%s\n", s);
    free(s);
    cJSON_Delete(j);
}

int cmd_train(int argc, char **argv) {
    args_t a;
    int rc = parse_args(argc, argv, &a, train_help, 0);
    if (rc) return rc < 0 ? 0 : rc;
    dt_config c;
    if ((rc = load_config(&a, &c))) return rc;
    char dir[1024];
    if (!a.run_dir) {
        char ts[32];
        time_t t = time(NULL);
        strftime(ts, sizeof ts, "%Y%m%d-%H%M%S", localtime(&t));
        snprintf(dir, sizeof dir, "runs/%s-%s", c.name, ts);
        a.run_dir = dir;
    }
    if (a.workers > 1 && !dt_comm_env_launched()) {
        // Start the workers: this program again, as N ranks of a local
        // shared-memory world, with the same arguments and one run dir.
        char exe[4096];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n <= 0) {
            cli_error("cannot find this program's path to start workers");
            return EXIT_RUNTIME;
        }
        exe[n] = 0;
        char *args[2 * MAX_SETS + 8];
        int k = 0;
        args[k++] = exe;
        args[k++] = "train";
        args[k++] = (char *)a.config;
        for (int i = 0; i < a.nsets; i++) {
            args[k++] = "--set";
            args[k++] = (char *)a.sets[i];
        }
        args[k++] = "--run-dir";
        args[k++] = (char *)a.run_dir;
        if (a.quiet) args[k++] = "--quiet";
        if (a.json) args[k++] = "--log-format=json";
        args[k] = NULL;
        dt_launch_params lp = dt_launch_default_params();
        lp.nranks = a.workers;
        int code = 0;
        if (dt_launch(&lp, args, &code) != DT_OK) {
            cli_error("%s", dt_last_error());
            return EXIT_RUNTIME;
        }
        return code == 0 ? 0 : EXIT_RUNTIME;
    }
    if (a.quiet) dt_log_set_level(DT_LOG_WARN);
    progress_state ps = {isatty(2), a.quiet, c.log_every, a.json, 0, 0};
    dt_train_result r;
    dt_status st = dt_train(&c, a.run_dir, on_progress, &ps, &r);
    if (ps.live) fputs("\n", stderr);
    if (st != DT_OK) {
        cli_error("%s", dt_last_error());
        return EXIT_RUNTIME;
    }
    if (a.json) {
        if (r.rank == 0) print_result_json(&c, &r, a.run_dir);
        return 0;
    }
    if (c.gpt) {
        if (r.rank != 0) return 0;
        char val[64] = "no val_file";
        if (r.test_loss >= 0) snprintf(val, sizeof val, "val loss %.4f", r.test_loss);
        printf("trained %lld steps in %.1f s (%.0f tokens/s): %s\nrun directory: %s\n", (long long)r.steps,
               r.wall_seconds, r.samples_per_sec * c.seq_len, val, a.run_dir);
        return 0;
    }
    if (r.rank == 0)
        printf("trained %lld steps in %.1f s (%.0f samples/s, %d worker%s x %d thread%s): test accuracy %.4f, "
               "test loss %.4f\nrun directory: %s\n",
               (long long)r.steps, r.wall_seconds, r.samples_per_sec, r.workers, r.workers > 1 ? "s" : "",
               r.threads, r.threads > 1 ? "s" : "", r.test_accuracy, r.test_loss, a.run_dir);
    return 0;
}

int cmd_eval(int argc, char **argv) {
    args_t a;
    int rc = parse_args(argc, argv, &a, eval_help, 1);
    if (rc) return rc < 0 ? 0 : rc;
    dt_config c;
    if ((rc = load_config(&a, &c))) return rc;
    float loss, acc;
    int n;
    if (dt_eval_checkpoint(&c, a.checkpoint, &loss, &acc, &n) != DT_OK) {
        cli_error("%s", dt_last_error());
        return EXIT_RUNTIME;
    }
    if (c.gpt) printf("validation tokens %d: next-token accuracy %.4f, loss %.4f\n", n, acc, loss);
    else printf("test samples %d: accuracy %.4f, loss %.4f\n", n, acc, loss);
    return 0;
}
