/* libFuzzer target: dt_config_parse on arbitrary bytes as INI text.
 *
 * The input is copied and NUL-terminated (an embedded NUL ends the text, as
 * it would for a C string). It is parsed twice: alone, and with --set
 * overrides. If the input holds a NUL byte, the bytes after the first one
 * are the override (so the fuzzer explores --set strings too); otherwise a
 * fixed valid override is used. A config that parses must be one the rest
 * of dtrain can use: layers, input, batch and ranges checked here. */
#include "dtrain/config.h"
#include "dtrain/gpt.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const dt_config *c) {
    if (c->gpt) {  // a GPT: sizes consistent, a context that fits, a bounded run
        dt_gpt_config g = dt_config_gpt(c);
        if (dt_gpt_config_check(&g, "fuzz") != DT_OK || c->nlayers != 0) abort();
        if (c->seq_len < 1 || c->seq_len > c->block_size || c->max_steps < 1 || !c->train_file[0]) abort();
        if (!memchr(c->train_file, 0, sizeof c->train_file) || !memchr(c->val_file, 0, sizeof c->val_file) ||
            !memchr(c->init_from, 0, sizeof c->init_from))
            abort();
    } else if (c->nlayers < 1 || c->nlayers > DT_MAX_LAYERS) abort();
    for (int i = 0; i < 3; i++)
        if (c->input[i] < 1) abort();
    if (c->batch < 1 || c->eval_batch < 1 || c->log_every < 1) abort();
    if (c->epochs < 0 || c->max_steps < 0 || (c->epochs == 0 && c->max_steps == 0)) abort();
    if (!(c->optim.lr > 0) || !(c->std > 0)) abort();
    if (!memchr(c->name, 0, sizeof c->name) || !memchr(c->data_dir, 0, sizeof c->data_dir) ||
        !memchr(c->preset, 0, sizeof c->preset) || !memchr(c->dataset, 0, sizeof c->dataset))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1 << 16)) return 0;  // configs are small; keep runs fast
    char *text = malloc(size + 2);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    text[size + 1] = 0;
    dt_config *c = malloc(sizeof *c);
    if (!c) {
        free(text);
        return 0;
    }
    if (dt_config_parse(c, text, "fuzz.ini", NULL, 0) == DT_OK) check(c);

    size_t tl = strlen(text);
    const char *ov[2] = {tl < size ? text + tl + 1 : "train.max_steps=5", "optim.lr=0.1"};
    if (dt_config_parse(c, text, "fuzz.ini", ov, 2) == DT_OK) check(c);
    free(c);
    free(text);
    return 0;
}
