/* Progress lines: human-readable and JSON. */
#include "dtrain/train.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

static void fmt_duration(double s, char *buf, size_t n) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, n, "%lds", t);
}

void dt_progress_format(const dt_progress *p, char *buf, size_t n) {
    if (p->is_eval && p->eval_accuracy < 0) {  // a language model: no accuracy
        snprintf(buf, n, "step %lld/%lld | train loss %.4f | val loss %.4f", (long long)p->step,
                 (long long)p->total_steps, p->loss, p->eval_loss);
        return;
    }
    if (p->is_eval && p->eval_auc) {
        snprintf(buf, n, "%s %d/%d done | train loss %.4f | test loss %.4f | test AUC %.4f", "epoch", p->epoch,
                 p->epochs, p->loss, p->eval_loss, p->eval_accuracy);
        return;
    }
    if (p->is_eval) {
        snprintf(buf, n, "%s %d/%d done | train loss %.4f | test loss %.4f | test accuracy %.2f%%",
                 p->rounds ? "round" : "epoch", p->epoch, p->epochs, p->loss, p->eval_loss, 100.0 * p->eval_accuracy);
        return;
    }
    char eta[32], rate[48], slow[64] = "";
    fmt_duration(p->eta_seconds, eta, sizeof eta);
    if (p->tokens_per_sec > 0) snprintf(rate, sizeof rate, "%.0f tokens/s", p->tokens_per_sec);
    else snprintf(rate, sizeof rate, "%.0f samples/s", p->samples_per_sec);
    if (p->workers > 1 && p->slowest_stage >= 0)
        snprintf(slow, sizeof slow, " | slowest stage %d (rank %d, %.0f ms)", p->slowest_stage, p->slowest_rank,
                 p->slowest_step_seconds * 1e3);
    else if (p->workers > 1)
        snprintf(slow, sizeof slow, " | slowest rank %d (%.0f ms)", p->slowest_rank, p->slowest_step_seconds * 1e3);
    if (p->rounds)  // (a round is a step, and there are no epochs)
        snprintf(buf, n, "round %lld/%lld | loss %.4f | lr %.2e | %s | ETA %s%s", (long long)p->step,
                 (long long)p->total_steps, p->loss, p->lr, rate, eta, slow);
    else
        snprintf(buf, n, "step %lld/%lld | epoch %d/%d | loss %.4f | lr %.2e | %s | ETA %s%s", (long long)p->step,
                 (long long)p->total_steps, p->epoch, p->epochs, p->loss, p->lr, rate, eta, slow);
}

void dt_progress_format_json(const dt_progress *p, char *buf, size_t n) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "type", p->is_eval ? "eval" : "step");
    cJSON_AddNumberToObject(j, "step", (double)p->step);
    cJSON_AddNumberToObject(j, "total_steps", (double)p->total_steps);
    cJSON_AddNumberToObject(j, "epoch", p->epoch);
    cJSON_AddNumberToObject(j, "epochs", p->epochs);
    cJSON_AddNumberToObject(j, p->is_eval ? "train_loss" : "loss", p->loss);
    cJSON_AddNumberToObject(j, "lr", p->lr);
    if (p->is_eval) {
        cJSON_AddNumberToObject(j, "eval_loss", p->eval_loss);
        if (p->eval_accuracy >= 0) cJSON_AddNumberToObject(j, "eval_accuracy", p->eval_accuracy);
    } else {
        cJSON_AddNumberToObject(j, "samples_per_sec", p->samples_per_sec);
        if (p->tokens_per_sec > 0) cJSON_AddNumberToObject(j, "tokens_per_sec", p->tokens_per_sec);
        cJSON_AddNumberToObject(j, "eta_seconds", p->eta_seconds);
        if (p->workers > 1) {
            cJSON_AddNumberToObject(j, "slowest_rank", p->slowest_rank);
            cJSON_AddNumberToObject(j, "slowest_step_seconds", p->slowest_step_seconds);
            if (p->slowest_stage >= 0) cJSON_AddNumberToObject(j, "slowest_stage", p->slowest_stage);
        }
    }
    char *s = cJSON_PrintUnformatted(j);
    snprintf(buf, n, "%s", s ? s : "{}");
    free(s);
    cJSON_Delete(j);
}
