/* The per-step agreement of all ranks (control.h), and the stop request. */
#include "engine/control.h"
#include "dtrain/train.h"

#include <signal.h>

static volatile sig_atomic_t g_stop;

void dt_train_request_stop(void) { g_stop = 1; }
int dt_control_stop_requested(void) { return g_stop != 0; }

dt_status dt_control_agree(dt_obs *obs, dt_comm_t comm, double loss_sum, int global, int save_vote,
                           int overflow, dt_control *out) {
    float v[4] = {(float)loss_sum, (float)dt_control_stop_requested(), (float)save_vote, (float)overflow};
    dt_status st = dt_obs_allreduce(obs, v, 4, comm);
    out->loss = v[0] / (float)global;
    out->stop = v[1] > 0;
    out->save = v[2] > 0;
    out->overflow = v[3] > 0;
    return st;
}

void dt_control_local(double loss_sum, int denom, int save_vote, int overflow, dt_control *out) {
    out->loss = (float)(loss_sum / (denom > 0 ? denom : 1));
    out->overflow = overflow;
    out->stop = dt_control_stop_requested();
    out->save = save_vote;
}
