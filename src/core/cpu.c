/* What the CPU can do, from cpuid and the OS's saved-state mask (xgetbv):
 * an instruction set counts only when the kernel saves its registers too
 * (AMX's tile data also needs a per-process permission, which oneDNN asks
 * for itself). */
#include "dtrain/core.h"

#include <cpuid.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[] = {"base", "avx2", "avx512", "avx512_bf16", "amx"};

const char *dt_isa_name(dt_isa isa) {
    return (unsigned)isa < sizeof names / sizeof *names ? names[isa] : "?";
}

static dt_cpu cpu;
static int cap_bad;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

static dt_isa probe(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return DT_ISA_BASE;
    int fma = c >> 12 & 1, osxsave = c >> 27 & 1;
    if (!osxsave) return DT_ISA_BASE;
    uint64_t xcr0 = xgetbv0();
    if ((xcr0 & 6) != 6) return DT_ISA_BASE; // SSE and AVX state
    if (__get_cpuid_max(0, NULL) < 7) return DT_ISA_BASE;
    unsigned b7, c7, d7, a71 = 0, x;
    __cpuid_count(7, 0, a, b7, c7, d7);
    __cpuid_count(7, 1, a71, x, x, x);
    if (!(b7 >> 5 & 1) || !fma) return DT_ISA_BASE;
    // F, DQ, BW, VL, and the opmask/ZMM state
    const unsigned v4 = 1u << 16 | 1u << 17 | 1u << 30 | 1u << 31;
    if ((b7 & v4) != v4 || (xcr0 & 0xe0) != 0xe0) return DT_ISA_AVX2;
    if (!(a71 >> 5 & 1)) return DT_ISA_AVX512;
    // AMX-BF16 and AMX-TILE, and the tile config/data state
    if ((d7 >> 22 & 1) && (d7 >> 24 & 1) && (xcr0 & 0x60000) == 0x60000) return DT_ISA_AMX;
    return DT_ISA_AVX512_BF16;
}

static void detect(void) {
    unsigned r[12] = {0}, a = 0, b = 0, c = 0, d = 0;
    __get_cpuid(0, &a, &b, &c, &d);
    memcpy(cpu.vendor, &b, 4), memcpy(cpu.vendor + 4, &d, 4), memcpy(cpu.vendor + 8, &c, 4);
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        int fam = a >> 8 & 15, mod = a >> 4 & 15;
        if (fam == 15) fam += a >> 20 & 255;
        if (fam >= 6) mod |= (a >> 16 & 15) << 4;
        cpu.family = fam, cpu.model = mod;
    }
    if ((unsigned)__get_cpuid_max(0x80000000, NULL) >= 0x80000004u) {
        for (unsigned i = 0; i < 3; i++) __get_cpuid(0x80000002 + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
        char brand[49] = {0};
        memcpy(brand, r, 48);
        const char *p = brand;
        while (*p == ' ') p++;
        snprintf(cpu.name, sizeof cpu.name, "%s", p);
        for (size_t n = strlen(cpu.name); n && cpu.name[n - 1] == ' '; n--) cpu.name[n - 1] = 0;
    }
    if (!cpu.name[0]) snprintf(cpu.name, sizeof cpu.name, "%s", cpu.vendor);
    cpu.found = cpu.isa = probe();
    const char *cap = getenv("DTRAIN_ISA");
    if (cap && *cap) {
        size_t i = 0;
        while (i < sizeof names / sizeof *names && strcmp(cap, names[i])) i++;
        if (i == sizeof names / sizeof *names) cap_bad = 1;
        else if ((dt_isa)i < cpu.isa) cpu.isa = (dt_isa)i;
    }
}

const dt_cpu *dt_cpu_get(void) {
    pthread_once(&once, detect);
    return &cpu;
}

dt_status dt_cpu_detect(const dt_cpu **out) {
    *out = dt_cpu_get();
    if (cap_bad)
        return dt_error(DT_ERR_ARG, "DTRAIN_ISA=%s: expected one of base, avx2, avx512, avx512_bf16, amx",
                        getenv("DTRAIN_ISA"));
    return DT_OK;
}
