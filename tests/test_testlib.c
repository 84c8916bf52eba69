/* The comparisons the other tests rest on (testlib.c): tl_weights_diff
 * and tl_rel / tl_max_rel. A NaN or an infinity in the weights fails every
 * tolerance the tests use (d >= 0 && d <= tol, d > x) and is never
 * bitwise equal, not even to the same bytes; equal files are bitwise 0,
 * a known difference is measured as documented, and files that differ in
 * names or shapes give -1. */
#include "dtrain/ckpt.h"
#include "testlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static char g_tmp[256];

// Writes DIR/name: tensors "w" (n floats from v) and "b" (2 floats).
static const char *weights(const char *name, const float *v, int n) {
    static const float b[2] = {0.5f, -0.25f};
    dt_st_tensor t[2] = {{"w", DT_F32, 1, {n}, v, sizeof(float) * (size_t)n}, {"b", DT_F32, 1, {2}, b, sizeof b}};
    const char *p = tl_path(g_tmp, name);
    CHECK(dt_st_write(p, t, 2, NULL, 0) == DT_OK, "write %s: %s", name, dt_last_error());
    return p;
}

// Whether a difference d passes each form of comparison the tests make.
static int passes_any(double d) { return (d >= 0 && d <= 1.0) || d > 1e-9 || d == 0; }

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/dtrain-test-testlib-XXXXXX");
    if (!mkdtemp(g_tmp)) return perror("mkdtemp"), 1;
    float v[4] = {1, -2, 3, 4}, u[4] = {1, -2, 3, 4.004f};
    char a[600], same[600], near[600];
    snprintf(a, sizeof a, "%s", weights("a.safetensors", v, 4));
    snprintf(same, sizeof same, "%s", weights("same.safetensors", v, 4));
    snprintf(near, sizeof near, "%s", weights("near.safetensors", u, 4));
    int bw = -1;
    double d = tl_weights_diff(a, same, &bw);
    CHECK(d == 0 && bw == 1, "equal files: diff %.3g, bitwise %d", d, bw);
    d = tl_weights_diff(a, near, &bw);
    CHECK(bw == 0 && fabs(d - (4.004f - 4.0) / 4.0) < 1e-9, "4 vs 4.004 with max |w| 4: diff %.9g (0.001)", d);

    // NaN and infinities, on either side, and on both with the same bytes.
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++) {
        float x[4];
        memcpy(x, v, sizeof x);
        x[2] = bad[k];
        char p[600], q[600];
        snprintf(p, sizeof p, "%s", weights("bad.safetensors", x, 4));
        snprintf(q, sizeof q, "%s", weights("bad2.safetensors", x, 4));
        const char *pairs[3][2] = {{a, p}, {p, a}, {p, q}};
        for (int j = 0; j < 3; j++) {
            bw = -1;
            d = tl_weights_diff(pairs[j][0], pairs[j][1], &bw);
            CHECK(!passes_any(d) && bw == 0, "a weight %g (%s): diff %g, bitwise %d: must fail every comparison",
                  (double)bad[k], j == 0 ? "second file" : j == 1 ? "first file" : "both, the same bytes", d, bw);
        }
    }
    // A NaN difference of finite weights cannot happen; one of huge ones
    // is finite and measured.
    float big[4] = {3e38f, -3e38f, 3, 4}, big2[4] = {-3e38f, 3e38f, 3, 4};
    char p[600];
    snprintf(p, sizeof p, "%s", weights("big.safetensors", big, 4));
    d = tl_weights_diff(p, weights("big2.safetensors", big2, 4), &bw);
    CHECK(bw == 0 && fabs(d - 2) < 1e-9, "3e38 vs -3e38: diff %g (2), not lost to overflow", d);
    // Names or shapes that differ.
    d = tl_weights_diff(a, weights("short.safetensors", v, 3), &bw);
    CHECK(d == -1, "another shape: %g (-1)", d);

    // tl_rel and tl_max_rel.
    CHECK(tl_rel(1, 1.5, 1e-6) == 0.5 / 1.5, "tl_rel(1, 1.5) = 1/3: %g", tl_rel(1, 1.5, 1e-6));
    CHECK(!(tl_rel(NAN, 1, 1e-6) <= 1e9) && !(tl_rel(1, NAN, 1e-6) <= 1e9) && !(tl_rel(NAN, NAN, 1e-6) <= 1e9),
          "tl_rel with a NaN fails any tolerance");
    CHECK(!(tl_rel(INFINITY, 1, 1e-6) <= 1e9) && !(tl_rel(INFINITY, -INFINITY, 1e-6) <= 1e9) &&
              tl_rel(-INFINITY, -INFINITY, 1e-6) == 0,
          "tl_rel: an infinity against anything else fails, against itself agrees");
    float r1[3] = {1, 2, 3}, r2[3] = {1, NAN, 3}, r3[3] = {1, INFINITY, 3};
    CHECK(!(tl_max_rel(r1, r2, 3, 1e-6) <= 1e9) && !(tl_max_rel(r2, r1, 3, 1e-6) <= 1e9),
          "tl_max_rel: one NaN element fails any tolerance (%g)", tl_max_rel(r1, r2, 3, 1e-6));
    CHECK(!(tl_max_rel(r1, r3, 3, 1e-6) <= 1e9), "tl_max_rel: one infinite element fails any tolerance (%g)",
          tl_max_rel(r1, r3, 3, 1e-6));
    printf("tl_weights_diff: NaN and infinities on either side fail every comparison; tl_rel, tl_max_rel too\n");
    tl_cleanup(g_tmp);
    return tl_finish();
}
