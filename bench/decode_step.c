/*
 * decode_step.c -- a decode step's calls to sdpa_forward in a loop, for counting instructions
 * (valgrind --tool=callgrind, whose guest CPU has no AVX-512, so the AVX2 table runs): Lq = 1,
 * Hq = 32, Hkv = 8, D = 128, f32 Q/O, an f16 K/V cache of Lk keys, 1 thread. callgrind_annotate
 * then shows what the step spends outside the kernels (flash_task, the merge, pack_q).
 *
 *     cc -O2 -Iinclude bench/decode_step.c build/libsdpa.a -lm -lpthread -o /tmp/ds
 *     valgrind --tool=callgrind --callgrind-out-file=/tmp/ds.out /tmp/ds [Lk 1024] [calls 20]
 *     callgrind_annotate /tmp/ds.out | head -20
 *
 * Not a test: nothing is checked but that the calls succeed.
 */
#include "sdpa.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    const int64_t lk = argc > 1 ? atol(argv[1]) : 1024, calls = argc > 2 ? atol(argv[2]) : 20;
    const int64_t hq = 32, hkv = 8, d = 128;
    if (lk < 1 || calls < 1) {
        fprintf(stderr, "decode_step: Lk and calls must be positive\n");
        return 2;
    }
    float *q = malloc((size_t)(hq * d) * sizeof(float)), *o = malloc((size_t)(hq * d) * 4);
    uint16_t *k = malloc((size_t)(hkv * lk * d) * 2), *v = malloc((size_t)(hkv * lk * d) * 2);
    if (q == NULL || o == NULL || k == NULL || v == NULL)
        return 1;
    for (int64_t i = 0; i < hq * d; i++)
        q[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    for (int64_t i = 0; i < hkv * lk * d; i++) { /* f16 values in [0.5, 1) and [0.25, 0.5) */
        k[i] = (uint16_t)(0x3800 + i * 7 % 500);
        v[i] = (uint16_t)(0x3400 + i * 11 % 700);
    }
    const sdpa_tensor tq = {q, SDPA_F32, {1, hq, 1, d}, {hq * d, d, d, 1}};
    const sdpa_tensor tk = {k, SDPA_F16, {1, hkv, lk, d}, {hkv * lk * d, lk * d, d, 1}};
    const sdpa_tensor tv = {v, SDPA_F16, {1, hkv, lk, d}, {hkv * lk * d, lk * d, d, 1}};
    sdpa_tensor to = {o, SDPA_F32, {1, hq, 1, d}, {hq * d, d, d, 1}};
    sdpa_ctx_params cp = {0};
    cp.n_threads = 1;
    sdpa_ctx *ctx = NULL;
    if (sdpa_ctx_create(&cp, &ctx) != SDPA_OK)
        return 1;
    const sdpa_params p = {0};
    for (int64_t r = 0; r < calls; r++)
        if (sdpa_forward(ctx, &tq, &tk, &tv, &p, &to, NULL) != SDPA_OK) {
            fprintf(stderr, "decode_step: %s\n", sdpa_ctx_last_error(ctx));
            return 1;
        }
    printf("o[5] = %g\n", o[5]);
    sdpa_ctx_destroy(ctx);
    free(q);
    free(o);
    free(k);
    free(v);
    return 0;
}
