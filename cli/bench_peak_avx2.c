/*
 * bench_peak_avx2.c — the AVX2 + FMA inner loops of the machine probe (bench.h). This file
 * alone is compiled with -mavx2 -mfma; bench_peak.c calls it only when the library's kernels
 * run at the AVX2 level or above, so the CPU and the OS have both.
 *
 * 12 independent chains in 12 of the 16 ymm registers (two more hold the constants): enough
 * for two FMA pipes with a latency of up to 6 cycles. Each chain is acc = acc * m + c with m
 * just below 1, which converges to 1 and never produces infinities or subnormals.
 */
#include "bench.h"

#include <immintrin.h>

static float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

float bench_fma_avx2(int64_t iters, int64_t *flops_per_iter) {
    const __m256 m = _mm256_set1_ps(1.0f - 0x1p-20f);
    const __m256 c = _mm256_set1_ps(0x1p-20f);
    __m256 a0 = _mm256_set1_ps(0.10f), a1 = _mm256_set1_ps(0.15f);
    __m256 a2 = _mm256_set1_ps(0.20f), a3 = _mm256_set1_ps(0.25f);
    __m256 a4 = _mm256_set1_ps(0.30f), a5 = _mm256_set1_ps(0.35f);
    __m256 a6 = _mm256_set1_ps(0.40f), a7 = _mm256_set1_ps(0.45f);
    __m256 a8 = _mm256_set1_ps(0.50f), a9 = _mm256_set1_ps(0.55f);
    __m256 a10 = _mm256_set1_ps(0.60f), a11 = _mm256_set1_ps(0.65f);
    for (int64_t i = 0; i < iters; i++) {
        a0 = _mm256_fmadd_ps(a0, m, c);
        a1 = _mm256_fmadd_ps(a1, m, c);
        a2 = _mm256_fmadd_ps(a2, m, c);
        a3 = _mm256_fmadd_ps(a3, m, c);
        a4 = _mm256_fmadd_ps(a4, m, c);
        a5 = _mm256_fmadd_ps(a5, m, c);
        a6 = _mm256_fmadd_ps(a6, m, c);
        a7 = _mm256_fmadd_ps(a7, m, c);
        a8 = _mm256_fmadd_ps(a8, m, c);
        a9 = _mm256_fmadd_ps(a9, m, c);
        a10 = _mm256_fmadd_ps(a10, m, c);
        a11 = _mm256_fmadd_ps(a11, m, c);
    }
    *flops_per_iter = 12 * 8 * 2; /* chains x lanes x (multiply + add) */
    a0 = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    a4 = _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7));
    a8 = _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11));
    return hsum256(_mm256_add_ps(_mm256_add_ps(a0, a4), a8));
}

/* Four accumulators so the adds do not serialise; the loads are the bottleneck. */
float bench_read_avx2(const float *p, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    __m256 s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    for (size_t i = 0; i < n; i += 64) {
        s0 = _mm256_add_ps(s0, _mm256_add_ps(_mm256_load_ps(p + i), _mm256_load_ps(p + i + 8)));
        s1 = _mm256_add_ps(s1,
                           _mm256_add_ps(_mm256_load_ps(p + i + 16), _mm256_load_ps(p + i + 24)));
        s2 = _mm256_add_ps(s2,
                           _mm256_add_ps(_mm256_load_ps(p + i + 32), _mm256_load_ps(p + i + 40)));
        s3 = _mm256_add_ps(s3,
                           _mm256_add_ps(_mm256_load_ps(p + i + 48), _mm256_load_ps(p + i + 56)));
    }
    return hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}
