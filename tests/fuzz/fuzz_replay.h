/* A main() for fuzz targets built without libFuzzer: runs
 * LLVMFuzzerTestOneInput over every file named on the command line (a
 * corpus replay), so that the targets build and run as ordinary tests with
 * any compiler. With -DDTRAIN_FUZZ=ON and clang, libFuzzer supplies main. */
#ifndef DT_FUZZ_REPLAY_H
#define DT_FUZZ_REPLAY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifdef DT_FUZZ_REPLAY
int main(int argc, char **argv) {
    int n = 0;
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            fprintf(stderr, "%s: cannot open\n", argv[i]);
            return 1;
        }
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        rewind(f);
        uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
        size_t got = fread(buf, 1, (size_t)len, f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, got);
        // Every prefix too: truncation is the commonest damage.
        for (size_t cut = 0; cut < got; cut += 1 + got / 64) LLVMFuzzerTestOneInput(buf, cut);
        free(buf);
        n++;
    }
    printf("replayed %d inputs\n", n);
    return 0;
}
#endif
#endif
