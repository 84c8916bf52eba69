/* dtrain train / dtrain eval */
#include "cli.h"
#include "dtrain/comm.h"
#include "dtrain/dtrain.h"
#include "dtrain/launch.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_SETS 256

static const char train_help[] =
    "usage: dtrain train CONFIG [--workers N] [--set SECTION.KEY=VALUE]... [--run-dir DIR]\n"
    "                    [--zero N] [--precision P] [--device D] [--memory-limit SIZE] [--deterministic]\n"
    "                    [--log-format text|json] [--metrics-port P] [--trace FILE]\n"
    "                    [--checkpoint-every N] [--resume auto] [--max-restarts N] [--spares K]\n"
    "                    [--plan auto]\n"
    "\n"
    "Trains the model CONFIG describes and writes into the run directory:\n"
    "  config.ini          the resolved config (every field, presets expanded)\n"
    "  model.safetensors   the final weights\n"
    "  summary.json        steps, final train loss, test_loss, test_accuracy,\n"
    "                      wall_seconds, samples_per_sec, compression and\n"
    "                      bytes_sent (rank 0's, over the steps; docs/compression.md)\n"
    "  metrics/rank-N.jsonl  every worker: one JSON object per step (loss, lr,\n"
    "                      grad norm, throughput, time per phase, bytes sent and\n"
    "                      received, peak memory) and per evaluation\n"    "  checkpoints/        step-N.safetensors (or step-N/ when sharded): the\n"
    "                      whole training state, with --checkpoint-every/-seconds\n"
    "One run at a time per run directory (RUN_DIR/.lock): a second one is refused\n"
    "with the first's PID. A new run renames an earlier summary.json to\n"
    "summary.previous.json.\n"
    "\n"
    "options:\n"
    "  --set S.K=V     override a config field, e.g. --set train.epochs=2\n"
    "                  --set optim.lr=0.05 --set train.threads=1 (repeatable);\n"
    "                  --set compression.method=fp16|bf16|int8|qsgd|sign|topk|\n"
    "                  randomk|powersgd compresses the workers' gradients\n"
    "                  (docs/compression.md)\n"
    "  --run-dir DIR   where to write (default runs/NAME-YYYYmmdd-HHMMSS)\n"
    "  --workers N     data parallel: N local worker processes over shared\n"
    "                  memory, each training on its share of every global batch\n"
    "                  of train.batch samples; threads per worker default to\n"
    "                  cores / N. Under mpirun or srun, every rank is a worker\n"
    "                  and --workers is not needed.\n"
    "  --workers MIN:MAX  elastic: start MAX workers; when one cannot come back\n"
    "                  after a failure, go on with the others (not fewer than\n"
    "                  MIN) and try to grow again every --elastic-retry seconds;\n"
    "                  with parallel.tensor x parallel.pipeline = G > 1, the\n"
    "                  group shrinks and grows by G (a data-parallel replica)\n"
    "  --deterministic bitwise identical results for any number of workers\n"
    "                  (parallel.deterministic = true)\n"
    "  --zero N        sharded data parallel (parallel.zero, docs/zero.md): 1\n"
    "                  shards the optimizer state over the workers, 2 the\n"
    "                  gradients too, 3 the parameters too (each layer's\n"
    "                  gathered when it runs); 0 (default) replicates all\n"
    "  --servers S     parameter servers (parallel.servers, docs/parameter-server.md):\n"
    "                  S server processes besides the workers (under mpirun the\n"
    "                  first S ranks) hold the parameters in balanced ranges and\n"
    "                  update them; the workers push gradients and pull weights.\n"
    "                  [ps] mode = sync (default) equals plain data parallel\n"
    "  --set parallel.tensor=T  tensor parallel: a GPT's layers (an MLP's or\n"
    "                  CNN's pairs of linear layers) split over T ranks\n"
    "                  (docs/model-parallel.md); parallel.sequence=true divides\n"
    "                  a GPT's layernorms and residual stream along the tokens\n"
    "                  too (T must divide train.seq_len)\n"
    "  --set parallel.sync_every=H  local SGD: each worker steps on its own\n"
    "                  share and the parameters are averaged every H steps\n"
    "                  (parallel.sync_warmup = S: S data-parallel steps first)\n"
    "  --precision P   fp32 (default), bf16 or fp16: the matmuls and convolutions\n"
    "                  in P, fp32 master weights and optimizer state; fp16 with\n"
    "                  dynamic loss scaling (train.precision,\n"
    "                  docs/mixed-precision.md)\n"
    "  --device D      cpu (default), cuda or cuda:N (train.device): where the\n"
    "                  model trains: one worker, fp32, a GPT or dense layers\n"
    "                  (the rest refused by name). A GPU that is not there, or\n"
    "                  a build without CUDA, is an error naming what is missing,\n"
    "                  never a CPU run; DTRAIN_GPU=sim: dtrain's simulated GPU,\n"
    "                  for tests (docs/gpu.md)\n"
    "  --set train.dynamic_batch=true  each worker's share of the global\n"
    "                  batch follows its measured step time (a slow worker gets\n"
    "                  less), with the same result (docs/data-parallel.md)\n"
    "  --set data.augment=crop,flip  augment training samples (seeded per\n"
    "                  sample); data.sampler=balanced, data.loader_threads=N,\n"
    "                  data.dataset=hdf5 with data.file=F.h5 (written by dtrain\n"
    "                  convert-data): docs/data.md\n"
    CLI_MEMORY_LIMIT_HELP
    "  --plan auto     train the fastest layout that fits (ZeRO stage, tensor,\n"
    "                  pipeline, micro-batches, recompute, bucket), as 'dtrain\n"
    "                  plan' ranks them for --workers N and --memory-limit\n"
    "                  (docs/plan.md): logged with its prediction and kept in\n"
    "                  summary.json's \"plan\"; the config's own layout is replaced\n"
    "\n"
    "observability (docs/observability.md):\n"
    "  --log-format F  text (default): a live line on a terminal, plain lines\n"
    "                  otherwise; json: one JSON object per progress line and\n"
    "                  the final result on stdout (logs stay on stderr)\n"
    "  --metrics-port P  serve Prometheus metrics at http://ADDR:P/metrics\n"
    "                  while training (obs.metrics_port)\n"
    "  --metrics-addr A  the IP address to listen on (obs.metrics_addr,\n"
    "                  default 127.0.0.1; 0.0.0.0 for every interface)\n"
    "  --trace FILE    write a Chrome trace (Perfetto, chrome://tracing) of\n"
    "                  every worker's phases and collectives (obs.trace)\n"
    "\n"
    "checkpoints and recovery (docs/checkpoints.md):\n"
    "  --checkpoint-every N    checkpoint every N steps (checkpoint.every_steps)\n"
    "  --checkpoint-seconds S  ... every S seconds (checkpoint.every_seconds)\n"
    "  --keep N        keep the newest N checkpoints (checkpoint.keep, default 3)\n"
    "  --checkpoint-sharded  every worker writes its slice of the state\n"
    "                  (RUN_DIR/checkpoints/step-N/); resumes on any worker count\n"
    "  --checkpoint-dir DIR  write the checkpoints there instead of\n"
    "                  RUN_DIR/checkpoints: a directory, or s3://BUCKET/PREFIX\n"
    "                  (checkpoint.dir; docs/s3.md)\n"
    "  --resume auto|PATH  continue from the newest valid checkpoint of the run\n"
    "                  directory (auto; none there: start at step 0), of another\n"
    "                  directory, or from one checkpoint file (PATH must exist\n"
    "                  and hold one)\n"
    "  --max-restarts N  when a worker dies or hangs, stop the others and start\n"
    "                  the group again from the newest checkpoint, up to N times\n"
    "                  (default 0)\n"
    "  --spares K      also start K idle workers: when a worker is killed or hangs,\n"
    "                  a spare takes its place and the state of a surviving\n"
    "                  worker (no disk), and the step in flight is redone, so no\n"
    "                  step is lost; without a spare left, --max-restarts as\n"
    "                  above (default 0; data parallel and ZeRO, whose slices\n"
    "                  come from a buddy rank's in-memory copy; parameter servers\n"
    "                  outside mode sync, where a spare takes a dead worker's or\n"
    "                  server's place alone, as a restart does; local SGD and\n"
    "                  compression, where every worker goes back to the newest\n"
    "                  checkpoint in place (needs --checkpoint-every); tensor and\n"
    "                  pipeline parallel, from a twin of the dead worker's shard\n"
    "                  (2 x tensor workers or more); not with --zero 1 under\n"
    "                  model parallelism or sharded checkpoints of data parallel)\n"
    "  --heartbeat-timeout S  a worker that reports no progress for S seconds\n"
    "                  counts as hung (default 120; 0 = off); workers waiting\n"
    "                  for it in a collective are alive, and say so\n"
    "  --elastic-retry S  with --workers MIN:MAX, seconds between attempts to\n"
    "                  grow back to MAX (default 60)\n"
    "  -q, --quiet     print only errors and the final result\n"
    "  -h, --help      this help\n"
    "\n"
    "Numbers are decimal (no hex, nan or inf) and within the flag's range. The\n"
    "worker count, the data files and a --resume PATH are checked before any\n"
    "worker starts.\n"
    "\n"
    "'dtrain report RUN_DIR' turns a run directory into an HTML report.\n"
    "Progress is one live line on a terminal, plain lines every\n"
    "train.log_every steps otherwise. The config format is in docs/config.md;\n"
    "configs/fashion-cnn.ini and configs/fashion-mlp.ini are examples;\n"
    "configs/gpt-fortunes.ini trains a GPT language model (docs/gpt.md).\n";

static const char federate_help[] =
    "usage: dtrain federate CONFIG [--workers N] [--set SECTION.KEY=VALUE]... [--run-dir DIR]\n"
    "                       [--log-format text|json] [--metrics-port P] [--trace FILE]\n"
    "\n"
    "Federated averaging over simulated clients, as CONFIG's [federated] section\n"
    "says (docs/federated.md): the training set is split over `clients` clients\n"
    "(partition = iid, shards or dirichlet with alpha); each of `rounds` rounds\n"
    "samples a fraction of them, each trains local_epochs epochs at local_batch\n"
    "from the global model with [optim] (plus FedProx's mu), and the server\n"
    "averages the updates weighted by sample count (algorithm = fedavg, fedavgm\n"
    "or fedadam, at server_lr). Clients that fail or miss `deadline` are left out\n"
    "(at least min_clients must report), as are updates holding NaN or Inf or\n"
    "with a norm above outlier x the round's median; secure = true sums masked\n"
    "updates mod 2^32. aggregator = median, trimmed, krum or clip combines the\n"
    "updates robustly; dp_clip with dp_noise or dp_epsilon is DP-FedAvg (the\n"
    "epsilon spent printed every round). The run directory gets:\n"
    "  clients.json        each client's sample count and class histogram\n"
    "  metrics/rank-N.jsonl  one record and one test evaluation per round\n"
    "  model.safetensors   the final global model\n"
    "  summary.json        round_test_accuracy (every round), rounds_to_85,\n"
    "                      bytes_sent_per_round, test_accuracy, left_out,\n"
    "                      dp (epsilon, round_epsilon), ...\n"
    "\n"
    "options:\n"
    "  --workers N     N local worker processes; a round's clients are dealt to\n"
    "                  them in turn (under mpirun or srun every rank is one).\n"
    "                  The global model is the same for any N (int64 fixed-point\n"
    "                  sums), given the same train.threads.\n"
    "  --set S.K=V     override a config field, e.g. --set federated.rounds=20\n"
    "  --run-dir DIR   where to write (default runs/NAME-YYYYmmdd-HHMMSS)\n"
    "  --log-format F, --metrics-port P, --trace FILE, -q/--quiet: as for\n"
    "                  dtrain train\n"
    "  -h, --help      this help\n"
    "\n"
    "Tests inject faults with DTRAIN_FED_FAIL=ROUND:CLIENT[,...] (the client\n"
    "fails) and DTRAIN_FED_DELAY=ROUND:CLIENT:SECONDS[,...] (it is that much\n"
    "slower).\n";

// dtrain federate runs this file's train command with dt_federate.
static int g_federate;

static const char eval_help[] =
    "usage: dtrain eval CONFIG --checkpoint WEIGHTS [--set SECTION.KEY=VALUE]...\n"
    "                   [--memory-limit SIZE]\n"
    "\n"
    "Evaluates weights (a model.safetensors written by 'dtrain train' for the\n"
    "same model, or one of its checkpoints: a step-N.safetensors file or a\n"
    "sharded step-N/ directory, verified first) on the test split of the\n"
    "config's dataset and prints the loss and accuracy.\n"
    "\n"
    "options:\n"
    CLI_MEMORY_LIMIT_HELP;

typedef struct {
    int tty, quiet, log_every, json;
    int live;          // a live line is on screen
    double last;       // time of the last live update
} progress_state;

static void on_progress(const dt_progress *p, void *user) {
    progress_state *s = user;
    char line[512];
    if (s->json) {  // stdout: JSON lines at the plain lines' pace, and every evaluation
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
    const char *config, *run_dir, *checkpoint, *memory_limit;
    const char *sets[MAX_SETS];
    int nsets, quiet, json;
    int workers, min_workers;  // min_workers < workers: elastic
    int max_restarts, spares;
    int plan;                  // --plan auto
    double heartbeat, elastic_retry;
    char set_buf[16][1100];    // --set texts made from the flags that are config fields
} args_t;

// The value of "--flag V" or "--flag=V" at argv[*i], or NULL if argv[*i] is
// not that flag. *missing is set when the value is absent.
static const char *flag_value(int argc, char **argv, int *i, const char *flag, int *missing) {
    size_t l = strlen(flag);
    const char *s = argv[*i];
    if (strncmp(s, flag, l)) return NULL;
    if (s[l] == '=') return s + l + 1;
    if (s[l]) return NULL;
    if (*i + 1 < argc) return argv[++*i];
    *missing = 1;
    return NULL;
}

// Local workers far beyond the cores run, but each gets a sliver of a core:
// said once, before they start (train.threads 0: one thread a worker then).
static void warn_oversubscribed(int workers, int threads) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long want = (long)workers * (threads > 0 ? threads : 1);
    if (cores > 0 && want > 4 * cores)
        dt_log(DT_LOG_WARN, "%d workers x %d thread%s on %ld cores: each gets about 1/%ld of a core, so steps will be "
                            "far slower than on %ld workers (fine for testing a layout)",
               workers, threads > 0 ? threads : 1, threads > 1 ? "s" : "", cores, (want + cores - 1) / cores, cores);
}

// Every option of train and eval, for "did you mean".
static const char *const train_flags[] = {
    "--workers", "--set", "--run-dir", "--log-format", "--metrics-port", "--metrics-addr", "--trace",
    "--checkpoint-every", "--checkpoint-seconds", "--keep", "--resume", "--checkpoint-dir", "--max-restarts", "--spares", "--zero",
    "--servers", "--precision", "--device", "--memory-limit", "--deterministic", "--checkpoint-sharded", "--heartbeat-timeout",
    "--elastic-retry", "--quiet", "--help", "--checkpoint", "--plan"};

static int parse_args(int argc, char **argv, args_t *a, const char *help, int is_eval) {
    memset(a, 0, sizeof *a);
    a->heartbeat = 120;
    a->elastic_retry = 60;
    int nbuf = 0;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i], *v;
        int missing = 0;
        double x;
        // Flags that are config fields: they reach the workers as --set.
        static const struct { const char *flag, *field; double lo, hi; int whole; } ck[] = {
            {"--checkpoint-every", "checkpoint.every_steps", 1, 1e15, 1},
            {"--checkpoint-seconds", "checkpoint.every_seconds", 0.001, 1e9, 0},
            {"--keep", "checkpoint.keep", 1, 1e6, 1},
            {"--resume", "checkpoint.resume", 0, 0, 0},
            {"--checkpoint-dir", "checkpoint.dir", 0, 0, 0},
            {"--metrics-port", "obs.metrics_port", 1, 65535, 1},
            {"--metrics-addr", "obs.metrics_addr", 0, 0, 0},
            {"--trace", "obs.trace", 0, 0, 0},
            {"--zero", "parallel.zero", 0, 3, 1},
            {"--servers", "parallel.servers", 0, 1024, 1},
            {"--precision", "train.precision", 0, 0, 0},
            {"--device", "train.device", 0, 0, 0},
        };
        enum { NCK = sizeof ck / sizeof ck[0] };
        int k = 0;
        while (!is_eval && k < NCK && !(v = flag_value(argc, argv, &i, ck[k].flag, &missing)) && !missing) k++;
        if (!is_eval && k < NCK) {
            if (missing || !*v) return cli_error("%s needs a value", ck[k].flag), EXIT_USAGE;
            if (ck[k].hi > 0 && parse_number(ck[k].flag, v, ck[k].lo, ck[k].hi, ck[k].whole, &x)) return EXIT_USAGE;
            if (!strcmp(ck[k].flag, "--precision") && strcmp(v, "fp32") && strcmp(v, "bf16") && strcmp(v, "fp16"))
                return cli_error("--precision: expected fp32, bf16 or fp16, got '%s'", v), EXIT_USAGE;
            if (!strcmp(ck[k].flag, "--device") && dt_device_index(v) < -1)
                return cli_error("--device: expected cpu, cuda or cuda:N (N a GPU's index, from 0), got '%s'", v), EXIT_USAGE;
            if (a->nsets == MAX_SETS || nbuf == (int)(sizeof a->set_buf / sizeof a->set_buf[0]))
                return cli_error("too many options"), EXIT_USAGE;
            snprintf(a->set_buf[nbuf], sizeof a->set_buf[nbuf], "%s=%s", ck[k].field, v);
            a->sets[a->nsets++] = a->set_buf[nbuf++];
            continue;
        }
        if (!is_eval && ((v = flag_value(argc, argv, &i, "--log-format", &missing)) || missing)) {
            if (!v || (strcmp(v, "text") && strcmp(v, "json")))
                return cli_error("--log-format needs text or json, got '%s'", v ? v : ""), EXIT_USAGE;
            a->json = !strcmp(v, "json");
            continue;
        }
        if (!is_eval && ((v = flag_value(argc, argv, &i, "--max-restarts", &missing)) || missing)) {
            if (parse_number("--max-restarts", v, 0, 1e6, 1, &x)) return EXIT_USAGE;
            a->max_restarts = (int)x;
            continue;
        }
        if (!is_eval && ((v = flag_value(argc, argv, &i, "--spares", &missing)) || missing)) {
            if (parse_number("--spares", v, 0, 4096, 1, &x)) return EXIT_USAGE;
            a->spares = (int)x;
            continue;
        }
        if (!is_eval && ((v = flag_value(argc, argv, &i, "--heartbeat-timeout", &missing)) || missing)) {
            if (parse_number("--heartbeat-timeout", v, 0, 1e9, 0, &a->heartbeat)) return EXIT_USAGE;
            continue;
        }
        if (!is_eval && ((v = flag_value(argc, argv, &i, "--elastic-retry", &missing)) || missing)) {
            if (parse_number("--elastic-retry", v, 0.1, 1e9, 0, &a->elastic_retry)) return EXIT_USAGE;
            continue;
        }
        if (!is_eval && ((v = flag_value(argc, argv, &i, "--plan", &missing)) || missing)) {
            if (!v || strcmp(v, "auto"))
                return cli_error("--plan: expected auto (the fastest layout that fits; 'dtrain plan' shows the "
                                 "ranking), got '%s'", v ? v : ""), EXIT_USAGE;
            a->plan = 1;
            continue;
        }
        if ((v = flag_value(argc, argv, &i, "--memory-limit", &missing)) || missing) {
            if (cli_memory_limit(v)) return EXIT_USAGE;
            a->memory_limit = v;
            continue;
        }
        if ((v = flag_value(argc, argv, &i, "--set", &missing)) || missing) {
            if (!v) return cli_error("--set needs SECTION.KEY=VALUE"), EXIT_USAGE;
            if (a->nsets == MAX_SETS) return cli_error("too many --set options"), EXIT_USAGE;
            a->sets[a->nsets++] = v;
            continue;
        }
        if (!is_eval && ((v = flag_value(argc, argv, &i, "--run-dir", &missing)) || missing)) {
            if (!v || !*v) return cli_error("--run-dir needs a directory"), EXIT_USAGE;
            a->run_dir = v;
            continue;
        }
        if (is_eval && ((v = flag_value(argc, argv, &i, "--checkpoint", &missing)) || missing)) {
            if (!v) return cli_error("--checkpoint needs a file"), EXIT_USAGE;
            a->checkpoint = v;
            continue;
        }
        if (!is_eval && ((v = flag_value(argc, argv, &i, "--workers", &missing)) || missing)) {
            char min[32] = "";
            const char *colon = v ? strchr(v, ':') : NULL;
            if (colon) snprintf(min, sizeof min, "%.*s", (int)(colon - v) < 31 ? (int)(colon - v) : 31, v);
            double lo, hi;
            if (parse_number("--workers", colon ? min : v, 1, 1024, 1, &lo) ||
                (colon && parse_number("--workers MIN:MAX", colon + 1, 1, 1024, 1, &hi)))
                return EXIT_USAGE;
            if (!colon) hi = lo;
            if (lo > hi) return cli_error("--workers %s: expected MIN:MAX with MIN <= MAX", v), EXIT_USAGE;
            a->min_workers = (int)lo;
            a->workers = (int)hi;
            continue;
        }
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            fputs(help, stdout);
            return -1;
        } else if (!is_eval && !strcmp(s, "--checkpoint-sharded")) {
            if (a->nsets == MAX_SETS) return cli_error("too many --set options"), EXIT_USAGE;
            a->sets[a->nsets++] = "checkpoint.sharded=true";
        } else if (!is_eval && !strcmp(s, "--deterministic")) {
            if (a->nsets == MAX_SETS) return cli_error("too many --set options"), EXIT_USAGE;
            a->sets[a->nsets++] = "parallel.deterministic=true";
        } else if (!strcmp(s, "-q") || !strcmp(s, "--quiet")) {
            a->quiet = 1;
        } else if (s[0] == '-' && s[1]) {
            const char *near = dt_suggest(s, train_flags, sizeof train_flags / sizeof *train_flags);
            const char *sec = s[1] == '-' ? dt_config_key_section(s + 2) : NULL;  // (a config key as a flag)
            char mean[160] = "";
            if (near) snprintf(mean, sizeof mean, "did you mean '%s'? ", near);
            else if (sec) snprintf(mean, sizeof mean, "did you mean '--set %s.%.60s=...'? ", sec, s + 2);
            cli_error("unknown option '%s' (%ssee 'dtrain %s --help')", s, mean, argv[0]);
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
// (--set) and a file that is not there, 1 for a bad file, as for any other
// runtime input error.
static int load_config(const args_t *a, dt_config *c) {
    if (access(a->config, F_OK) != 0)  // (a name that is not there is a usage error)
        return cli_error("%s: no such config file (see 'dtrain train --help')", a->config), EXIT_USAGE;
    dt_status st = dt_config_load(c, a->config, a->sets, a->nsets);
    if (st != DT_OK) {
        cli_error("%s", dt_last_error());
        return strncmp(dt_last_error(), "--set", 5) == 0 ? EXIT_USAGE : EXIT_RUNTIME;
    }
    return 0;
}

// The ranks of one data-parallel replica: tensor x pipeline (model
// parallel, docs/model-parallel.md), else 1.
static int replica_ranks(const dt_config *c) { return c->tensor * c->pipeline; }

// What can be checked before any worker starts: the worker counts against
// the batch (dt_train_check, for every count an elastic group may have), and
// that the files the config names exist. 0, or an exit code.
static int check_before_start(const args_t *a, const dt_config *c) {
    if (dt_train_check_device(c) != DT_OK) return cli_error("%s", dt_last_error()), EXIT_USAGE;
    if (g_federate && dt_federate_check(c, a->workers > 1 ? a->workers : 1) != DT_OK)
        return cli_error("%s", dt_last_error()), EXIT_USAGE;
    int g = replica_ranks(c);  // an elastic group changes by whole replicas
    for (int n = a->min_workers; n <= a->workers && !g_federate; n++)
        if ((n > 1 || c->ps_servers > 0) && ((n - a->min_workers) % g == 0 || n == a->workers) &&
            dt_train_check(c, n) != DT_OK)
            return cli_error("--workers %d: %s", n, dt_last_error()), EXIT_USAGE;
    if (a->spares > 0 && a->min_workers < 2 && dt_train_alone_from(c) < 0)
        return cli_error("--spares: a spare takes the state of a surviving worker; it needs --workers 2 or more%s",
                         a->min_workers < a->workers ? " (the elastic minimum included)" : ""),
               EXIT_USAGE;
    if (dt_train_check_spares(c, a->min_workers, a->spares) != DT_OK) return cli_error("%s", dt_last_error()), EXIT_USAGE;
    char img[1024], lab[1024];
    int hdf5 = !strcmp(c->dataset, "hdf5");
    if (!c->gpt && !hdf5 && (dt_idx_find_split(c->data_dir, "train", img, lab, sizeof img) != DT_OK ||
                    dt_idx_find_split(c->data_dir, "t10k", img, lab, sizeof img) != DT_OK))
        return cli_error("[data] dir: %s", dt_last_error()), EXIT_RUNTIME;
    const struct { const char *field, *path; } files[] = {
        {"[checkpoint] resume", strcmp(c->resume, "auto") ? c->resume : ""},
        {"[data] file", hdf5 ? c->data_file : ""},
        {"[data] train_file", c->gpt ? c->train_file : ""},
        {"[data] val_file", c->gpt ? c->val_file : ""},
        {"[model] init_from", c->init_from},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        int kind = 1;
        const char *why = "";
        if (!files[i].path[0]) continue;
        if (dt_path_remote(files[i].path)) {  // (an object, or a prefix with objects under it)
            if (dt_path_kind(files[i].path, &kind, NULL) != DT_OK)
                return cli_error("%s: %s", files[i].field, dt_last_error()), EXIT_RUNTIME;
            why = "no such object";
        } else if (access(files[i].path, F_OK) != 0) {
            kind = 0;
            why = strerror(errno);
        }
        if (!kind)
            return cli_error("%s: %s: %s%s", files[i].field, files[i].path, why,
                             strstr(files[i].field, "_file") ? " (make token files from text with: dtrain prepare-text "
                                                               "FILE... -o PREFIX; docs/gpt.md)" : ""),
                   EXIT_RUNTIME;
    }
    return 0;
}

// A spare loads its data while it idles (dt_train_warm); a failure here
// shows again, in full, if it ever trains.
static void warm_spare(void *user) {
    if (dt_train_warm(user) != DT_OK) dt_log(DT_LOG_DEBUG, "spare: loading ahead: %s", dt_last_error());
}

// The newest checkpoint of the run directory into out ("" when none): a
// file, or a sharded one marked complete (one given up or cut short by the
// failure has no COMPLETE, and a resume skips it).
static void newest_ckpt(const dt_config *c, const char *run_dir, char *out, size_t len) {
    char dir[1100], done[1300], **list = NULL;
    int n = 0, kind;
    dt_config_ckpt_dir(c, run_dir, dir, sizeof dir);
    if (dt_ckpt_list(dir, &list, &n) != DT_OK) n = 0;
    out[0] = 0;
    for (int i = 0; i < n && !out[0]; i++) {
        size_t l = strlen(list[i]);
        snprintf(done, sizeof done, "%s/COMPLETE", list[i]);
        if ((l > 12 && !strcmp(list[i] + l - 12, ".safetensors")) ||
            (dt_path_kind(done, &kind, NULL) == DT_OK && kind == 1))
            snprintf(out, len, "%s", list[i]);
    }
    for (int i = 0; i < n; i++) free(list[i]);
    free(list);
}

// Rank 0's line after a stop on request: the step, the checkpoint that
// holds it (the newest in the run directory) and how to go on.
static void print_stopped(const dt_config *c, const dt_train_result *r, const char *run_dir) {
    char ck[1200];
    newest_ckpt(c, run_dir, ck, sizeof ck);
    fprintf(stderr, "stopped at step %lld%s%s%s; continue with --resume auto --run-dir %s\n", (long long)r->steps,
            ck[0] ? " (checkpoint " : "", ck, ck[0] ? ")" : "", run_dir);
}

// After a failure the supervisor cannot repair: where the run can go on from.
static int failed_run(const dt_config *c, const char *run_dir) {
    char ck[1200];
    newest_ckpt(c, run_dir, ck, sizeof ck);
    if (ck[0]) dt_log(DT_LOG_INFO, "the newest checkpoint is %s: continue with --resume auto --run-dir %s", ck, run_dir);
    else dt_log(DT_LOG_INFO, "no checkpoint was written in %s (--checkpoint-every N makes them)", run_dir);
    return EXIT_RUNTIME;
}

static void on_stop_signal(int sig) {
    (void)sig;
    dt_train_request_stop();
}

// SIGUSR1 (finish the step, checkpoint, exit DT_EXIT_STOPPED) is taken by
// a thread of its own, in sigwait, and blocked in the threads that train:
// a handler run on a thread inside oneDNN's JIT GEMM (whose kernels point
// the stack pointer into the heap, up to oneDNN 3.11.0: its issue 4845)
// writes its signal frame there, which corrupts the heap. The handler stays
// installed for a thread made before the block (it would run there as it
// did before); the block is inherited by every thread made after it.
static void *stop_waiter(void *arg) {
    sigset_t set = *(sigset_t *)arg;
    free(arg);
    for (int sig;;)
        if (sigwait(&set, &sig) == 0) dt_train_request_stop();
    return NULL;
}

static void take_stop_signal(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    sigset_t *set = malloc(sizeof *set);
    pthread_t t;
    if (!set) return;
    sigemptyset(set);
    sigaddset(set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, set, NULL);
    if (pthread_create(&t, NULL, stop_waiter, set) != 0) {
        pthread_sigmask(SIG_UNBLOCK, set, NULL);  // (the handler then, as before)
        free(set);
        return;
    }
    pthread_detach(t);
}

// Starts the workers (this program again, as ranks of a local shared-memory
// world, with the same arguments and one run directory) and watches them:
// when one dies or hangs, the group starts again from the newest checkpoint,
// up to --max-restarts times; elastic mode shrinks the group when a worker
// cannot come back and grows it again later.
static int supervise(const args_t *a, const dt_config *c) {
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) {
        cli_error("cannot find this program's path to start workers");
        return EXIT_RUNTIME;
    }
    exe[len] = 0;
    int elastic = a->min_workers < a->workers, n = a->workers, restarts = 0, growing = 0;
    if (a->max_restarts > 0 && c->ckpt_every_steps <= 0 && c->ckpt_every_seconds <= 0)
        dt_log(DT_LOG_WARN, "--max-restarts without checkpoints (--checkpoint-every/--checkpoint-seconds): "
                            "a restart starts again from step 0");
    double failed_at = 0;
    int64_t failed_step = -1;
    for (int attempt = 0;; attempt++) {
        char *args[2 * MAX_SETS + 14];
        int k = 0;
        args[k++] = exe;
        args[k++] = g_federate ? "federate" : "train";
        args[k++] = (char *)a->config;
        for (int i = 0; i < a->nsets; i++) {
            args[k++] = "--set";
            args[k++] = (char *)a->sets[i];
        }
        // After the first attempt, always continue from the newest checkpoint.
        if (attempt > 0) {
            args[k++] = "--set";
            args[k++] = "checkpoint.resume=auto";
        }
        args[k++] = "--run-dir";
        args[k++] = (char *)a->run_dir;
        if (a->memory_limit) {
            args[k++] = "--memory-limit";
            args[k++] = (char *)a->memory_limit;
        }
        if (a->quiet) args[k++] = "--quiet";
        if (a->json) args[k++] = "--log-format=json";
        args[k] = NULL;
        dt_launch_params lp = dt_launch_default_params();
        lp.nranks = n + c->ps_servers;  // parameter servers: the first ranks
        lp.heartbeat_timeout = a->heartbeat;
        lp.nspares = a->spares;
        lp.graceful = 60;  // Ctrl-C: every worker checkpoints and stops at the end of its step
        lp.stop_after = elastic && n < a->workers ? a->elastic_retry : 0;
        lp.failed_at = failed_at;
        lp.failed_step = failed_step;
        // Parameter servers outside mode sync: a worker that dies or hangs
        // is let in alone again and rejoins, and so is a server (from its
        // range of the newest checkpoint); the others go on. The process
        // that takes its place is a spare when one is ready, else one
        // started for it (a restart). With dynamic sharing server 0 (rank
        // 0) holds the hand-out of the epoch's pieces: its death is the
        // group's, which restarts from the newest checkpoint (at an epoch's
        // end).
        int alone = dt_train_alone_from(c);
        if (alone >= 0 && (a->max_restarts > restarts || a->spares > 0)) {
            lp.respawn_from = alone;
            lp.max_respawns = a->max_restarts > restarts ? a->max_restarts - restarts : 0;
        }
        dt_launch_result r;
        if (dt_launch(&lp, args, &r) != DT_OK) {
            cli_error("%s", dt_last_error());
            return EXIT_RUNTIME;
        }
        restarts += r.respawns;
        if (r.respawns && r.exit_code == 0 && !r.stopped)
            dt_log(DT_LOG_WARN, "finished after %d restart%s of a process alone (restarts: %d)", r.respawns,
                   r.respawns == 1 ? "" : "s", restarts);
        if (r.first_step_at > 0) failed_at = 0;  // the launcher logged the recovery
        if (r.exit_code == 0 && !r.stopped) return 0;
        if (r.interrupted) {  // the user's stop (Ctrl-C), never a failure to repair
            if (!r.stopped) cli_error("%s: the workers were stopped at once, without a checkpoint of their step",
                                      strsignal(r.interrupted));
            return 128 + r.interrupted;  // (stopped at a step: rank 0 named it and its checkpoint)
        }
        if (r.stopped && r.stop_asked) return DT_EXIT_STOPPED;  // rank 0 said how to go on
        if (r.stopped) {  // stopped at a checkpoint to grow
            n += replica_ranks(c);
            growing = 1;
            dt_log(DT_LOG_INFO, "elastic: growing to %d workers from the newest checkpoint", n);
            continue;
        }
        const char *why = r.hung ? "hung" : r.signal ? strsignal(r.signal) : "failed";
        char who[32];  // with parameter servers, the first ranks are the servers
        if (r.failed_rank < 0) snprintf(who, sizeof who, "the group");
        else if (r.failed_rank < c->ps_servers) snprintf(who, sizeof who, "server %d", r.failed_rank);
        else snprintf(who, sizeof who, "worker %d", r.failed_rank - c->ps_servers);
        if (!failed_at) {
            failed_at = r.failed_at;
            failed_step = r.last_step;
        }
        if (elastic && r.failed_early && n - replica_ranks(c) >= a->min_workers) {
            // The worker could not come back: go on without it (and its replica's other ranks).
            n -= replica_ranks(c);
            dt_log(DT_LOG_WARN, "elastic: %s (%s) could not %s; continuing with %d workers (minimum %d)", who, why,
                   growing ? "join" : "come back", n, a->min_workers);
            if (growing) {  // a failed attempt to grow is not a restart
                growing = 0;
                continue;
            }
        }
        growing = 0;
        if (restarts >= a->max_restarts) {
            if (a->max_restarts > 0)
                cli_error("%s %s; giving up after %d restart%s", who, why, restarts, restarts == 1 ? "" : "s");
            return failed_run(c, a->run_dir);
        }
        restarts++;
        char at[48] = " before the first step";
        if (r.last_step >= 0) snprintf(at, sizeof at, " at step %lld", (long long)r.last_step);
        dt_log(DT_LOG_WARN, "%s %s%s; restarting %d worker%s from the newest checkpoint (restart %d of %d)", who, why,
               at, n, n > 1 ? "s" : "", restarts, a->max_restarts);
    }
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

// --plan auto: the planner's choice for a's workers and memory limit,
// added to a's --set options (their text in buf) and c reloaded with it.
static int plan_layout(args_t *a, dt_config *c, char *buf, size_t len) {
    if (dt_comm_env_launched() || g_federate || a->min_workers < a->workers || c->ps_servers > 0 || c->sync_every > 0)
        return cli_error("--plan auto plans data parallel, ZeRO, tensor and pipeline layouts for dtrain's own "
                         "launcher on a fixed --workers N (not under mpirun or srun, elastic, federated, with "
                         "parameter servers or local SGD)"), EXIT_USAGE;
    int rc = cli_plan_best(a->config, a->sets, a->nsets, a->workers, a->run_dir, buf, len);
    if (rc) return rc;
    for (char *save = NULL, *t = strtok_r(buf, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
        if (!strcmp(t, "--set")) continue;
        if (a->nsets == MAX_SETS) return cli_error("too many --set options"), EXIT_USAGE;
        a->sets[a->nsets++] = t;
    }
    return load_config(a, c);
}

int cmd_federate(int argc, char **argv) {
    g_federate = 1;
    return cmd_train(argc, argv);
}

int cmd_train(int argc, char **argv) {
    args_t a;
    int rc = parse_args(argc, argv, &a, g_federate ? federate_help : train_help, 0);
    if (rc) return rc < 0 ? 0 : rc;
    dt_config c;
    if ((rc = load_config(&a, &c))) return rc;
    // Workers leave this to whoever started them: ours are checked by the
    // supervisor, and under mpirun a --resume file need only be on rank 0's
    // host (the resume itself fails there if it is missing).
    // A spare (--spares) idles here until it takes a dead worker's place,
    // then runs as that worker; released at the end of the run, it is done.
    if (dt_spare_is()) {
        int r;
        if (dt_spare_wait_idle(&r, warm_spare, &c) != DT_OK) {
            cli_error("%s", dt_last_error());
            return EXIT_RUNTIME;
        }
        if (r < 0) {  // released: the run is over
            dt_train_warm(NULL);
            return 0;
        }
    }
    if (a.spares > 0 && dt_comm_env_launched()) {  // our own workers get DTRAIN_SPARES instead
        cli_error("--spares: spares are dtrain's own launcher's (--workers N); under mpirun, srun or dtrain run "
                  "use --max-restarts or scripts/mpirun-restart.sh");
        return EXIT_USAGE;
    }
    if (g_federate && a.spares > 0) {
        cli_error("--spares: dtrain federate cannot take a spare in a worker's place");
        return EXIT_USAGE;
    }
    if (g_federate && (a.max_restarts > 0 || a.min_workers < a.workers)) {
        cli_error("%s: dtrain federate does not checkpoint, so it cannot restart or resize its workers",
                  a.max_restarts > 0 ? "--max-restarts" : "--workers MIN:MAX");
        return EXIT_USAGE;
    }
    if (c.ps_servers > 0 && a.workers == 0) a.workers = a.min_workers = 1;  // one worker besides the servers
    char dir[1024];
    if (!a.run_dir) {
        char ts[32];
        time_t t = time(NULL);
        strftime(ts, sizeof ts, "%Y%m%d-%H%M%S", localtime(&t));
        snprintf(dir, sizeof dir, "runs/%s-%s", c.name, ts);
        a.run_dir = dir;
    }
    static char plan_sets[1024];
    if (a.plan && (rc = plan_layout(&a, &c, plan_sets, sizeof plan_sets))) return rc;
    if (!dt_comm_env_launched() && (rc = check_before_start(&a, &c))) return rc;
    // One run per directory: this process (the launcher, for --workers) or
    // rank 0 of an mpirun group holds the lock until it exits.
    int lock_fd;
    if (dt_run_dir_lock(a.run_dir, &lock_fd) != DT_OK) {
        cli_error("%s", dt_last_error());
        return EXIT_RUNTIME;
    }
    // Before anything is trained: room for its checkpoints and weights.
    if (!dt_comm_env_launched() && dt_check_disk(&c, a.run_dir) != DT_OK) {
        cli_error("%s", dt_last_error());
        return EXIT_RUNTIME;
    }
    if ((a.workers > 1 || a.max_restarts > 0 || a.spares > 0 || c.ps_servers > 0) && !dt_comm_env_launched()) {
        // Before any worker starts: all of them must fit. (Errors reading the
        // data are left to the workers, which report them in full.)
        if (dt_check_memory(&c, DT_MEM_TRAIN, a.workers > 1 ? a.workers : 1, 1, NULL) == DT_ERR_NOMEM) {
            cli_error("%s", dt_last_error());
            return EXIT_RUNTIME;
        }
        warn_oversubscribed(a.workers + c.ps_servers, c.threads);
        rc = supervise(&a, &c);
        if (rc == 0) cli_plan_record(a.run_dir);
        return rc;
    }
    if (a.quiet) dt_log_set_level(DT_LOG_WARN);
    take_stop_signal();
    progress_state ps = {isatty(2), a.quiet, c.log_every, a.json, 0, 0};
    dt_train_result r;
    dt_status st = (g_federate ? dt_federate : dt_train)(&c, a.run_dir, on_progress, &ps, &r);
    if (ps.live) fputs("\n", stderr);
    if (st != DT_OK) {
        cli_error("%s", dt_last_error());
        return EXIT_RUNTIME;
    }
    if (r.stopped) {
        if (r.rank == 0) print_stopped(&c, &r, a.run_dir);
        return DT_EXIT_STOPPED;
    }
    if (a.json) {
        if (r.rank == 0) print_result_json(&c, &r, a.run_dir);
        return 0;
    }
    if (g_federate) {
        if (r.rank == 0)
            printf("federated %lld rounds in %.1f s (%d worker%s): test accuracy %.4f, test loss %.4f\nrun directory: %s\n",
                   (long long)r.steps, r.wall_seconds, r.workers, r.workers > 1 ? "s" : "", r.test_accuracy,
                   r.test_loss, a.run_dir);
        return 0;
    }
    if (r.rank == 0) cli_plan_record(a.run_dir);
    if (c.gpt) {
        if (r.rank != 0) return 0;
        char val[64] = "no val_file";
        if (r.test_loss >= 0) snprintf(val, sizeof val, "val loss %.4f", r.test_loss);
        printf("trained %lld steps in %.1f s (%.0f tokens/s): %s\nrun directory: %s\n", (long long)r.steps,
               r.wall_seconds, r.samples_per_sec * c.seq_len, val, a.run_dir);
        return 0;
    }
    if (r.rank == 0)
        printf("trained %lld steps in %.1f s (%.0f samples/s, %d worker%s x %d thread%s): test %s %.4f, "
               "test loss %.4f\nrun directory: %s\n",
               (long long)r.steps, r.wall_seconds, r.samples_per_sec, r.workers, r.workers > 1 ? "s" : "",
               r.threads, r.threads > 1 ? "s" : "", c.recsys ? "AUC" : "accuracy", r.test_accuracy, r.test_loss,
               a.run_dir);
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
