/*
 * decode_kernels.c -- cycles per key of a decode step's three kernels (qk_few, the few-rows
 * softmax, P V), called straight from a kernel table on 64-key slices of a cache small enough
 * to stay in L2: the arithmetic alone, without the DRAM reads (x86 only: it counts TSC
 * cycles; the TSC rate is /proc/cpuinfo's "cpu MHz" on most Linux guests).
 *
 *     cc -O2 -Iinclude bench/decode_kernels.c build/libsdpa.a -lm -lpthread -o /tmp/dk
 *     /tmp/dk [keys 4096] [reps 1000] [f16|bf16|f32] [avx512|avx2] [rows 4]
 *
 * `rows` query rows (1 to 4: a GQA group of that many, Lq = 1), D = 128. The table's softmax_few
 * runs where the table has one, its softmax otherwise. Not a test: nothing is checked but that it
 * runs.
 */
#include "../src/core/half.h"
#include "../src/kernels/ukernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h> /* __rdtsc */

enum { D = 128, NR = 4, SLICE = 64 };

int main(int argc, char **argv) {
    const long nkeys = argc > 1 ? atol(argv[1]) : 4096, reps = argc > 2 ? atol(argv[2]) : 1000;
    const char *type = argc > 3 ? argv[3] : "f16";
    const int half = strcmp(type, "f32") != 0, bf16 = strcmp(type, "bf16") == 0;
    if (half && !bf16 && strcmp(type, "f16") != 0) {
        fprintf(stderr, "decode_kernels: the cache type is f16, bf16 or f32\n");
        return 2;
    }
    const int want_avx2 = argc > 4 && strcmp(argv[4], "avx2") == 0;
    const int nr = argc > 5 ? atoi(argv[5]) : NR;
    if (nr < 1 || nr > NR) {
        fprintf(stderr, "decode_kernels: rows must be 1 to %d\n", NR);
        return 2;
    }
    if (!want_avx2 && !__builtin_cpu_supports("avx512bw")) {
        fprintf(stderr, "decode_kernels: this CPU has no AVX-512; pass avx2\n");
        return 2;
    }
    const sdpa__ukernels *uk = want_avx2 ? &sdpa__uk_avx2 : &sdpa__uk_avx512;
    if (nkeys < SLICE || nkeys % SLICE != 0 || reps < 1) {
        fprintf(stderr, "decode_kernels: keys must be a positive multiple of %d\n", SLICE);
        return 2;
    }
    const size_t es = half ? 2 : 4, n = (size_t)nkeys * D;
    char *k = aligned_alloc(64, n * es), *v = aligned_alloc(64, n * es);
    float *q = aligned_alloc(64, NR * D * sizeof(float)), *o = calloc(NR * D, sizeof(float));
    float *s = aligned_alloc(64, SLICE * 16 * sizeof(float)), m[16], l[16], alpha[16];
    if (k == NULL || v == NULL || q == NULL || o == NULL || s == NULL)
        return 1;
    for (size_t i = 0; i < n; i++) { /* ordinary values in [-0.5, 0.5) */
        const float x = (float)((i * 7) % 101) * 0.01f - 0.5f;
        const float y = (float)((i * 5) % 103) * 0.01f - 0.5f;
        if (half) {
            const uint16_t hx = bf16 ? sdpa__f64_to_bf16(x) : sdpa__f64_to_f16(x);
            const uint16_t hy = bf16 ? sdpa__f64_to_bf16(y) : sdpa__f64_to_f16(y);
            memcpy(k + 2 * i, &hx, 2);
            memcpy(v + 2 * i, &hy, 2);
        } else {
            memcpy(k + 4 * i, &x, 4);
            memcpy(v + 4 * i, &y, 4);
        }
    }
    for (int i = 0; i < NR * D; i++)
        q[i] = 0.01f * (float)(i % 13);
    const float *rows[NR] = {q, q + D, q + 2 * D, q + 3 * D};
    for (int r = 0; r < 16; r++) {
        m[r] = -1e30f;
        l[r] = 0.0f;
    }
    const int elem = bf16 ? SDPA__ELEM_BF16 : half ? SDPA__ELEM_F16 : SDPA__ELEM_F32;
    double t_qk = 0, t_sm = 0, t_pv = 0;
    for (long r = 0; r < reps; r++)
        for (long j = 0; j < nkeys; j += SLICE) {
            const char *kj = k + (size_t)j * D * es, *vj = v + (size_t)j * D * es;
            /* the next slice's rows, which the kernels ask for ahead (the first at the end) */
            const size_t jn = j + SLICE < nkeys ? (size_t)(j + SLICE) : 0;
            const char *kn = k + jn * D * es, *vn = v + jn * D * es;
            const unsigned long long a = __rdtsc();
            if (half)
                uk->qk_few_half(elem, SLICE, nr, D, kj, D, kn, rows, 0.088f, s, 16);
            else
                uk->qk_few(SLICE, nr, D, (const float *)kj, D, (const float *)kn, rows, 0.088f, s,
                           16);
            const unsigned long long b = __rdtsc();
            if (uk->softmax_few != NULL)
                uk->softmax_few(SLICE, nr, s, 16, m, l, alpha);
            else
                uk->softmax(SLICE, uk->lanes, s, 16, m, l, alpha);
            const unsigned long long c = __rdtsc();
            uk->pv_few(elem, SLICE, nr, D, s, 16, alpha, vj, D, vn, o, D);
            const unsigned long long d = __rdtsc();
            t_qk += (double)(b - a);
            t_sm += (double)(c - b);
            t_pv += (double)(d - c);
        }
    const double per = (double)reps * (double)nkeys;
    printf("%s, %s cache, %ld keys, %d rows, D=%d: TSC cycles per key: qk %.1f, softmax %.1f, "
           "pv %.1f, all %.1f (o[0] %g)\n",
           uk->name, type, nkeys, nr, D, t_qk / per, t_sm / per, t_pv / per,
           (t_qk + t_sm + t_pv) / per, o[0]);
    return 0;
}
