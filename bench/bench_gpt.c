/* GPT training throughput of one process: full AdamW steps (forward,
 * backward, update) on random tokens for a GPT preset.
 *
 *   bench_gpt --preset gpt-small|gpt2-124m|gpt-tiny [--batch B] [--seq T]
 *             [--vocab V] [--threads N] [--steps S] [--warmup W] [--json]
 *
 * Prints tokens/s and ms/step (the mean over S steps after W warm-up steps).
 */
#include "dtrain/dtrain.h"
#include "kernels/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    const char *preset = "gpt-small";
    int B = 8, T = 256, V = 0, threads = 1, steps = 10, warm = 2, json = 0;
    const char *prec = "fp32";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (!strcmp(a, "--preset") && more) preset = argv[++i];
        else if (!strcmp(a, "--batch") && more) B = atoi(argv[++i]);
        else if (!strcmp(a, "--seq") && more) T = atoi(argv[++i]);
        else if (!strcmp(a, "--vocab") && more) V = atoi(argv[++i]);
        else if (!strcmp(a, "--threads") && more) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--steps") && more) steps = atoi(argv[++i]);
        else if (!strcmp(a, "--warmup") && more) warm = atoi(argv[++i]);
        else if (!strcmp(a, "--precision") && more) prec = argv[++i];
        else if (!strcmp(a, "--json")) json = 1;
        else {
            fprintf(stderr, "usage: bench_gpt --preset NAME [--batch B] [--seq T] [--vocab V] [--threads N] "
                            "[--steps S] [--warmup W] [--precision fp32|bf16|fp16] [--json]\n");
            return 2;
        }
    }
    dt_gpt_config c;
    if (dt_gpt_preset(preset, &c) != DT_OK) {
        fprintf(stderr, "%s\n", dt_last_error());
        return 2;
    }
    if (V > 0) {
        c.vocab_size = V;
        c.padded_vocab_size = dt_gpt_pad_vocab(V);
    }
    dt_set_threads(threads);
    dt_kernels_set_precision(!strcmp(prec, "bf16") ? DT_BF16 : !strcmp(prec, "fp16") ? DT_F16 : DT_F32);
    dt_gpt *m;
    if (dt_gpt_create(&m, &c, B, T) != DT_OK) {
        fprintf(stderr, "%s\n", dt_last_error());
        return 1;
    }
    dt_gpt_init(m, 1);
    dt_optim_params op = dt_optim_default_params(DT_OPTIM_ADAMW);
    op.lr = 3e-4f;
    op.weight_decay = 0.1f;
    dt_optim *o;
    if (dt_optim_create(&o, &op, dt_gpt_num_params(m)) != DT_OK) {
        fprintf(stderr, "%s\n", dt_last_error());
        return 1;
    }
    int32_t *x = malloc(sizeof(int32_t) * B * T), *y = malloc(sizeof(int32_t) * B * T);
    dt_rng r;
    dt_rng_seed(&r, 7);
    for (int i = 0; i < B * T; i++) x[i] = (int32_t)dt_rng_below(&r, c.vocab_size), y[i] = (int32_t)dt_rng_below(&r, c.vocab_size);
    double t0 = 0;
    float loss = 0;
    for (int s = 0; s < warm + steps; s++) {
        if (s == warm) t0 = dt_now();
        dt_gpt_zero_grad(m);
        dt_gpt_forward(m, x, y, B, T, &loss);
        dt_gpt_backward(m);
        dt_optim_step(o, dt_gpt_params(m), dt_gpt_grads(m), op.lr, 1.0f);
    }
    double dt = dt_now() - t0;
    double tps = (double)steps * B * T / dt;
    if (json)
        printf("{\"impl\": \"dtrain\", \"preset\": \"%s\", \"batch\": %d, \"seq\": %d, \"vocab\": %d, \"threads\": %d, "
               "\"steps\": %d, \"precision\": \"%s\", \"params\": %zu, \"loss\": %.4f, \"tokens_per_sec\": %.1f, "
               "\"ms_per_step\": %.2f}\n",
               preset, B, T, c.vocab_size, threads, steps, prec, dt_gpt_num_params(m), loss, tps, 1e3 * dt / steps);
    else
        printf("dtrain %s B=%d T=%d V=%d threads %d: %.0f tokens/s, %.1f ms/step (loss %.3f)\n", preset, B, T,
               c.vocab_size, threads, tps, 1e3 * dt / steps, loss);
    free(x);
    free(y);
    dt_optim_free(o);
    dt_gpt_free(m);
    return 0;
}
