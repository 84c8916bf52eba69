/* State on disk ([parallel] offload = disk, docs/zero.md): shared mappings
 * of unlinked files, so the state can be larger than memory. The kernel
 * writes dirty pages back and reads them in again as they are used.
 * dt_state_alloc makes the optimizer state, which the update walks front to
 * back (MADV_SEQUENTIAL: large read-ahead, pages dropped behind);
 * dt_state_back moves memory the caller has (ZeRO stage 3's parameter
 * slice) onto such a file in place. */
#include "dtrain/optim.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <stdint.h>
#include <unistd.h>

// A new file in dir of `bytes` bytes, its blocks reserved, unlinked at once
// (gone with the process, whatever way it ends); -1 and a recorded error
// naming dir when it cannot be made. `what` names the state in messages.
static int state_file(const char *dir, size_t bytes, const char *what) {
    char path[1024];
    static int seq;
    snprintf(path, sizeof path, "%s/.dtrain-state-%ld-%d", dir, (long)getpid(), __atomic_fetch_add(&seq, 1, __ATOMIC_RELAXED));
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        dt_error(DT_ERR_IO, "[parallel] offload_dir %s: cannot create the %s file: %s", dir, what, strerror(errno));
        return -1;
    }
    unlink(path);
    int rc = posix_fallocate(fd, 0, (off_t)bytes);
    if (rc != 0) {
        close(fd);
        dt_error(DT_ERR_IO, "[parallel] offload_dir %s: no room for %zu bytes of %s: %s", dir, bytes, what, strerror(rc));
        return -1;
    }
    return fd;
}

float *dt_state_alloc(size_t n, const char *dir) {
    if (!dir) return dt_alloc(sizeof(float) * (n ? n : 1));
    size_t bytes = sizeof(float) * (n ? n : 1);
    int fd = state_file(dir, bytes, "optimizer state");
    if (fd < 0) return NULL;
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

// The whole pages inside p[0, n): [*a, *b), empty when there are none.
static void inner_pages(const float *p, size_t n, uintptr_t *a, uintptr_t *b) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), x = (uintptr_t)p, y = (uintptr_t)(p + n);
    *a = (x + page - 1) / page * page;
    *b = y / page * page;
    if (*b < *a) *b = *a;
}

size_t dt_state_back(float *p, size_t n, const char *dir) {
    uintptr_t a, b;
    inner_pages(p, n, &a, &b);
    size_t bytes = b - a;
    if (!bytes) return 0;
    int fd = state_file(dir, bytes, "parameter slice");
    if (fd < 0) return SIZE_MAX;
    // The pages' contents go to the file first; the mapping then replaces
    // the anonymous pages at the same addresses.
    for (size_t done = 0; done < bytes;) {
        ssize_t w = pwrite(fd, (const char *)a + done, bytes - done, (off_t)done);
        if (w <= 0) {
            int err = w < 0 ? errno : ENOSPC;
            close(fd);
            dt_error(DT_ERR_IO, "[parallel] offload_dir %s: writing %zu bytes of parameters: %s", dir, bytes, strerror(err));
            return SIZE_MAX;
        }
        done += (size_t)w;
    }
    void *m = mmap((void *)a, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    int err = errno;
    close(fd);
    if (m == MAP_FAILED) {  // the old pages are untouched when MAP_FIXED fails before replacing them
        dt_error(DT_ERR_IO, "[parallel] offload_dir %s: cannot map %zu bytes of parameters: %s", dir, bytes, strerror(err));
        return SIZE_MAX;
    }
    return bytes;
}

void dt_state_unback(float *p, size_t n) {
    uintptr_t a, b;
    inner_pages(p, n, &a, &b);
    size_t bytes = b - a;
    if (!bytes) return;
    // Fresh anonymous pages with the same contents, moved over the file's
    // mapping in one call (the file, already unlinked, goes with it).
    void *t = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (t == MAP_FAILED) return;  // the mapping stays: still valid memory, freed with the process
    memcpy(t, (void *)a, bytes);
    if (mremap(t, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)a) == MAP_FAILED) munmap(t, bytes);
}

void dt_state_free(float *p, size_t n, const char *dir) {
    if (!p) return;
    if (!dir) dt_free(p);
    else munmap(p, sizeof(float) * (n ? n : 1));
}
