/* CUDA kernels on CPU threads (cuda_emu.h): a block's threads are fibers
 * of the launching thread, each run until it waits at a barrier or ends,
 * then the first in order that can run (from thread 0, or from the last:
 * dt_emu_reversed). On x86-64 a switch is a few
 * instructions (the callee-saved registers and the stack pointer);
 * elsewhere ucontext's (whose signal mask costs two system calls a
 * switch). */
#include "cuda_emu.h"
#include "core/bf16.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
alignas(128) float sm[DT_EMU_SHARED_FLOATS];
// The kernels' fixed-size __shared__ arrays (emu_host.h), bounds the
// linker makes for the section (weak: a binary may have none).
extern "C" char __start_dt_emu_shared[] __attribute__((weak)), __stop_dt_emu_shared[] __attribute__((weak));

namespace {

enum { MAX_THREADS = 1024, STACK = 256 << 10 };
enum { READY, WAITING, DONE };

#if defined(__x86_64__)
typedef void *context;  // the stack pointer, the callee-saved registers pushed there
#else
typedef ucontext_t context;
#endif

struct fiber {
    context ctx;
    char *stack = nullptr;
    int state = DONE;
    const char *at = nullptr;  // the barrier it waits at
};

// A barrier over n threads: count of them there now.
struct barrier {
    unsigned n = 0, count = 0;
};

fiber g_f[MAX_THREADS];
context g_main;
unsigned g_cur;
unsigned g_low;  // the lowest place in the order (below) of threads a barrier let go since the scheduler's last look
barrier g_block, g_warp[MAX_THREADS / 32];
float g_lanes[MAX_THREADS];  // a shuffle's values, a slot a thread
const std::function<void()> *g_fn;

#if defined(__x86_64__)
}  // namespace
// The callee-saved registers pushed, the stack pointer saved in *from, to's
// taken and its registers popped.
extern "C" void dt_emu_switch(void **from, void *to);
asm(".text\n.globl dt_emu_switch\n.type dt_emu_switch, @function\ndt_emu_switch:\n"
    "pushq %rbp\npushq %rbx\npushq %r12\npushq %r13\npushq %r14\npushq %r15\n"
    "movq %rsp, (%rdi)\nmovq %rsi, %rsp\n"
    "popq %r15\npopq %r14\npopq %r13\npopq %r12\npopq %rbx\npopq %rbp\nret\n"
    ".size dt_emu_switch, .-dt_emu_switch\n");
namespace {

// A context that starts entry (which never returns) on the stack [lo, lo + n).
void make(context *c, char *lo, size_t n, void (*entry)()) {
    void **sp = (void **)(((uintptr_t)(lo + n)) & ~(uintptr_t)15);
    *--sp = nullptr;         // (entry's return address: none)
    *--sp = (void *)entry;   // (the switch's ret)
    for (int i = 0; i < 6; i++) *--sp = nullptr;
    *c = sp;
}
void to(context *from, context *c) { dt_emu_switch(from, *c); }
#else
void make(context *c, char *lo, size_t n, void (*entry)()) {
    getcontext(c);
    c->uc_stack.ss_sp = lo, c->uc_stack.ss_size = n, c->uc_link = nullptr;
    makecontext(c, entry, 0);
}
void to(context *from, context *c) { swapcontext(from, c); }
#endif

// Thread t's place in the order the scheduler takes them (and the thread
// at place p): thread 0 first, or the last (dt_emu_reversed).
unsigned place(unsigned t) { return dt_emu_reversed ? blockDim.x - 1 - t : t; }

// Back to the block's scheduler until every thread of b (the first of
// them at index first, n of them) has come. The last one to come goes
// back too, so that the threads go on past the barrier in the scheduler's
// order, not the last one first.
void wait_at(barrier *b, unsigned first, const char *what) {
    if (++b->count == b->n) {
        b->count = 0;
        for (unsigned t = first; t < first + b->n; t++) g_f[t].state = READY;
        unsigned low = place(dt_emu_reversed ? first + b->n - 1 : first);
        if (low < g_low) g_low = low;
    } else {
        g_f[g_cur].state = WAITING, g_f[g_cur].at = what;
    }
    to(&g_f[g_cur].ctx, &g_main);
}

void thread_main() {
    (*g_fn)();
    g_f[g_cur].state = DONE;
    to(&g_f[g_cur].ctx, &g_main);  // (never resumed: a block's threads start again from make)
    abort();
}

// One block: its threads made fibers; the first one in the order that
// can run runs until it waits or ends, and so on until all are done (so
// thread 0's warp goes as far as it can before the next starts, and a
// block barrier's absence shows as the others read what it wrote after
// it); none that can run while some are not done is a barrier some thread
// never reaches.
void run_block(unsigned nt) {
    for (unsigned t = 0; t < nt; t++) {
        fiber *f = &g_f[t];
        if (!f->stack) {  // (a page below it never mapped: an overflow faults, not a write into the heap)
            size_t guard = (size_t)sysconf(_SC_PAGESIZE);
            void *p = mmap(NULL, guard + STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED || mprotect(p, guard, PROT_NONE)) {
                perror("emulated GPU: a thread's stack");
                abort();
            }
            f->stack = (char *)p + guard;
        }
        make(&f->ctx, f->stack, STACK, thread_main);
        f->state = READY;
    }
    for (unsigned p = 0;;) {  // (p: no thread at a place below it can run)
        while (p < nt && g_f[place(p)].state != READY) p++;
        if (p == nt) break;
        unsigned t = place(p);
        g_cur = t, threadIdx = dim3(t, 0, 0), g_low = nt;
        to(&g_main, &g_f[t].ctx);
        if (g_low < p) p = g_low;
    }
    unsigned done = 0;
    for (unsigned t = 0; t < nt; t++) done += g_f[t].state == DONE;
    if (done < nt) {
        unsigned w = 0;
        while (g_f[w].state != WAITING) w++;
        fprintf(stderr, "emulated GPU: block (%u, %u), thread %u: %s not reached by every thread (%u of %u "
                "finished without it): a barrier in divergent code\n", blockIdx.x, blockIdx.y, w, g_f[w].at, done, nt);
        abort();
    }
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

void __syncthreads() { wait_at(&g_block, 0, "__syncthreads"); }

int __syncthreads_count(int predicate) {
    static int preds[MAX_THREADS];
    preds[threadIdx.x] = predicate != 0;
    __syncthreads();
    int n = 0;
    for (unsigned t = 0; t < blockDim.x; t++) n += preds[t];
    __syncthreads();  // (every thread has counted before any writes its next predicate)
    return n;
}
void __syncwarp(unsigned) {
    unsigned w = threadIdx.x / 32;
    wait_at(&g_warp[w], w * 32, "a warp's barrier (__syncwarp or a shuffle)");
}

float __shfl_sync(unsigned, float v, int lane) {
    unsigned w = threadIdx.x / 32 * 32, me = threadIdx.x;
    g_lanes[me] = v;
    __syncwarp();
    float r = g_lanes[w + (lane & 31)];
    __syncwarp();
    return r;
}

static uint32_t g_frags[MAX_THREADS][6];  // (a lane's mma fragments: A's 4 registers, B's 2)

// A 16-bit factor of an mma fragment's register (its low half first).
static float factor(uint32_t r, int half, int h) {
    uint16_t v = (uint16_t)(r >> (16 * half));
    return h == 1 ? dt_bf16_to_f32(v) : __half2float(__ushort_as_half(v));
}

void dt_emu_mma16816(float d[4], const uint32_t a[4], const uint32_t b[2], int h) {
    unsigned w = threadIdx.x / 32 * 32, lane = threadIdx.x % 32;
    for (int i = 0; i < 4; i++) g_frags[threadIdx.x][i] = a[i];
    g_frags[threadIdx.x][4] = b[0], g_frags[threadIdx.x][5] = b[1];
    __syncwarp();
    float A[16][16], B[16][8];
    for (unsigned L = 0; L < 32; L++) {
        const uint32_t *f = g_frags[w + L];
        unsigned g = L / 4, c = L % 4;
        for (int e = 0; e < 2; e++) {
            A[g][2 * c + e] = factor(f[0], e, h), A[g + 8][2 * c + e] = factor(f[1], e, h);
            A[g][8 + 2 * c + e] = factor(f[2], e, h), A[g + 8][8 + 2 * c + e] = factor(f[3], e, h);
            B[2 * c + e][g] = factor(f[4], e, h), B[8 + 2 * c + e][g] = factor(f[5], e, h);
        }
    }
    __syncwarp();
    unsigned g = lane / 4, c = lane % 4;
    for (int i = 0; i < 4; i++) {
        unsigned row = g + 8 * (i / 2), col = 2 * c + i % 2;
        float s = d[i];
        for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col];
        d[i] = s;
    }
}

float __shfl_xor_sync(unsigned, float v, int lane_mask) {
    return __shfl_sync(0xffffffffu, v, (int)(threadIdx.x % 32) ^ lane_mask);
}

size_t dt_emu_optin = sizeof(float) * DT_EMU_SHARED_FLOATS;  // (cuda_emu.h: C linkage)
int dt_emu_reversed;

void dt_emu_launch(dim3 g, dim3 b, size_t shared, const std::function<void()> &fn) {
    if (b.x == 0 || (b.x % 32 && b.x != 1) || b.x > MAX_THREADS || b.y != 1 || b.z != 1 || g.z != 1 ||
        shared > sizeof(float) * DT_EMU_SHARED_FLOATS) {
        fprintf(stderr, "emulated GPU: launch of blocks of %u x %u x %u threads with %zu bytes of shared memory: "
                "not emulated\n", b.x, b.y, b.z, shared);
        abort();
    }
    blockDim = b, gridDim = g, g_fn = &fn;
    g_block.n = b.x, g_block.count = 0;
    for (unsigned w = 0; w < (b.x + 31) / 32; w++) g_warp[w].n = b.x < 32 ? b.x : 32, g_warp[w].count = 0;
    size_t floats = (shared + sizeof(float) - 1) / sizeof(float);
    for (unsigned y = 0; y < g.y; y++)
        for (unsigned x = 0; x < g.x; x++) {
            for (size_t i = 0; i < floats; i++) sm[i] = NAN;  // (a value read before any thread wrote it shows)
            if (__start_dt_emu_shared)  // (all bits set: a NaN as a float or a double)
                memset(__start_dt_emu_shared, 0xff, (size_t)(__stop_dt_emu_shared - __start_dt_emu_shared));
            blockIdx = dim3(x, y, 0);
            run_block(b.x);
        }
}
