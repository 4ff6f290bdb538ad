/*
 * bench_peak_avx512.c — the AVX-512 inner loops of the machine probe (bench.h). This file
 * alone is compiled with -mavx512f; bench_peak.c calls it only when the library's kernels run
 * at the AVX-512 level or above, so the CPU and the OS have it.
 *
 * The FMA loop keeps 16 independent chains in 16 zmm registers: a core with two 512-bit FMA
 * pipes and a 4-cycle latency needs 8 chains in flight to keep both pipes busy, and 16 leave
 * room for longer latencies. Each chain is acc = acc * m + c with m just below 1, so it
 * converges to c / (1 - m) = 1 and never reaches infinities or subnormals, which would slow
 * the pipes down on some CPUs.
 */
#include "bench.h"

#include <immintrin.h>

float bench_fma_avx512(int64_t iters, int64_t *flops_per_iter) {
    const __m512 m = _mm512_set1_ps(1.0f - 0x1p-20f);
    const __m512 c = _mm512_set1_ps(0x1p-20f);
    __m512 a0 = _mm512_set1_ps(0.10f), a1 = _mm512_set1_ps(0.15f);
    __m512 a2 = _mm512_set1_ps(0.20f), a3 = _mm512_set1_ps(0.25f);
    __m512 a4 = _mm512_set1_ps(0.30f), a5 = _mm512_set1_ps(0.35f);
    __m512 a6 = _mm512_set1_ps(0.40f), a7 = _mm512_set1_ps(0.45f);
    __m512 a8 = _mm512_set1_ps(0.50f), a9 = _mm512_set1_ps(0.55f);
    __m512 a10 = _mm512_set1_ps(0.60f), a11 = _mm512_set1_ps(0.65f);
    __m512 a12 = _mm512_set1_ps(0.70f), a13 = _mm512_set1_ps(0.75f);
    __m512 a14 = _mm512_set1_ps(0.80f), a15 = _mm512_set1_ps(0.85f);
    for (int64_t i = 0; i < iters; i++) {
        a0 = _mm512_fmadd_ps(a0, m, c);
        a1 = _mm512_fmadd_ps(a1, m, c);
        a2 = _mm512_fmadd_ps(a2, m, c);
        a3 = _mm512_fmadd_ps(a3, m, c);
        a4 = _mm512_fmadd_ps(a4, m, c);
        a5 = _mm512_fmadd_ps(a5, m, c);
        a6 = _mm512_fmadd_ps(a6, m, c);
        a7 = _mm512_fmadd_ps(a7, m, c);
        a8 = _mm512_fmadd_ps(a8, m, c);
        a9 = _mm512_fmadd_ps(a9, m, c);
        a10 = _mm512_fmadd_ps(a10, m, c);
        a11 = _mm512_fmadd_ps(a11, m, c);
        a12 = _mm512_fmadd_ps(a12, m, c);
        a13 = _mm512_fmadd_ps(a13, m, c);
        a14 = _mm512_fmadd_ps(a14, m, c);
        a15 = _mm512_fmadd_ps(a15, m, c);
    }
    *flops_per_iter = 16 * 16 * 2; /* chains x lanes x (multiply + add) */
    a0 = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
    a4 = _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7));
    a8 = _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11));
    a12 = _mm512_add_ps(_mm512_add_ps(a12, a13), _mm512_add_ps(a14, a15));
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a4), _mm512_add_ps(a8, a12)));
}

/* Four accumulators so the adds do not serialise; the loads are the bottleneck. */
float bench_read_avx512(const float *p, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    __m512 s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += 64) {
        s0 = _mm512_add_ps(s0, _mm512_load_ps(p + i));
        s1 = _mm512_add_ps(s1, _mm512_load_ps(p + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_load_ps(p + i + 32));
        s3 = _mm512_add_ps(s3, _mm512_load_ps(p + i + 48));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}
