/* Training from C with libdtrain: load a config, override fields, train,
 * read the result.
 *
 *   cc train_fashion.c $(pkg-config --cflags --libs dtrain) -o train_fashion
 *   ./train_fashion configs/fashion-mlp.ini train.epochs=1
 */
#include <dtrain/dtrain.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CONFIG [SECTION.KEY=VALUE]...\n", argv[0]);
        return 2;
    }
    dt_config c;
    if (dt_config_load(&c, argv[1], (const char *const *)argv + 2, argc - 2) != DT_OK) {
        fprintf(stderr, "%s\n", dt_last_error());
        return 1;
    }
    dt_train_result r;
    if (dt_train(&c, NULL, NULL, NULL, &r) != DT_OK) {  // NULL run dir: write no files
        fprintf(stderr, "%s\n", dt_last_error());
        return 1;
    }
    printf("steps %lld, test accuracy %.4f\n", (long long)r.steps, r.test_accuracy);
    return 0;
}
