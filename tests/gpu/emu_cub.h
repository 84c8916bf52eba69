/* cub's radix sort of (key, value) pairs, for src/gpu/gpt.cu on the
 * emulator (cuda_emu.h): a stable sort by key on the host, as cub's radix
 * sort is stable; its room asked first (temp NULL), as cub's, and 0 bytes
 * of it refused. Keys compared whole (the callers sort all 32 bits). */
#ifndef DT_TESTS_EMU_CUB_H
#define DT_TESTS_EMU_CUB_H

#include <algorithm>
#include <driver_types.h>
#include <numeric>
#include <stddef.h>
#include <vector>

namespace cub {
struct DeviceRadixSort {
    template <typename K, typename V, typename S>
    static cudaError_t SortPairs(void *temp, size_t &bytes, const K *kin, K *kout, const V *vin, V *vout, int n,
                                 int begin_bit, int end_bit, S stream) {
        (void)begin_bit, (void)end_bit, (void)stream;
        if (!temp) return bytes = 256 + sizeof(K) * (size_t)n, cudaSuccess;
        if (bytes < 256 + sizeof(K) * (size_t)n) return cudaErrorInvalidValue;
        std::vector<int> at((size_t)n);
        std::iota(at.begin(), at.end(), 0);
        std::stable_sort(at.begin(), at.end(), [&](int a, int b) { return kin[a] < kin[b]; });
        for (int i = 0; i < n; i++) kout[i] = kin[at[i]], vout[i] = vin[at[i]];
        return cudaSuccess;
    }
};
}  // namespace cub

#endif
