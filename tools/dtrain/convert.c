/* dtrain convert: GPT weights between llm.c checkpoints and safetensors. */
#include "cli.h"
#include "dtrain/dtrain.h"

#include <stdio.h>
#include <string.h>

static const char help[] =
    "usage: dtrain convert --from FORMAT IN --to OUT\n"
    "\n"
    "Converts GPT-2 weights between llm.c's checkpoint (FORMAT llmc: the\n"
    "gpt2_124M.bin that llm.c's scripts write and its trainer reads) and\n"
    "dtrain's safetensors (FORMAT safetensors: the model.safetensors of a GPT\n"
    "run). OUT gets the other format. The parameters are copied bit for bit,\n"
    "so llmc -> safetensors -> llmc reproduces the original file byte for byte.\n"
    "\n"
    "examples:\n"
    "  dtrain convert --from llmc gpt2_124M.bin --to gpt2.safetensors\n"
    "  dtrain convert --from safetensors runs/x/model.safetensors --to model.bin\n";

int cmd_convert(int argc, char **argv) {
    const char *from, *in, *out;
    int rc = cli_from_to(argc, argv, help, "IN", "OUT", &from, &in, &out);
    if (rc >= 0) return rc;
    int to_llmc;
    if (!strcmp(from, "llmc")) to_llmc = 0;
    else if (!strcmp(from, "safetensors")) to_llmc = 1;
    else return cli_error("--from '%s': expected llmc or safetensors", from), EXIT_USAGE;

    // The reader tells the two formats apart by content; check that IN is
    // what the user said, so that a mix-up is reported, not converted.
    FILE *f = dt_fopen_read(in);
    unsigned char h[4] = {0};
    if (f) {
        if (fread(h, 1, 4, f) != 4) h[0] = h[1] = h[2] = h[3] = 0;
        fclose(f);
    }
    int is_llmc = (h[0] | h[1] << 8 | h[2] << 16 | (unsigned)h[3] << 24) == DT_LLMC_MAGIC;
    if (f && is_llmc != !to_llmc)
        return cli_error("%s: this %s an llm.c checkpoint, but --from says %s", in, is_llmc ? "is" : "is not", from),
               EXIT_RUNTIME;

    dt_gpt_config c;
    if (dt_gpt_weights_convert(in, out, to_llmc, &c) != DT_OK) return cli_error("%s", dt_last_error()), EXIT_RUNTIME;
    printf("%s -> %s (%s): L%d H%d C%d block_size %d vocab %d (padded %d), %zu parameters\n", in, out,
           to_llmc ? "llmc" : "safetensors", c.n_layer, c.n_head, c.n_embd, c.block_size, c.vocab_size,
           c.padded_vocab_size, dt_gpt_config_num_params(&c));
    return 0;
}
