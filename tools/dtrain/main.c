/* dtrain: entry point and subcommand dispatch. */
#include "cli.h"
#include "dtrain/dtrain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} commands[] = {
    {"train", cmd_train, "train a model described by a config file"},
    {"federate", cmd_federate, "federated averaging over simulated clients ([federated])"},
    {"eval", cmd_eval, "evaluate saved weights on the test set"},
    {"run", cmd_run, "start N local ranks of a program (dtrain run -n N -- PROG ARGS)"},
    {"prepare-text", cmd_prepare_text, "text files -> byte-level GPT token files"},
    {"convert", cmd_convert, "GPT weights between llm.c and safetensors"},
    {"convert-data", cmd_convert_data, "an IDX data set into one HDF5 file"},
    {"make-clicks", cmd_make_clicks, "a synthetic click log from a planted model (the recommender)"},
    {"sample", cmd_sample, "generate text with a trained GPT"},
    {"report", cmd_report, "an HTML report of a run directory (charts, per-rank times)"},
    {"inspect", cmd_inspect, "show a checkpoint's training state and tensors, verify it"},
    {"export", cmd_export, "a checkpoint's weights alone, for inference"},
    {"simulate", cmd_simulate, "predict step time and scaling on many hosts from a profiled run"},
    {"plan", cmd_plan, "the fastest layout that fits: ZeRO, tensor, pipeline, ... ranked"},
};
#define NCOMMANDS (int)(sizeof commands / sizeof commands[0])

static void usage(FILE *f) {
    fprintf(f,
            "usage: dtrain COMMAND [ARGS]...\n"
            "       dtrain --help | --version\n\n"
            "Distributed training of neural networks on CPUs.\n\n"
            "commands:\n");
    for (int i = 0; i < NCOMMANDS; i++) fprintf(f, "  %-13s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'dtrain COMMAND --help' describes a command. Exit status: 0 success,\n"
               "1 runtime error, 2 usage error.\n\n"
               "environment:\n"
               "  DTRAIN_LOG=error|warn|info|debug   how much goes to stderr (default info)\n"
               "  DTRAIN_ISA=base|avx2|avx512|avx512_bf16|amx\n"
               "                 the widest instruction set dtrain and oneDNN may choose at run\n"
               "                 time (default: all the CPU has; --version shows it)\n");
}

// OpenMP threads that spin while they wait for work take the core from
// whatever else runs there (another worker, the communication thread, the
// loader): on a 2-core machine a 2-thread run next to any other busy process
// slows down 3-4x. A passive wait policy (sleep at once) costs a few percent
// when the machine is otherwise idle. libgomp reads the policy when it loads,
// before main, so dtrain sets it and starts itself again, once, unless the
// user chose a policy.
static void use_passive_wait(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);  // if this fails, go on as we are
}

int main(int argc, char **argv) {
    use_passive_wait(argv);
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        const dt_cpu *cpu = dt_cpu_get();
        printf("dtrain %s\ncpu: %s (%s family %d model %d), instruction set %s", dt_version(), cpu->name,
               cpu->vendor, cpu->family, cpu->model, dt_isa_name(cpu->found));
        if (cpu->isa != cpu->found) printf(", capped to %s by DTRAIN_ISA", dt_isa_name(cpu->isa));
        printf("\nbuilt with: %s\n", dt_build_features());
        char dev[4096];
        dt_device_report(dev, sizeof dev);
        printf("%s\n", dev);
        return 0;
    }
    const dt_cpu *cpu;
    if (dt_cpu_detect(&cpu) != DT_OK) {
        cli_error("%s", dt_last_error());
        return EXIT_USAGE;
    }
#ifdef __AVX2__
    if (cpu->found < DT_ISA_AVX2) {
        cli_error("this CPU (%s) has no AVX2 and FMA, which this build of dtrain needs; rebuild with "
                  "cmake -DDTRAIN_ARCH=x86-64", cpu->name);
        return EXIT_FAILURE;
    }
#endif
    for (int i = 0; i < NCOMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    cli_error("unknown command '%s' (see 'dtrain --help')", argv[1]);
    return EXIT_USAGE;
}
