/* Deterministic mode's fixed point, one definition for the CPU's loops
 * (engine/strategies/strategy.c: dt_fixed_add, dt_fixed_to_float) and the
 * GPU's kernels (gpu/optim.cu), as core/hd.h's rules are shared: a
 * gradient goes into an int64 sum as round(g x scale), clamped to +-4e18
 * so that a diverging run cannot overflow, and comes back as sum / 2^32.
 * Integer addition is associative, so such sums (and an int64 allreduce of
 * them) give the same bits in any order. */
#ifndef DT_CORE_FIXED_H
#define DT_CORE_FIXED_H

#include "core/hd.h"

#include <math.h>
#include <stdint.h>

#define DT_FIXED_SCALE 4294967296.0  // 2^32

DT_HD int64_t dt_fixed_of(float g, double scale) {
    double x = (double)g * scale;
    return (int64_t)llrint(x > 4e18 ? 4e18 : x < -4e18 ? -4e18 : x);
}

DT_HD float dt_fixed_value(int64_t acc) { return (float)((double)acc / DT_FIXED_SCALE); }

#endif
