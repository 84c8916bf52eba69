/* A stand-in for libcudnn with the version FAKE_VERSION (test_gpu: the
 * run-time loader's version check and its search of PyTorch's packages). */
#include <stddef.h>

size_t cudnnGetVersion(void);
size_t cudnnGetVersion(void) { return FAKE_VERSION; }
