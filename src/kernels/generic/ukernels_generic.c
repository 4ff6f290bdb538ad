/*
 * ukernels_generic.c — the flash micro-kernels in portable C (see ukernels.h for the
 * contract of each). Always built, always available: the fallback on CPUs without AVX2 and
 * the readable statement of what the SIMD versions must compute. expf is the C library's.
 */
#include "../ukernels.h"

#include "../../core/half.h"

#include <math.h>

void sdpa__pack_q_generic(int64_t nr, int64_t dk, const float *const *rows, float *qt,
                          int64_t ldq) {
    const int64_t npad = (nr + 7) / 8 * 8; /* a multiple of every table's lanes using this */
    for (int64_t d = 0; d < dk; d++) {
        float *qt_d = qt + d * ldq;
        for (int64_t r = 0; r < nr; r++)
            qt_d[r] = rows[r][d];
        for (int64_t r = nr; r < npad; r++)
            qt_d[r] = 0.0f;
    }
}

/* The dot products are accumulated in double: without FMA (portable C does not contract
 * a * b + c), a float sum of float products would be less accurate than an f32 baseline that
 * uses FMA, which is what the SIMD tables and the tests' baseline do. */
static void qk_generic(int64_t nk, int64_t nr, int64_t dk, const float *k, int64_t ldk,
                       const float *qt, int64_t ldq, float scale, float *s, int64_t lds) {
    enum { CHUNK = 64 };
    double acc[CHUNK];
    for (int64_t j = 0; j < nk; j++) {
        const float *k_j = k + j * ldk;
        for (int64_t r0 = 0; r0 < nr; r0 += CHUNK) {
            const int64_t n = nr - r0 < CHUNK ? nr - r0 : CHUNK;
            for (int64_t r = 0; r < n; r++)
                acc[r] = 0.0;
            for (int64_t d = 0; d < dk; d++) {
                const double kd = (double)k_j[d];
                const float *qt_d = qt + d * ldq + r0;
                for (int64_t r = 0; r < n; r++)
                    acc[r] += kd * (double)qt_d[r];
            }
            for (int64_t r = 0; r < n; r++)
                s[j * lds + r0 + r] = scale * (float)acc[r];
        }
    }
}

static int softmax_generic(int64_t nk, int64_t nr, float *s, int64_t lds, float *m, float *l,
                           float *alpha) {
    int hidden = 0;
    for (int64_t r = 0; r < nr; r++) {
        float mx = m[r];
        for (int64_t j = 0; j < nk; j++) {
            const float x = s[j * lds + r];
            mx = x > mx || isnan(x) ? x : mx; /* a NaN score makes the row NaN */
        }
        const float u = mx == -INFINITY ? 0.0f : mx;
        alpha[r] = expf(m[r] - u);
        float sum = 0.0f;
        for (int64_t j = 0; j < nk; j++) {
            float *x = &s[j * lds + r];
            hidden |= *x == -INFINITY;
            *x = *x == -INFINITY ? -0.0f : expf(*x - u);
            sum += *x;
        }
        l[r] = l[r] * alpha[r] + sum;
        m[r] = mx;
    }
    return hidden;
}

/* Skips the weights of hidden keys (-0.0), which costs the portable code little and makes it
 * also the careful P V the driver uses when a V tile holds NaN or Inf: a hidden key is never
 * multiplied, so its 0 x NaN cannot reach the output. The tile's sum is accumulated in double
 * and added to o once: without FMA (portable C does not contract a * b + c), a float sum
 * rounding each product and each addition would be less accurate than the f32 baseline. */
void sdpa__pv_generic(int64_t nk, int64_t nr, int64_t dv, const float *p, int64_t ldp,
                      const float *alpha, const float *v, int64_t ldv, float *o, int64_t ldo) {
    enum { CHUNK = 64 };
    double acc[CHUNK];
    for (int64_t r = 0; r < nr; r++) {
        float *o_r = o + r * ldo;
        for (int64_t c0 = 0; c0 < dv; c0 += CHUNK) {
            const int64_t n = dv - c0 < CHUNK ? dv - c0 : CHUNK;
            for (int64_t c = 0; c < n; c++)
                acc[c] = 0.0;
            for (int64_t j = 0; j < nk; j++) {
                const float pj = p[j * ldp + r];
                if (pj == 0.0f && signbit(pj))
                    continue;
                const float *v_j = v + j * ldv + c0;
                for (int64_t c = 0; c < n; c++)
                    acc[c] += (double)pj * (double)v_j[c];
            }
            for (int64_t c = 0; c < n; c++)
                o_r[c0 + c] = (float)((double)alpha[r] * (double)o_r[c0 + c] + acc[c]);
        }
    }
}

void sdpa__load_row_generic(int elem, int64_t n, const void *src, int64_t stride, float *dst) {
    const uint16_t *h = src;
    for (int64_t c = 0; c < n; c++) {
        if (elem == SDPA__ELEM_F16)
            dst[c] = sdpa__f16_to_f32(h[c * stride]);
        else if (elem == SDPA__ELEM_BF16)
            dst[c] = sdpa__bf16_to_f32(h[c * stride]);
        else
            dst[c] = ((const float *)src)[c * stride];
    }
}

void sdpa__store_row_generic(int elem, int64_t n, const float *src, float scale, void *dst,
                             int64_t stride) {
    uint16_t *h = dst;
    for (int64_t c = 0; c < n; c++) {
        const float x = src[c] * scale;
        if (elem == SDPA__ELEM_F16)
            h[c * stride] = sdpa__f64_to_f16((double)x);
        else if (elem == SDPA__ELEM_BF16)
            h[c * stride] = sdpa__f64_to_bf16((double)x);
        else
            ((float *)dst)[c * stride] = x;
    }
}

const sdpa__ukernels sdpa__uk_generic = {
    .name = "generic",
    .lanes = 8,
    .pack_q = sdpa__pack_q_generic,
    .qk = qk_generic,
    .qk_few = NULL,
    .softmax = softmax_generic,
    .pv = sdpa__pv_generic,
    .load_row = sdpa__load_row_generic,
    .store_row = sdpa__store_row_generic,
};
