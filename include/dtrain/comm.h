/*
 * dtrain/comm.h - communicators and collectives (shaped like NCCL and MPI).
 *
 * A communicator is a group of ranks that take part in collectives together.
 * Every training strategy talks to its peers through this header, so it is
 * small and strict:
 *
 *   dt_comm_t world;
 *   if (dt_comm_init_env(&world) != DT_OK) { puts(dt_last_error()); return 1; }
 *   int rank = dt_comm_rank(world), size = dt_comm_size(world);
 *
 *   // sum gradients in place, then divide by the number of ranks
 *   dt_allreduce(grad, grad, n, DT_F32, DT_AVG, world);
 *
 *   // start an allreduce, compute, then wait for it
 *   dt_request_t req;
 *   dt_iallreduce(bucket, bucket, m, DT_BF16, DT_SUM, world, &req);
 *   backward_next_layer();
 *   dt_wait(&req);
 *
 *   dt_comm_destroy(world);
 *
 * Where the ranks come from. dt_comm_init_env() reads the environment:
 *   - `dtrain run -n N -- prog` (the built-in launcher) sets DTRAIN_RANK,
 *     DTRAIN_WORLD_SIZE and DTRAIN_SHM_NAME; the ranks then talk through one
 *     POSIX shared-memory segment (the "shm" backend);
 *   - mpirun / srun set OMPI_COMM_WORLD_RANK, PMI_RANK or PMIX_RANK; the
 *     ranks then use MPI (the "mpi" backend), or shared memory inside each
 *     host plus MPI between hosts ("hier") when several ranks share a host;
 *   - nothing set: the process is rank 0 of a world of 1. This is not a
 *     special case: every collective works and simply copies.
 *   DTRAIN_COMM_BACKEND=shm|mpi|hier forces a backend.
 *
 * Semantics shared by all collectives:
 *   - Buffers are (send, recv, count, dtype). send == recv means in place.
 *   - All ranks of a communicator call the same collectives in the same
 *     order with matching count, dtype, op and root. The check mode (on by
 *     default in debug builds; DTRAIN_COMM_CHECK=1 or dt_comm_set_check())
 *     verifies this before every collective and reports a mismatch as
 *     DT_ERR_COMM naming each rank's arguments.
 *   - fp16 and bf16 reductions accumulate in fp32 and round once.
 *   - Results are bitwise identical on every rank and from run to run (the
 *     shm backend sums in rank order 0, 1, ..., n-1; the ring, rhd and tree
 *     algorithms that DTRAIN_COMM_ALGO can force in an order fixed by the
 *     rank count, see docs/comm.md). MPI's own collectives make no promise.
 *   - Nothing waits forever. Every blocking wait has a timeout (300 s by
 *     default; DTRAIN_COMM_TIMEOUT=seconds or dt_comm_set_timeout()). When
 *     a peer dies or times out the call returns DT_ERR_COMM or
 *     DT_ERR_TIMEOUT, and dt_last_error() names the op, its sequence number
 *     and the ranks that did not arrive. After such an error the
 *     communicator is broken: later calls fail at once with the same status
 *     (see dt_comm_get_async_error()); destroy it.
 *   - A communicator is used by one thread at a time (like NCCL). The
 *     non-blocking collectives run on the communicator's own progress
 *     thread, in the order they were issued, before any later blocking
 *     collective. Point-to-point transfers progress side by side with them
 *     and with each other (see dt_isend).
 */
#ifndef DTRAIN_COMM_H
#define DTRAIN_COMM_H

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_comm *dt_comm_t;
typedef struct dt_request *dt_request_t;

/* Reduction operators. DT_AVG is a sum divided by the number of ranks
 * (integer division for integer types). */
typedef enum { DT_SUM = 0, DT_AVG, DT_MAX, DT_MIN } dt_redop;

/* Color for dt_comm_split() meaning "this rank joins no sub-communicator". */
#define DT_COMM_UNDEFINED (-1)

/* ---- creation and queries ---------------------------------------------- */

/* Creates the world communicator from the environment (see the top of this
 * file). On success *out is a new communicator that the caller frees with
 * dt_comm_destroy(). Returns DT_ERR_COMM if the launcher's shared memory
 * cannot be attached or MPI cannot be initialised, DT_ERR_CONFIG for a bad
 * DTRAIN_* variable. Same as dt_comm_init(&dt_comm_default_params(), out). */
DT_API dt_status dt_comm_init_env(dt_comm_t *out);

/* Explicit settings; every field left at its default is taken from the
 * environment as dt_comm_init_env() does. */
typedef struct {
    const char *backend;  /* "auto", "shm", "mpi", "hier"; NULL: DTRAIN_COMM_BACKEND */
    int rank, size;       /* shm: -1: DTRAIN_RANK / DTRAIN_WORLD_SIZE */
    const char *shm_name; /* shm: the launcher's segment; NULL: DTRAIN_SHM_NAME,
                             and without one a private world of 1 */
    double timeout;       /* seconds; <= 0: DTRAIN_COMM_TIMEOUT, else 300 */
    int check;            /* 1 / 0; -1: DTRAIN_COMM_CHECK, else on in debug builds */
} dt_comm_params;

DT_API dt_comm_params dt_comm_default_params(void);

/* Creates the world communicator from `p` (not kept after the call). */
DT_API dt_status dt_comm_init(const dt_comm_params *p, dt_comm_t *out);

/* Splits `c` into sub-communicators: ranks passing the same `color` end up
 * in one new communicator, ordered by `key` (ties by rank in c). Collective
 * over c. A rank passing DT_COMM_UNDEFINED gets *out == NULL. The caller
 * frees *out with dt_comm_destroy(), before destroying c. */
DT_API dt_status dt_comm_split(dt_comm_t c, int color, int key, dt_comm_t *out);

/* Waits for pending non-blocking operations, then releases everything the
 * communicator holds. Not collective; NULL is ignored. */
DT_API void dt_comm_destroy(dt_comm_t c);

/* Marks the communicator as failed on this rank and tells the peers: their
 * pending and later collectives return DT_ERR_COMM naming this rank and
 * `reason` (may be NULL). Queued requests fail. Still call
 * dt_comm_destroy(). Returns DT_OK. */
DT_API dt_status dt_comm_abort(dt_comm_t c, const char *reason);

/* Replacing a dead rank. When a peer of a launched world communicator
 * dies, the survivors' collectives fail (DT_ERR_COMM) and the communicator
 * is broken. If the launcher puts a new process in the dead rank's place
 * (dtrain's launcher does so from its spares, docs/checkpoints.md), every
 * rank calls dt_comm_rejoin: each survivor after its failed call, once its
 * non-blocking requests are waited for; the newcomer right after
 * dt_comm_init, which made it the dead rank. The call waits, for up to
 * `timeout` seconds (<= 0: the communicator's timeout), until no rank is
 * missing and every rank has joined the new generation, then makes the
 * communicator usable again as if just created: the error is cleared and
 * sequence numbers start over. Nothing of the interrupted collectives is
 * kept; what the ranks had exchanged is theirs to agree on again.
 *
 * Returns DT_OK; DT_ERR_COMM when the launcher said that no process will
 * come; DT_ERR_TIMEOUT naming the ranks that did not join; DT_ERR_ARG for
 * a communicator that cannot (a split, another backend than shm, transfers
 * of dt_isend/dt_irecv still in flight). A rank that dies during a rejoin
 * starts it over for everybody, at the next generation. */
DT_API dt_status dt_comm_rejoin(dt_comm_t c, double timeout);
/* The generation this communicator last joined: 0 until a rejoin, then
 * the same number on every rank (each replacement starts a new one). A
 * newcomer's is >= 1 from its rejoin on: it joined a group that is
 * already running, whose start-up collectives are over. */
DT_API uint64_t dt_comm_generation(dt_comm_t c);

/* DT_OK while the communicator is healthy; otherwise the status of the error
 * that broke it (peer death, timeout, mismatch, abort), and dt_last_error()
 * is set to its message. Never blocks. */
DT_API dt_status dt_comm_get_async_error(dt_comm_t c);

/* Replaceable ranks (the shm backend under `dtrain train`'s launcher, which
 * restarts a dead rank alone when asked to; docs/parameter-server.md,
 * "Faults"). A rank's replacement is a new process in its place, with the
 * rank's incarnation one higher.
 *
 * dt_comm_set_peer_faults(c, 1): from now on a point-to-point transfer that
 * fails because its peer died fails alone: it returns DT_ERR_COMM, and the
 * communicator stays usable for the other peers (by default it breaks).
 * Collectives wait for a peer that is being restarted (up to the timeout).
 *
 * dt_comm_peer_state: DT_PEER_RUNNING, DT_PEER_RESTARTING (dead, a
 * replacement is on its way) or DT_PEER_GONE (dead for good, or exited, as
 * the launcher marked it: a dead process it has not marked yet is still
 * running here); *incarnation (may be NULL) its incarnation. Never blocks.
 *
 * dt_comm_peer_reset: a survivor, once it has no transfer in flight with a
 * restarting peer, empties the point-to-point channels between the two and
 * lets the replacement in. dt_comm_rejoin_peers: the replacement waits (up to
 * the timeout) until each of `peers` did so, then counts as running
 * (npeers 0: at once; dt_comm_peer_ready then says, without blocking,
 * whether `peer` did so: until then the replacement must not talk to it).
 * dt_comm_incarnation: this process's incarnation (0: the first).
 *
 * dt_comm_split_rejoin: the replacement's place in the communicator that
 * dt_comm_split(c, color, ...) gave its predecessor (the next split of c,
 * as the predecessor made it), without the others taking part; it takes
 * part in that communicator's next collective.
 *
 * dt_comm_seq: how many collectives this rank has started on c (on a
 * replacement's split from dt_comm_split_rejoin: its predecessor's count;
 * on shm a barrier started is one the others can pass). Ranks that made
 * the same collectives have the same count, so a replacement can tell how
 * far into a known sequence of collectives its predecessor had come.
 *
 * The MPI backend does not replace ranks: these return DT_ERR_COMM (state:
 * DT_PEER_RUNNING). */
enum { DT_PEER_RUNNING = 0, DT_PEER_RESTARTING = 1, DT_PEER_GONE = 2 };
DT_API void dt_comm_set_peer_faults(dt_comm_t c, int tolerate);
DT_API int dt_comm_peer_state(dt_comm_t c, int peer, int *incarnation);
/* dt_comm_replaced: the rank of c whose place a new process took (a spare,
 * --spares) since c last joined, or -1 (none, or a backend that replaces
 * none). Never blocks: a wait outside c's own collectives (NCCL's) ends on
 * such a death with it. */
DT_API int dt_comm_replaced(dt_comm_t c);
/* dt_comm_regrouped: 1 when the world (c, or the communicator it was
 * split from) began a new generation since c last joined: a new process
 * took a dead rank's place, one of c's or not, and c's ranks left its
 * collectives for the recovery. Never blocks; 0 on a backend that
 * replaces none. */
DT_API int dt_comm_regrouped(dt_comm_t c);
DT_API dt_status dt_comm_peer_reset(dt_comm_t c, int peer);
DT_API dt_status dt_comm_rejoin_peers(dt_comm_t c, const int *peers, int npeers);
DT_API int dt_comm_peer_ready(dt_comm_t c, int peer);
DT_API int dt_comm_incarnation(dt_comm_t c);
DT_API dt_status dt_comm_split_rejoin(dt_comm_t c, int color, dt_comm_t *out);
DT_API uint64_t dt_comm_seq(dt_comm_t c);

/* 1 if the environment makes this process one rank of a group (the
 * variables of `dtrain run`, mpirun or srun), else 0. */
DT_API int dt_comm_env_launched(void);

DT_API int dt_comm_rank(dt_comm_t c);
DT_API int dt_comm_size(dt_comm_t c);
/* Rank among the ranks on this host, how many share it, the host's index
 * and the number of hosts. For the shm backend: rank, size, 0, 1. */
DT_API int dt_comm_local_rank(dt_comm_t c);
DT_API int dt_comm_local_size(dt_comm_t c);
DT_API int dt_comm_node(dt_comm_t c);
DT_API int dt_comm_nnodes(dt_comm_t c);
/* "shm", "mpi" or "hier". The string is static. */
DT_API const char *dt_comm_backend(dt_comm_t c);

/* Timeout of every blocking wait on this communicator, in seconds (> 0);
 * dt_comm_timeout says it (0 for NULL). */
DT_API void dt_comm_set_timeout(dt_comm_t c, double seconds);
DT_API double dt_comm_timeout(dt_comm_t c);
/* Turns the argument check on (1) or off (0). Every rank must use the same
 * setting, because the check is itself a small collective. */
DT_API void dt_comm_set_check(dt_comm_t c, int on);

/* ---- statistics -----------------------------------------------------------
 * Counted by the front end for every collective that completed on this
 * rank (not for the argument check's internal exchange). Bytes are what a
 * bandwidth-optimal ring algorithm moves per rank, as nccl-tests counts its
 * "bus" bytes: an allreduce of S bytes over n ranks sends and receives
 * 2(n-1)/n x S each; reduce_scatter and allgather (n-1)/n of the whole
 * buffer; broadcast S from the root to each other rank; reduce S from each
 * other rank to the root; point to point S. A world of 1 moves nothing. */
typedef struct {
    uint64_t ops;              /* completed collectives and sends/recvs */
    uint64_t bytes_sent, bytes_recv;
    double busy_seconds;       /* summed time inside them (whichever thread ran them) */
} dt_comm_stats;

/* Totals since the communicator was created. Safe from any thread. */
DT_API void dt_comm_get_stats(dt_comm_t c, dt_comm_stats *out);

/* Called once per completed collective with its name ("allreduce", ...),
 * sequence number, bytes sent + received as dt_comm_stats counts them, and
 * start and end time (dt_now()), on the thread that ran it: the caller's
 * for blocking calls, the progress thread for non-blocking ones. It must be
 * quick and must not call into the communicator. */
typedef void (*dt_comm_observer)(const char *op, uint64_t seq, uint64_t bytes, double start,
                                 double end, void *user);
/* Installs fn (NULL removes it). After it returns, the previous observer is
 * no longer running and will not be called again. */
DT_API void dt_comm_set_observer(dt_comm_t c, dt_comm_observer fn, void *user);

/* ---- waiting ------------------------------------------------------------
 * A rank blocked in a collective for more than about 10 ms says what it
 * waits on: the operation ("allreduce", ...; an argument check names the
 * collective checked), its sequence number on its communicator, and the
 * first rank of that communicator it still waits for (-1 if the backend
 * cannot tell, as with MPI). A launcher uses this to tell a rank that is
 * waiting for a peer from one that is hung (docs/observability.md). */
typedef struct {
    const char *op;
    uint64_t seq;
    int peer;
} dt_comm_wait_info;

/* Called on the waiting thread about every 10-50 ms while a wait lasts
 * (w: what it waits on), and once with w == NULL when that wait is over.
 * It must be quick and must not call into a communicator. */
typedef void (*dt_comm_wait_hook)(const dt_comm_wait_info *w);
/* Installs fn for every communicator of the process (NULL removes it). */
DT_API void dt_comm_set_wait_hook(dt_comm_wait_hook fn);

/* ---- collectives --------------------------------------------------------
 * All return DT_OK, DT_ERR_ARG (bad pointer, dtype, op, root or peer; the
 * call did nothing and the communicator stays usable), DT_ERR_COMM or
 * DT_ERR_TIMEOUT (the communicator is now broken). Buffers stay owned by
 * the caller. */

/* recv[i] = op over ranks of send[i], for i < count, on every rank. */
DT_API dt_status dt_allreduce(const void *send, void *recv, size_t count, dt_dtype dtype,
                              dt_redop op, dt_comm_t c);

/* send holds size*recvcount elements; rank r receives block r of the
 * reduction in recv[0..recvcount). In place when recv == send (the result
 * then sits at the start of the buffer, as in NCCL's "recv = send" case
 * with offset 0). */
DT_API dt_status dt_reduce_scatter(const void *send, void *recv, size_t recvcount,
                                   dt_dtype dtype, dt_redop op, dt_comm_t c);

/* recv (size*sendcount elements) gets every rank's send block in rank
 * order. In place when send == recv + rank*sendcount (element units). */
DT_API dt_status dt_allgather(const void *send, void *recv, size_t sendcount, dt_dtype dtype,
                              dt_comm_t c);

/* Allgather with a different count per rank: rank p's block goes to
 * recv + displs[p] and has counts[p] elements. counts and displs (size
 * entries each, identical on all ranks) stay owned by the caller and may be
 * freed when the call returns (also for the non-blocking form). */
DT_API dt_status dt_allgatherv(const void *send, size_t sendcount, void *recv,
                               const size_t *counts, const size_t *displs, dt_dtype dtype,
                               dt_comm_t c);

/* Copies root's send[0..count) into every rank's recv (NCCL style: send is
 * read only on root; pass send == recv for MPI_Bcast behaviour). */
DT_API dt_status dt_broadcast(const void *send, void *recv, size_t count, dt_dtype dtype,
                              int root, dt_comm_t c);

/* Like dt_allreduce, but only root's recv is written (recv may be NULL
 * elsewhere). */
DT_API dt_status dt_reduce(const void *send, void *recv, size_t count, dt_dtype dtype,
                           dt_redop op, int root, dt_comm_t c);

/* Returns once every rank has entered the barrier. */
DT_API dt_status dt_barrier(dt_comm_t c);

/* Point to point: a dt_send must be matched by a dt_recv of the same count
 * and dtype on `peer`; messages between one pair arrive in order. A
 * transfer does not wait for collectives or other transfers: they progress
 * side by side (dt_isend/dt_irecv below). A transfer that makes no progress
 * for the communicator's timeout fails with DT_ERR_TIMEOUT naming the peer;
 * a dead peer gives DT_ERR_COMM. */
DT_API dt_status dt_send(const void *buf, size_t count, dt_dtype dtype, int peer, dt_comm_t c);
DT_API dt_status dt_recv(void *buf, size_t count, dt_dtype dtype, int peer, dt_comm_t c);

/* ---- non-blocking twins -------------------------------------------------
 * Same arguments plus a request out-parameter. They queue the operation on
 * the communicator's progress thread and return at once; the buffers must
 * stay valid and untouched until dt_wait()/dt_test() report completion.
 * Argument errors are returned immediately (and *req is NULL). */

DT_API dt_status dt_iallreduce(const void *send, void *recv, size_t count, dt_dtype dtype,
                               dt_redop op, dt_comm_t c, dt_request_t *req);
DT_API dt_status dt_ireduce_scatter(const void *send, void *recv, size_t recvcount,
                                    dt_dtype dtype, dt_redop op, dt_comm_t c,
                                    dt_request_t *req);
DT_API dt_status dt_iallgather(const void *send, void *recv, size_t sendcount, dt_dtype dtype,
                               dt_comm_t c, dt_request_t *req);
DT_API dt_status dt_ibroadcast(const void *send, void *recv, size_t count, dt_dtype dtype,
                               int root, dt_comm_t c, dt_request_t *req);

DT_API dt_status dt_iallgatherv(const void *send, size_t sendcount, void *recv,
                                const size_t *counts, const size_t *displs, dt_dtype dtype,
                                dt_comm_t c, dt_request_t *req);
DT_API dt_status dt_ireduce(const void *send, void *recv, size_t count, dt_dtype dtype,
                            dt_redop op, int root, dt_comm_t c, dt_request_t *req);
DT_API dt_status dt_ibarrier(dt_comm_t c, dt_request_t *req);

/* Non-blocking point to point. Unlike the collectives above they are not
 * queued behind earlier calls: every send and receive in flight moves
 * along at once (on a background thread, and in dt_wait/dt_test), so
 *   dt_irecv(in, n, DT_F32, peer, c, &r1); dt_isend(out, n, DT_F32, peer, c, &r2);
 *   dt_wait(&r1); dt_wait(&r2);
 * exchanges messages of any size between two ranks. Messages between one
 * pair still arrive in the order they were sent. */
DT_API dt_status dt_isend(const void *buf, size_t count, dt_dtype dtype, int peer, dt_comm_t c,
                          dt_request_t *req);
DT_API dt_status dt_irecv(void *buf, size_t count, dt_dtype dtype, int peer, dt_comm_t c,
                          dt_request_t *req);

/* Waits for the request, frees it, sets *req to NULL and returns the
 * operation's status (with dt_last_error() set on failure). *req == NULL
 * returns DT_OK. */
DT_API dt_status dt_wait(dt_request_t *req);

/* Never blocks. If the operation is still running: *done = 0, returns
 * DT_OK. Otherwise *done = 1 and it behaves like dt_wait(). */
DT_API dt_status dt_test(dt_request_t *req, int *done);

/* Short name of an operator ("sum", "avg", "max", "min"). */
DT_API const char *dt_redop_name(dt_redop op);

#ifdef __cplusplus
}
#endif
#endif
