/* A minimal test harness: CHECK-style assertions that count and report, and
 * a closing "N passed, N failed" line; main returns non-zero on failure. */
#ifndef DT_TESTLIB_H
#define DT_TESTLIB_H

#include "dtrain/ckpt.h"

#include <stddef.h>
#include <stdio.h>

extern int tl_passed, tl_failed;

void tl_check(int ok, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Relative difference |a-b| / max(|a|,|b|,floor); INFINITY when either is
 * NaN or only one is infinite (the same infinity on both sides: 0). */
double tl_rel(double a, double b, double floor);
/* Largest relative difference over n elements. */
double tl_max_rel(const float *a, const float *b, size_t n, double floor);
/* Normwise relative difference of b from a: max |a - b| / max |a| (the
 * largest |a| at least 1e-30); INFINITY where any difference is NaN. */
double tl_normwise(const float *a, const float *b, size_t n);
/* Runs a shell command, captures stdout+stderr into out (NUL-terminated),
 * returns the exit status (or -1). */
int tl_run(const char *cmd, char *out, size_t n);
/* Starts the shell command cmd (which writes its output to the file log)
 * in the background, waits up to wait_s seconds for `text` to appear in
 * log, then removes the file `release` (a resource the run was kept from:
 * an elastic group's slot) and waits up to end_s seconds for the command
 * to end (killed after that). Returns its waitpid status; *seen: whether
 * text appeared. */
int tl_run_released(const char *cmd, const char *log, const char *text, const char *release, double wait_s,
                    double end_s, int *seen);
/* Caps this process's address space (RLIMIT_AS) at what it maps now plus
 * `extra` bytes, so that a call that tries to allocate more than that fails
 * (the way to show that a refusal allocated nothing, rather than timing
 * it); tl_uncap_memory() lifts the cap. Returns 0, setting nothing, under
 * AddressSanitizer or ThreadSanitizer (they reserve terabytes up front) or
 * where the limit cannot be set. */
int tl_cap_memory(size_t extra);
void tl_uncap_memory(void);
/* Path of the dtrain binary (DTRAIN_BIN, else build/dtrain). */
const char *tl_dtrain(void);
/* Prints "N passed, N failed"; returns 1 if a check failed, else 77 if
 * tl_skip was called (ctest's "skipped", with SKIP_RETURN_CODE 77), else 0. */
int tl_finish(void);
/* Says why a part cannot run here ("SKIPPED: ..."). Only for a test (or
 * one mode of a test) registered with SKIP_RETURN_CODE 77 that runs that
 * part alone, so that ctest shows the part skipped rather than passed. */
void tl_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Removes the temp directory dir unless a check failed or KEEP is set in
 * the environment (then says where the files are). */
void tl_cleanup(const char *dir);
/* The whole file at path, NUL-terminated, malloc'd (free with free()); NULL
 * if it cannot be read. *len (may be NULL) gets its size. */
char *tl_read_file(const char *path, size_t *len);
/* Whether the files at a and b both read and hold the same bytes. */
int tl_same_file(const char *a, const char *b);
/* The number after the first "KEY": in the file at path (summary.json and
 * the like); -1 when the file or the key is missing. */
double tl_json_number(const char *path, const char *key);
/* dir/name in one of 4 rotating buffers (so up to 4 can be in use at once). */
const char *tl_path(const char *dir, const char *name);
/* How often `what` occurs in the file at path (0 if it cannot be read). */
int tl_count(const char *path, const char *what);
/* The PID of the child of `launcher` started as rank `rank` (DTRAIN_RANK in
 * its environment), or -1. */
int tl_rank_pid(int launcher, int rank);
/* Writes DIR/PREFIX-images-idx3-ubyte.gz and -labels-idx1-ubyte.gz: n 28x28
 * images whose label is visible in them (a bright block at a label-dependent
 * place), so that models learn something. */
void tl_make_images(const char *dir, const char *prefix, int n, unsigned long long seed);
/* Largest |a-b| / max(max|a|, 1e-3) over all F32 tensors of two weight
 * files (weights or checkpoints: tensors matched by name); -1 if they
 * differ in names or shapes; NaN (and *bitwise 0) if either holds a NaN or
 * an infinity, so that every comparison with a tolerance (d <= tol, d > x,
 * d >= 0) fails: test `d >= 0 && d <= tol` or `d > x`, never `!(d > tol)`
 * or `d != 0`. *bitwise says whether every byte agrees. */
double tl_weights_diff(const char *a, const char *b, int *bitwise);
/* Tensor t of f, its bytes read whole into a buffer that lives until
 * tl_finish (NULL after a failed CHECK). */
const void *tl_st_data(const dt_st_file *f, const dt_st_tensor *t);

/* tl_weights_diff of the final weights of the runs DIR/a and DIR/b. */
double tl_runs_diff(const char *dir, const char *a, const char *b, int *bitwise);
/* The small CNN of the strategy and data tests ([model] and [optim]: two
 * convolutions, a pooling, dropout, AdamW). */
extern const char tl_cfg_cnn[];
/* Writes `text` to DIR/NAME.ini and runs `dtrain train` on it with N
 * workers, --quiet, the run directory DIR/NAME and the extra flags; the
 * output goes to out (n bytes), and with the command to stderr when the
 * exit code is not 0. Returns the exit code. */
int tl_train(const char *dir, const char *name, const char *text, int workers, const char *extra, char *out, size_t n);

#define CHECK(cond, ...) tl_check(!!(cond), __FILE__, __LINE__, __VA_ARGS__)
#define CHECK_NEAR(a, b, tol, what)                                                    \
    do {                                                                               \
        double _a = (a), _b = (b), _r = tl_rel(_a, _b, 1e-6);                          \
        tl_check(_r <= (tol), __FILE__, __LINE__, "%s: %.9g vs %.9g (rel %.2e > %.1e)", \
                 what, _a, _b, _r, (double)(tol));                                     \
    } while (0)

#endif
