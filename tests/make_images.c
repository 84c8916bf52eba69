/* make_images DIR: the small synthetic image set of the C tests
 * (tl_make_images: 243 training, 100 test samples), for script tests. */
#include "testlib.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: make_images DIR\n");
        return 2;
    }
    tl_make_images(argv[1], "train", 243, 1);
    tl_make_images(argv[1], "t10k", 100, 2);
    return 0;
}
