/* A federated run's state and its round's aggregation
 * (engine/federated/round.c); engine/federated/federate.c runs the rounds
 * (dt_federate, docs/federated.md): the clients' training, which fills the
 * round's rows and reports, then these calls:
 *
 *   (the reports' allreduce)  fed_screen       who is left out, named
 *   fed_sum_rows              (the sums' allreduce, or the rows' when gathered)
 *   fed_server_step           the mean, robust or noisy update, the server optimizer's step */
#ifndef DT_ENGINE_FED_ROUND_H
#define DT_ENGINE_FED_ROUND_H

#include "dtrain/config.h"
#include "dtrain/optim.h"
#include "engine/robust/robust.h"
#include "engine/tasks/task.h"
#include "obs/json.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int round, client;
    double delay;  // seconds; < 0: the client fails
} fault;

typedef struct {
    const dt_config *c;
    const dt_task_ops *tops;
    dt_task *task;
    dt_comm_t comm;
    int rank, W;
    float *params, *grads;  // the task's model: a client trains in them
    size_t n;
    float *global;          // the server's model
    dt_optim *client_opt, *server_opt;
    uint32_t *idx;          // the partition: client k's samples idx[start[k] .. start[k + 1])
    int *start;
    int C, m;               // clients, clients per round
    int *sampled;           // this round's, ascending
    int64_t *acc;           // the n update sums
    float *rows;            // m x n: the round's updates (this rank's clients'; every client's when gathered)
    int64_t *meta;          // [m reported][m squared norm][m loss]: the doubles' bits, one client's each
    uint8_t *bad;           // m: a client that did not report or was screened out
    uint32_t *masked, *msum;
    fault *faults;
    int nfaults;
    int gather;             // the updates go to every rank in the clear (a robust aggregator, the "lie" attack)
    dt_attack attack;       // DTRAIN_ATTACK (tests, benches): the round's clients 0 .. evil - 1 attack
    int evil;
    int32_t *labels;        // the training labels (labelflip flips an attacker's while it trains)
    int classes;
    double sigma, q;        // DP-FedAvg: noise multiplier, sampling rate (sigma 0: no DP)
    float *eps;             // DP: the epsilon spent after each round
    cJSON *left_out;        // [{round, client, reason}] of the screened-out updates
    int nleft;
} fed;

/* A key for round r and client k (k < 0: the round's own draws), from the seed. */
uint64_t fed_round_key(const dt_config *c, int r, int k);
/* A double in (and out of) an int64 slot of the reports: one client's each, so their sum is exact. */
void fed_put_double(int64_t *slot, double x);
double fed_get_double(const int64_t *slot);
/* Client k's share of the round's `total` samples. */
double fed_share_of(const fed *f, int k, long total);
/* f->bad from the allreduced reports: not reported, no samples, or
 * screened (robust.h: NaN/Inf, a norm above [federated] outlier x the
 * median; NaN/Inf alone under DP); each screened client logged (rank 0)
 * and listed in f->left_out. The same on every rank. */
void fed_screen(fed *f, int r);
/* This rank's kept rows into f->acc: fixed point weighted by their share
 * (1 each under DP), or masked when secure. */
void fed_sum_rows(fed *f, long total, uint64_t key);
/* Round r's update from the allreduced sums or rows into the server
 * optimizer (FedAvg's renormalised mean, the robust aggregate, or DP's
 * noisy sum over m); *reported, *loss, *norm; *applied = 0 when fewer
 * than min_clients were kept. */
dt_status fed_server_step(fed *f, int r, long total, uint64_t key, int *reported, float *loss, float *norm,
                          int *applied);

#endif
