/* CUDA kernels on CPU threads (cuda_emu.h). */
#include "cuda_emu.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
alignas(128) float sm[DT_EMU_SHARED_FLOATS];

namespace {

struct barrier {
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    unsigned n = 0, count = 0, gen = 0;
};

enum { MAX_THREADS = 1024 };
barrier g_block, g_warp[MAX_THREADS / 32];
float g_lanes[MAX_THREADS];  // a shuffle's values, a slot a thread

void wait_at(barrier *b, const char *what) {
    pthread_mutex_lock(&b->mu);
    unsigned gen = b->gen;
    if (++b->count == b->n) {
        b->count = 0;
        b->gen++;
        pthread_cond_broadcast(&b->cv);
    } else {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 20;
        while (gen == b->gen)
            if (pthread_cond_timedwait(&b->cv, &b->mu, &until) == ETIMEDOUT) {
                fprintf(stderr, "emulated GPU: block (%u, %u), thread %u: %s not reached by every thread in 20 s "
                        "(%u of %u there): a barrier in divergent code\n", blockIdx.x, blockIdx.y, threadIdx.x, what,
                        b->count, b->n);
                abort();
            }
    }
    pthread_mutex_unlock(&b->mu);
}

struct job {
    const std::function<void()> *fn;
    unsigned tid;
};

// A thread of every block in turn: thread 0 fills the shared memory with
// NaNs between two barriers, then the block runs.
void *run_thread(void *arg) {
    job *j = (job *)arg;
    threadIdx = dim3(j->tid, 0, 0);
    for (unsigned y = 0; y < gridDim.y; y++)
        for (unsigned x = 0; x < gridDim.x; x++) {
            if (j->tid == 0)
                for (size_t i = 0; i < DT_EMU_SHARED_FLOATS; i++) sm[i] = NAN;
            wait_at(&g_block, "the start of a block");
            blockIdx = dim3(x, y, 0);
            (*j->fn)();
            wait_at(&g_block, "the end of a block");
        }
    return NULL;
}

}  // namespace

void dt_emu_wmma_check(const void *p, unsigned ldm, size_t elem) {
    const char *c = (const char *)p, *base = (const char *)sm;
    int shared = c >= base && c < base + sizeof(float) * DT_EMU_SHARED_FLOATS;
    if ((shared && (c - base) % 32) || (ldm * elem) % 16) {
        fprintf(stderr, "emulated GPU: block (%u, %u), thread %u: a wmma pointer %s%zu bytes into shared memory (not "
                "32-byte aligned) or a stride of %u elements of %zu bytes (not a multiple of 16)\n", blockIdx.x,
                blockIdx.y, threadIdx.x, shared ? "" : "outside it, ", shared ? (size_t)(c - base) : 0, ldm, elem);
        abort();
    }
}

void __syncthreads() { wait_at(&g_block, "__syncthreads"); }
void __syncwarp(unsigned) { wait_at(&g_warp[threadIdx.x / 32], "a warp's barrier (__syncwarp or a shuffle)"); }

float __shfl_sync(unsigned, float v, int lane) {
    unsigned w = threadIdx.x / 32 * 32;
    g_lanes[threadIdx.x] = v;
    __syncwarp();
    float r = g_lanes[w + (lane & 31)];
    __syncwarp();
    return r;
}

float __shfl_xor_sync(unsigned, float v, int lane_mask) {
    return __shfl_sync(0xffffffffu, v, (int)(threadIdx.x % 32) ^ lane_mask);
}

void dt_emu_launch(dim3 g, dim3 b, size_t shared, const std::function<void()> &fn) {
    if (b.x == 0 || (b.x % 32 && b.x != 1) || b.x > MAX_THREADS || b.y != 1 || b.z != 1 || g.z != 1 ||
        shared > sizeof(float) * DT_EMU_SHARED_FLOATS) {
        fprintf(stderr, "emulated GPU: launch of blocks of %u x %u x %u threads with %zu bytes of shared memory: "
                "not emulated\n", b.x, b.y, b.z, shared);
        abort();
    }
    blockDim = b, gridDim = g;
    g_block.n = b.x;
    for (unsigned w = 0; w < b.x / 32; w++) g_warp[w].n = 32;
    static pthread_t th[MAX_THREADS];
    static job jobs[MAX_THREADS];
    for (unsigned t = 0; t < b.x; t++) {
        jobs[t] = job{&fn, t};
        if (pthread_create(&th[t], NULL, run_thread, &jobs[t])) {
            perror("emulated GPU: pthread_create");
            abort();
        }
    }
    for (unsigned t = 0; t < b.x; t++) pthread_join(th[t], NULL);
}
