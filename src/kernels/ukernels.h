/*
 * ukernels.h — the micro-kernel ABI: one table of function pointers per ISA
 * (src/kernels/<isa>/), called by the drivers in src/attn/. Only fixed-width types cross it,
 * so a kernel file sees nothing of the library but this header. Which CPU features a table
 * needs is said where it is registered (src/dispatch/dispatch.c).
 *
 * The tiled forward works on a tile of query rows against a tile of keys with the scores kept
 * TRANSPOSED, s[j * lds + r] for key j and query row r, so that the online softmax runs down
 * columns: every SIMD lane is one query row, and max, exp and sum need no horizontal
 * reductions. Query rows are padded to a multiple of `lanes`; keys are not padded. All
 * matrices are f32 with strides in elements (K and V strides may be 0 or negative: they can
 * point straight into the caller's tensors).
 *
 * The backward (src/attn/flash_backward.c) drives the same entries, some with their operands'
 * roles exchanged: qk given query rows where it takes keys, and keys packed where it takes
 * Q^T, gives the scores row-major (one key per lane); pv summing over query rows instead of
 * keys gives dK and dV. Nothing in an entry's contract depends on which is which.
 */
#ifndef SDPA_UKERNELS_H
#define SDPA_UKERNELS_H

#include <stdint.h>

/* Element types the widening and storing entries take; the values are those of sdpa_dtype. */
enum sdpa__elem { SDPA__ELEM_F32 = 0, SDPA__ELEM_F16 = 1, SDPA__ELEM_BF16 = 2 };

/* store_row's report of the values it stored from (bits). */
enum { SDPA__STORED_INF = 1, SDPA__STORED_NAN = 2 };

/* The most query rows qk_few takes. */
#define SDPA__FEW_ROWS 4

typedef struct sdpa__ukernels {
    const char *name;
    int lanes; /* query rows per vector; nr arguments below are multiples of it */
    /* softmax and softmax_few give their weights, and so their sums l, times 2^weight_exp2 (0
     * or more): a table whose exp would otherwise make subnormal weights scales them into the
     * normal range. Exact (a power of two), so O = acc / l is what it is unscaled; the
     * drivers take l * 2^-weight_exp2 for the LSE. */
    int weight_exp2;
    /* qt[d*ldq + r] = rows[r][d] for r < nr, d < dk, and 0 for nr <= r < round_up(nr, lanes):
     * the query rows of a task, transposed so that rows run along the vector lanes */
    void (*pack_q)(int64_t nr, int64_t dk, const float *const *rows, float *qt, int64_t ldq);
    /* s[j*lds + r] = scale * sum_d k[j*ldk + d] * qt[d*ldq + r]   for j < nk, r < nr
     * (the scale is applied to the finished dot product, as the reference does) */
    void (*qk)(int64_t nk, int64_t nr, int64_t dk, const float *k, int64_t ldk, const float *qt,
               int64_t ldq, float scale, float *s, int64_t lds);
    /* Optional (NULL: not offered), for a decode step's few query rows: the scores of nr <= 4
     * rows given row-major (q_rows[r][d]), as qk computes them, into lanes [0, nr) of one
     * vector of lanes per key; lanes [nr, lanes) are set to 0. Where qk would spend a whole
     * vector of FMAs per key and feature on 4 useful lanes, this runs along the features.
     * k_next: where the rows after these continue (the next slice's first row, with the same
     * stride ldk): a table may ask for rows there ahead of use; it never reads them, and a
     * prefetch never faults, so any address will do (k + nk * ldk for a contiguous cache, the
     * next page's row for a paged one). */
    void (*qk_few)(int64_t nk, int64_t nr, int64_t dk, const float *k, int64_t ldk,
                   const float *k_next, const float *const *q_rows, float scale, float *s,
                   int64_t lds);
    /* Optional (NULL: not offered), qk_few with the keys' rows stored as elem (SDPA__ELEM_F16
     * or SDPA__ELEM_BF16; unit feature stride, row stride ldk in elements), widened as they
     * are loaded, with no pass through a packed f32 tile. For f16, bitwise what qk_few gives
     * on those rows widened first by load_row. For bf16 a table may add a score's products
     * in an order of its own (AVX-512 and AVX2: two adjacent features in one lane, so that
     * 32 (16) elements of a key row are widened in two operations), as accurate as qk_few's
     * sum; fixed, so that a row's scores depend on nothing but its query row and the keys.
     * The driver takes it for every few-row slice of a half-precision K that it can read in
     * place (unit feature stride), even where a widened copy of K exists. */
    void (*qk_few_half)(int elem, int64_t nk, int64_t nr, int64_t dk, const void *k, int64_t ldk,
                        const void *k_next, const float *const *q_rows, float scale, float *s,
                        int64_t lds);
    /* Optional (NULL: not offered), pv for a decode step's nr <= SDPA__FEW_ROWS rows with V's
     * rows stored as elem (any enum sdpa__elem; unit feature stride, row stride ldv in
     * elements) and read in place, bitwise what pv gives on those rows widened first by
     * load_row; as it passes over rows [0, nk) it asks for the rows [0, nk) at v_next (the
     * next slice's, as qk_few's k_next), so the driver need not. */
    void (*pv_few)(int elem, int64_t nk, int64_t nr, int64_t dv, const float *p, int64_t ldp,
                   const float *alpha, const void *v, int64_t ldv, const void *v_next, float *o,
                   int64_t ldo);
    /* The online-softmax step for nk keys, for every row r < nr (E = 2^weight_exp2):
     *   m' = max(m[r], max_j s[j][r]);  u = (m' == -inf ? 0 : m')
     *   alpha[r] = exp(m[r] - u);  s[j][r] = (s == -inf ? -0.0f : exp(s - u) * E)
     *   l[r] = l[r] * alpha[r] + sum_j s[j][r];  m[r] = m'
     * -0.0 marks hidden keys (exp never returns it), so that a careful P.V can skip them.
     * @return nonzero if any score was -inf (some key is hidden from some row). */
    int (*softmax)(int64_t nk, int64_t nr, float *s, int64_t lds, float *m, float *l, float *alpha);
    /* Optional (NULL: not offered), softmax for a decode step's nr <= SDPA__FEW_ROWS rows, with
     * the keys packed SDPA__FEW_ROWS to a vector: only lanes [0, nr) of each key's scores and
     * of m, l and alpha are read or written. Scores, weights, m and alpha are bitwise
     * softmax's; l's sum over the keys may be formed in another (fixed) order. */
    int (*softmax_few)(int64_t nk, int64_t nr, float *s, int64_t lds, float *m, float *l,
                       float *alpha);
    /* Optional (NULL: not offered), softmax for weights that are rounded to bf16 next (a matrix
     * unit's P V), on the scores scale * s (scale finite and not 0; 1 where s holds the
     * scores): softmax's contract on the scores fl(scale * s), m, alpha and the -0.0 marks
     * bitwise softmax's on those in rows without a NaN score (but for the sign of a zero m),
     * and the weights (and so l) by a cheaper exp, within 2^-16 relative of exp(x) (a 128th
     * of the bf16 rounding that follows), where x = scale * s - u is rounded once unless a
     * scaled score of the row's vector is -inf or +inf (then x = fl(scale * s) - u, as
     * softmax forms it); +0 where x < -104. The matrix unit's qk then leaves its sums
     * unscaled (scale 1), and no pass scales them. */
    int (*softmax_bf16p)(int64_t nk, int64_t nr, float *s, int64_t lds, float scale, float *m,
                         float *l, float *alpha);
    /* The backward's weights, recomputed from the forward's log-sum-exp u (one per row): for
     * every j < nk and r < nr,
     *   s[j*lds + r] = (s == -inf ? -0.0f : exp(s - u[r]))
     * with softmax's exp (its accuracy down to e^-87, unscaled; below, the table's floor: e^-87
     * or +0, never a subnormal; a NaN stays NaN; never -0.0 itself), so that -0.0 marks hidden
     * keys as there. @return nonzero if any score was -inf. */
    int (*exp_lse)(int64_t nk, int64_t nr, float *s, int64_t lds, const float *u);
    /* exp_lse for a row-major tile, one subtrahend per row: for every r < nr and j < nk (nk a
     * multiple of lanes),
     *   s[r*lds + j] = (s == -inf ? -0.0f : exp(s - u[r*ldu]))
     * with exp_lse's exp, bitwise what exp_lse gives on the same (s, u) pairs. @return
     * nonzero if any score was -inf. */
    int (*exp_lse_rows)(int64_t nr, int64_t nk, float *s, int64_t lds, const float *u, int64_t ldu);
    /* The backward's dS, in place over dP~ = dO . v: for every r < nr and c < n (any n >= 0),
     * with e = r*ld + c and delta_rc = delta[c] when per_lane, else delta[r],
     *   x = dp[e], times z[e] when z is not NULL (dropout's factors)
     *   x = w[e] * (x - delta_rc), times dsdx[e] when dsdx is not NULL (softcap's derivative)
     *   dp[e] = (w[e] is -0.0, the weight of a hidden pair) ? -0.0f : x
     * so that a hidden key's NaN (dp may hold one) gets no further. Nothing else is read or
     * written: not the lanes from n up to a multiple of lanes. */
    void (*ds)(int64_t nr, int64_t n, float *dp, int64_t ld, const float *w, const float *z,
               const float *dsdx, const float *delta, int per_lane);
    /* Softcap, in place, for i < n (any n >= 0):
     *   t = tanh(x[i] / cap);  x[i] = cap * t;  dsdx[i] = (1 - t) * (1 + t) if dsdx not NULL
     * (the derivative, as the backward wants it: accurate where t is near +-1). x / cap is
     * rounded once; tanh is the table's own: cap * t within 3.5 ulp of cap tanh(x / cap)
     * (libm's tanhf reaches 3.1 by that measure; tests/test_flash.c samples it),
     * odd (-0.0 stays -0.0), +-1 at +-inf, NaN for NaN. The forward and the backward both
     * form scores with it, so that the backward's are bitwise the forward's. */
    void (*softcap)(int64_t n, float *x, float cap, float *dsdx);
    /* ALiBi's and the mask's terms of a tile's scores, in place, for r < nr and j < nk (any
     * nr, nk >= 0; one of rs and js is 1), with e = r*rs + j*js, in this order:
     *   x = s[e]
     *   x = x - slope[r] * (float)|pos[r] + step * j|    when slope is not NULL
     *   x = (m[r][j] == -inf ? -inf : x + m[r][j])       when m is not NULL
     *   s[e] = x
     * each product and sum rounded once to f32 (the operations of src/attn/tile.h). pos[r] and
     * step are integers held in doubles with |pos[r]| + step * nk < 2^53, so that the distance
     * is exact before its one rounding to f32. m[r] points at row r's additive mask values,
     * f32, contiguous (a bool mask comes as -inf and -0.0: x + -0.0 is x, whatever x is).
     * Every table gives the same bits; nothing outside the nr x nk scores is read or written.
     * The forward's transposed tiles (rs = 1) and the backward's row-major ones (js = 1) both
     * come here: a row's mask values run along the keys, so the transposed layout needs them
     * turned (written a score at a time down a column, they cost as much as the Q K^T). */
    void (*bias)(int64_t nr, int64_t nk, const float *slope, const double *pos, double step,
                 const float *const *m, float *s, int64_t rs, int64_t js);
    /* o[r*ldo + c] = alpha[r] * o[r*ldo + c] + sum_j p[j*ldp + r] * v[j*ldv + c]
     * for r < nr (not padded), c < dv. */
    void (*pv)(int64_t nk, int64_t nr, int64_t dv, const float *p, int64_t ldp, const float *alpha,
               const float *v, int64_t ldv, float *o, int64_t ldo);
    /* Optional (NULL: not offered), pv with the weights stored transposed, p[r*ldp + j] in
     * place of p[j*ldp + r], bitwise what pv gives on them transposed: the backward's
     * dQ += dS K straight from its row-major dS, with no transposing pass. */
    void (*pv_t)(int64_t nk, int64_t nr, int64_t dv, const float *p, int64_t ldp,
                 const float *alpha, const float *v, int64_t ldv, float *o, int64_t ldo);
    /* pv for a slice where the softmax hid some key and whose V holds a NaN or an Inf: a zero
     * weight (a hidden key's -0.0) adds nothing, whatever its v row holds, and every result
     * is otherwise bitwise what pv gives when those rows are finite (the same operations in
     * the same order): a hidden key has no effect at all, not even a rounding. */
    void (*pv_careful)(int64_t nk, int64_t nr, int64_t dv, const float *p, int64_t ldp,
                       const float *alpha, const float *v, int64_t ldv, float *o, int64_t ldo);
    /* Widening: dst[c] = src[c * stride] for c < n, where src holds elements of type elem
     * (enum sdpa__elem), exactly (every f16 and bf16 value is an f32). */
    void (*load_row)(int elem, int64_t n, const void *src, int64_t stride, float *dst);
    /* Storing: dst[c * stride] = src[c] * scale, the product formed in f32 and rounded once
     * to elem, to nearest with ties to even; where src[c] is a NaN, that NaN made quiet,
     * whatever the scale. @return what src[0, n) holds besides numbers: SDPA__STORED_INF if
     * an Inf (of either sign), | SDPA__STORED_NAN if a NaN, else 0 -- what the drivers look
     * for in an accumulator as they store it, in the same pass. */
    int (*store_row)(int elem, int64_t n, const float *src, float scale, void *dst, int64_t stride);
    /* Dropout's factors for keys [j0, j0 + n) of row (b, h, i) (core/philox.h), for n >= 0
     * and any j0 >= 0 (not only multiples of 4):
     *   z[jj] = draw(j) < threshold ? keep_scale : 0.0f   for jj < n, j = j0 + jj
     * where draw(j) is word j % 4 of Philox4x32-10 of the counter (j / 4, i, h, b), each word
     * taken mod 2^32, under key: bitwise the decisions of sdpa__dropout_draws4. threshold is
     * in [0, 2^32] as sdpa__dropout_threshold gives it (2^32 keeps every key, 0 none); a
     * dropped factor is +0. Vectorised along j, a vector of counters (four keys each) a step;
     * nothing is written outside z[0, n). */
    void (*dropout_row)(const uint32_t key[2], int64_t b, int64_t h, int64_t i, int64_t j0,
                        int64_t n, uint64_t threshold, float keep_scale, float *z);
} sdpa__ukernels;

/* The entries of a matrix unit (AMX): the tiled forward's scores and P V from half-precision
 * operands read as they are, where Q, K and V are all `elem` (sdpa__flash_mx_fits, flash.h).
 * They sum the products in the unit's own order, and P V rounds the weights to elem first, so
 * they are not bitwise the vector table's (docs/numerics.md). The driver keeps the vector
 * table for everything else (the softmax, the rules, the decode kernels). */
typedef struct sdpa__mx_kernels {
    const char *name;
    int elem;     /* the element type of Q, K and V (enum sdpa__elem) */
    int dk_step;  /* Dk must be a multiple of it */
    int dv_step;  /* Dv must be a multiple of it */
    int d_max;    /* the most features Dk and Dv may have */
    int keys_max; /* the most keys qk and pv take in one call */
    int lanes;    /* the rows of its blocks: the vector table's lanes must be the same */
    /* Q rows (elem values, unit feature stride: rows[r][d]) in the unit's layout for qk, rows
     * from nr up to a multiple of 16 zero; qt holds (dk / 2 + 1) * ldq 32-bit words. */
    void (*pack_q)(int64_t nr, int64_t dk, const void *const *rows, void *qt, int64_t ldq);
    /* s[j * lds + r] = scale * sum_d k[j * ldk + d] q[r][d] for j < nk <= keys_max and r < nr
     * (a multiple of 16), with the rows of Q packed by pack_q (row r0 at qt + r0 words, row
     * stride ldq) and K's rows (elem, unit feature stride) read in place, every value as it
     * is (a subnormal too). A key's values change no other key's scores. Rows of s from nk up
     * to a multiple of 16 are written too. */
    void (*qk)(int64_t nk, int64_t nr, int64_t dk, const void *k, int64_t ldk, const void *qt,
               int64_t ldq, float scale, float *s, int64_t lds);
    /* pv's o = alpha o + P V (its layouts) with P rounded to elem and V's rows (elem, unit
     * feature stride) read in place, every value as it is; a key whose weight is -0.0 (hidden)
     * changes no bit of o, whatever its V holds (NaN, Inf): pv_careful's guarantee. nk <=
     * keys_max. A weight below 2^-126 (an f32 subnormal) may count as 0: the driver takes the
     * unit only with a vector table whose softmax scales its weights out of that range
     * (weight_exp2 > 0). alpha NULL: o = P V, the rows' old values never read (the driver's
     * first slice over every row of a task, so that the accumulator needs no zeroing). */
    void (*pv)(int64_t nk, int64_t nr, int64_t dv, const float *p, int64_t ldp, const float *alpha,
               const void *v, int64_t ldv, float *o, int64_t ldo);
} sdpa__mx_kernels;

/* The AMX-BF16 entries (src/kernels/amx/), built where the compiler targets AMX (or with
 * SDPA_AMX_EMULATE, the tile instructions emulated in C). */
extern const sdpa__mx_kernels sdpa__mx_amx;

/* The portable table, always built. */
extern const sdpa__ukernels sdpa__uk_generic;
/* Portable entries that the tables share where they have nothing faster: the scalar Q pack,
 * the scalar widening and storing, and dropout's factors drawn a Philox call at a time
 * (dropout_generic.c). */
void sdpa__pack_q_generic(int64_t nr, int64_t dk, const float *const *rows, float *qt, int64_t ldq);
void sdpa__load_row_generic(int elem, int64_t n, const void *src, int64_t stride, float *dst);
int sdpa__store_row_generic(int elem, int64_t n, const float *src, float scale, void *dst,
                            int64_t stride);
void sdpa__dropout_row_generic(const uint32_t key[2], int64_t b, int64_t h, int64_t i, int64_t j0,
                               int64_t n, uint64_t threshold, float keep_scale, float *z);

/* The x86 tables, built where the compiler targets x86, and their vectorised widening and
 * storing (convert_<isa>.c: bitwise the portable entries' results). */
extern const sdpa__ukernels sdpa__uk_avx2;
extern const sdpa__ukernels sdpa__uk_avx512;
void sdpa__load_row_avx2(int elem, int64_t n, const void *src, int64_t stride, float *dst);
int sdpa__store_row_avx2(int elem, int64_t n, const float *src, float scale, void *dst,
                         int64_t stride);
void sdpa__load_row_avx512(int elem, int64_t n, const void *src, int64_t stride, float *dst);
int sdpa__store_row_avx512(int elem, int64_t n, const float *src, float scale, void *dst,
                           int64_t stride);
/* The x86 tables' entries for a decode step's few rows (decode_<isa>.c). */
void sdpa__qk_few_avx2(int64_t nk, int64_t nr, int64_t dk, const float *k, int64_t ldk,
                       const float *k_next, const float *const *q_rows, float scale, float *s,
                       int64_t lds);
void sdpa__qk_few_half_avx2(int elem, int64_t nk, int64_t nr, int64_t dk, const void *k,
                            int64_t ldk, const void *k_next, const float *const *q_rows,
                            float scale, float *s, int64_t lds);
int sdpa__softmax_few_avx2(int64_t nk, int64_t nr, float *s, int64_t lds, float *m, float *l,
                           float *alpha);
void sdpa__qk_few_avx512(int64_t nk, int64_t nr, int64_t dk, const float *k, int64_t ldk,
                         const float *k_next, const float *const *q_rows, float scale, float *s,
                         int64_t lds);
void sdpa__qk_few_half_avx512(int elem, int64_t nk, int64_t nr, int64_t dk, const void *k,
                              int64_t ldk, const void *k_next, const float *const *q_rows,
                              float scale, float *s, int64_t lds);
int sdpa__softmax_few_avx512(int64_t nk, int64_t nr, float *s, int64_t lds, float *m, float *l,
                             float *alpha);
/* bias of the x86 tables (bias_<isa>.c): a vector of rows or of keys a step. */
void sdpa__bias_avx2(int64_t nr, int64_t nk, const float *slope, const double *pos, double step,
                     const float *const *m, float *s, int64_t rs, int64_t js);
void sdpa__bias_avx512(int64_t nr, int64_t nk, const float *slope, const double *pos, double step,
                       const float *const *m, float *s, int64_t rs, int64_t js);
/* dropout_row of the x86 tables (dropout_<isa>.c): 8 (AVX2) or 16 (AVX-512) Philox counters,
 * 32 or 64 keys, a step. */
void sdpa__dropout_row_avx2(const uint32_t key[2], int64_t b, int64_t h, int64_t i, int64_t j0,
                            int64_t n, uint64_t threshold, float keep_scale, float *z);
void sdpa__dropout_row_avx512(const uint32_t key[2], int64_t b, int64_t h, int64_t i, int64_t j0,
                              int64_t n, uint64_t threshold, float keep_scale, float *z);

#endif /* SDPA_UKERNELS_H */
