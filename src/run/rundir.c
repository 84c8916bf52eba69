/*
 * rundir.c - one run per run directory.
 *
 * The lock is flock(2) on RUN_DIR/.lock, which the kernel drops when its
 * holder exits in any way (SIGKILL included): a lock file left behind by a
 * dead run is not locked, whatever PID it still holds, and is simply taken.
 * The file is never removed, since removing it would let two runs lock two
 * different files of the same name.
 */
#include "dtrain/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

/* This process's world rank from a launcher's environment (dtrain run,
 * Open MPI, MPICH/PMI, PMIx, Slurm), or 0 when none set one. */
static int env_world_rank(void) {
    static const char *vars[] = {"DTRAIN_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

/* The PID written in the lock file, or 0. */
static long lock_holder(int fd) {
    char buf[32];
    ssize_t k = pread(fd, buf, sizeof buf - 1, 0);
    if (k <= 0) return 0;
    buf[k] = 0;
    return strtol(buf, NULL, 10);
}

dt_status dt_run_dir_lock(const char *dir, int *out) {
    if (!dir || !*dir || !out) return dt_error(DT_ERR_ARG, "dt_run_dir_lock: missing run directory");
    *out = -1;
    if (env_world_rank() != 0) return DT_OK;  // rank 0 of the group holds it
    dt_status st = dt_make_dirs(dir);
    if (st != DT_OK) return st;
    char path[4096];
    snprintf(path, sizeof path, "%s/.lock", dir);
    int fd;
    if (dt_open_write(path, 0, &fd) != DT_OK)
        return dt_error(DT_ERR_IO, "the run directory's lock file %s", dt_last_error());
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EINTR) continue;
        int e = errno;
        long pid = e == EWOULDBLOCK ? lock_holder(fd) : 0;
        close(fd);
        if (e != EWOULDBLOCK) return dt_error(DT_ERR_IO, "%s: cannot lock: %s", path, strerror(e));
        if (pid > 0 && pid == (long)getppid()) return DT_OK;  // our launcher's, for the whole run
        char who[32] = "";
        if (pid > 0) snprintf(who, sizeof who, " (pid %ld)", pid);
        return dt_error(DT_ERR_IO, "run directory %s is in use by another dtrain run%s; wait for it to end or "
                                   "use another run directory", dir, who);
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
        int e = errno;
        close(fd);
        return dt_error(DT_ERR_IO, "%s: cannot write: %s", path, strerror(e));
    }
    // An earlier run's summary must not pass for this run's if it fails.
    char sum[4096], prev[4096];
    snprintf(sum, sizeof sum, "%s/summary.json", dir);
    snprintf(prev, sizeof prev, "%s/summary.previous.json", dir);
    if (rename(sum, prev) == 0)
        dt_log(DT_LOG_INFO, "%s: the summary.json of the previous run is now summary.previous.json", dir);
    else if (errno != ENOENT) {
        int e = errno;
        close(fd);
        return dt_error(DT_ERR_IO, "%s: cannot move the previous run's summary aside: %s", sum, strerror(e));
    }
    *out = fd;
    return DT_OK;
}

void dt_run_dir_unlock(int fd) {
    if (fd >= 0) close(fd);
}
