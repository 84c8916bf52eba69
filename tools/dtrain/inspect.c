/* dtrain inspect / dtrain export: look into checkpoints, take weights out. */
#include "cli.h"
#include "dtrain/dtrain.h"

#include <stdio.h>
#include <string.h>

static const char inspect_help[] =
    "usage: dtrain inspect FILE\n"
    "\n"
    "Prints what a checkpoint (RUN_DIR/checkpoints/step-N.safetensors, or a\n"
    "sharded step-N/ directory) or a weights file holds: the training state\n"
    "(step, epoch, position in the epoch, RNG, world size, optimizer, format\n"
    "version, config and its hash), every tensor with its dtype and shape, and\n"
    "whether the checksum holds. Text from the file is printed with control\n"
    "characters escaped (\\x1b). Exit status 1 when the file is damaged.\n";

static const char export_help[] =
    "usage: dtrain export CHECKPOINT -o WEIGHTS [--dtype fp32|bf16|fp16]\n"
    "\n"
    "Writes the weights of a checkpoint (a file, or a sharded step-N/\n"
    "directory) alone, without the optimizer state: the same safetensors file\n"
    "a run's model.safetensors is, for 'dtrain eval', 'dtrain sample', other\n"
    "tools, and 'dtrain convert' (GPT -> llm.c). The checkpoint is verified\n"
    "first; WEIGHTS is written atomically (on error nothing is left).\n"
    "\n"
    "  --dtype T  the weights' type: fp32 (default; checkpoints hold fp32 master\n"
    "             weights whatever the run's precision), or bf16 / fp16, rounded\n"
    "             to nearest even: inference weights in half the bytes, for other\n"
    "             tools (dtrain eval, sample and convert read fp32)\n";

int cmd_inspect(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        fputs(inspect_help, stdout);
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-') {
        cli_error("expected one FILE (see 'dtrain inspect --help')");
        return EXIT_USAGE;
    }
    if (dt_ckpt_inspect(argv[1], stdout) != DT_OK) {
        cli_error("%s", dt_last_error());
        return EXIT_RUNTIME;
    }
    return 0;
}

int cmd_export(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    dt_dtype type = DT_F32;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(export_help, stdout);
            return 0;
        } else if (!strcmp(argv[i], "-o")) {
            if (i + 1 >= argc) return cli_error("-o needs a file"), EXIT_USAGE;
            out = argv[++i];
        } else if (!strcmp(argv[i], "--dtype")) {
            const char *v = i + 1 < argc ? argv[++i] : "";
            if (!strcmp(v, "fp32")) type = DT_F32;
            else if (!strcmp(v, "bf16")) type = DT_BF16;
            else if (!strcmp(v, "fp16")) type = DT_F16;
            else return cli_error("--dtype needs fp32, bf16 or fp16, got '%s'", v), EXIT_USAGE;
        } else if (argv[i][0] == '-' || in) {
            return cli_error("unexpected argument '%s' (see 'dtrain export --help')", argv[i]), EXIT_USAGE;
        } else {
            in = argv[i];
        }
    }
    if (!in || !out) return cli_error("need CHECKPOINT and -o WEIGHTS (see 'dtrain export --help')"), EXIT_USAGE;
    if (dt_ckpt_export_weights_as(in, out, type) != DT_OK) return cli_error("%s", dt_last_error()), EXIT_RUNTIME;
    printf("%s -> %s\n", in, out);
    return 0;
}
