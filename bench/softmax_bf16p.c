/*
 * softmax_bf16p.c -- the AVX-512 table's softmax_bf16p (the weights the AMX path rounds to
 * bf16 next) on its own: the worst relative error of its exp over a million random x in
 * [-104, 0] against exp in double, and its TSC cycles per key and 16 rows on ordinary scores,
 * on scores half of which are -1e9 (a finite mask value) and half -110 (below the floor at
 * -104, where the polynomial's lanes are masked off), so that a microcode assist on those
 * lanes would show. The figures of docs/numerics.md and ukernels_avx512.c come from it.
 *
 *     cc -O2 -Iinclude bench/softmax_bf16p.c build/libsdpa.a -lm -lpthread -o /tmp/sb
 *     taskset -c 1 /tmp/sb
 *
 * x86 with AVX-512 only (it counts TSC cycles). Not a test: nothing is checked.
 */
#include "../src/kernels/ukernels.h"

#include "sdpa.h"

#include <math.h>
#include <stdio.h>
#include <x86intrin.h> /* __rdtsc */

int main(void) {
    sdpa_ctx *ctx;
    if (sdpa_ctx_create(NULL, &ctx) != SDPA_OK)
        return 1;
    const int isa = sdpa_ctx_isa(ctx);
    sdpa_ctx_destroy(ctx);
    if (isa != SDPA_ISA_AVX512 && isa != SDPA_ISA_AMX) {
        fprintf(stderr, "softmax_bf16p: the CPU lacks AVX-512\n");
        return 2;
    }
    const sdpa__ukernels *uk = &sdpa__uk_avx512;

    /* the exp: one key per row, m = 0, so that a weight is exp(x) 2^weight_exp2 */
    enum { N = 1 << 20 };
    static float s[N], x[N], m[N], l[N], a[N];
    uint64_t z = 88172645463325252u;
    for (int i = 0; i < N; i++) {
        z ^= z << 13;
        z ^= z >> 7;
        z ^= z << 17;
        x[i] = s[i] = i == 0 ? 0.0f : -104.0f * (float)((double)(z >> 11) * 0x1p-53);
        m[i] = 0.0f;
        l[i] = 0.0f;
    }
    uk->softmax_bf16p(1, N, s, N, 1.0f, m, l, a);
    double worst = 0.0, worst_x = 0.0, worst_ulp = 0.0;
    for (int i = 0; i < N; i++) {
        const double w = ldexp((double)s[i], -uk->weight_exp2), want = exp((double)x[i]);
        const double r = fabs(w / want - 1.0);
        const double u = fabs(w - want) / ldexp(1.0, ilogb(want) - 23);
        if (r > worst) {
            worst = r;
            worst_x = x[i];
        }
        worst_ulp = u > worst_ulp ? u : worst_ulp;
    }
    printf("exp over %d random x in [-104, 0]: worst %.3g relative (at x = %.4f), %.1f ulp; "
           "exp(0) = %.9g\n",
           N, worst, worst_x, worst_ulp, ldexp((double)s[0], -uk->weight_exp2));

    /* the speed: 64 keys of 256 rows, the fastest of 2000 calls */
    enum { NK = 64, NR = 256 };
    static const char *const kind[] = {"ordinary scores", "half of them -1e9", "half of them -110"};
    for (int k = 0; k < 3; k++) {
        uint64_t best = UINT64_MAX;
        for (int rep = 0; rep < 2000; rep++) {
            for (int e = 0; e < NK * NR; e++)
                s[e] = (e / NR) % 2 == 0 ? (float)((e * 7919) % 1000) / 100.0f
                       : k == 0          ? -(float)((e * 31) % 1000) / 100.0f
                       : k == 1          ? -1e9f
                                         : -110.0f;
            for (int r = 0; r < NR; r++) {
                m[r] = 0.0f;
                l[r] = 0.0f;
            }
            const uint64_t t0 = __rdtsc();
            uk->softmax_bf16p(NK, NR, s, NR, 1.0f, m, l, a);
            const uint64_t t = __rdtsc() - t0;
            best = t < best ? t : best;
        }
        printf("%-18s %.2f TSC cycles per key and 16 rows\n", kind[k],
               (double)best / (NK * NR / 16));
    }
    return 0;
}
