/*
 * shm.c - the shared-memory backend: ranks on one host exchanging data
 * through one POSIX shared-memory segment (shm_open + mmap), like NCCL's
 * shm transport or Open MPI's "vader".
 *
 * The segment (created by the launcher, or privately for a world of 1):
 *
 *   header      magic, rank count, abort flag + reason, launcher's per-rank
 *               process state (running / exited / died)
 *   ctl[n]      per-rank flags, each on its own cache line (so a rank's
 *               writes never invalidate the line another rank polls)
 *   small[n][2] per-rank buffers for small messages, by op parity
 *   big[n][8]   per-rank pipeline slots for large messages, by step mod 8
 *               (2 MiB per rank; DTRAIN_SHM_SLOTS changes the split)
 *   chan[n][n]  point-to-point mailboxes, sender x receiver
 *
 * Every flag is a 64-bit counter that only grows, written by its owner
 * with a release store and read by the others with acquire loads; "rank p
 * reached step s" is `flag[p] >= s`. There are no locks in the segment.
 *
 * Two algorithms of its own (and algo.c's, below):
 *
 * direct (small messages: for reductions, where every rank reduces the
 *   whole vector, <= 16 KiB per rank, or <= 1 KiB with two ranks; <= 32 KiB
 *   for the others; see shm_choose). One
 *   synchronisation per op:
 *   every rank copies its input into its small buffer for op S (parity
 *   S & 1), sets arrive = S, waits until all ranks arrived, and computes
 *   the whole result itself by reading the peers' buffers. Reusing buffer
 *   S & 1 is safe once every peer arrived at op S-1, because a rank only
 *   starts op S-1 after finishing its reads of op S-2.
 *
 * rsag (large messages): reduce-scatter + allgather, pipelined in steps.
 *   The vector is cut into n slices; rank j owns slice j. Each step moves
 *   one piece of every slice (piece = 256 KiB slot / n):
 *     1. copy my pieces of the slices I do not own into my big buffer,
 *        set ready = step;
 *     2. wait for all ready, reduce my own piece from my input and the
 *        peers' buffers (in rank order), writing the result to my big
 *        buffer and my output in the same pass, set reduced = step;
 *     3. wait for all reduced, copy the peers' reduced pieces to my output,
 *        set done = step.
 *   (With two ranks, step 2 writes its result over the peer's contribution
 *   in the peer's buffer, which it has just read, and step 3 reads the own
 *   buffer: see `swap` in rsag_run.)
 *   Every rank reduces a different slice at the same time, so the n cores
 *   share the arithmetic and the memory traffic; the pieces are small
 *   enough to stay in L2 between the writer and the readers. The slot of
 *   step s (s mod 8) is rewritten at step s+8 only after every peer is done
 *   with step s, so a rank can run up to 8 steps ahead of the slowest one,
 *   which absorbs scheduling jitter. Reduce-scatter is steps 1-2, allgather
 *   and broadcast are steps 1 and 3, reduce is rsag gathering at the root.
 *
 * Because each element is reduced exactly once, by its owner, in rank
 * order, every rank gets the same bits, run after run, whatever the path.
 *
 * DTRAIN_COMM_ALGO=ring|rhd|tree runs algo.c's point-to-point algorithms
 * instead, through the slots (shm_sendrecv); shm_choose says when.
 *
 * Waiting (wait_ge) never blocks for ever: it spins briefly, yields, then
 * blocks on a futex in the header that flag-raising peers wake (wait.c,
 * post()), and every few milliseconds checks the abort flag, the
 * launcher's record of dead ranks, kill(pid, 0) on the peers, and the
 * deadline. Errors name the op, its sequence number, the phase and the
 * ranks that did not arrive.
 */
#include "comm/shm/shm.h"

#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// segment layout

#define SHM_MAGIC 0x6474726e73686d31ull /* "dtrnshm1" */
#define CACHELINE 64
#define SMALL_BYTES (32u << 10) /* per rank, per parity */
#define BIG_BYTES (2u << 20)    /* pipeline buffer per rank, cut into slots */
#define BIG_NSLOTS 8            /* default slots: steps a rank may run ahead */
#define P2P_SLOT (64u << 10)
#define P2P_NSLOTS 4
#define MAX_RANKS 4096

enum { RANK_RUNNING = 0, RANK_EXITED = 1, RANK_DIED = 2, RANK_RESTARTING = 3 };

typedef struct {
    uint64_t magic;
    int32_t nranks;
    int32_t pad0;
    uint64_t size;
    _Atomic uint32_t abort_flag;
    int32_t abort_rank;
    char abort_reason[480];
    /* Blocking waits: a waiter that stopped spinning counts itself in
     * `sleepers` and sleeps on the futex `epoch`; a rank that raises a flag
     * while anybody sleeps bumps `epoch` and wakes them. */
    _Alignas(CACHELINE) _Atomic uint32_t sleepers;
    _Alignas(CACHELINE) _Atomic uint32_t epoch;
    /* Replaceable ranks (the launcher's dt_shm_set_respawn): the segments
     * of splits keep their names, for a replacement to attach to. */
    _Alignas(CACHELINE) _Atomic uint32_t respawn;
    int32_t color; /* a split's segment: its color */
    /* Replacing a rank (rejoin, below): the launcher bumps `gen` each time
     * it puts a new process in a dead rank's place, and sets
     * `rejoin_refused` when it will not (no spare left). */
    _Alignas(CACHELINE) _Atomic uint64_t gen;
    _Atomic uint32_t rejoin_refused;
    _Atomic int32_t replaced_rank; /* the rank of the latest generation's newcomer */
} seg_header;

typedef struct {
    _Alignas(CACHELINE) _Atomic uint64_t arrive; /* direct path: op counter */
    uint64_t desc[4][4];                         /* op S's arguments, slot S & 3 */
    _Alignas(CACHELINE) _Atomic uint64_t ready;  /* rsag: my input pieces are in place */
    _Alignas(CACHELINE) _Atomic uint64_t reduced;/* rsag: my reduced piece is in place */
    _Alignas(CACHELINE) _Atomic uint64_t done;   /* rsag: my reads of the step are over */
    _Alignas(CACHELINE) _Atomic int32_t pid;     /* set by the rank on attach */
    _Atomic int32_t state;                       /* set by the launcher: RANK_* */
    _Atomic int32_t detail;                      /* exit code, or signal number */
    _Atomic int32_t incarnation;                 /* the launcher's restarts of this rank */
    int32_t parent_rank;                         /* a split's segment: the member's parent rank */
    _Atomic uint64_t useq;                       /* the front end's number of the rank's last collective */
    /* rejoin's two barriers: the generation this rank entered, and the one
     * whose counters it has reset (they only grow, like the flags above) */
    _Alignas(CACHELINE) _Atomic uint64_t rj_enter;
    _Atomic uint64_t rj_reset;
} rank_ctl;

typedef struct {
    _Alignas(CACHELINE) _Atomic uint64_t head; /* slots written by the sender */
    _Alignas(CACHELINE) _Atomic uint64_t tail; /* slots consumed by the receiver */
    /* the incarnation + 1 of the sender ([0]) and of the receiver ([1])
     * that a survivor last emptied the channel for (dt_comm_peer_reset) */
    _Alignas(CACHELINE) _Atomic uint64_t gen[2];
    _Alignas(CACHELINE) struct {
        uint64_t len, total;
    } hdr[P2P_NSLOTS];
    _Alignas(CACHELINE) char data[P2P_NSLOTS][P2P_SLOT];
} p2p_chan;

typedef struct {
    size_t ctl, small, big, chan, total;
} seg_layout;

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static seg_layout layout_for(int n) {
    seg_layout l;
    l.ctl = 4096;
    l.small = align_up(l.ctl + (size_t)n * sizeof(rank_ctl), 4096);
    l.big = align_up(l.small + (size_t)n * 2 * SMALL_BYTES, 4096);
    l.chan = align_up(l.big + (size_t)n * BIG_BYTES, 4096);
    l.total = align_up(l.chan + (size_t)n * n * sizeof(p2p_chan), 4096);
    return l;
}

size_t dt_shm_segment_size(int n) { return layout_for(n).total; }

void dt_shm_segment_init(void *base, int n) {
    seg_header *h = base;
    memset(h, 0, sizeof *h);
    h->nranks = n;
    h->size = layout_for(n).total;
    atomic_thread_fence(memory_order_release);
    h->magic = SHM_MAGIC;
}

void dt_shm_mark_rank(void *base, int rank, int state, int detail) {
    seg_header *h = base;
    if (rank < 0 || rank >= h->nranks) return;
    rank_ctl *ctl = (rank_ctl *)((char *)base + layout_for(h->nranks).ctl);
    atomic_store(&ctl[rank].detail, detail);
    atomic_store(&ctl[rank].state, state);
}

void dt_shm_set_respawn(void *base) { atomic_store(&((seg_header *)base)->respawn, 1); }

int dt_shm_take_place(void *base, int rank, int alone) {
    seg_header *h = base;
    if (rank < 0 || rank >= h->nranks) return -1;
    rank_ctl *ctl = (rank_ctl *)((char *)base + layout_for(h->nranks).ctl);
    atomic_store(&ctl[rank].detail, 0);
    if (alone) {
        int inc = atomic_fetch_add(&ctl[rank].incarnation, 1) + 1;
        atomic_store(&ctl[rank].state, RANK_RESTARTING);
        return inc;
    }
    atomic_store(&ctl[rank].pid, 0);
    atomic_store(&ctl[rank].state, RANK_RUNNING);
    atomic_store(&h->replaced_rank, rank);
    int gen = (int)atomic_fetch_add(&h->gen, 1) + 1;
    atomic_fetch_add(&h->epoch, 1); /* wake sleepers: they look again */
    syscall(SYS_futex, &h->epoch, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
    return gen;
}

void dt_shm_refuse_rejoin(void *base) {
    seg_header *h = base;
    atomic_store(&h->rejoin_refused, 1);
}

int dt_shm_all_attached(void *base) {
    seg_header *h = base;
    rank_ctl *ctl = (rank_ctl *)((char *)base + layout_for(h->nranks).ctl);
    for (int r = 0; r < h->nranks; r++)
        if (!atomic_load(&ctl[r].pid)) return 0;
    return 1;
}

// ----------------------------------------------------------------------------
// per-communicator state

typedef struct {
    char name[200]; /* segment name, "" for a private one */
    void *base;
    size_t size;
    seg_header *hdr;
    rank_ctl *ctl;
    char *small, *big;
    p2p_chan *chan;
    int n, me;
    uint64_t opseq;   /* ops run through this backend (incl. internal ones) */
    uint64_t step;    /* rsag/pipeline steps run so far */
    int *world;       /* world rank of each member, for the launcher's states */
    dt_algo algo;     /* DTRAIN_COMM_ALGO */
    int verified;     /* the point-to-point algorithms checked a peer's arguments */
    uint64_t gen;     /* the generation this rank last joined (rejoin) */
    size_t chunk; /* DTRAIN_SHM_CHUNK: bytes per piece, 0 = whole slot */
    int nslots;   /* DTRAIN_SHM_SLOTS (2..64, same on every rank) */
    size_t slot;  /* BIG_BYTES / nslots */
} shm_state;

/* The world segment, where the launcher records dead ranks; sub-
 * communicators look up their members' liveness there. */
static seg_header *g_world_hdr;
static rank_ctl *g_world_ctl;
/* Each world rank's incarnation as this process last knew it: when it
 * attached to the world, or when it emptied the channels with the rank's
 * replacement (peer_reset). A point-to-point transfer with a rank whose
 * incarnation grew since fails (peer_gone_how). */
static _Atomic int32_t *g_known_inc;
static int g_host_ranks = 1; /* ranks sharing this host: decides spinning */

static inline shm_state *ST(dt_comm_t c) { return c->be; }
static inline char *small_buf(shm_state *s, int r, uint64_t op) {
    return s->small + ((size_t)r * 2 + (op & 1)) * SMALL_BYTES;
}
static inline char *big_buf(shm_state *s, int r, uint64_t step) {
    return s->big + (size_t)r * BIG_BYTES + (size_t)(step % (uint64_t)s->nslots) * s->slot;
}
static inline p2p_chan *chan_of(shm_state *s, int src, int dst) {
    return s->chan + (size_t)src * s->n + dst;
}

static dt_status map_segment(shm_state *s, void *base, size_t size, int n, int me) {
    seg_layout l = layout_for(n);
    seg_header *h = base;
    if (h->magic != SHM_MAGIC || h->nranks != n || h->size != l.total || size < l.total)
        return dt_error(DT_ERR_COMM,
                        "shm segment '%s': not a dtrain segment for %d ranks (found %d ranks, "
                        "%llu bytes)",
                        s->name, n, h->nranks, (unsigned long long)h->size);
    s->base = base;
    s->size = size;
    s->hdr = h;
    s->ctl = (rank_ctl *)((char *)base + l.ctl);
    s->small = (char *)base + l.small;
    s->big = (char *)base + l.big;
    s->chan = (p2p_chan *)((char *)base + l.chan);
    s->n = n;
    s->me = me;
    atomic_store(&s->ctl[me].pid, (int32_t)getpid());
    /* continue from the segment's counters, so that a communicator can be
     * destroyed and created again over the same segment (all ranks alike) */
    s->opseq = atomic_load(&s->ctl[me].arrive);
    s->step = atomic_load(&s->ctl[me].done);
    return DT_OK;
}

static shm_state *state_new(int n) {
    shm_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->world = calloc((size_t)n, sizeof(int));
    if (!s->world) {
        free(s);
        return NULL;
    }
    s->algo = dt_algo_from_env();
    const char *ns = getenv("DTRAIN_SHM_SLOTS");
    s->nslots = ns && atoi(ns) >= 2 && atoi(ns) <= 64 ? atoi(ns) : BIG_NSLOTS;
    s->slot = BIG_BYTES / (size_t)s->nslots / 4096 * 4096;
    const char *ch = getenv("DTRAIN_SHM_CHUNK");
    if (ch && *ch) s->chunk = (size_t)strtoull(ch, NULL, 10) / CACHELINE * CACHELINE;
    return s;
}

/* The world segment stays mapped for the life of the process: its name is
 * unlinked once every rank attached, and a world communicator destroyed and
 * created again must find it. */
static void *g_world_map;
static size_t g_world_map_size;
static char g_world_map_name[200];

/* Maps the named segment read-write: *base and *size. */
static dt_status map_named(const char *name, void **base, size_t *size) {
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) return dt_error(DT_ERR_COMM, "shm segment '%s': cannot open: %s", name, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(seg_header)) {
        close(fd);
        return dt_error(DT_ERR_COMM, "shm segment '%s': too small or unreadable", name);
    }
    void *b = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (b == MAP_FAILED) return dt_error(DT_ERR_COMM, "shm segment '%s': mmap failed: %s", name, strerror(errno));
    *base = b;
    *size = (size_t)st.st_size;
    return DT_OK;
}

dt_status dt_shm_map_world(const char *name) {
    if (g_world_map) return DT_OK;
    dt_status rc = map_named(name, &g_world_map, &g_world_map_size);
    if (rc == DT_OK) snprintf(g_world_map_name, sizeof g_world_map_name, "%s", name);
    return rc;
}

static void state_free(shm_state *s) {
    if (!s) return;
    if (s->base && s->base != g_world_map) munmap(s->base, s->size);
    free(s->world);
    free(s);
}

static dt_status open_and_map(shm_state *s, const char *name, int n, int me) {
    snprintf(s->name, sizeof s->name, "%s", name);
    void *base = NULL;
    size_t size = 0;
    dt_status rc = map_named(name, &base, &size);
    if (rc != DT_OK) return rc;
    rc = map_segment(s, base, size, n, me);
    if (rc != DT_OK) munmap(base, size);
    return rc;
}

dt_status dt_shm_init_world(dt_comm_t c, const char *name) {
    if (c->size > MAX_RANKS)
        return dt_error(DT_ERR_CONFIG, "shm backend: %d ranks (at most %d)", c->size, MAX_RANKS);
    shm_state *s = state_new(c->size);
    if (!s) return dt_error(DT_ERR_NOMEM, "shm backend: out of memory");
    dt_status rc;
    if (name && g_world_map && !strcmp(name, g_world_map_name)) {
        snprintf(s->name, sizeof s->name, "%s", name);
        rc = map_segment(s, g_world_map, g_world_map_size, c->size, c->rank);
    } else if (name) {
        rc = open_and_map(s, name, c->size, c->rank);
        if (rc == DT_OK && !g_world_map) {
            g_world_map = s->base;
            g_world_map_size = s->size;
            snprintf(g_world_map_name, sizeof g_world_map_name, "%s", name);
        }
    } else {
        size_t size = dt_shm_segment_size(1);
        void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) {
            rc = dt_error(DT_ERR_NOMEM, "shm backend: mmap of %zu bytes failed", size);
        } else {
            dt_shm_segment_init(base, 1);
            rc = map_segment(s, base, size, 1, 0);
        }
    }
    if (rc != DT_OK) {
        state_free(s);
        return rc;
    }
    for (int i = 0; i < c->size; i++) s->world[i] = i;
    g_world_hdr = s->hdr;
    g_world_ctl = s->ctl;
    free((void *)g_known_inc);
    if ((g_known_inc = malloc(sizeof *g_known_inc * (size_t)c->size)))
        for (int i = 0; i < c->size; i++) atomic_store(&g_known_inc[i], atomic_load(&g_world_ctl[i].incarnation));
    g_host_ranks = c->size;
    c->be = s;
    c->ops = &dt_shm_ops;
    return DT_OK;
}

// ----------------------------------------------------------------------------
// the world communicator of ranks started by dtrain's launcher (shm_host.h)

static const char *shm_name_of(const dt_comm_params *p) {
    const char *name = p->shm_name ? p->shm_name : getenv(DT_ENV_SHM_NAME);
    return name && *name ? name : NULL;
}

int dt_shm_launched(const dt_comm_params *p) { return shm_name_of(p) != NULL; }

static int env_int(const char *name, int def, int *bad) {
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < 0 || x > 1 << 24) {
        *bad = 1;
        return def;
    }
    return (int)x;
}

dt_status dt_shm_init_params(dt_comm_t c, const dt_comm_params *p) {
    const char *shm_name = shm_name_of(p);
    int bad = 0;
    if (shm_name) {
        c->rank = p->rank >= 0 ? p->rank : env_int(DT_ENV_RANK, -1, &bad);
        c->size = p->size >= 0 ? p->size : env_int(DT_ENV_WORLD_SIZE, -1, &bad);
        if (bad || c->rank < 0 || c->size < 1 || c->rank >= c->size)
            return dt_error(DT_ERR_CONFIG,
                            "rank %d of %d (" DT_ENV_RANK "=%s " DT_ENV_WORLD_SIZE "=%s): expected "
                            "0 <= rank < size",
                            c->rank, c->size,
                            getenv(DT_ENV_RANK) ? getenv(DT_ENV_RANK) : "(unset)",
                            getenv(DT_ENV_WORLD_SIZE) ? getenv(DT_ENV_WORLD_SIZE) : "(unset)");
    } else {
        if ((p->rank > 0) || (p->size > 1))
            return dt_error(DT_ERR_CONFIG,
                            "rank %d of %d: a world of more than one rank needs a shared-memory "
                            "segment (shm_name / " DT_ENV_SHM_NAME ", set by dtrain run) or MPI",
                            p->rank, p->size);
        c->rank = 0;
        c->size = 1;
    }
    c->world_rank = c->rank;
    c->local_rank = c->rank;
    c->local_size = c->size;
    c->node = 0;
    c->nnodes = 1;
    return dt_shm_init_world(c, shm_name);
}

dt_status dt_shm_create_named(dt_comm_t c, const char *name, int creator) {
    (void)creator;
    size_t size = dt_shm_segment_size(c->size);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return dt_error(DT_ERR_COMM, "shm segment '%s': cannot create: %s", name, strerror(errno));
    if (ftruncate(fd, (off_t)size) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(name);
        return dt_error(DT_ERR_COMM, "shm segment '%s': cannot size to %zu bytes: %s", name, size,
                        strerror(e));
    }
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        shm_unlink(name);
        return dt_error(DT_ERR_COMM, "shm segment '%s': mmap failed: %s", name, strerror(errno));
    }
    dt_shm_segment_init(base, c->size);
    munmap(base, size);
    return DT_OK;
}

dt_status dt_shm_attach_named(dt_comm_t c, const char *name) {
    shm_state *s = state_new(c->size);
    if (!s) return dt_error(DT_ERR_NOMEM, "shm backend: out of memory");
    dt_status rc = open_and_map(s, name, c->size, c->rank);
    if (rc != DT_OK) {
        state_free(s);
        return rc;
    }
    for (int i = 0; i < c->size; i++) s->world[i] = i;
    c->be = s;
    c->ops = &dt_shm_ops;
    return DT_OK;
}

void dt_shm_unlink_named(const char *name) { shm_unlink(name); }

void dt_shm_set_host_ranks(int n) {
    if (n > g_host_ranks) g_host_ranks = n;
}

// ----------------------------------------------------------------------------
// waiting for peers

/* Why rank p cannot arrive any more, or NULL if it still might. A rank
 * the launcher is restarting (RANK_RESTARTING) is gone for a point-to-point
 * transfer (p2p: what was in flight with it is lost) and awaited by a
 * collective (its replacement takes its place there). */
static const char *peer_gone_how(shm_state *s, int p, char *buf, size_t n, int p2p) {
    int w = s->world[p];
    if (g_world_ctl && w >= 0 && w < g_world_hdr->nranks) {
        int st = atomic_load(&g_world_ctl[w].state);
        int d = atomic_load(&g_world_ctl[w].detail);
        if (st == RANK_RESTARTING && !p2p) return NULL;
        if (st == RANK_RESTARTING) {
            snprintf(buf, n, "rank %d died and is being restarted", p);
            return buf;
        }
        /* A new process in p's place since this one attached or last
         * emptied the channels between them (g_known_inc): what was in
         * flight is lost, however soon the replacement marked itself
         * running (a spare is quick). */
        int inc = atomic_load(&g_world_ctl[w].incarnation);
        if (p2p && p != s->me && g_known_inc && inc > atomic_load(&g_known_inc[w])) {
            snprintf(buf, n, "rank %d died and a new process took its place (incarnation %d)", p, inc);
            return buf;
        }
        if (st == RANK_DIED) {
            if (d > 0)
                snprintf(buf, n, "rank %d died (killed by signal %d: %s)", p, d, strsignal(d));
            else
                snprintf(buf, n, "rank %d died (exit status %d)", p, -d);
            return buf;
        }
        if (st == RANK_EXITED) {
            snprintf(buf, n, "rank %d exited without taking part", p);
            return buf;
        }
    }
    int pid = atomic_load(&s->ctl[p].pid);
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
        /* reaped: the launcher may be about to record how; say what we know */
        if (g_world_ctl && w >= 0 && w < g_world_hdr->nranks &&
            atomic_load(&g_world_ctl[w].state) != RANK_RUNNING)
            return peer_gone_how(s, p, buf, n, p2p);
        /* a replaceable rank: the launcher is about to say whether it
         * restarts it; a transfer waits for that (a survivor asks the
         * peer's state as soon as its transfer fails) */
        if (g_world_hdr && atomic_load(&g_world_hdr->respawn)) return NULL;
        snprintf(buf, n, "rank %d died (pid %d is gone)", p, pid);
        return buf;
    }
    return NULL;
}

static const char *peer_gone(shm_state *s, int p, char *buf, size_t n) { return peer_gone_how(s, p, buf, n, 0); }
/* A rank of the world was replaced since this communicator last joined
 * (dt_comm_rejoin): whatever it waits for will not come. */
static const char *replaced(shm_state *s, char *buf, size_t n) {
    if (!g_world_hdr) return NULL;
    uint64_t g = atomic_load(&g_world_hdr->gen);
    if (g <= s->gen) return NULL;
    snprintf(buf, n, "rank %d died and a new process took its place (generation %llu)",
             atomic_load(&g_world_hdr->replaced_rank), (unsigned long long)g);
    return buf;
}

static void describe(char *buf, size_t n, const dt_coll_args *a) {
    if (a->check_of)
        snprintf(buf, n, "%s (seq %llu, argument check)", dt_coll_name((dt_coll)(a->check_of - 1)),
                 (unsigned long long)a->seq);
    else if (a->kind == DT_COLL_BARRIER)
        snprintf(buf, n, "barrier (seq %llu)", (unsigned long long)a->seq);
    else if (a->kind == DT_COLL_SEND || a->kind == DT_COLL_RECV)
        snprintf(buf, n, "%s (%zu x %s, peer %d)", dt_coll_name(a->kind), a->count,
                 dt_dtype_name(a->dtype), a->root);
    else
        snprintf(buf, n, "%s (seq %llu, %zu x %s)", dt_coll_name(a->kind),
                 (unsigned long long)a->seq, a->count, dt_dtype_name(a->dtype));
}

static double g_wait_time, g_wait_start;
static long g_wait_slow;
static int g_profile = -1;

static dt_status wait_ge_impl(dt_comm_t c, const dt_coll_args *a, const char *phase,
                              _Atomic uint64_t *flag0, size_t stride, uint64_t target, int only);

/* DTRAIN_SHM_PROFILE=1: total time spent waiting, printed at destroy. */
static dt_status wait_ge(dt_comm_t c, const dt_coll_args *a, const char *phase,
                         _Atomic uint64_t *flag0, size_t stride, uint64_t target, int only) {
    if (g_profile < 0) g_profile = getenv("DTRAIN_SHM_PROFILE") != NULL;
    if (!g_profile) {
        dt_status rc = wait_ge_impl(c, a, phase, flag0, stride, target, only);
        dt_waiter_done();
        return rc;
    }
    double t0 = dt_now();
    if (!g_wait_start) g_wait_start = t0;
    dt_status rc = wait_ge_impl(c, a, phase, flag0, stride, target, only);
    dt_waiter_done();
    double el = dt_now() - t0;
    g_wait_time += el;
    if (el > 50e-6) g_wait_slow++;
    return rc;
}

/* Waits until the counter of every rank (or only rank `only` if >= 0),
 * found at flag0 + p * stride bytes, is >= target. */
static dt_status wait_ge_impl(dt_comm_t c, const dt_coll_args *a, const char *phase,
                              _Atomic uint64_t *flag0, size_t stride, uint64_t target, int only) {
    shm_state *s = ST(c);
    int lo = only >= 0 ? only : 0, hi = only >= 0 ? only + 1 : s->n;
#define FLAG(p) ((_Atomic uint64_t *)((char *)flag0 + (size_t)(p) * stride))
    int p = lo;
    for (; p < hi; p++)
        if (p != s->me && atomic_load_explicit(FLAG(p), memory_order_acquire) < target) break;
    if (p == hi) return DT_OK;

    dt_waiter w;
    dt_waiter_init(&w, c->timeout, g_host_ranks);
    for (;;) {
        while (p < hi &&
               (p == s->me || atomic_load_explicit(FLAG(p), memory_order_acquire) >= target))
            p++;
        if (p == hi) return DT_OK;
        if (dt_waiter_should_block(&w)) {
            atomic_fetch_add(&s->hdr->sleepers, 1);
            atomic_thread_fence(memory_order_seq_cst);
            uint32_t seen = atomic_load(&s->hdr->epoch);
            int q = p;
            while (q < hi &&
                   (q == s->me || atomic_load_explicit(FLAG(q), memory_order_acquire) >= target))
                q++;
            if (q < hi) {
                struct timespec ts = {0, 10000000}; /* bounded: slow checks still run */
                syscall(SYS_futex, &s->hdr->epoch, FUTEX_WAIT, seen, &ts, NULL, 0);
            }
            atomic_fetch_sub(&s->hdr->sleepers, 1);
            if (!dt_waiter_tick(&w)) continue;
        } else if (!dt_waiter_step(&w)) {
            continue;
        }

        /* slow checks: aborts, dead peers, the deadline */
        char what[160], why[160] = "", missing[256] = "";
        int nmiss = 0, first = -1;
        size_t ml = 0;
        for (int q = lo; q < hi; q++) {
            if (q == s->me || atomic_load_explicit(FLAG(q), memory_order_acquire) >= target)
                continue;
            if (!nmiss++) first = q;
            if (ml < sizeof missing - 16)
                ml += (size_t)snprintf(missing + ml, sizeof missing - ml, "%s%d", ml ? " " : "", q);
            if (!why[0]) peer_gone(s, q, why, sizeof why);
        }
        if (!nmiss) continue;
        dt_waiter_note(a, first);
        describe(what, sizeof what, a);
        /* an abort carries the first failing rank's reason: report it first */
        if (atomic_load(&s->hdr->abort_flag) == 1)
            return dt_error(DT_ERR_COMM, "%s, %s on rank %d: rank %d aborted the communicator: %s",
                            what, phase, c->rank, s->hdr->abort_rank, s->hdr->abort_reason);
        if (why[0] || replaced(s, why, sizeof why))
            return dt_error(DT_ERR_COMM, "%s, %s on rank %d: %s; ranks not arrived: %s", what,
                            phase, c->rank, why, missing);
        if (atomic_load(&c->err) != DT_OK)
            return dt_error((dt_status)atomic_load(&c->err), "%s, %s: communicator failed: %s",
                            what, phase, c->err_msg);
        if (dt_waiter_expired(&w))
            return dt_error(DT_ERR_TIMEOUT,
                            "%s, %s on rank %d: timed out after %.3g s; ranks not arrived: %s",
                            what, phase, c->rank, c->timeout, missing);
    }
#undef FLAG
}

#define CTL_WAIT(c, a, phase, field, target, only)                                          \
    wait_ge(c, a, phase, &ST(c)->ctl[0].field, sizeof(rank_ctl), target, only)

static void wake_sleepers(shm_state *s) {
    atomic_fetch_add(&s->hdr->epoch, 1);
    syscall(SYS_futex, &s->hdr->epoch, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

/* Raises a flag. The fence orders the store before the read of `sleepers`
 * (and pairs with the fence before a waiter blocks, in wait_ge_impl):
 * either the waiter sees the flag or
 * this rank sees the waiter and wakes it. */
static inline void post(shm_state *s, _Atomic uint64_t *f, uint64_t v) {
    atomic_store_explicit(f, v, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&s->hdr->sleepers, memory_order_relaxed)) wake_sleepers(s);
}

// ----------------------------------------------------------------------------
// choosing the path

/* Direct below the crossover, rsag above. For reductions the direct
 * path makes every rank reduce the whole vector, so it pays off only for
 * small vectors: up to 16 KiB, and with two ranks, where the pipelined
 * path writes into lines it has just read (see `swap`), only up to 1 KiB
 * (measured: at 4 KiB 2.0-2.2 us pipelined vs 2.6 us direct). */
#define DIRECT_REDUCE_MAX (SMALL_BYTES / 2)
#define DIRECT_REDUCE_MAX_2RANKS 1024

static int swap_enabled(void);

/* The shm backend's choice for a collective moving `bytes` per rank (the
 * size the direct path would publish). A forced algorithm is taken where
 * it applies: direct for anything that fits the small buffers, rsag for
 * anything, ring and rhd for allreduce, tree for broadcast and reduce.
 * Otherwise: direct up to the crossover, rsag above. The point-to-point
 * algorithms are never chosen automatically here: with every buffer in
 * shared memory, direct (one synchronisation) and rsag (each byte reduced
 * once, by its owner, while all ranks work at once) move fewer bytes and
 * wait less. */
static dt_algo shm_choose(dt_comm_t c, const dt_coll_args *a, size_t bytes) {
    shm_state *s = ST(c);
    dt_coll k = a->kind;
    int reduction = k == DT_COLL_ALLREDUCE || k == DT_COLL_REDUCE;
    dt_algo algo = DT_ALGO_AUTO;
    switch (s->algo) {
    case DT_ALGO_DIRECT: if (bytes <= SMALL_BYTES) algo = DT_ALGO_DIRECT; break;
    case DT_ALGO_RSAG: algo = DT_ALGO_RSAG; break;
    case DT_ALGO_RING:
    case DT_ALGO_RHD: if (k == DT_COLL_ALLREDUCE) algo = s->algo; break;
    case DT_ALGO_TREE: if (k == DT_COLL_BROADCAST || k == DT_COLL_REDUCE) algo = DT_ALGO_TREE; break;
    default: break;
    }
    if (algo == DT_ALGO_AUTO) {
        size_t direct_max = !reduction ? SMALL_BYTES
                            : s->n == 2 && swap_enabled() ? DIRECT_REDUCE_MAX_2RANKS
                                                         : DIRECT_REDUCE_MAX;
        algo = bytes <= direct_max ? DT_ALGO_DIRECT : DT_ALGO_RSAG;
    }
    dt_algo_log(c, a, bytes, algo);
    return algo;
}

// ----------------------------------------------------------------------------
// the always-on argument check
//
// Every op publishes its arguments (op number, kind, dtype, op, count, root)
// next to its arrive counter, in slot op & 3, before it raises any flag for
// that op, and only once every peer has started op-3 (so it is done
// verifying op-4, the slot's previous user). Once a rank has seen a peer's
// first flag for op S, the peer's slot S & 3 therefore holds op S. (A rank
// can run more than one op ahead: a broadcast does not wait for all ranks.)
// Comparing costs a cache line the waiter touches anyway, so unlike
// the full check mode (comm.c) it is always on; it catches mismatched
// counts, dtypes and roots, and ranks that called different collectives.

static void publish_desc(shm_state *s, const dt_coll_args *a, uint64_t op) {
    atomic_store_explicit(&s->ctl[s->me].useq, a->seq, memory_order_relaxed);  // for a replacement (rejoin)
    uint64_t *d = s->ctl[s->me].desc[op & 3];
    d[0] = op;
    d[1] = (uint64_t)a->kind | (uint64_t)a->dtype << 8 |
           (uint64_t)(a->kind == DT_COLL_ALLREDUCE || a->kind == DT_COLL_REDUCE ||
                              a->kind == DT_COLL_REDUCE_SCATTER
                          ? a->op
                          : 0)
               << 16;
    d[2] = a->count;
    d[3] = (a->kind == DT_COLL_BROADCAST || a->kind == DT_COLL_REDUCE) ? (uint64_t)a->root : 0;
}

/* Compares the peers' (or only `only`'s) published arguments for op with
 * mine; on a mismatch returns DT_ERR_COMM naming both sides. */
static dt_status verify_desc(dt_comm_t c, const dt_coll_args *a, uint64_t op, int only) {
    shm_state *s = ST(c);
    const uint64_t *m = s->ctl[s->me].desc[op & 3];
    int lo = only >= 0 ? only : 0, hi = only >= 0 ? only + 1 : s->n;
    for (int p = lo; p < hi; p++) {
        if (p == s->me) continue;
        const uint64_t *d = s->ctl[p].desc[op & 3];
        uint64_t pc = d[2], mc = m[2];
        int same = d[0] == m[0] && d[1] == m[1] && d[3] == m[3];
        if (a->kind == DT_COLL_ALLGATHERV) same = same && pc == a->counts[p];
        else same = same && pc == mc;
        if (same) continue;
        if (d[0] != m[0])
            return dt_error(DT_ERR_COMM,
                            "%s seq %llu on rank %d: rank %d is at another collective (ranks "
                            "called different sequences of collectives)",
                            dt_coll_name(a->kind), (unsigned long long)a->seq, c->rank, p);
        return dt_error(DT_ERR_COMM,
                        "%s seq %llu: argument mismatch across ranks: rank %d: %s count=%llu "
                        "dtype=%s op=%s root=%llu vs rank %d: %s count=%llu dtype=%s op=%s "
                        "root=%llu",
                        dt_coll_name(a->kind), (unsigned long long)a->seq, c->rank,
                        dt_coll_name((dt_coll)(m[1] & 0xff)), (unsigned long long)mc,
                        dt_dtype_name((dt_dtype)((m[1] >> 8) & 0xff)),
                        dt_redop_name((dt_redop)((m[1] >> 16) & 0xff)), (unsigned long long)m[3], p,
                        dt_coll_name((dt_coll)(d[1] & 0xff)), (unsigned long long)pc,
                        dt_dtype_name((dt_dtype)((d[1] >> 8) & 0xff)),
                        dt_redop_name((dt_redop)((d[1] >> 16) & 0xff)), (unsigned long long)d[3]);
    }
    return DT_OK;
}

/* Starts a pipelined op: the direct path's op counter must advance on
 * every rank for every collective, whatever path it takes. */
static dt_status begin_op(dt_comm_t c, const dt_coll_args *a) {
    shm_state *s = ST(c);
    uint64_t op = s->opseq + 1;
    if (op > 3) {
        dt_status rc = CTL_WAIT(c, a, "waiting for peers to catch up", arrive, op - 3, -1);
        if (rc != DT_OK) return rc;
    }
    s->opseq = op;
    s->verified = 0;
    publish_desc(s, a, op);
    post(s, &s->ctl[s->me].arrive, op);
    return DT_OK;
}

/* Direct path: before writing my small buffer of op `op`, every peer must
 * have started op-1 (so it finished reading op-2, same parity); then
 * publish, wait for everyone, check the arguments. */
static dt_status direct_publish(dt_comm_t c, const dt_coll_args *a, const void *src,
                                size_t bytes, uint64_t *op_out) {
    shm_state *s = ST(c);
    uint64_t op = s->opseq + 1;
    dt_status rc = CTL_WAIT(c, a, "waiting to reuse buffers", arrive, op - 1, -1);
    if (rc != DT_OK) return rc;
    if (bytes) memcpy(small_buf(s, s->me, op), src, bytes);
    s->opseq = op;
    publish_desc(s, a, op);
    post(s, &s->ctl[s->me].arrive, op);
    *op_out = op;
    rc = CTL_WAIT(c, a, "waiting for peers' data", arrive, op, -1);
    if (rc != DT_OK) return rc;
    return verify_desc(c, a, op, -1);
}

// ----------------------------------------------------------------------------
// the rsag engine
//
// The data is n slices; slice j (owned by rank j) starts at element
// in_off[j] of the input and has len[j] elements. Step s handles elements
// [s*pe, (s+1)*pe) of every slice, pe = elements per piece.

typedef struct {
    const char *in;      /* input base (bytes) */
    char *out;           /* output base, NULL if this rank keeps no result */
    const size_t *in_off;/* per slice, elements */
    const size_t *out_off;/* per slice, elements, where the slice lands in out */
    const size_t *len;   /* per slice, elements */
    int reduce;          /* 1: reduce slices (phase 2) */
    int gather;          /* 1: every rank gathers all slices; 0: none */
    int gather_root;     /* >= 0: only this rank gathers */
    int bcast_root;      /* >= 0: broadcast, only root's slice is real */
} rsag_plan;

static int swap_enabled(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("DTRAIN_SHM_SWAP");
        on = !(e && !strcmp(e, "0"));
    }
    return on;
}

static dt_status rsag_run(dt_comm_t c, const dt_coll_args *a, const rsag_plan *P) {
    shm_state *s = ST(c);
    int n = s->n, me = s->me;
    size_t es = dt_dtype_size(a->dtype);
    /* Reduction splits the buffer into n pieces; gathers use it whole. */
    size_t piece = P->reduce ? (s->slot / (size_t)n) / CACHELINE * CACHELINE : s->slot;
    if (s->chunk && s->chunk < piece) piece = s->chunk;
    size_t pe = piece / es;
    size_t maxlen = 0;
    for (int j = 0; j < n; j++)
        if (P->len[j] > maxlen) maxlen = P->len[j];
    size_t nsteps = (maxlen + pe - 1) / pe;
    const void *srcs[MAX_RANKS > 64 ? 64 : MAX_RANKS];
    const void **sp = n <= 64 ? srcs : malloc((size_t)n * sizeof *sp);
    if (!sp) return dt_error(DT_ERR_NOMEM, "shm: out of memory");
    dt_status rc = DT_OK;
    int gathers = P->gather || P->gather_root == me;
    /* Two ranks, allreduce or reduce: write the reduced piece back over the
     * peer's contribution in the peer's slot (lines this rank has just
     * read), and gather from the own slot. The same bytes cross between the
     * cores, but the reduction's stores hit lines already in this core's
     * cache instead of missing (measured: 1.3-1.7x at 256 KiB-4 MiB).
     * DTRAIN_SHM_SWAP=0 turns it off. */
    int swap = n == 2 && P->reduce && (P->gather || P->gather_root >= 0) && swap_enabled();

    for (size_t st = 0; st < nsteps; st++) {
        uint64_t g = ++s->step;
        size_t e0 = st * pe;
        char *mine = big_buf(s, me, g);
#define PIECE_LEN(j) (P->len[j] > e0 ? (P->len[j] - e0 < pe ? P->len[j] - e0 : pe) : 0)

        /* 1. my slot for step g is free once every peer is done with the
         *    step that used it last, g - nslots */
        if (g > (uint64_t)s->nslots &&
            (rc = CTL_WAIT(c, a, "waiting to reuse buffers", done, g - (uint64_t)s->nslots, -1)) != DT_OK)
            goto out;
        if (P->reduce) {
            for (int j = 0; j < n; j++) {
                size_t m = PIECE_LEN(j);
                if (j != me && m) memcpy(mine + (size_t)j * piece, P->in + (P->in_off[j] + e0) * es, m * es);
            }
        } else if (P->bcast_root < 0 || P->bcast_root == me) {
            size_t m = PIECE_LEN(me);
            if (m) {
                memcpy(mine, P->in + (P->in_off[me] + e0) * es, m * es);
                if (P->out && P->out + P->out_off[me] * es != P->in + P->in_off[me] * es)
                    memcpy(P->out + (P->out_off[me] + e0) * es, mine, m * es);
            }
        }
        post(s, &s->ctl[me].ready, g);

        if (P->reduce) {
            /* 2. reduce my piece of my slice, in rank order */
            if ((rc = CTL_WAIT(c, a, "waiting for peers' pieces", ready, g, -1)) != DT_OK) goto out;
            if (st == 0 && (rc = verify_desc(c, a, s->opseq, -1)) != DT_OK) goto out;
            size_t m = PIECE_LEN(me);
            if (m) {
                for (int p = 0; p < n; p++)
                    sp[p] = p == me ? (const void *)(P->in + (P->in_off[me] + e0) * es)
                                    : (const void *)(big_buf(s, p, g) + (size_t)me * piece);
                char *dst = swap ? (char *)sp[1 - me] : mine + (size_t)me * piece, *dst2 = NULL;
                if (P->out && (P->gather || P->gather_root < 0 || P->gather_root == me))
                    dst2 = P->out + (P->out_off[me] + e0) * es;
                /* reduce-scatter keeps no copy in shm: nobody gathers it */
                if (!P->gather && P->gather_root < 0 && dst2) {
                    dst = dst2;
                    dst2 = NULL;
                }
                dt_reduce_kernel2(dst, dst2, sp, n, m, a->dtype, a->op, n);
            }
            post(s, &s->ctl[me].reduced, g);
        }

        /* 3. gather the other slices' pieces */
        if (gathers || P->bcast_root >= 0) {
            if (P->reduce) {
                if ((rc = CTL_WAIT(c, a, "waiting for reduced pieces", reduced, g, -1)) != DT_OK) goto out;
                for (int p = 0; p < n; p++) {
                    size_t m = PIECE_LEN(p);
                    const char *src = swap ? mine : big_buf(s, p, g);
                    if (p != me && m)
                        memcpy(P->out + (P->out_off[p] + e0) * es, src + (size_t)p * piece, m * es);
                }
            } else if (P->bcast_root >= 0) {
                int r = P->bcast_root;
                if (r != me) {
                    if ((rc = CTL_WAIT(c, a, "waiting for the root's data", ready, g, r)) != DT_OK) goto out;
                    if (st == 0 && (rc = verify_desc(c, a, s->opseq, r)) != DT_OK) goto out;
                    size_t m = PIECE_LEN(r);
                    if (m) memcpy(P->out + (P->out_off[r] + e0) * es, big_buf(s, r, g), m * es);
                }
            } else {
                if ((rc = CTL_WAIT(c, a, "waiting for peers' blocks", ready, g, -1)) != DT_OK) goto out;
                if (st == 0 && (rc = verify_desc(c, a, s->opseq, -1)) != DT_OK) goto out;
                for (int p = 0; p < n; p++) {
                    size_t m = PIECE_LEN(p);
                    if (p != me && m) memcpy(P->out + (P->out_off[p] + e0) * es, big_buf(s, p, g), m * es);
                }
            }
        }
        post(s, &s->ctl[me].done, g);
#undef PIECE_LEN
    }
out:
    if (sp != srcs) free(sp);
    return rc;
}

// ----------------------------------------------------------------------------
// the transport of the point-to-point algorithms (algo.c)
//
// One call is a round of lockstep steps through the slots, the same number
// on every rank (round_max / piece): in step g a rank copies its piece of
// the message it sends into its slot g, raises ready, reads the piece it
// receives from the sender's slot g, raises done. The slot rule is rsag's:
// slot g is rewritten only once every peer is done with step g - nslots.

static dt_status shm_sendrecv(dt_comm_t c, const dt_coll_args *a, const void *sbuf, size_t sbytes,
                              int to, void *rbuf, size_t rbytes, int from, size_t round_max) {
    shm_state *s = ST(c);
    size_t piece = s->chunk && s->chunk < s->slot ? s->chunk : s->slot;
    size_t nsteps = round_max ? (round_max + piece - 1) / piece : 1;
    dt_status rc;
    for (size_t st = 0; st < nsteps; st++) {
        uint64_t g = ++s->step;
        size_t o = st * piece;
        if (to >= 0 && o < sbytes) {
            if (g > (uint64_t)s->nslots &&
                (rc = CTL_WAIT(c, a, "waiting to reuse buffers", done, g - (uint64_t)s->nslots, -1)) != DT_OK)
                return rc;
            memcpy(big_buf(s, s->me, g), (const char *)sbuf + o, sbytes - o < piece ? sbytes - o : piece);
        }
        post(s, &s->ctl[s->me].ready, g);
        if (from >= 0) {
            if ((rc = CTL_WAIT(c, a, "waiting for a peer's piece", ready, g, from)) != DT_OK) return rc;
            if (!s->verified) {
                if ((rc = verify_desc(c, a, s->opseq, from)) != DT_OK) return rc;
                s->verified = 1;
            }
            if (o < rbytes)
                memcpy((char *)rbuf + o, big_buf(s, from, g), rbytes - o < piece ? rbytes - o : piece);
        }
        post(s, &s->ctl[s->me].done, g);
    }
    return DT_OK;
}

/* Runs one of algo.c's algorithms. */
static dt_status shm_run_algo(dt_comm_t c, const dt_coll_args *a, dt_algo algo) {
    dt_status rc = begin_op(c, a);
    if (rc != DT_OK) return rc;
    switch (algo) {
    case DT_ALGO_RING: return dt_algo_ring_allreduce(c, a, shm_sendrecv);
    case DT_ALGO_RHD: return dt_algo_rhd_allreduce(c, a, shm_sendrecv);
    default:
        return a->kind == DT_COLL_BROADCAST ? dt_algo_tree_broadcast(c, a, shm_sendrecv)
                                            : dt_algo_tree_reduce(c, a, shm_sendrecv);
    }
}

/* Balanced partition of count elements into n slices (the first count % n
 * slices get one more), with slice starts aligned to 16 elements where the
 * count allows, so that slices start on cache lines. */
static void partition(size_t count, int n, size_t *off, size_t *len) {
    size_t per = (count + (size_t)n - 1) / (size_t)n;
    if (count >= (size_t)n * 64) per = (per + 15) / 16 * 16;
    size_t o = 0;
    for (int j = 0; j < n; j++) {
        size_t l = o < count ? (count - o < per ? count - o : per) : 0;
        off[j] = o;
        len[j] = l;
        o += l;
    }
}

// ----------------------------------------------------------------------------
// collectives

typedef struct {
    size_t *off, *len, *off2;
    size_t stack[3 * 64];
} slices;

static int slices_init(slices *sl, int n) {
    size_t *m = n <= 64 ? sl->stack : malloc((size_t)n * 3 * sizeof(size_t));
    if (!m) return -1;
    sl->off = m;
    sl->len = m + n;
    sl->off2 = m + 2 * n;
    return 0;
}
static void slices_free(slices *sl) {
    if (sl->off != sl->stack) free(sl->off);
}

static dt_status shm_allreduce_impl(dt_comm_t c, const dt_coll_args *a, int root) {
    shm_state *s = ST(c);
    size_t es = dt_dtype_size(a->dtype), bytes = a->count * es;
    int keep = root < 0 || root == s->me;
    dt_algo algo = shm_choose(c, a, bytes);
    if (algo != DT_ALGO_DIRECT && algo != DT_ALGO_RSAG) return shm_run_algo(c, a, algo);
    if (algo == DT_ALGO_DIRECT) {
        uint64_t op;
        dt_status rc = direct_publish(c, a, a->send, bytes, &op);
        if (rc != DT_OK || !keep || !bytes) return rc;
        const void *srcs[64];
        const void **sp = s->n <= 64 ? srcs : malloc((size_t)s->n * sizeof *sp);
        if (!sp) return dt_error(DT_ERR_NOMEM, "shm: out of memory");
        for (int p = 0; p < s->n; p++) sp[p] = small_buf(s, p, op);
        dt_reduce_kernel(a->recv, sp, s->n, a->count, a->dtype, a->op, s->n);
        if (sp != srcs) free(sp);
        return DT_OK;
    }
    dt_status rc0 = begin_op(c, a);
    if (rc0 != DT_OK) return rc0;
    slices sl;
    if (slices_init(&sl, s->n)) return dt_error(DT_ERR_NOMEM, "shm: out of memory");
    partition(a->count, s->n, sl.off, sl.len);
    rsag_plan P = {.in = a->send, .out = keep ? a->recv : NULL, .in_off = sl.off,
                   .out_off = sl.off, .len = sl.len, .reduce = 1, .gather = root < 0,
                   .gather_root = root, .bcast_root = -1};
    dt_status rc = rsag_run(c, a, &P);
    slices_free(&sl);
    return rc;
}

static dt_status shm_allreduce(dt_comm_t c, const dt_coll_args *a) {
    return shm_allreduce_impl(c, a, -1);
}

static dt_status shm_reduce(dt_comm_t c, const dt_coll_args *a) {
    return shm_allreduce_impl(c, a, a->root);
}

static dt_status shm_reduce_scatter(dt_comm_t c, const dt_coll_args *a) {
    shm_state *s = ST(c);
    size_t es = dt_dtype_size(a->dtype), rc_ = a->count;
    size_t total = rc_ * (size_t)s->n * es;
    if (shm_choose(c, a, total) == DT_ALGO_DIRECT) {
        uint64_t op;
        dt_status rc = direct_publish(c, a, a->send, total, &op);
        if (rc != DT_OK || !rc_) return rc;
        const void *srcs[64];
        const void **sp = s->n <= 64 ? srcs : malloc((size_t)s->n * sizeof *sp);
        if (!sp) return dt_error(DT_ERR_NOMEM, "shm: out of memory");
        for (int p = 0; p < s->n; p++) sp[p] = small_buf(s, p, op) + (size_t)s->me * rc_ * es;
        dt_reduce_kernel(a->recv, sp, s->n, rc_, a->dtype, a->op, s->n);
        if (sp != srcs) free(sp);
        return DT_OK;
    }
    dt_status rc0 = begin_op(c, a);
    if (rc0 != DT_OK) return rc0;
    slices sl;
    if (slices_init(&sl, s->n)) return dt_error(DT_ERR_NOMEM, "shm: out of memory");
    for (int j = 0; j < s->n; j++) {
        sl.off[j] = (size_t)j * rc_;
        sl.len[j] = rc_;
        sl.off2[j] = 0;
    }
    rsag_plan P = {.in = a->send, .out = a->recv, .in_off = sl.off, .out_off = sl.off2,
                   .len = sl.len, .reduce = 1, .gather = 0, .gather_root = -1, .bcast_root = -1};
    dt_status rc = rsag_run(c, a, &P);
    slices_free(&sl);
    return rc;
}

static dt_status shm_allgatherv(dt_comm_t c, const dt_coll_args *a) {
    shm_state *s = ST(c);
    size_t es = dt_dtype_size(a->dtype), maxc = 0;
    for (int p = 0; p < s->n; p++)
        if (a->counts[p] > maxc) maxc = a->counts[p];
    char *out = a->recv;
    if (shm_choose(c, a, maxc * es) == DT_ALGO_DIRECT) {
        uint64_t op;
        dt_status rc = direct_publish(c, a, a->send, a->count * es, &op);
        if (rc != DT_OK) return rc;
        for (int p = 0; p < s->n; p++) {
            char *dst = out + a->displs[p] * es;
            const char *src = p == s->me ? (const char *)a->send : small_buf(s, p, op);
            if (a->counts[p] && dst != src) memmove(dst, src, a->counts[p] * es);
        }
        return DT_OK;
    }
    dt_status rc0 = begin_op(c, a);
    if (rc0 != DT_OK) return rc0;
    slices sl;
    if (slices_init(&sl, s->n)) return dt_error(DT_ERR_NOMEM, "shm: out of memory");
    for (int j = 0; j < s->n; j++) {
        sl.off[j] = 0;
        sl.len[j] = a->counts[j];
    }
    rsag_plan P = {.in = a->send, .out = a->recv, .in_off = sl.off, .out_off = a->displs,
                   .len = sl.len, .reduce = 0, .gather = 1, .gather_root = -1, .bcast_root = -1};
    dt_status rc = rsag_run(c, a, &P);
    slices_free(&sl);
    return rc;
}

static dt_status shm_broadcast(dt_comm_t c, const dt_coll_args *a) {
    shm_state *s = ST(c);
    size_t es = dt_dtype_size(a->dtype), bytes = a->count * es;
    int r = a->root;
    dt_algo algo = shm_choose(c, a, bytes);
    if (algo == DT_ALGO_TREE) return shm_run_algo(c, a, algo);
    if (algo == DT_ALGO_DIRECT) {
        uint64_t op;
        dt_status rc = direct_publish(c, a, s->me == r ? a->send : NULL, s->me == r ? bytes : 0, &op);
        if (rc != DT_OK || !bytes) return rc;
        const void *src = s->me == r ? a->send : small_buf(s, r, op);
        if (a->recv != src) memmove(a->recv, src, bytes);
        return DT_OK;
    }
    dt_status rc0 = begin_op(c, a);
    if (rc0 != DT_OK) return rc0;
    slices sl;
    if (slices_init(&sl, s->n)) return dt_error(DT_ERR_NOMEM, "shm: out of memory");
    for (int j = 0; j < s->n; j++) {
        sl.off[j] = 0;
        sl.len[j] = j == r ? a->count : 0;
    }
    rsag_plan P = {.in = a->send, .out = a->recv, .in_off = sl.off, .out_off = sl.off,
                   .len = sl.len, .reduce = 0, .gather = 0, .gather_root = -1, .bcast_root = r};
    dt_status rc = rsag_run(c, a, &P);
    slices_free(&sl);
    return rc;
}

static dt_status shm_barrier(dt_comm_t c, const dt_coll_args *a) {
    uint64_t op;
    return direct_publish(c, a, NULL, 0, &op);
}

// ----------------------------------------------------------------------------
// point to point: a ring of P2P_NSLOTS slots per (sender, receiver) pair,
// moved along without blocking (the front end does the waiting)

/* An empty message still takes one piece. */
static size_t p2p_pieces(size_t total) { return total ? (total + P2P_SLOT - 1) / P2P_SLOT : 1; }

static dt_status shm_p2p_progress(dt_comm_t c, dt_p2p *p, int slow, int *moved) {
    shm_state *s = ST(c);
    const dt_coll_args *a = &p->args;
    int peer = a->root, sending = a->kind == DT_COLL_SEND;
    p2p_chan *ch = sending ? chan_of(s, s->me, peer) : chan_of(s, peer, s->me);
    size_t total = a->count * dt_dtype_size(a->dtype), np = p2p_pieces(total);
    char what[160];
    p->started = 1;
    while (p->pos < np) {
        size_t off = p->pos * P2P_SLOT, m = total - off < P2P_SLOT ? total - off : P2P_SLOT;
        if (sending) {
            uint64_t h = atomic_load_explicit(&ch->head, memory_order_relaxed);
            if (h >= atomic_load_explicit(&ch->tail, memory_order_acquire) + P2P_NSLOTS) break;
            size_t k = h % P2P_NSLOTS;
            if (m) memcpy(ch->data[k], (const char *)a->send + off, m);
            ch->hdr[k].len = m;
            ch->hdr[k].total = total;
            post(s, &ch->head, h + 1);
        } else {
            uint64_t t = atomic_load_explicit(&ch->tail, memory_order_relaxed);
            if (atomic_load_explicit(&ch->head, memory_order_acquire) <= t) break;
            size_t k = t % P2P_NSLOTS;
            if (ch->hdr[k].total != total || ch->hdr[k].len != m) {
                describe(what, sizeof what, a);
                return dt_error(DT_ERR_COMM, "%s on rank %d: message of %llu bytes, expected %zu",
                                what, c->rank, (unsigned long long)ch->hdr[k].total, total);
            }
            if (m) memcpy((char *)a->recv + off, ch->data[k], m);
            post(s, &ch->tail, t + 1);
        }
        p->pos++;
        *moved = 1;
    }
    if (p->pos == np) {
        p->done = 1;
        return DT_OK;
    }
    if (slow) {
        char why[160];
        describe(what, sizeof what, a);
        if (atomic_load(&s->hdr->abort_flag) == 1)
            return dt_error(DT_ERR_COMM, "%s on rank %d: rank %d aborted the communicator: %s", what,
                            c->rank, s->hdr->abort_rank, s->hdr->abort_reason);
        int gone = peer_gone_how(s, peer, why, sizeof why, 1) != NULL;
        if (gone || replaced(s, why, sizeof why)) {
            p->peer_gone = gone;
            return dt_error(DT_ERR_COMM, "%s on rank %d: %s; ranks not arrived: %d", what, c->rank,
                            why, peer);
        }
    }
    return DT_OK;
}

/* A half-sent message stays in the channel: the communicator is broken. */
static void shm_p2p_cancel(dt_comm_t c, dt_p2p *p) {
    (void)c;
    (void)p;
}

// ----------------------------------------------------------------------------
// split, abort, destroy

static dt_status record_members(const char *name, const int *members, int n, int color);

static dt_status shm_split(dt_comm_t parent, dt_comm_t child, const int *members, int nmembers,
                           int color, int color_index) {
    (void)color;
    shm_state *ps = ST(parent);
    char name[200];
    if (ps->name[0] && ps->gen)  // split again after a rejoin (dt_comm_rejoin), with a newcomer among them
        snprintf(name, sizeof name, "%.150s.g%llu.s%d.%d", ps->name, (unsigned long long)ps->gen, parent->nsplits,
                 color_index);
    else if (ps->name[0])
        snprintf(name, sizeof name, "%.150s.s%d.%d", ps->name, parent->nsplits, color_index);
    else
        snprintf(name, sizeof name, "/dtrain-p%d.s%d.%d", (int)getpid(), parent->nsplits,
                 color_index);
    dt_coll_args b = {.kind = DT_COLL_BARRIER, .seq = parent->seq};
    dt_status rc = DT_OK, rc2;
    int creator = child && child->rank == 0;
    if (creator) rc = dt_shm_create_named(child, name, 1);
    if (creator && rc == DT_OK) rc = record_members(name, members, nmembers, color);
    /* everyone waits for the segments to exist, even if one failed */
    if ((rc2 = shm_barrier(parent, &b)) != DT_OK) return rc2;
    if (child && rc == DT_OK) {
        rc = dt_shm_attach_named(child, name);
        if (rc == DT_OK) {
            for (int i = 0; i < nmembers; i++) ST(child)->world[i] = ps->world[members[i]];
            ST(child)->gen = ps->gen;  // a later replacement breaks it (it cannot rejoin)
        }
    }
    if ((rc2 = shm_barrier(parent, &b)) != DT_OK) return rc2;
    if (creator && !(g_world_hdr && atomic_load(&g_world_hdr->respawn))) dt_shm_unlink_named(name);
    return rc;
}

// ----------------------------------------------------------------------------
// replaceable ranks (comm.h: dt_comm_peer_state, dt_comm_peer_reset,
// dt_comm_rejoin_peers, dt_comm_split_rejoin)
//
// The launcher restarts a dead rank alone (dt_shm_take_place, alone): the rank's
// incarnation grows and it is marked restarting. A survivor that talked to
// it point to point sees its transfers fail (peer_gone_how), and empties
// the channels between the two (peer_reset), stamping them with the
// incarnation it reset them for; the replacement waits for those stamps
// before it sends anything (rejoin), then marks itself running. Its
// collectives continue from the dead rank's counters in the segment
// (map_segment), so it takes part in the next collective the survivors
// (who wait for a restarting rank) run; its communicators split off before
// it started are found by name (split_rejoin), each split's segment
// holding its color and its members' parent ranks.

static dt_status record_members(const char *name, const int *members, int n, int color) {
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) return dt_error(DT_ERR_COMM, "shm segment '%s': cannot open: %s", name, strerror(errno));
    size_t size = dt_shm_segment_size(n);
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) return dt_error(DT_ERR_COMM, "shm segment '%s': mmap failed: %s", name, strerror(errno));
    seg_header *h = base;
    rank_ctl *ctl = (rank_ctl *)((char *)base + layout_for(n).ctl);
    h->color = color;
    for (int i = 0; i < n; i++) ctl[i].parent_rank = members[i];
    munmap(base, size);
    return DT_OK;
}

static int shm_replaced(dt_comm_t c) {
    shm_state *s = ST(c);
    if (!g_world_hdr || atomic_load(&g_world_hdr->gen) <= s->gen) return -1;
    int w = atomic_load(&g_world_hdr->replaced_rank);
    for (int q = 0; q < c->size; q++)
        if (s->world[q] == w) return q;
    return -1;
}

static int shm_regrouped(dt_comm_t c) { return g_world_hdr && atomic_load(&g_world_hdr->gen) > ST(c)->gen; }

static int shm_peer_state(dt_comm_t c, int peer, int *incarnation) {
    shm_state *s = ST(c);
    int w = s->world[peer];
    if (!g_world_ctl || w < 0 || w >= g_world_hdr->nranks) return DT_PEER_RUNNING;
    int st = atomic_load(&g_world_ctl[w].state);
    if (incarnation) *incarnation = atomic_load(&g_world_ctl[w].incarnation);
    if (st == RANK_RESTARTING) return DT_PEER_RESTARTING;
    if (st != RANK_RUNNING) return DT_PEER_GONE;
    int pid = atomic_load(&s->ctl[peer].pid);
    if (pid <= 0 || kill(pid, 0) == 0 || errno != ESRCH) return DT_PEER_RUNNING;
    // Reaped but not marked yet: where ranks are let in alone the launcher
    // is about to say whether a replacement comes (restarting) or not
    // (gone): not gone for good before it has.
    return atomic_load(&g_world_hdr->respawn) ? DT_PEER_RUNNING : DT_PEER_GONE;
}

static dt_status shm_peer_reset(dt_comm_t c, int peer) {
    shm_state *s = ST(c);
    int w = s->world[peer];
    uint64_t inc = g_world_ctl && w >= 0 && w < g_world_hdr->nranks ? (uint64_t)atomic_load(&g_world_ctl[w].incarnation) : 0;
    if (g_known_inc && w >= 0 && g_world_hdr && w < g_world_hdr->nranks) atomic_store(&g_known_inc[w], (int32_t)inc);
    p2p_chan *ch[2] = {chan_of(s, s->me, peer), chan_of(s, peer, s->me)};
    for (int k = 0; k < 2; k++) {
        atomic_store(&ch[k]->head, 0);
        atomic_store(&ch[k]->tail, 0);
    }
    post(s, &ch[0]->gen[1], inc + 1);  // the peer receives on the first, sends on the second
    post(s, &ch[1]->gen[0], inc + 1);
    return DT_OK;
}

static dt_status shm_rejoin_peers(dt_comm_t c, const int *peers, int npeers) {
    shm_state *s = ST(c);
    if (!g_world_ctl) return DT_OK;
    int me = s->world[s->me];
    uint64_t inc = (uint64_t)atomic_load(&g_world_ctl[me].incarnation);
    double deadline = dt_now() + c->timeout;
    for (int i = 0; i < npeers; i++) {
        int p = peers[i];
        while (atomic_load(&chan_of(s, s->me, p)->gen[0]) < inc + 1 || atomic_load(&chan_of(s, p, s->me)->gen[1]) < inc + 1) {
            char why[160];
            if (peer_gone_how(s, p, why, sizeof why, 1))
                return dt_error(DT_ERR_COMM, "rank %d, rejoining: %s", c->rank, why);
            if (dt_now() > deadline)
                return dt_error(DT_ERR_TIMEOUT, "rank %d, rejoining: rank %d did not let it back in %.3g s", c->rank, p,
                                c->timeout);
            usleep(2000);
        }
    }
    atomic_store(&g_world_ctl[me].state, RANK_RUNNING);
    return DT_OK;
}

static int shm_peer_ready(dt_comm_t c, int peer) {
    shm_state *s = ST(c);
    if (!g_world_ctl) return 1;
    uint64_t inc = (uint64_t)atomic_load(&g_world_ctl[s->world[s->me]].incarnation);
    return atomic_load(&chan_of(s, s->me, peer)->gen[0]) >= inc + 1 && atomic_load(&chan_of(s, peer, s->me)->gen[1]) >= inc + 1;
}

static dt_status shm_split_rejoin(dt_comm_t parent, dt_comm_t child, int color) {
    shm_state *ps = ST(parent);
    if (!ps->name[0]) return dt_error(DT_ERR_COMM, "rank %d: no split to rejoin in a private segment", parent->rank);
    for (int ci = 0; ci <= color; ci++) {
        char name[200];
        snprintf(name, sizeof name, "%.150s.s%d.%d", ps->name, parent->nsplits, ci);
        int fd = shm_open(name, O_RDONLY, 0);
        if (fd < 0) continue;
        seg_header h;
        ssize_t got = read(fd, &h, sizeof h);
        close(fd);
        if (got != (ssize_t)sizeof h || h.magic != SHM_MAGIC || h.color != color) continue;
        // my place: the member whose parent rank is mine
        int n = h.nranks, me = -1;
        if (n < 1 || n > MAX_RANKS) continue;
        size_t size = dt_shm_segment_size(n);
        fd = shm_open(name, O_RDONLY, 0);
        void *base = fd < 0 ? MAP_FAILED : mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
        if (fd >= 0) close(fd);
        if (base == MAP_FAILED) continue;
        const rank_ctl *ctl = (const rank_ctl *)((const char *)base + layout_for(n).ctl);
        for (int i = 0; i < n; i++)
            if (ctl[i].parent_rank == parent->rank) me = i;
        munmap(base, size);
        if (me < 0) return dt_error(DT_ERR_COMM, "rank %d: not a member of split '%s'", parent->rank, name);
        shm_state *s = state_new(n);
        if (!s) return dt_error(DT_ERR_NOMEM, "shm backend: out of memory");
        child->size = n;
        child->rank = me;
        child->local_rank = me;
        child->local_size = n;
        dt_status rc = open_and_map(s, name, n, me);  // the own place, its counters
        if (rc != DT_OK) {
            state_free(s);
            return rc;
        }
        for (int i = 0; i < n; i++) s->world[i] = ps->world[s->ctl[i].parent_rank];
        child->seq = atomic_load(&s->ctl[me].useq);  // the collectives' numbers go on (check mode compares them)
        child->be = s;
        child->ops = &dt_shm_ops;
        return DT_OK;
    }
    return dt_error(DT_ERR_COMM, "rank %d: no split of color %d to rejoin (split %d of '%s')", parent->rank, color,
                    parent->nsplits, ps->name);
}

// ----------------------------------------------------------------------------
// rejoin: a new process in a dead rank's place (dt_comm_rejoin)
//
// The launcher reaps the dead process, marks its rank running again and
// bumps the segment's generation (dt_shm_take_place). Every rank of the
// world then calls rejoin: the survivors, whose collectives failed on the
// death, and the newcomer, which attached as the dead rank. Each
//   0. waits until no rank is marked gone and the generation G is newer
//      than the one it last joined;
//   1. sets rj_enter = G and waits until every rank entered G: from then
//      on nobody touches the collective flags;
//   2. resets its own flags (arrive, ready, reduced, done, the heads of the
//      channels it sends on and the tails of those it receives on), clears
//      the abort flag its peers raised on the death, sets rj_reset = G and
//      waits until every rank did.
// A rank that is gone meanwhile, or a newer generation, sends it back to
// 0; a refusal from the launcher (no process will come) fails it at once.

static int first_below(shm_state *s, size_t off, uint64_t g) {
    for (int p = 0; p < s->n; p++)
        if (atomic_load((_Atomic uint64_t *)((char *)&s->ctl[p] + off)) < g) return p;
    return -1;
}

static int first_gone(shm_state *s) {
    for (int p = 0; p < s->n; p++)
        if (atomic_load(&s->ctl[p].state) != RANK_RUNNING) return p;
    return -1;
}

static void reset_own(shm_state *s) {
    int me = s->me;
    atomic_store(&s->ctl[me].arrive, 0);
    atomic_store(&s->ctl[me].ready, 0);
    atomic_store(&s->ctl[me].reduced, 0);
    atomic_store(&s->ctl[me].done, 0);
    memset(s->ctl[me].desc, 0, sizeof s->ctl[me].desc);
    for (int q = 0; q < s->n; q++) {
        atomic_store(&chan_of(s, me, q)->head, 0);
        atomic_store(&chan_of(s, q, me)->tail, 0);
    }
    atomic_store(&s->hdr->abort_flag, 0);
    s->opseq = 0;
    s->step = 0;
    s->verified = 0;
}

static dt_status shm_rejoin(dt_comm_t c, double timeout, uint64_t *gen_out) {
    shm_state *s = ST(c);
    if (s->hdr != g_world_hdr || !s->name[0])
        return dt_error(DT_ERR_ARG, "rejoin on rank %d: only a launched world communicator takes a new process in a "
                                    "rank's place (not a split, not a private world of 1)",
                        c->rank);
    dt_waiter w;
    dt_waiter_init(&w, timeout, g_host_ranks);
    uint64_t G = 0;
    int phase = 0;
    const size_t enter_off = offsetof(rank_ctl, rj_enter), reset_off = offsetof(rank_ctl, rj_reset);
    for (;;) {
        uint64_t g = atomic_load(&s->hdr->gen);
        int gone = first_gone(s);
        if (gone >= 0 && atomic_load(&s->hdr->rejoin_refused)) {
            char why[160];
            if (!peer_gone(s, gone, why, sizeof why)) snprintf(why, sizeof why, "rank %d is gone", gone);
            return dt_error(DT_ERR_COMM, "rejoin on rank %d: %s and no process will take its place", c->rank, why);
        }
        if (phase > 0 && (g != G || gone >= 0)) phase = 0;  // another death: start over
        if (phase == 0 && gone < 0 && g > s->gen) {
            G = g;
            post(s, &s->ctl[s->me].rj_enter, G);
            phase = 1;
        }
        if (phase == 1 && first_below(s, enter_off, G) < 0) {
            reset_own(s);
            post(s, &s->ctl[s->me].rj_reset, G);
            phase = 2;
        }
        if (phase == 2 && first_below(s, reset_off, G) < 0) {
            s->gen = G;
            *gen_out = G;
            dt_waiter_done();
            return DT_OK;
        }
        if (!dt_waiter_step(&w)) continue;
        int who = phase == 0 ? gone : first_below(s, phase == 1 ? enter_off : reset_off, G);
        dt_waiter_note_op("rejoin", G, who);
        if (dt_waiter_expired(&w)) {
            dt_waiter_done();
            if (phase == 0)
                return dt_error(DT_ERR_TIMEOUT, "rejoin on rank %d: timed out after %.3g s: %s", c->rank, timeout,
                                gone >= 0 ? "no process took the dead rank's place" : "no rank was replaced");
            char missing[256] = "";
            size_t ml = 0;
            for (int p = 0; p < s->n && ml < sizeof missing - 16; p++)
                if (atomic_load((_Atomic uint64_t *)((char *)&s->ctl[p] + (phase == 1 ? enter_off : reset_off))) < G)
                    ml += (size_t)snprintf(missing + ml, sizeof missing - ml, "%s%d", ml ? " " : "", p);
            return dt_error(DT_ERR_TIMEOUT, "rejoin (generation %llu) on rank %d: timed out after %.3g s; ranks not arrived: %s",
                            (unsigned long long)G, c->rank, timeout, missing);
        }
    }
}

static void shm_abort(dt_comm_t c, const char *reason) {
    shm_state *s = ST(c);
    if (!s || !s->hdr) return;
    uint32_t zero = 0;
    if (atomic_compare_exchange_strong(&s->hdr->abort_flag, &zero, 2)) {
        s->hdr->abort_rank = c->rank;
        snprintf(s->hdr->abort_reason, sizeof s->hdr->abort_reason, "%s", reason ? reason : "");
        atomic_store(&s->hdr->abort_flag, 1);
    }
}

static void shm_destroy(dt_comm_t c) {
    shm_state *s = ST(c);
    if (!s) return;
    if (g_profile > 0 && g_wait_start)
        dt_log(DT_LOG_INFO, "shm rank %d: %.3f s of %.3f s waiting, %ld waits > 50 us", c->rank,
               g_wait_time, dt_now() - g_wait_start, g_wait_slow);
    if (s->hdr == g_world_hdr) {
        g_world_hdr = NULL;
        g_world_ctl = NULL;
        free((void *)g_known_inc);
        g_known_inc = NULL;
    }
    state_free(s);
    c->be = NULL;
}

const struct dt_comm_ops dt_shm_ops = {
    .name = "shm",
    .allreduce = shm_allreduce,
    .reduce_scatter = shm_reduce_scatter,
    .allgatherv = shm_allgatherv,
    .broadcast = shm_broadcast,
    .reduce = shm_reduce,
    .barrier = shm_barrier,
    .p2p_progress = shm_p2p_progress,
    .p2p_cancel = shm_p2p_cancel,
    .split = shm_split,
    .abort = shm_abort,
    .rejoin = shm_rejoin,
    .destroy = shm_destroy,
    .peer_state = shm_peer_state,
    .replaced = shm_replaced,
    .regrouped = shm_regrouped,
    .peer_reset = shm_peer_reset,
    .rejoin_peers = shm_rejoin_peers,
    .peer_ready = shm_peer_ready,
    .split_rejoin = shm_split_rejoin,
};
