/* Training throughput of one process: samples/s of full SGD steps (forward,
 * backward, optimizer) on synthetic data for the mlp, cnn or resnet18 preset
 * (the running statistics left alone by the optimizer, as the run loop does).
 *
 *   bench_train --model mlp|cnn|resnet18 [--width W] [--batch B] [--threads T] [--steps N] [--json]
 */
#include "dtrain/dtrain.h"
#include "kernels/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    const char *model = "mlp";
    int batch = 0, threads = 1, steps = 0, json = 0, width = 16;
    const char *prec = "fp32";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--precision") && i + 1 < argc) prec = argv[++i];
        else if (!strcmp(argv[i], "--width") && i + 1 < argc) width = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json")) json = 1;
        else {
            fprintf(stderr, "usage: bench_train --model mlp|cnn|resnet18 [--width W] [--batch B] [--threads T] [--steps N] "
                            "[--precision fp32|bf16|fp16] [--json]\n");
            return 2;
        }
    }
    int is_cnn = !strcmp(model, "cnn"), is_resnet = !strcmp(model, "resnet18");
    if (!batch) batch = is_cnn || is_resnet ? 64 : 256;
    if (!steps) steps = is_resnet ? 20 : is_cnn ? 60 : 200;
    char text[96];
    snprintf(text, sizeof text, "[model]\npreset = %s\nwidth = %d\n", is_resnet ? "resnet18" : is_cnn ? "cnn" : "mlp",
             is_resnet ? width : 0);
    dt_config c;
    if (dt_config_parse(&c, text, "bench", NULL, 0) != DT_OK) {
        fprintf(stderr, "%s\n", dt_last_error());
        return 1;
    }
    dt_set_threads(threads);
    dt_kernels_set_precision(!strcmp(prec, "bf16") ? DT_BF16 : !strcmp(prec, "fp16") ? DT_F16 : DT_F32);
    dt_model *m;
    if (dt_model_create(&m, c.input, c.layers, c.nlayers, batch) != DT_OK) {
        fprintf(stderr, "%s\n", dt_last_error());
        return 1;
    }
    dt_model_init(m, 1);
    dt_optim_params op = dt_optim_default_params(DT_OPTIM_SGD);
    op.momentum = 0.9f;
    dt_optim *o;
    dt_optim_create(&o, &op, dt_model_num_params(m));
    int nb;
    const dt_grad_range *bufs = dt_model_buffer_ranges(m, &nb);
    dt_optim_set_frozen(o, (const size_t *)bufs, nb);
    int in = dt_model_input_size(m);
    float *x = malloc(sizeof(float) * in * batch);
    int32_t *y = malloc(sizeof(int32_t) * batch);
    dt_rng r;
    dt_rng_seed(&r, 7);
    for (int i = 0; i < in * batch; i++) x[i] = dt_rng_normal(&r);
    for (int i = 0; i < batch; i++) y[i] = (int32_t)dt_rng_below(&r, 10);
    double t0 = 0;
    int warm = steps / 5 + 2;
    for (int s = 0; s < warm + steps; s++) {
        if (s == warm) t0 = dt_now();
        float loss;
        dt_model_zero_grad(m);
        dt_model_forward(m, x, y, batch, 1, &loss);
        dt_model_backward(m);
        dt_optim_step(o, dt_model_params(m), dt_model_grads(m), 0.01f, 1.0f);
    }
    double dt = dt_now() - t0;
    double sps = steps * (double)batch / dt;
    if (json)
        printf("{\"impl\": \"dtrain\", \"model\": \"%s\", \"batch\": %d, \"threads\": %d, \"steps\": %d, "
               "\"precision\": \"%s\", \"samples_per_sec\": %.1f, \"ms_per_step\": %.3f}\n",
               model, batch, threads, steps, prec, sps, 1e3 * dt / steps);
    else
        printf("dtrain %s batch %d threads %d: %.0f samples/s (%.2f ms/step)\n", model, batch, threads, sps,
               1e3 * dt / steps);
    free(x);
    free(y);
    dt_optim_free(o);
    dt_model_free(m);
    return 0;
}
