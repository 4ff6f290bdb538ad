/*
 * tile.h — what the tiled drivers' files (flash*.c, the forward; flash_backward*.c, the backward)
 * share:
 * where a row of a tensor lives, whether a tile holds a NaN or an Inf, and the one statement
 * in f32 of how a score is formed from its scaled product. The backward recomputes the
 * forward's weights from its log-sum-exp, so both must form every score by the same
 * operations in the same order; keeping that rule here keeps them from drifting apart.
 */
#ifndef SDPA_TILE_H
#define SDPA_TILE_H

#include "../core/half.h"
#include "../core/problem.h"
#include "../kernels/ukernels.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline int64_t sdpa__round_up(int64_t x, int64_t m) {
    return (x + m - 1) / m * m;
}

/* Where element (b, h, l, 0) of t lives. */
static inline const void *sdpa__row_at(const sdpa_tensor *t, int64_t b, int64_t h, int64_t l) {
    return (const char *)t->data + sdpa__offset(t, b, h, l, 0) * (int64_t)sdpa_dtype_size(t->dtype);
}

/* Whether rows [0, n) of x (f32, row stride ld, d columns) hold a NaN or an Inf. Asked only of
 * tiles where some key is hidden, the only case where such a value could leak as 0 x NaN. */
static inline int sdpa__has_nonfinite(const float *x, int64_t n, int64_t ld, int64_t d) {
    uint32_t bad = 0;
    for (int64_t j = 0; j < n; j++)
        for (int64_t c = 0; c < d; c++) {
            uint32_t u;
            memcpy(&u, &x[j * ld + c], sizeof u);
            bad |= (u & 0x7f800000u) == 0x7f800000u;
        }
    return bad != 0;
}

/* Whether w is -0.0, the mark of a hidden weight (the softmax's and exp_lse's): all ones
 * if so, else 0. */
static inline uint32_t sdpa__hidden_mask(float w) {
    uint32_t u;
    memcpy(&u, &w, sizeof u);
    return u == 0x80000000u ? 0xffffffffu : 0u;
}

/* After pv_careful, which adds nothing for any zero weight: a weight w that is 0 (either sign)
 * on a pair the row sees (prob, laid out like w, is not the -0.0 of a hidden pair) still
 * multiplies its operand in the reference, where 0 x Inf and 0 x NaN are NaN: that NaN is put
 * where it goes. pv's sum: o[r * ldo + c] gets w[j * wj + r * wr] x[j * ldx + c], j < nj,
 * r < nr. The forward passes its weights as both w and prob (a dropped or underflowed weight
 * is +0, a hidden one -0.0); the backward passes dS and P (softcap's derivative is 0 at a
 * score of +-inf, which an Inf in q or k gives). */
static inline void sdpa__nan_of_visible_zeros(int64_t nj, int64_t nr, int64_t d, const float *w,
                                              const float *prob, int64_t wj, int64_t wr,
                                              const float *x, int64_t ldx, float *o, int64_t ldo) {
    for (int64_t j = 0; j < nj; j++)
        for (int64_t r = 0; r < nr; r++) {
            if (w[j * wj + r * wr] != 0.0f || sdpa__hidden_mask(prob[j * wj + r * wr]))
                continue;
            for (int64_t c = 0; c < d; c++)
                if (!isfinite(x[j * ldx + c]))
                    o[r * ldo + c] = NAN;
        }
}

/* Joins an attention sink sigma (sdpa.h, Semantics) to a row whose softmax so far has
 * log-sum-exp *lse (-inf: no key; NaN: a NaN row, left as it is): *lse becomes
 * log(exp(*lse) + exp(sigma)), and the factor the row's output is multiplied by,
 * exp(old lse - new lse), is returned (0 for a row with no key, whose output stays 0). */
static inline double sdpa__add_sink(double sigma, double *lse) {
    if (sigma == -INFINITY || isnan(*lse))
        return 1.0;
    if (*lse == -INFINITY) {
        *lse = sigma;
        return 0.0;
    }
    const double top = *lse > sigma ? *lse : sigma;
    const double a = exp(*lse - top), sum = a + exp(sigma - top);
    *lse = top + log(sum);
    return a / sum;
}

/* Rows and keys of a tile per call of the table's bias: the mask rows of one call that cannot
 * be read in place are widened into a tile of this size on the stack (4 KiB). */
enum { SDPA__BIAS_ROWS = 16, SDPA__BIAS_KEYS = 64 };

/* The score of query i and key j of (batch b, query head h) from its scaled product
 * x = scale q_i . k_j, for a key the window rule lets the row see (sdpa.h, Semantics):
 *     s = softcap(x) + alibi_ij + mask_ij,
 * -inf where a bool mask or a -inf bias hides the key. softcap, c tanh(x / c), is the table's
 * entry (ukernels.h; with ds/dx for the backward); so are ALiBi's and the mask's terms (bias),
 * which this applies to a tile, in place over softcap(x):
 *     s = s - slope_h * (float)|alibi_step (j - i) - off - alibi_shift|
 *     s = (mask_ij == -inf ? -inf : s + mask_ij)
 * (a bool mask read as -inf and -0.0: s + -0.0 is s). Rows r < nr of the tile are query i[r]
 * of head h[r], keys [j0, j0 + nk), the scores s[r * rs + jj * js] (one of rs and js 1). Every
 * score of the tile takes the terms, also those of keys a row's window hides: the drivers hide
 * those afterwards (a hidden score is -inf whatever it was), so that a tile is one call of the
 * table's entry per 16 rows. The forward and the backward both form their scores here. */
static inline void sdpa__tile_bias(const sdpa__ukernels *uk, const sdpa__problem *p, int64_t b,
                                   const int64_t *h, const int64_t *i, int64_t nr, int64_t j0,
                                   int64_t nk, float *s, int64_t rs, int64_t js) {
    if (p->alibi == NULL && !p->has_mask)
        return;
    const sdpa_tensor *mk = &p->mask;
    const int64_t step = p->alibi_step > 1 ? p->alibi_step : 1;
    float slope[SDPA__BIAS_ROWS], wide[SDPA__BIAS_ROWS * SDPA__BIAS_KEYS];
    double pos[SDPA__BIAS_ROWS];
    const float *m[SDPA__BIAS_ROWS];
    for (int64_t ja = 0; ja < nk; ja += SDPA__BIAS_KEYS) {
        const int64_t n = nk - ja < SDPA__BIAS_KEYS ? nk - ja : SDPA__BIAS_KEYS, j = j0 + ja;
        for (int64_t ra = 0; ra < nr; ra += SDPA__BIAS_ROWS) {
            const int64_t nb = nr - ra < SDPA__BIAS_ROWS ? nr - ra : SDPA__BIAS_ROWS;
            for (int64_t r = 0; r < nb; r++) {
                const int64_t h_r = h[ra + r], i_r = i[ra + r];
                if (p->alibi != NULL) { /* the distance at key j; each key further adds step */
                    slope[r] = p->alibi[h_r];
                    pos[r] = (double)(step * (j - i_r) - p->off - p->alibi_shift);
                }
                if (!p->has_mask)
                    continue;
                const void *row = (const char *)mk->data + sdpa__offset(mk, b, h_r, i_r, j) *
                                                               (int64_t)sdpa_dtype_size(mk->dtype);
                float *w = wide + r * SDPA__BIAS_KEYS;
                m[r] = w;
                if (mk->dtype == SDPA_F32 && mk->stride[3] == 1)
                    m[r] = (const float *)row;
                else if (mk->dtype == SDPA_BOOL)
                    for (int64_t jj = 0; jj < n; jj++)
                        w[jj] = sdpa__load(row, SDPA_BOOL, jj * mk->stride[3]) != 0.0f ? -0.0f
                                                                                       : -INFINITY;
                else
                    uk->load_row((int)mk->dtype, n, row, mk->stride[3], w);
            }
            uk->bias(nb, n, p->alibi != NULL ? slope : NULL, pos, (double)step,
                     p->has_mask ? m : NULL, s + ra * rs + ja * js, rs, js);
        }
    }
}

#endif /* SDPA_TILE_H */
