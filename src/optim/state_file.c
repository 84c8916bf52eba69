/* Optimizer state on disk (dt_state_alloc in optim.h; [parallel] offload =
 * disk, docs/zero.md): a shared mapping of an unlinked file, so the state
 * can be larger than memory. The kernel writes dirty pages back and reads
 * them in again as the update walks the state front to back
 * (MADV_SEQUENTIAL: large read-ahead, pages dropped behind). */
#include "dtrain/optim.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

float *dt_state_alloc(size_t n, const char *dir) {
    if (!dir) return dt_alloc(sizeof(float) * (n ? n : 1));
    size_t bytes = sizeof(float) * (n ? n : 1);
    char path[1024];
    static int seq;
    snprintf(path, sizeof path, "%s/.dtrain-optim-%ld-%d", dir, (long)getpid(), __atomic_fetch_add(&seq, 1, __ATOMIC_RELAXED));
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        dt_error(DT_ERR_IO, "[parallel] offload_dir %s: cannot create the optimizer state file: %s", dir, strerror(errno));
        return NULL;
    }
    unlink(path);  // gone with the process, whatever way it ends
    int rc = posix_fallocate(fd, 0, (off_t)bytes);
    if (rc != 0) {
        close(fd);
        dt_error(DT_ERR_IO, "[parallel] offload_dir %s: no room for %zu bytes of optimizer state: %s", dir, bytes,
                 strerror(rc));
        return NULL;
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (p == MAP_FAILED) {
        dt_error(DT_ERR_IO, "[parallel] offload_dir %s: cannot map %zu bytes of optimizer state: %s", dir, bytes,
                 strerror(err));
        return NULL;
    }
    madvise(p, bytes, MADV_SEQUENTIAL);
    return p;  // a new file reads as zeros
}

void dt_state_free(float *p, size_t n, const char *dir) {
    if (!p) return;
    if (!dir) dt_free(p);
    else munmap(p, sizeof(float) * (n ? n : 1));
}
