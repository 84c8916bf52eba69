/* libFuzzer target: dt_ckpt_read on arbitrary bytes (as a file), for a
 * fixed small model (tensors "0.weight" [3, 4] and "0.bias" [3], AdamW).
 *
 * Whatever the bytes, the read either fails and leaves the model's buffers
 * exactly as they were, or succeeds with a training state in range. */
#include "dtrain/ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NP 15

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("fuzz-checkpoint", 0);
    if (fd < 0) return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    dt_tensor_info t[2] = {{"0.weight", 2, {3, 4}, 0, 12}, {"0.bias", 1, {3}, 12, 3}};
    float p[NP], m1[NP], m2[NP], before[3 * NP];
    int64_t step = -7;
    for (int i = 0; i < NP; i++) p[i] = m1[i] = m2[i] = (float)i;
    memcpy(before, p, sizeof p);
    memcpy(before + NP, m1, sizeof m1);
    memcpy(before + 2 * NP, m2, sizeof m2);
    dt_ckpt_model m = {.tensors = t, .ntensors = 2, .params = p, .nparams = NP, .nstates = 2, .states = {m1, m2},
                       .opt_step = &step, .optimizer = "adamw", .config = ""};
    dt_train_state s;
    if (dt_ckpt_read(path, &m, &s) != DT_OK) {
        if (memcmp(before, p, sizeof p) || memcmp(before + NP, m1, sizeof m1) ||
            memcmp(before + 2 * NP, m2, sizeof m2) || step != -7)
            abort();  // a failed read touched the model
    } else if (s.step < 0 || s.epoch < 0 || s.epoch_batch < 0 || s.world < 1) {
        abort();
    }
    close(fd);
    return 0;
}
