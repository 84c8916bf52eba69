/* The dtrain command-line tool: one file per subcommand. Each cmd_* gets
 * argv starting at its own name and returns the process exit code:
 * 0 success, 1 runtime error, 2 usage error. */
#ifndef DT_CLI_H
#define DT_CLI_H

#include <stddef.h>

#define EXIT_RUNTIME 1
#define EXIT_USAGE 2

int cmd_train(int argc, char **argv);
int cmd_federate(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_prepare_text(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_convert_data(int argc, char **argv);
int cmd_sample(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_simulate(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_make_clicks(int argc, char **argv);

/* Prints "dtrain: error: ..." to stderr, control characters escaped
 * (dt_escape_text). */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* --memory-limit V: parses V (dt_mem_parse_size) and sets the library's
 * limit; returns 0, or -1 after printing the error. */
int cli_memory_limit(const char *v);

/* The --help line of --memory-limit, shared by train, eval and sample. */
#define CLI_MEMORY_LIMIT_HELP                                                          \
    "  --memory-limit SIZE  each worker's memory (e.g. 2G, 512M; K/M/G/T =\n"       \
    "                  powers of 1024): refuse to start when a worker would\n"       \
    "                  need more for its activations, parameters, gradients,\n"     \
    "                  optimizer state and data (naming the ZeRO stage that\n"      \
    "                  fits), and in training cap each worker at it (a memory\n"   \
    "                  cgroup, else RLIMIT_DATA); available memory\n"              \
    "                  (MemAvailable, the memory cgroup) is always checked\n"

/* The arguments of a converter, `dtrain CMD --from FORMAT IN --to OUT` (or
 * --help, which prints help): fills *from, *in, *out (NULL when not
 * given). Returns -1 to go on, or the exit code (0 after --help, 2 after
 * a usage error, printed naming `in_name`/`out_name`). */
int cli_from_to(int argc, char **argv, const char *help, const char *in_name, const char *out_name, const char **from,
                const char **in, const char **out);

/* The value v of a numeric flag, read by dt_parse_number (decimal, finite,
 * in [lo, hi], whole if asked; NULL = the value is missing). Returns 0, or
 * prints the error naming the flag and returns -1. */
int parse_number(const char *flag, const char *v, double lo, double hi, int whole, double *out);

/* The value of a link's flag (--link BW,LATENCY: "10gbit,50us", a rate in
 * gbit, mbit, kbit or bit a second, a one-way latency in s, ms, us or ns):
 * *bytes_per_s and *latency_s. Returns 0, or prints the error naming flag
 * and returns -1. */
int cli_parse_link(const char *flag, const char *link, double *bytes_per_s, double *latency_s);

/* dtrain train --plan auto: the fastest layout of CONFIG (with the --set
 * options) on `workers` workers that fits the memory limit
 * (cli_memory_limit's), as " --set ..." options into sets (len bytes),
 * logged; its prediction kept for cli_plan_record. A calibration run,
 * when the model's profile is not cached, goes to RUN_DIR/plan-calibration. Returns 0, or the exit
 * code after printing the error. */
int cli_plan_best(const char *config, const char *const *sets, int nsets, int workers, const char *run_dir,
                  char *sets_out, size_t len);
/* Adds "plan" (the layout, its predicted step and memory) to
 * RUN_DIR/summary.json after a run that cli_plan_best chose. */
void cli_plan_record(const char *run_dir);

#endif
