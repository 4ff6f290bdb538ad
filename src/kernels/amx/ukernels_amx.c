/*
 * ukernels_amx.c — the matrix-unit entries for AMX-BF16 (sdpa__mx_kernels, ukernels.h):
 * the scores and P V of the tiled forward by TDPBF16PS when Q, K and V are bf16. Compiled
 * with the AVX-512 and AMX flags for this file only, and called only after the dispatcher has
 * checked CPUID, XGETBV and Linux's permission for the tile data.
 *
 * Every tile is 16 rows of 64 bytes: 16 x 32 bf16 (A, and B in its pairs layout) or 16 x 16
 * f32 (C). TDPBF16PS(C, A, B) adds to C[m][n] the products A[m][2k+e] B[k][2n+e] (k < 16,
 * e < 2) of two bf16 values, each exact in f32, summed in f32 by the unit; it reads bf16
 * subnormals as 0 and flushes subnormal sums to 0. So the scores of a key or a query row that
 * holds a subnormal are formed again with f32 FMAs, and a subnormal, NaN or Inf of V goes to
 * the unit as 0 and has its products added in f32 after, for the rows that see its key only
 * (a hidden key's weight, -0.0, must never meet a NaN).
 *
 * - Scores, transposed as the vector tables leave them (s[j * lds + r]): C = K Q^T, with A the
 *   caller's K rows read in place (16 keys x 32 features a tile) and B the task's Q in pairs
 *   (pack_q: features 2p and 2p + 1 of row r side by side, row p of the tile). Tiles of 2 key
 *   blocks x 2 row blocks share their loads.
 * - P V: C = a zeroed 16 x 16 f32 tile, A = P^T rounded to bf16 (16 rows x 32 keys,
 *   transposed from the scores' layout through 16 x 16 transposes of key pairs), B = V's rows
 *   in pairs (keys 2p and 2p + 1 of column c side by side), packed once per call for all the
 *   row blocks; then o = alpha o + C by one FMA a value, so that the f32 accumulator never
 *   passes through a tile (the unit flushes subnormal sums, and its C input, to 0).
 *
 * Tile configuration is per thread: each call loads it and releases the tiles at its end, so
 * nothing of the tile state outlives a call (a worker that then sleeps has no tile data for
 * the kernel to save).
 *
 * SDPA_AMX_EMULATE (cmake -DSDPA_AMX_EMULATE=ON) builds the same code with the tile
 * instructions done in C (emulated TDPBF16PS: the pairs' products added one at a time, each
 * sum rounded to nearest, subnormals read and left as 0), so that the table's logic is tested
 * on CPUs without AMX. The hardware sums differently: on an Intel Xeon (model 207) the last
 * bit of 4 in 10 of its results differs from this emulation.
 */
#include "../avx512/transpose_avx512.h"
#include "../ukernels.h"
#include "tile_config.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

enum {
    TROWS = 16,     /* rows of every tile */
    TBYTES = 64,    /* bytes of every tile row */
    D_MAX = 256,    /* the most features (Dk, Dv) the entries take */
    KEYS_MAX = 128, /* the most keys a call takes */
    DK_STEP = 32,   /* Dk: a multiple of an A tile's bf16 columns */
    DV_STEP = 16    /* Dv: a multiple of a C tile's f32 columns */
};

#if defined(SDPA_AMX_EMULATE)

static _Thread_local unsigned char emu_tile[8][TROWS * TBYTES];

static void emu_load(int t, const void *base, int64_t stride) {
    for (int r = 0; r < TROWS; r++)
        memcpy(emu_tile[t] + r * TBYTES, (const char *)base + r * stride, TBYTES);
}

static void emu_store(int t, void *base, int64_t stride) {
    for (int r = 0; r < TROWS; r++)
        memcpy((char *)base + r * stride, emu_tile[t] + r * TBYTES, TBYTES);
}

/* A bf16 or f32 value as the unit reads it: a subnormal is 0 (of its sign). */
static float emu_daz(uint32_t u) {
    if ((u & 0x7f800000u) == 0)
        u &= 0x80000000u;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static float emu_ftz(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return emu_daz(u);
}

static void emu_dp(int c, int a, int b) {
    float cm[TROWS * TROWS];
    uint16_t am[TROWS * 32], bm[TROWS * 32];
    memcpy(cm, emu_tile[c], sizeof cm);
    memcpy(am, emu_tile[a], sizeof am);
    memcpy(bm, emu_tile[b], sizeof bm);
    for (int m = 0; m < TROWS; m++)
        for (int n = 0; n < TROWS; n++) {
            uint32_t u;
            memcpy(&u, &cm[m * TROWS + n], sizeof u);
            float x = emu_daz(u);
            for (int k = 0; k < TROWS; k++)
                for (int e = 0; e < 2; e++) {
                    const float pa = emu_daz((uint32_t)am[m * 32 + 2 * k + e] << 16);
                    const float pb = emu_daz((uint32_t)bm[k * 32 + 2 * n + e] << 16);
                    x = emu_ftz(x + emu_ftz(pa * pb));
                }
            cm[m * TROWS + n] = x;
        }
    memcpy(emu_tile[c], cm, sizeof cm);
}

#define TILES_BEGIN() ((void)0)
#define TILES_END() ((void)0)
#define TLOAD(t, base, stride) emu_load(t, base, stride)
#define TSTORE(t, base, stride) emu_store(t, base, stride)
#define TZERO(t) memset(emu_tile[t], 0, sizeof emu_tile[t])
#define TDP(c, a, b) emu_dp(c, a, b)

#else

/* Every tile 16 rows (TROWS) of 64 bytes (TBYTES). */
_Static_assert(TROWS == 16 && TBYTES == 64, "tile_config.h configures 16 rows of 64 bytes");
static void tiles_begin(void) {
    sdpa__tile_config c;
    sdpa__tile_config_full(&c);
    _tile_loadconfig(&c);
}

#define TILES_BEGIN() tiles_begin()
#define TILES_END() _tile_release()
/* GCC's _tile_loadd (12.2) is an asm statement that does not tell the compiler it reads
 * memory (its _tile_stored does): the compiler barrier before each load keeps the plain stores
 * that filled its source (P^T, V's pairs, K's padded tail) ahead of it, where an inlined
 * producer might otherwise have them moved past the load or dropped as dead. */
#define TLOAD(t, base, stride)                                                                     \
    do {                                                                                           \
        __asm__ volatile("" ::: "memory");                                                         \
        _tile_loadd(t, base, stride);                                                              \
    } while (0)
#define TSTORE(t, base, stride) _tile_stored(t, base, stride)
#define TZERO(t) _tile_zero(t)
#define TDP(c, a, b) _tile_dpbf16ps(c, a, b)

#endif

static uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* bf16 bits: a subnormal (exponent 0, fraction not 0), which the unit would read as 0. */
static int bf16_subnormal(uint32_t h) {
    return (h & 0x7f80u) == 0 && (h & 0x7fu) != 0;
}

/* Q rows (bf16, unit feature stride) in pairs: qt[p * ldq + r] holds features 2p (low half)
 * and 2p + 1 (high half) of row r, for p < dk / 2 and r < nr, and 0 for the rows up to a
 * multiple of 16; then, as row dk / 2, whether row r holds a subnormal (nonzero), which the
 * unit would read as 0: amx_qk forms that row's scores itself. 16 rows and DK_STEP (32)
 * features a block, so dk must be a multiple of DK_STEP: a row's 32 values are already its 16
 * pairs, in order, so the block is only turned around, so that pair p of the 16 rows is one
 * vector. (Written a value at a time, down the columns of qt, from the rows widened to f32,
 * this took 66,000-69,000 TSC cycles a 256-row task at D = 128, against 11,000-13,000 now:
 * bench/mx_kernels.c's pack_q line on an Intel Xeon.) */
static void amx_pack_q(int64_t nr, int64_t dk, const void *const *rows, void *qt_, int64_t ldq) {
    uint32_t *qt = qt_;
    const int64_t nrp = (nr + TROWS - 1) / TROWS * TROWS;
    const __m512i expo = _mm512_set1_epi16(0x7f80), frac = _mm512_set1_epi16(0x007f);
    for (int64_t r0 = 0; r0 < nrp; r0 += TROWS) {
        __mmask16 sub = 0; /* the rows of the block that hold a subnormal */
        for (int64_t d0 = 0; d0 < dk; d0 += DK_STEP) {
            __m512 x[16]; /* pairs of bf16, moved as 32-bit values */
            for (int r = 0; r < 16; r++) {
                if (r0 + r >= nr) {
                    x[r] = _mm512_setzero_ps();
                    continue;
                }
                const __m512i h = _mm512_loadu_si512((const uint16_t *)rows[r0 + r] + d0);
                const __mmask32 zero_e =
                    _mm512_cmpeq_epi16_mask(_mm512_and_si512(h, expo), _mm512_setzero_si512());
                if (_mm512_mask_test_epi16_mask(zero_e, h, frac) != 0)
                    sub |= (__mmask16)(1u << r);
                x[r] = _mm512_castsi512_ps(h);
            }
            sdpa__transpose16_avx512(x);
            for (int p = 0; p < 16; p++)
                _mm512_storeu_ps(qt + (d0 / 2 + p) * ldq + r0, x[p]);
        }
        _mm512_storeu_si512(qt + dk / 2 * ldq + r0, _mm512_maskz_set1_epi32(sub, 1));
    }
}

/* Which of rows [0, n) of x (bf16, row stride ld elements, d features, d a multiple of 16)
 * hold a value the unit does not read as it is: bit 0 of flags[j] a subnormal (read as 0),
 * bit 1 a NaN or an Inf (whose products amx_pv forms itself). @return the union. */
static int special_rows(int64_t n, int64_t d, const uint16_t *x, int64_t ld, unsigned char *flags) {
    const __m512i expo = _mm512_set1_epi16(0x7f80), frac = _mm512_set1_epi16(0x007f);
    int any = 0;
    for (int64_t j = 0; j < n; j++) {
        __mmask32 sub = 0, bad = 0;
        for (int64_t c = 0; c < d; c += 32) {
            const __mmask32 in = d - c >= 32 ? 0xffffffffu : (1u << (d - c)) - 1u;
            const __m512i v = _mm512_maskz_loadu_epi16(in, x + j * ld + c);
            const __m512i e = _mm512_and_si512(v, expo);
            const __mmask32 zero_e = _mm512_cmpeq_epi16_mask(e, _mm512_setzero_si512());
            sub |= _mm512_mask_test_epi16_mask(zero_e, v, frac);
            bad |= _mm512_cmpeq_epi16_mask(e, expo);
        }
        flags[j] = (unsigned char)((sub != 0) | (bad != 0) << 1);
        any |= flags[j];
    }
    return any;
}

static float bf16_value(uint32_t h) {
    const uint32_t u = (h & 0xffffu) << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* The score of key j for row r formed with f32 FMAs over the features (every value read as
 * it is), for the rows and keys that hold a subnormal. */
static float exact_score(int64_t dk, const uint16_t *krow, const uint32_t *qt, int64_t ldq,
                         int64_t r, float scale) {
    float acc = 0.0f;
    for (int64_t p = 0; p < dk / 2; p++) {
        const uint32_t pair = qt[p * ldq + r];
        acc = fmaf(bf16_value(pair), bf16_value(krow[2 * p]), acc);
        acc = fmaf(bf16_value(pair >> 16), bf16_value(krow[2 * p + 1]), acc);
    }
    return scale * acc;
}

/* exact_score for rows [0, nr) (a multiple of 16) of key krow, 16 rows a vector: the same
 * FMAs in the same order, so the same bits. */
static void exact_key_scores(int64_t dk, const uint16_t *krow, const uint32_t *qt, int64_t ldq,
                             int64_t nr, float scale, float *s_j) {
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
    for (int64_t r = 0; r < nr; r += 16) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t p = 0; p < dk / 2; p++) {
            const __m512i pair = _mm512_loadu_si512(qt + p * ldq + r);
            acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(pair, 16)),
                                  _mm512_set1_ps(bf16_value(krow[2 * p])), acc);
            acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(pair, high)),
                                  _mm512_set1_ps(bf16_value(krow[2 * p + 1])), acc);
        }
        _mm512_storeu_ps(s_j + r, _mm512_mul_ps(_mm512_set1_ps(scale), acc));
    }
}

/* The scores of a block of up to 2 x 2 tiles (cb[t], t = 2 ki + ri: keys 16 ki.., rows
 * 16 ri.. from c0 = s + j0 lds + r0), scaled into s: scale times the unit's sum, one rounding.
 * Tiles the block lacks (two_k, two_r 0) are not written. */
static void scale_block(const float *cb, float *c0, int64_t lds, int two_k, int two_r,
                        float scale) {
    const __m512 sc = _mm512_set1_ps(scale);
    for (int t = 0; t < 4; t++) {
        const int ki = t >> 1, ri = t & 1;
        if ((ki && !two_k) || (ri && !two_r))
            continue;
        for (int i = 0; i < TROWS; i++)
            _mm512_storeu_ps(c0 + (ki * TROWS + i) * lds + ri * TROWS,
                             _mm512_mul_ps(sc, _mm512_load_ps(cb + t * TROWS * TROWS + i * TROWS)));
    }
}

/* s[j * lds + r] = scale * sum_d k[j * ldk + d] q[r][d] for j < nk <= 128, r < nr (a multiple
 * of 16), with qt from amx_pack_q (row r0 of the pairs at qt, row stride ldq pairs). Rows of
 * s from nk up to a multiple of 16 are written too (with scores of zero keys). The scores of
 * a key or a row that holds a subnormal are formed again by exact_score, so that every value
 * is read as it is and a key's values change no other key's scores. */
static void amx_qk(int64_t nk, int64_t nr, int64_t dk, const void *k_, int64_t ldk, const void *qt_,
                   int64_t ldq, float scale, float *s, int64_t lds) {
    const uint16_t *k = k_;
    const uint32_t *qt = qt_;
    const int64_t nkb = (nk + TROWS - 1) / TROWS, full = nk / TROWS, nrb = nr / TROWS;
    /* the last block of keys, when partial, from a copy padded with zero rows: a tile load
     * of 16 rows would read past the keys (past the tensor, or the page) */
    _Alignas(64) uint16_t tail[TROWS * D_MAX];
    if (full < nkb) {
        memset(tail, 0, (size_t)(TROWS * dk) * sizeof *tail);
        for (int64_t j = 0; j < nk - full * TROWS; j++)
            memcpy(tail + j * dk, k + (full * TROWS + j) * ldk, (size_t)dk * sizeof *tail);
    }
    const int64_t qs = ldq * 4;
    /* A block's sums are stored to an L1 buffer, and scaled into s while the unit works on
     * the next block (its tile instructions come first): two buffers, taken in turn. With a
     * scale of 1 (the driver's, when the softmax scales the scores: softmax_bf16p) the tiles
     * are stored straight into s: at D = 128 (64) that took the step from 10.5-10.7 to
     * 9.4-9.8 (6.4-6.7 to 5.1-5.2) TSC cycles per key and 16 rows, bench/mx_kernels.c on an
     * Intel Xeon with AMX. */
    _Alignas(64) float cbuf[2][4 * TROWS * TROWS];
    float *due = NULL; /* the block still to scale: at due, from cbuf[cur ^ 1] */
    int due_k = 0, due_r = 0, cur = 0;
    TILES_BEGIN();
    for (int64_t kb = 0; kb < nkb; kb += 2) {
        const int two_k = kb + 1 < nkb;
        const uint16_t *a0 = kb < full ? k + kb * TROWS * ldk : tail;
        const uint16_t *a1 = kb + 1 < full ? k + (kb + 1) * TROWS * ldk : tail;
        const int64_t sa0 = (kb < full ? ldk : dk) * 2, sa1 = (kb + 1 < full ? ldk : dk) * 2;
        for (int64_t rb = 0; rb < nrb; rb += 2) {
            const int two_r = rb + 1 < nrb;
            TZERO(0);
            TZERO(1);
            TZERO(2);
            TZERO(3);
            for (int64_t dc = 0; dc < dk / 32; dc++) {
                const uint32_t *b0 = qt + dc * 16 * ldq + rb * TROWS;
                TLOAD(4, a0 + dc * 32, sa0);
                TLOAD(6, b0, qs);
                TDP(0, 4, 6);
                if (two_r) {
                    TLOAD(7, b0 + TROWS, qs);
                    TDP(1, 4, 7);
                }
                if (two_k) {
                    TLOAD(5, a1 + dc * 32, sa1);
                    TDP(2, 5, 6);
                    if (two_r)
                        TDP(3, 5, 7);
                }
            }
            /* the block's tiles: straight into s where the scale is 1 (the sums are the
             * scores), else into cbuf[cur], scaled into s by the next block's turn; tile
             * (ki, ri) at cb + ki * down + ri * right, its rows ld floats apart */
            const int direct = scale == 1.0f;
            if (!direct && due != NULL)
                scale_block(cbuf[cur ^ 1], due, lds, due_k, due_r, scale);
            float *cb = direct ? s + kb * TROWS * lds + rb * TROWS : cbuf[cur];
            const int64_t ld = direct ? lds : TROWS, right = direct ? TROWS : TROWS * TROWS;
            const int64_t down = direct ? TROWS * lds : 2 * TROWS * TROWS;
            TSTORE(0, cb, ld * 4);
            if (two_r)
                TSTORE(1, cb + right, ld * 4);
            if (two_k) {
                TSTORE(2, cb + down, ld * 4);
                if (two_r)
                    TSTORE(3, cb + down + right, ld * 4);
            }
            if (!direct) {
                due = s + kb * TROWS * lds + rb * TROWS;
                due_k = two_k;
                due_r = two_r;
                cur ^= 1;
            }
        }
    }
    TILES_END();
    if (due != NULL)
        scale_block(cbuf[cur ^ 1], due, lds, due_k, due_r, scale);
    unsigned char flags[KEYS_MAX];
    if (special_rows(nk, dk, k, ldk, flags) & 1)
        for (int64_t j = 0; j < nk; j++)
            if (flags[j] & 1)
                exact_key_scores(dk, k + j * ldk, qt, ldq, nr, scale, s + j * lds);
    const uint32_t *sub_q = qt + dk / 2 * ldq;
    for (int64_t r = 0; r < nr; r++)
        if (sub_q[r] != 0)
            for (int64_t j = 0; j < nk; j++)
                s[j * lds + r] = exact_score(dk, k + j * ldk, qt, ldq, r, scale);
}

#if defined(SDPA_AMX_EMULATE)
/* bf16 of 16 f32 values (to nearest, ties to even; a NaN stays a quiet NaN), in the low half
 * of each 32-bit lane. */
INLINE __m512i bf16_lanes(__m512 x) {
    /* an f32 subnormal is read as 0 (of its sign), as VCVTNE2PS2BF16 reads it */
    const __mmask16 sub = _mm512_cmpeq_epi32_mask(
        _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7f800000)),
        _mm512_setzero_si512());
    x = _mm512_mask_mov_ps(x, sub,
                           _mm512_castsi512_ps(_mm512_and_si512(
                               _mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u))));
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_mask_mov_epi32(
        r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
}

/* The weights of two keys for 16 rows, as bf16 pairs: lane r holds p0[r] (low half) and
 * p1[r] (high half), each to nearest, ties to even. */
INLINE __m512i bf16_pairs(__m512 p0, __m512 p1) {
    return _mm512_or_si512(bf16_lanes(p0), _mm512_slli_epi32(bf16_lanes(p1), 16));
}
#else
/* The same by VCVTNE2PS2BF16 (AVX512-BF16, which every CPU with AMX-BF16 has): to nearest,
 * ties to even, a NaN quiet; it reads an f32 subnormal as 0, as TDPBF16PS would read the
 * bf16 it rounds to. One conversion gives the 16 words of p0 then those of p1; VPERMW
 * interleaves them. */
INLINE __m512i bf16_pairs(__m512 p0, __m512 p1) {
    const __m512i words = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);
    /* word 2r of the result is word r of `words`, word 2r + 1 is word 16 + r */
    const __m512i inter =
        _mm512_set_epi32(0x001f000f, 0x001e000e, 0x001d000d, 0x001c000c, 0x001b000b, 0x001a000a,
                         0x00190009, 0x00180008, 0x00170007, 0x00160006, 0x00150005, 0x00140004,
                         0x00130003, 0x00120002, 0x00110001, 0x00100000);
    return _mm512_permutexvar_epi16(inter, words);
}
#endif

/* P^T of the 16 rows from r0 as the unit's A tiles, bf16: pt[r * KEYS_MAX + j] for keys
 * j < nk32 (zero past nk), from the weights' layout p[j * ldp + r]. */
static void pt_block(int64_t nk, int64_t nk32, const float *p, int64_t ldp, int64_t r0,
                     uint16_t *pt) {
    for (int64_t kc = 0; kc < nk32; kc += 32) {
        __m512 x[16]; /* pairs of bf16, moved as 32-bit values */
        for (int64_t q = 0; q < 16; q++) {
            const int64_t j = kc + 2 * q;
            const __m512 p0 = j < nk ? _mm512_loadu_ps(p + j * ldp + r0) : _mm512_setzero_ps();
            const __m512 p1 =
                j + 1 < nk ? _mm512_loadu_ps(p + (j + 1) * ldp + r0) : _mm512_setzero_ps();
            x[q] = _mm512_castsi512_ps(bf16_pairs(p0, p1));
        }
        sdpa__transpose16_avx512(x);
        for (int r = 0; r < 16; r++)
            _mm512_store_ps(pt + r * KEYS_MAX + kc, x[r]);
    }
}

/* o = alpha o + P V for rn rows from r0 of n tiles of 16 columns from column tile cb (o's
 * row r at o + (r0 + r) * ldo + 16 cb, its sums at pv16[r * 64]), one rounding, in f32: the
 * accumulator never enters a tile, whose sums the unit flushes when subnormal. alpha NULL:
 * o = P V, o not read (a sum the unit flushed to -0 then stays -0, where 0 + -0 gave +0). */
static void o_update(int64_t r0, int64_t rn, int64_t cb, int64_t n, const float *alpha, float *o,
                     int64_t ldo, const float *pv16) {
    o += r0 * ldo + cb * 16;
    if (alpha == NULL) {
        for (int64_t r = 0; r < rn; r++)
            for (int64_t i = 0; i < n; i++)
                _mm512_storeu_ps(o + r * ldo + 16 * i, _mm512_load_ps(pv16 + r * 64 + 16 * i));
        return;
    }
    for (int64_t r = 0; r < rn; r++) {
        const __m512 av = _mm512_set1_ps(alpha[r0 + r]);
        float *orow = o + r * ldo;
        for (int64_t i = 0; i < n; i++)
            _mm512_storeu_ps(orow + 16 * i,
                             _mm512_fmadd_ps(av, _mm512_loadu_ps(orow + 16 * i),
                                             _mm512_load_ps(pv16 + r * 64 + 16 * i)));
    }
}

/* o[r * ldo + c] = alpha[r] o[r * ldo + c] + sum_j bf16(p[j * ldp + r]) v[j * ldv + c] for
 * r < nr, c < dv (a multiple of 16), j < nk <= 128, with v bf16 rows read in place: the sum by
 * the unit into zeroed tiles, added to the scaled accumulator by one FMA. A weight below
 * 2^-126 (an f32 subnormal) counts as 0, as VCVTNE2PS2BF16 reads it: the vector softmax
 * scales its weights (weight_exp2) so that it never gives one. A value of
 * V the unit would not read as it is (a subnormal, read as 0; a NaN or an Inf, which a hidden
 * key's weight -0.0 must not meet) goes to the unit as 0, and its products are then added in
 * f32 for the rows that see its key (weight not -0.0; a +0 weight gives 0 x Inf = NaN, as in
 * the reference): a hidden key changes no bit of a row, whatever its V holds. Rows of o from
 * nr are not written. alpha NULL: o = P V, o read by none of it (it may hold anything). */
static void amx_pv(int64_t nk, int64_t nr, int64_t dv, const float *p, int64_t ldp,
                   const float *alpha, const void *v_, int64_t ldv, float *o, int64_t ldo) {
    const uint16_t *v = v_;
    const int64_t nk32 = (nk + 31) / 32 * 32, npairs = nk32 / 2;
    unsigned char flags[KEYS_MAX];
    const int special = special_rows(nk, dv, v, ldv, flags);
    /* V in pairs: vp[kp * dv + c] = v[2kp][c] | v[2kp + 1][c] << 16, zero past the keys and,
     * in a row special_rows flagged, where a value is special */
    _Alignas(64) uint32_t vp[KEYS_MAX / 2 * D_MAX];
    const __m512i expo = _mm512_set1_epi32(0x7f80), frac = _mm512_set1_epi32(0x007f);
    for (int64_t kp = 0; kp < npairs; kp++) {
        const int64_t j = 2 * kp;
        for (int64_t c = 0; c < dv; c += 16) {
            __m512i w[2];
            for (int e = 0; e < 2; e++) {
                w[e] = j + e < nk ? _mm512_cvtepu16_epi32(
                                        _mm256_loadu_si256((const void *)(v + (j + e) * ldv + c)))
                                  : _mm512_setzero_si512();
                if (j + e < nk && flags[j + e]) {
                    const __m512i ex = _mm512_and_si512(w[e], expo);
                    const __mmask16 odd =
                        _mm512_cmpeq_epi32_mask(ex, expo) |
                        _mm512_mask_test_epi32_mask(
                            _mm512_cmpeq_epi32_mask(ex, _mm512_setzero_si512()), w[e], frac);
                    w[e] = _mm512_mask_mov_epi32(w[e], odd, _mm512_setzero_si512());
                }
            }
            _mm512_store_si512(vp + kp * dv + c,
                               _mm512_or_si512(w[0], _mm512_slli_epi32(w[1], 16)));
        }
    }
    /* The unit's work on one block of 16 rows and up to 64 columns is interleaved with the
     * vector work around it, which does not wait for it: after its tile instructions come the
     * next block's P^T (when these are the block's first columns) and the O update of the
     * block before, and only then its tile stores. So P^T and P V's sums have two buffers
     * each, taken in turn. (Done one after the other, the two kinds of work took about 14 and
     * 9 TSC cycles per key and 16 rows at D = 128 on an Intel Xeon; together, 18.) */
    _Alignas(64) uint16_t pts[2][TROWS * KEYS_MAX];
    _Alignas(64) float pv16s[2][TROWS * 64];
    const int64_t nrb = (nr + TROWS - 1) / TROWS, ncb = dv / 16;
    int64_t due_r0 = -1, due_rn = 0, due_cb = 0, due_n = 0; /* the O update still to do */
    int due_buf = 0;
    TILES_BEGIN();
    if (nrb > 0)
        pt_block(nk, nk32, p, ldp, 0, pts[0]);
    for (int64_t rb = 0; rb < nrb; rb++) {
        const int64_t r0 = rb * TROWS, rn = nr - r0 < TROWS ? nr - r0 : TROWS;
        const uint16_t *pt = pts[rb & 1];
        for (int64_t cb = 0; cb < ncb; cb += 4) {
            const int64_t n = ncb - cb < 4 ? ncb - cb : 4;
            TZERO(0);
            TZERO(1);
            TZERO(2);
            TZERO(3);
            for (int64_t kc = 0; kc < nk32; kc += 32) {
                const uint32_t *b = vp + kc / 2 * dv + cb * 16;
                TLOAD(4, pt + kc, KEYS_MAX * 2);
                TLOAD(5, b, dv * 4);
                TDP(0, 4, 5);
                if (n > 1) {
                    TLOAD(6, b + 16, dv * 4);
                    TDP(1, 4, 6);
                }
                if (n > 2) {
                    TLOAD(7, b + 32, dv * 4);
                    TDP(2, 4, 7);
                }
                if (n > 3) {
                    TLOAD(5, b + 48, dv * 4);
                    TDP(3, 4, 5);
                }
            }
            if (cb == 0 && rb + 1 < nrb)
                pt_block(nk, nk32, p, ldp, r0 + TROWS, pts[(rb + 1) & 1]);
            if (due_r0 >= 0)
                o_update(due_r0, due_rn, due_cb, due_n, alpha, o, ldo, pv16s[due_buf]);
            due_buf ^= 1;
            float *pv16 = pv16s[due_buf];
            TSTORE(0, pv16, 64 * 4);
            if (n > 1)
                TSTORE(1, pv16 + 16, 64 * 4);
            if (n > 2)
                TSTORE(2, pv16 + 32, 64 * 4);
            if (n > 3)
                TSTORE(3, pv16 + 48, 64 * 4);
            due_r0 = r0;
            due_rn = rn;
            due_cb = cb;
            due_n = n;
        }
    }
    TILES_END();
    if (due_r0 >= 0)
        o_update(due_r0, due_rn, due_cb, due_n, alpha, o, ldo, pv16s[due_buf]);
    if (!special)
        return;
    for (int64_t j = 0; j < nk; j++) {
        if (!flags[j])
            continue;
        for (int64_t c = 0; c < dv; c++) {
            const uint32_t h = v[j * ldv + c];
            if ((h & 0x7f80u) != 0x7f80u && !bf16_subnormal(h))
                continue;
            const float x = bf16_value(h);
            for (int64_t r = 0; r < nr; r++) {
                const float w = p[j * ldp + r];
                if (f32_bits(w) != 0x80000000u) /* not a hidden key's -0.0 */
                    o[r * ldo + c] += w * x;
            }
        }
    }
}

const sdpa__mx_kernels sdpa__mx_amx = {
#if defined(SDPA_AMX_EMULATE)
    .name = "amx-emulated",
#else
    .name = "amx",
#endif
    .elem = SDPA__ELEM_BF16,
    .dk_step = DK_STEP,
    .dv_step = DV_STEP,
    .d_max = D_MAX,
    .keys_max = KEYS_MAX,
    .lanes = TROWS,
    .pack_q = amx_pack_q,
    .qk = amx_qk,
    .pv = amx_pv,
};
