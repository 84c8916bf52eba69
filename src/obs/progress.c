/* Human-readable progress lines. */
#include "dtrain/train.h"

#include <stdio.h>

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
    if (p->is_eval) {
        snprintf(buf, n, "epoch %d/%d done | train loss %.4f | test loss %.4f | test accuracy %.2f%%",
                 p->epoch, p->epochs, p->loss, p->eval_loss, 100.0 * p->eval_accuracy);
        return;
    }
    char eta[32];
    fmt_duration(p->eta_seconds, eta, sizeof eta);
    snprintf(buf, n, "step %lld/%lld | epoch %d/%d | loss %.4f | lr %.2e | %.0f samples/s | ETA %s",
             (long long)p->step, (long long)p->total_steps, p->epoch, p->epochs, p->loss, p->lr,
             p->samples_per_sec, eta);
}
