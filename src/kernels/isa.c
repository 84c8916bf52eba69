/* oneDNN's instruction set, capped by DTRAIN_ISA (dt_cpu_get): oneDNN
 * chooses its kernels at run time from what the CPU has, and takes a lower
 * ceiling only before its first primitive, so every entry into oneDNN here
 * calls dt_kernels_init() first. */
#include "kernels/kernels.h"

#include "dtrain/core.h"

#ifndef DTRAIN_HAVE_ONEDNN
void dt_kernels_init(void) {}
const char *dt_kernels_isa(void) { return "none (built without oneDNN)"; }
#else
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <pthread.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void cap(void) {
    const dt_cpu *c = dt_cpu_get();
    if (c->isa == c->found) return;
    static const dnnl_cpu_isa_t to[] = {
        [DT_ISA_BASE] = dnnl_cpu_isa_sse41,
        [DT_ISA_AVX2] = dnnl_cpu_isa_avx2,
        [DT_ISA_AVX512] = dnnl_cpu_isa_avx512_core,
        [DT_ISA_AVX512_BF16] = dnnl_cpu_isa_avx512_core_bf16,
        [DT_ISA_AMX] = dnnl_cpu_isa_avx512_core_amx,
    };
    dnnl_set_max_cpu_isa(to[c->isa]);
}

void dt_kernels_init(void) { pthread_once(&once, cap); }

const char *dt_kernels_isa(void) {
    dt_kernels_init();
    return dnnl_cpu_isa2str(dnnl_get_effective_cpu_isa());
}
#endif
