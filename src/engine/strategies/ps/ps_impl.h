/* ps_impl.h - what the files of the parameter-server strategy (the "ps"
 * strategy, engine/strategies/ps/) share: the messages' header and kinds,
 * the servers' statistics, the worker's state (ps_worker, the strategy
 * object), a server's (server, with a peer per worker), and the functions
 * one file calls in another. ps.c has the overview; the files:
 *
 *   ps.c      the strategy's table, its config check, set-up and teardown
 *             (the pieces, the groups, INIT), the summary
 *   worker.c  the workers' steps: pushes from the grad hook, the norm,
 *             COMMIT and the weights, the meetings (params_sync)
 *   server.c  a server's loop: its start, the headers it handles, and how
 *             each mode applies the gradients and answers
 *   msg.c     the message kinds' names, the waits and checks of headers,
 *             a push's check and receipt
 *   robust.c  mode sync's screen of faulty gradients and [ps] aggregator
 *   ckpt.c    the servers' checkpoints outside mode sync: the model's
 *             description (DESC), SAVE and SAVED, the writer
 *   faults.c  faults outside mode sync: a worker's death and its
 *             replacement's rejoining, a server's restart and the workers'
 *             HELLO to it */
#ifndef DT_PS_IMPL_H
#define DT_PS_IMPL_H

#include "dtrain/launch.h"
#include "engine/codecs/codec.h"
#include "engine/robust/robust.h"
#include "engine/strategies/strategy.h"
#include "engine/tables.h"
#include "engine/worker.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

// ----------------------------------------------------------------------------
// the messages

enum { H_KIND, H_STEP, H_VERSION, H_OFF, H_COUNT, H_A, H_B, H_C, H_N };
#define PS_MAGIC 0x50530000LL  // "PS" in a message kind
enum {
    M_INIT = PS_MAGIC + 1,
    M_PUSH,
    M_COMMIT,
    M_FETCH,
    M_END,
    M_NORM,
    M_WEIGHTS,
    M_STATES,
    M_JOIN,
    M_JOINED,
    M_RESUME,
    M_DESC,
    M_SAVE,
    M_SAVED,
    M_HELLO,
    M_HELLOED,
    M_PULL,
    M_SPUSH,
    M_ROWS,
};

// Statistics a server keeps (sent with STATES): the staleness of every
// applied gradient (updates of the range between the weights it was
// computed from and its own; the last bin counts HIST_MAX and above),
// then the figures below.
enum { HIST_MAX = 63, ST_APPLIED = 64, ST_DROPPED, ST_STEPS, ST_MAX_GAP, ST_MIN_PER_STEP, ST_MAX_PER_STEP, ST_MAX_QUEUED,
       ST_PEAK_RSS, ST_DIED, ST_REJOINED, ST_PIECES, ST_SKIPPED, ST_LEFT_OUT, ST_N };

enum { MODE_SYNC, MODE_ASYNC, MODE_SSP, MODE_BACKUP };
extern const char *const ps_mode_names[];  // ([ps] mode's names, by MODE_*)

static inline int64_t bits_of(double x) {
    int64_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static inline double double_of(int64_t b) {
    double x;
    memcpy(&x, &b, sizeof x);
    return x;
}

// What the servers' checkpoints say about the model, as worker 0's DESC
// brings it (ckpt.c: its text).
typedef struct {
    char *text;  // the blob, cut in place; the fields point into it
    const char *dir, *optimizer, *config;
    dt_tensor_info *tensors;
    int ntensors;
    dt_st_meta *meta;
    int nmeta;
} model_desc;

// ----------------------------------------------------------------------------
// the worker's side

typedef struct {
    size_t lo, hi;  // a contiguous part of the block, inside one server's range
    size_t pos;     // where it starts in the gradient order
    int server;
    const uint8_t *msg;  // [compression]: the piece's message of step `coded` (the codec's buffer), bytes long
    size_t bytes;
    int64_t coded;
} piece;

typedef struct {
    dt_strategy base;
    int S;              // servers: world ranks 0..S-1
    size_t *slo, *shi;  // their ranges
    piece *p;           // from the END of the order: p[0] is final first
    int np, next;
    int64_t (*hdr)[H_N];
    dt_request_t *req;  // two per piece: header and data
    int64_t *acc;       // deterministic: this worker's fixed-point sums
    int64_t step;
    int64_t *ver;       // the version of each server's weights this worker holds
    int *sinc;          // the incarnation of each server this worker knows (a restarted one's is higher)
    int64_t *leaders;   // the world ranks of the workers that talk to the servers (groups' leaders), G of them
    int G;
    int64_t stats[ST_N];  // server 0's, from the last params_sync (ps_summary)
    int64_t cseq;         // the workers' collectives made before this worker's last committed step (-1: none yet)
    dt_comm_t group;      // [ps] groups: this worker's group (NULL: none)
    dt_codec *codec;      // [compression]: what the pushes are encoded with (NULL: none, fp32)
    int leader;           // this worker talks to the servers
    float weight;         // async, ssp: the share's part of the global batch, which the server's learning rate scales by
    double t_first, t_backward_end;
    dt_rows_layout rl;    // the recommender's tables (rows.c): the rows' placement on the servers
    dt_rows_plan plan;    // ... a message's rows, placed and cut by server
    uint64_t table_bytes, dense_bytes;  // bytes of rows pulled and pushed, and of the block's pushes and weights
    int64_t table_steps;  // steps that pulled and pushed rows
    int64_t *rows_to;     // rows pushed to each server (S): the servers' balance
    dt_status err;
    char errmsg[1024];
} ps_worker;

// ----------------------------------------------------------------------------
// the server's side

typedef struct {
    int64_t h[H_N];   // the header being received
    dt_request_t req; // its receive, NULL once the worker ended
    void *buf;        // this step's push: the range's gradient (int64 sums when deterministic)
    uint8_t *seen;    // elements of the range pushed this step
    size_t got;
    int64_t step;     // the worker's next step: the one its pushes are for
    int64_t sent;     // the version of the weights it was last sent
    int64_t arrived;  // when its push completed (backup: the first N - b of a step)
    int committed, held, ended;
    int finished;     // it said END: a replacement for it after that only ends (JOINED says so)
    int rank;         // in the world
    int dropped;      // its process died: 1 until the launcher restarts it, 2 until the replacement runs,
                      // 3 while it rejoins (JOIN, RESUME); 0: taking part
    int inc;          // the replacement's incarnation
    int nostep;       // this server (a replacement) never heard its step: it died before its HELLO
    double dead_at;
    int64_t stale;    // the staleness its last gradient was applied at (-1: dropped)
    int64_t unit;     // dynamic sharing: 1 + the piece its last COMMIT trained (0: none)
    int64_t doing;    // server 0: the piece it trains now (-1: none, its epoch's are all out)
    int64_t cseq;     // the workers' collectives its COMMIT says it had made (ps_rejoin), and those of
    int64_t done_cseq;// its last step done with (before `step`; -1: none since the start)
    int64_t rows_pushed;  // the recommender's tables (rows.c): steps whose rows it pushed
    int64_t *ids;     // its held pull's rows (a pull waits for the rows of the steps before it: sync)
    size_t nids, cap;
    int64_t pull_step;
    int pull_held;
    int64_t *pq;      // sync: its push of the step's rows (placed numbers), until every worker's is in
    float *pg;        // ... their gradients [pk, dim]
    size_t pk, pcap;
    int save_owed;    // its SAVE's checkpoint is being written: SAVED (of save_step) once it is (ps_saved)
    int64_t save_step;
    double lr, scale;
} peer;

typedef struct {
    const dt_config *c;
    dt_comm_t all, mine;
    int S, N, me;      // servers, workers (world ranks S..S+N-1), this server's index
    int mode;
    size_t n, lo, len;
    int det;
    float *params, *grad;
    uint8_t *msg;      // [compression]: a push's message, before it is decoded (msgcap bytes)
    size_t msgcap;
    dt_optim *opt;
    int64_t step, version, arrivals;
    peer *w;
    int reduced;       // sync: this step's pushes are summed and the norm sent
    int ended;         // workers that said END
    int64_t stats[ST_N];
    const char *run_dir;
    int64_t *ranks;    // the world ranks of its peers (INIT; NULL: every worker)
    model_desc desc;   // worker 0's DESC (checkpoints)
    dt_ckpt_model cm;  // this server's view for its writer
    dt_ckpt_writer *writer;
    int64_t saved_step; // the step of its last checkpoint (-1: none)
    int seeded;         // restarted alone with no checkpoint: its range from a worker's weights (restore)
    int64_t units;      // dynamic sharing: pieces an epoch (steps x workers; 0: fixed shares)
    int64_t next_unit;  // server 0: the next piece to hand out, numbered over the run
    int robust;         // mode sync: the pushes are screened and combined by [ps] aggregator (robust.c)
    dt_attack attack;   // DTRAIN_ATTACK (tests, benches): the first workers' pushes replaced
    float *rows;        // deterministic and robust: the N pushes as floats (N x len)
    struct {            // the recommender's tables (rows.c): sh.n = 0, none
        dt_rows_layout L;
        dt_rows_shard sh;
        int64_t step;   // the steps applied (sync: every worker's rows of a step summed first)
        float *buf;     // a pull's rows [buf_rows, dim]
        size_t buf_rows;
    } tb;
} server;

// ----------------------------------------------------------------------------
// across the files

// The one bound of the protocol's waits outside a transfer (a dead peer's
// restart, a replacement let in by its peers, a checkpoint's shards): the
// world communicator's timeout (DTRAIN_COMM_TIMEOUT, 300 s by default),
// which bounds every transfer that does not move too. A wait past it fails
// the process with an error naming the peer; the launcher never restarts a
// process that failed alone, so the group restarts (--max-restarts).
static inline double ps_timeout(dt_comm_t all) { return dt_comm_timeout(all); }

// msg.c
const char *ps_kind_name(int64_t k);
dt_status ps_wait_all(dt_request_t *r, int n);
dt_status ps_expect(ps_worker *w, int j, int64_t *h, int64_t kind);
dt_status ps_refuse(server *sv, int wi, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
dt_status ps_post_header(server *sv, int wi);
dt_status ps_take_push(server *sv, int wi);

// worker.c: the seam's operations of a step and a meeting, and their parts
int ps_plan(dt_strategy *s, int first, int share, int global);
dt_grad_ready_fn ps_grad_hook(dt_strategy *s, int k, void **user);
void ps_micro_end(dt_strategy *s, int k);
dt_status ps_sync(dt_strategy *s);
dt_status ps_grad_norm(dt_strategy *s, double *norm);
dt_status ps_update(dt_strategy *s, float lr, float scale);
dt_status ps_params_sync(dt_strategy *s);
void ps_push(ps_worker *w, int i);
dt_status ps_meet(ps_worker *w);

// ckpt.c
void ps_desc_free(model_desc *d);
dt_status ps_desc_decode(model_desc *d, char *text, size_t len, int me);
dt_status ps_desc_of(ps_worker *w, char **b, size_t *len);
dt_status ps_send_desc(ps_worker *w, int j);
dt_status ps_ckpt_save(dt_strategy *s, const dt_train_state *ts, char *lost, size_t n);
int ps_ckpt_extra(dt_strategy *s, dt_st_tensor *t, int max);
dt_status ps_take_desc(server *sv, int wi);
dt_status ps_make_writer(server *sv);
dt_status ps_save(server *sv, int wi);
dt_status ps_saved(server *sv, int *moved);

// faults.c: the worker's side
int ps_server_lost(ps_worker *w, int j);
dt_status ps_server_back(ps_worker *w, int j);
dt_status ps_back_if_lost(ps_worker *w, int j);
dt_status ps_repush(ps_worker *w, int j);
dt_status ps_rejoin(ps_worker *w);
// faults.c: the server's side
dt_status ps_survive(server *sv, int wi, dt_status st);
dt_status ps_tend(server *sv, int *moved);
dt_status ps_restart(server *sv);
dt_status ps_hello(server *sv, int wi);
dt_status ps_joined(server *sv, int wi);
dt_status ps_resume(server *sv, int wi);

// robust.c
dt_status ps_reduce_pushes(server *sv);

// rows.c: the recommender's tables on the servers
dt_status ps_rows_pull(dt_strategy *s, const int64_t *ids, size_t n, float *vals);
dt_status ps_rows_push(dt_strategy *s, const int64_t *ids, size_t n, const float *g);
int ps_has_tables(const dt_config *c);
dt_status ps_tables_check(const dt_config *c);
dt_status ps_tables_setup(server *sv, const char *from);
int ps_tables_extra(void *user, dt_st_tensor *t, int max);
void ps_tables_free(server *sv);
dt_status ps_take_pull(server *sv, int wi);
dt_status ps_take_rows(server *sv, int wi);

// server.c
dt_status ps_setup(server *sv);
dt_status ps_serve(const dt_config *c, dt_comm_t all, dt_comm_t mine, const char *run_dir);

#endif
