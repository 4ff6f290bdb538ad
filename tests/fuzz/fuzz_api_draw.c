/*
 * fuzz_api_draw.c — the API fuzz target's input turned into a case: shapes, dtypes, layouts,
 * scalar parameters, threads and ISA cap from the input's tail; tensor values from its head
 * (a PRNG seeded from the tail takes over when the head runs out); then, rarely, special
 * values, NULLs, aliasing and extents changed after allocation. Every argument made invalid
 * on purpose is noted with the calls that must refuse it (fz_note_bad). The backward's
 * arguments and the KV call, drawn last from the bytes left over, are
 * fuzz_api_draw_leftover.c's; the input's readers (take) are fuzz_api_draw.h's.
 *
 * This is the mapping the committed corpus (tests/fuzz/corpus/api) was found through: the
 * order in which bytes are taken is part of it. Every byte is taken in its own declarator or
 * statement, never two in one expression, whose order C leaves to the compiler: gcc's and
 * clang's builds draw the same case from an input (fuzz_replay_api runs the corpus found by
 * clang's libFuzzer build under gcc), and a new reading must keep that.
 */
#include "fuzz_api.h"
#include "fuzz_api_draw.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- invalid arguments ------------------------------------------------------------------- */

void fz_note_bad_status(fz_case *c, fz_bad which, const char *why, sdpa_status st,
                        const char *msg) {
    c->bad[which] = 1;
    c->n_bad[which]++;
    c->want[which] = st;
    c->want_msg[which] = msg;
    if (c->n_why < 8)
        c->why[c->n_why++] = why;
}

void fz_note_bad(fz_case *c, fz_bad which, const char *why) {
    fz_note_bad_status(c, which, why, SDPA_OK, NULL);
}

/* ---- parameters -------------------------------------------------------------------------- */

static int64_t draw_len(fz_src *s) {
    static const int64_t edges[] = {15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129};
    const unsigned x = take(s);
    if (x < 224)
        return 1 + (int64_t)(x % 70);
    return edges[x % (sizeof edges / sizeof edges[0])];
}

/* 1..40 mostly; sometimes 48..80, which reaches the AVX-512 P V's 4-vector column tail
 * (Dv 49..63) and head dimensions past 64. */
static int64_t draw_dim(fz_src *s) {
    const unsigned x = take(s);
    return x < 236 ? 1 + (int64_t)(x % 40) : 48 + (int64_t)(x % 33);
}

/* f32/f16/bf16 mostly; one time in 32 a dtype no tensor may have. */
static sdpa_dtype draw_dtype(fz_src *s, int *invalid) {
    static const int bad[4] = {SDPA_BOOL, 4, 7, -1};
    const unsigned x = take(s);
    if (x % 32 == 31) {
        *invalid = 1;
        return (sdpa_dtype)bad[(x >> 5) % 4];
    }
    return (sdpa_dtype)(x % 3);
}

fz_layout fz_draw_layout(fz_src *s) {
    fz_layout ly = {0};
    const unsigned a = take(s);
    ly.base = (a & 3) == 3 ? 2 : (a & 3) == 2 ? 1 : 0;
    if ((a >> 2 & 3) == 3)
        ly.pad = 1 + (int64_t)(take(s) % 7);
    const unsigned mod = a >> 4;
    if (mod == 10 || mod == 11)
        ly.neg = take(s) & 15u;
    else if (mod == 12)
        ly.zero = (take(s) & 15u) ? (take(s) & 15u) : 3u;
    else if (mod == 13)
        ly.huge = 1 + (int)(take(s) % 5);
    else if (mod == 14)
        ly.misalign = 1;
    else if (mod == 15)
        ly.overlap = 1;
    return ly;
}

static float bits_float(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static float draw_scale(fz_src *s, fz_case *c) {
    const unsigned kind = take(s) % 12;
    if (kind < 5)
        return 0.0f; /* the default, 1/sqrt(Dk) */
    if (kind < 8) {
        const unsigned mant = take(s), ex = take(s) % 10;
        const float x = ldexpf(1.0f + (float)mant / 256.0f, (int)ex - 7);
        return kind == 7 ? -x : x;
    }
    if (kind < 10) {
        /* a denormal: exponent bits 0, mantissa from the input, never 0 */
        const uint32_t lo = take(s), mid = take(s), hi = take(s) & 0x7fu;
        uint32_t m = lo | mid << 8 | hi << 16;
        m = m ? m : 1u;
        return bits_float(m | (kind == 9 ? 0x80000000u : 0u));
    }
    static const float bad[4] = {NAN, INFINITY, -INFINITY, -NAN};
    fz_note_bad(c, FZ_BAD_PARAMS, "scale not finite");
    return bad[take(s) % 4];
}

static float draw_softcap(fz_src *s, fz_case *c) {
    const unsigned kind = take(s) % 16;
    if (kind < 9)
        return 0.0f;
    if (kind < 13) {
        const unsigned mant = take(s), ex = take(s) % 8;
        return ldexpf(1.0f + (float)mant / 256.0f, (int)ex - 2);
    }
    if (kind == 13) {
        static const float odd[4] = {1e-40f, 1e-30f, 1e30f, -0.0f}; /* all valid */
        return odd[take(s) % 4];
    }
    static const float bad[4] = {-1.0f, NAN, INFINITY, -INFINITY};
    fz_note_bad(c, FZ_BAD_PARAMS, "softcap negative or not finite");
    return bad[take(s) % 4];
}

static int64_t draw_window(fz_src *s, fz_case *c, int64_t L) {
    static const int64_t odd[4] = {INT64_MAX, (int64_t)1 << 62, INT64_MIN, -1000};
    const unsigned x = take(s);
    const int64_t w = x < 232 ? -2 + (int64_t)(x % (unsigned)(L + 5)) : odd[x % 4];
    if (w < -1 && c->params.use_window)
        fz_note_bad(c, FZ_BAD_PARAMS, "window bound < -1");
    return w;
}

/* Shrinks the problem until B*Hq*Lq*Lk*(Dk+Dv+4) <= FZ_MAX_WORK, keeping Lq and Lk (the tile
 * edges are what the fuzzer should reach) as long as possible. */
static void fit_budget(fz_case *c, int heads_bad) {
#define WORK (c->B * c->Hq * c->Lq * c->Lk * (c->Dk + c->Dv + 4))
    if (WORK > FZ_MAX_WORK)
        c->B = 1;
    if (WORK > FZ_MAX_WORK && !heads_bad) {
        const int64_t g = c->Hq / c->Hkv;
        c->Hkv = 1;
        c->Hq = g;
    }
    if (WORK > FZ_MAX_WORK) {
        c->Dk = c->Dk > 8 ? 1 + c->Dk % 8 : c->Dk;
        c->Dv = c->Dv > 8 ? 1 + c->Dv % 8 : c->Dv;
    }
    while (WORK > FZ_MAX_WORK && c->Hq > 1 && !heads_bad) {
        c->Hq = c->Hq / 2 > 0 ? c->Hq / 2 : 1;
    }
    while (WORK > FZ_MAX_WORK) {
        if (c->Lq > c->Lk)
            c->Lq /= 2;
        else
            c->Lk /= 2;
    }
#undef WORK
}

/* ---- values ------------------------------------------------------------------------------ */

/* The value of a float input element: from the head of the input while it lasts (multiples
 * of 1/32, exact in every dtype), then from the PRNG. */
static double draw_value(fz_src *s, tu_rng *r, double mag) {
    const int b = data_byte(s);
    if (b >= 0)
        return ((double)b - 128.0) / 32.0 * mag;
    return tu_randn(r) * mag;
}

static int byte_or_rng(fz_src *s, tu_rng *r) {
    const int b = data_byte(s);
    return b >= 0 ? b : (int)(tu_next(r) & 255u);
}

/* Fills every element of a float input (the gaps were set to NaN bytes before). */
void fz_fill_float(fz_tensor *f, fz_src *s, tu_rng *r, double mag) {
    sdpa_tensor *t = &f->t;
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t h = 0; h < t->shape[1]; h++)
            for (int64_t l = 0; l < t->shape[2]; l++)
                for (int64_t d = 0; d < t->shape[3]; d++)
                    tu_set(t, b, h, l, d, draw_value(s, r, mag));
}

/* Mask values: -inf (bool: false) with probability about thr/256; additive values also
 * -1e9, 0 and small finite biases. */
static void fill_mask(fz_tensor *f, fz_src *s, tu_rng *r, unsigned thr) {
    sdpa_tensor *t = &f->t;
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t h = 0; h < t->shape[1]; h++)
            for (int64_t l = 0; l < t->shape[2]; l++)
                for (int64_t d = 0; d < t->shape[3]; d++) {
                    const unsigned u = (unsigned)byte_or_rng(s, r);
                    const int64_t o =
                        b * t->stride[0] + h * t->stride[1] + l * t->stride[2] + d * t->stride[3];
                    if (t->dtype == SDPA_BOOL) {
                        /* any nonzero byte means "may attend", not only 1 */
                        ((unsigned char *)t->data)[o] = u < thr ? 0 : (unsigned char)(1 + u % 255);
                        continue;
                    }
                    double x;
                    if (u < thr)
                        x = -INFINITY;
                    else if (u % 16 == 0)
                        x = -1e9;
                    else if (u % 4 == 0)
                        x = 0.0;
                    else
                        x = ((double)(u % 64) - 32.0) / 8.0;
                    tu_set(t, b, h, l, d, x);
                }
}

/* Huge finite values for an element of dtype dt: the largest f16, a large bf16 (testing.md),
 * and the f16 maximum again for f32 (scores must stay in f32's range). In V, no more than the
 * output dtype holds: O is a convex combination of V's rows, and a value f16 cannot hold
 * would become Inf on output by the contract, not by a fault. All are exact in their dtype. */
static double huge_value(sdpa_dtype dt, int in_v, sdpa_dtype out) {
    if (dt != SDPA_BF16)
        return 65504.0;
    return in_v && out == SDPA_F16 ? 65280.0 : 133120.0; /* bf16 rounds 65504 up to 65536 */
}

/* ---- the case, part by part, in the order the bytes are taken ---------------------------- */

/* The dtypes drawn for q, k, v and out. */
typedef struct dtypes {
    sdpa_dtype q, k, v, out;
} dtypes;

static void draw_problem(fz_case *c, fz_src *s, dtypes *dt) {
    /* shapes */
    c->B = 1 + take(s) % 3;
    const unsigned hb = take(s);
    c->Hkv = 1 + hb % 3;
    c->Hq = c->Hkv * (1 + (hb >> 2) % 4);
    const int heads_bad = (hb >> 4) == 15 && c->Hkv > 1;
    if (heads_bad) {
        c->Hq += 1;
        fz_note_bad(c, FZ_BAD_COMMON, "Hq not a multiple of Hkv");
    }
    c->Lq = draw_len(s);
    c->Lk = draw_len(s);
    c->Dk = draw_dim(s);
    c->Dv = draw_dim(s);
    fit_budget(c, heads_bad);

    /* dtypes */
    int bad_dt = 0;
    dt->q = draw_dtype(s, &bad_dt);
    dt->k = draw_dtype(s, &bad_dt);
    if (bad_dt)
        fz_note_bad(c, FZ_BAD_COMMON, "q or k dtype invalid");
    bad_dt = 0;
    dt->v = draw_dtype(s, &bad_dt);
    dt->out = draw_dtype(s, &bad_dt);
    if (bad_dt)
        fz_note_bad(c, FZ_BAD_FWD, "v or out dtype invalid");

    /* scalar parameters */
    const unsigned fl = take(s);
    c->params.causal = fl & 1u;
    c->params.use_window = fl >> 1 & 1u;
    c->q.used = c->k.used = c->v.used = c->out.used = c->w.used = 1;
    c->lse.used = fl >> 2 & 1u;
    c->params.align = (sdpa_align)(fl >> 3 & 1u);
    if ((fl >> 4) == 15) {
        c->params.align = (sdpa_align)((fl & 1u) ? 2 : -1);
        fz_note_bad(c, FZ_BAD_PARAMS, "align invalid");
    }
    c->params.scale = draw_scale(s, c);
    c->params.softcap = draw_softcap(s, c);
    c->params.window_left = draw_window(s, c, c->Lk);
    c->params.window_right = draw_window(s, c, c->Lk);
}

static void draw_threads(fz_case *c, fz_src *s, int best_isa) {
    const unsigned th = take(s);
    c->t1 = 1 + (int)(th % 4);
    c->t2 = 1 + (int)((th >> 2) % 4);
    if (c->t2 == c->t1)
        c->t2 = c->t1 % 4 + 1;
    c->isa = SDPA_ISA_GENERIC + (int)((th >> 4) % 3);
    if (c->isa == SDPA_ISA_AVX512 && (th & 0x80)) /* (3 of its 5 draws: the AMX table) */
        c->isa = SDPA_ISA_AMX;
    if (c->isa > best_isa)
        c->isa = best_isa;
}

/* q, k, v, out, lse and the weights: layouts and exact-size buffers. */
static void draw_tensors(fz_case *c, fz_src *s, const dtypes *dt) {
    const int64_t shq[4] = {c->B, c->Hq, c->Lq, c->Dk}, shk[4] = {c->B, c->Hkv, c->Lk, c->Dk};
    const int64_t shv[4] = {c->B, c->Hkv, c->Lk, c->Dv}, sho[4] = {c->B, c->Hq, c->Lq, c->Dv};
    const int64_t shl[4] = {c->B, c->Hq, c->Lq, 1}, shw[4] = {c->B, c->Hq, c->Lq, c->Lk};
    c->q.ly = fz_draw_layout(s);
    c->k.ly = fz_draw_layout(s);
    c->v.ly = fz_draw_layout(s);
    c->out.ly = fz_draw_layout(s);
    fz_alloc_tensor(c, &c->q, dt->q, shq, 0, FZ_BAD_COMMON, FZ_BAD_COMMON, take(s));
    fz_alloc_tensor(c, &c->k, dt->k, shk, 0, FZ_BAD_COMMON, FZ_BAD_COMMON, take(s));
    fz_alloc_tensor(c, &c->v, dt->v, shv, 0, FZ_BAD_FWD, FZ_BAD_FWD, take(s));
    fz_alloc_tensor(c, &c->out, dt->out, sho, 1, FZ_BAD_FWD, FZ_BAD_OUT, take(s));
    if (c->lse.used) {
        c->lse.ly = fz_draw_layout(s);
        const unsigned x = take(s);
        sdpa_dtype dl = SDPA_F32;
        if (x % 16 == 15) {
            dl = (sdpa_dtype)(x >> 4 & 1u ? SDPA_F16 : SDPA_BF16);
            fz_note_bad(c, FZ_BAD_FWD, "lse dtype not f32");
        }
        fz_alloc_tensor(c, &c->lse, dl, shl, 1, FZ_BAD_FWD, FZ_BAD_OUT, take(s));
    }
    const unsigned wx = take(s);
    if (wx % 16 == 15) {
        c->w.ly = fz_draw_layout(s);
    }
    fz_alloc_tensor(c, &c->w, wx % 32 == 31 ? SDPA_F16 : SDPA_F32, shw, 1, FZ_BAD_W, FZ_BAD_W,
                    take(s));
    if (wx % 32 == 31)
        fz_note_bad(c, FZ_BAD_W, "weights dtype not f32");
}

/* The mask (5 times in 8): a dtype, the extents it broadcasts, a layout. */
static void draw_mask(fz_case *c, fz_src *s) {
    const unsigned mk = take(s);
    if (mk % 8 < 3)
        return;
    static const sdpa_dtype mdt[5] = {SDPA_BOOL, SDPA_F32, SDPA_F16, SDPA_BF16, SDPA_BOOL};
    sdpa_dtype dm = mdt[(mk % 8 - 3) % 5];
    if (mk >> 3 == 31) {
        dm = (sdpa_dtype)7;
        fz_note_bad(c, FZ_BAD_PARAMS, "mask dtype invalid");
    }
    const int64_t shw[4] = {c->B, c->Hq, c->Lq, c->Lk};
    const unsigned bc = take(s);
    int64_t shm[4];
    memcpy(shm, shw, sizeof shm);
    for (int i = 0; i < 4; i++)
        if (bc >> i & 1u)
            shm[i] = 1;
    if (bc >> 4 == 15) {
        const int i = (int)(take(s) % 4);
        shm[i] = shw[i] + 1;
        fz_note_bad(c, FZ_BAD_PARAMS, "mask extent neither 1 nor full");
    }
    c->mask.used = 1;
    c->mask.ly = fz_draw_layout(s);
    fz_alloc_tensor(c, &c->mask, dm, shm, 0, FZ_BAD_PARAMS, FZ_BAD_PARAMS, take(s));
    c->params.mask = &c->mask.t;
}

/* ALiBi slopes (1 time in 4), sometimes misaligned or not finite. */
static void draw_alibi(fz_case *c, fz_src *s) {
    const unsigned al = take(s);
    if (al % 4 != 3)
        return;
    const int mis = al >> 2 == 63;
    c->slopes_bytes = (size_t)c->Hq * sizeof(float) + (size_t)mis;
    c->slopes_buf = calloc(1, c->slopes_bytes); /* the misaligned byte defined too */
    float *sl = (float *)(void *)((unsigned char *)c->slopes_buf + mis);
    for (int64_t h = 0; h < c->Hq; h++) {
        const float x = ldexpf(1.0f, -(int)(1 + take(s) % 8));
        if (mis)
            memcpy((unsigned char *)sl + h * 4, &x, sizeof x);
        else
            sl[h] = (al >> 2 & 3u) == 1 ? -x : x;
    }
    if (mis)
        fz_note_bad(c, FZ_BAD_PARAMS, "alibi_slopes misaligned");
    if (!mis && (al >> 4 & 7u) == 7) {
        sl[take(s) % (unsigned)c->Hq] = (al >> 7) ? NAN : INFINITY;
        fz_note_bad(c, FZ_BAD_PARAMS, "alibi slope not finite");
    }
    c->params.alibi_slopes = sl;
}

/* The values of the inputs; their gaps hold NaN (bool: 0) so that reading them shows. */
static void draw_values(fz_case *c, fz_src *s, tu_rng *rng) {
    fz_tensor *const in[4] = {&c->q, &c->k, &c->v, &c->mask};
    const unsigned mg = take(s);
    for (int i = 0; i < 4; i++)
        if (in[i]->used)
            memset(in[i]->buf, in[i]->t.dtype == SDPA_BOOL ? 0x00 : 0xFF, in[i]->bytes);
    if (fz_fillable(&c->q))
        fz_fill_float(&c->q, s, rng, ldexp(1.0, (int)(mg % 5) - 2));
    if (fz_fillable(&c->k))
        fz_fill_float(&c->k, s, rng, ldexp(1.0, (int)(mg / 5 % 5) - 2));
    if (fz_fillable(&c->v))
        fz_fill_float(&c->v, s, rng, ldexp(1.0, (int)(mg / 25 % 5) - 2));
    if (c->mask.used && fz_fillable(&c->mask)) {
        static const unsigned thr[8] = {0, 16, 48, 96, 160, 224, 252, 256};
        fill_mask(&c->mask, s, rng, thr[take(s) % 8]);
    }
}

/* Special values (1 time in 4): NaN, +-Inf or huge finite values at drawn elements. */
static void draw_specials(fz_case *c, fz_src *s, int valid_values, sdpa_dtype dout) {
    fz_tensor *const in[4] = {&c->q, &c->k, &c->v, &c->mask};
    const unsigned sp = take(s);
    if (sp % 4 != 3 || !valid_values)
        return;
    c->n_inj = 1 + (int)(sp >> 2) % 4;
    for (int n = 0; n < c->n_inj; n++) {
        fz_injection *inj = &c->inj[n];
        inj->tensor = (int)(take(s) % 4);
        inj->kind = (int)(take(s) % 5);
        fz_tensor *f = in[inj->tensor];
        if (!f->used || !fz_fillable(f) || (inj->tensor == 3 && f->t.dtype == SDPA_BOOL)) {
            inj->tensor = 2;
            f = &c->v;
        }
        int64_t flat = (int64_t)take16(s);
        for (int i = 3; i >= 0; i--) {
            inj->at[i] = flat % f->t.shape[i];
            flat /= f->t.shape[i];
        }
        static const double val[5] = {NAN, INFINITY, -INFINITY, 1.0, -1.0};
        double x = val[inj->kind];
        if (inj->kind >= 3)
            x *= inj->tensor == 3 ? 1e9 : huge_value(f->t.dtype, inj->tensor == 2, dout);
        tu_set(&f->t, inj->at[0], inj->at[1], inj->at[2], inj->at[3], x);
        /* a huge value in an f32 V read into an f32 output (1 time in 2): its whole column,
         * every key, at +-3e38, so that the unnormalised accumulator passes FLT_MAX where the
         * output, a convex combination, stays finite */
        if (inj->kind >= 3 && inj->tensor == 2 && f->t.dtype == SDPA_F32 && dout == SDPA_F32 &&
            take(s) % 2) {
            for (int64_t j = 0; j < f->t.shape[2]; j++)
                tu_set(&f->t, inj->at[0], inj->at[1], j, inj->at[3], val[inj->kind] * 3e38);
            c->huge_v = 1;
        }
        if (inj->tensor == 3)
            c->nonfinite |= inj->kind <= 1; /* -inf and -1e9 are ordinary mask values */
        else if (inj->kind <= 2)
            c->nonfinite = 1;
        else if (inj->tensor <= 1)
            c->huge_qk = 1;
    }
}

/* Scores beyond f32 (sdpa.h, "Scores beyond f32"; issue 10, item 8: q = k = [1e20, 1e20] gave
 * a NaN row in sdpa_forward but weights (1, 0) from sdpa_weights). Where a huge value went
 * into Q or K and both are f32 or bf16 (which hold 2^66), one time in 2 the row it went into
 * and a row of the other tensor that meets it (same batch, same group of heads) are set
 * throughout to +-2^a (Q) and +-2^b (K): their q.k is +-inf in f32 and in the reference, so
 * the row is NaN (+inf) or the key hidden (-inf), or +-C under softcap, in both calls.
 *   - Each row has one sign, so every product q_d k_d of the pair has the sign of their
 *     product: whatever order a kernel sums them in, its partial sums only grow in
 *     magnitude and never meet inf - inf. That is sdpa.h's caveat (an f32 partial sum that
 *     overflows where the double total fits, q = [1e20, -1e20] against k = [1e20, 1e20]),
 *     documented and not checked here.
 *   - The total is at least 2^130, four times FLT_MAX, so the rounding of f32 sums cannot
 *     bring it back under: either every product overflows (a = b = 66), or (Dk >= 8) none
 *     does and only the sum passes FLT_MAX (a + b = 130 - floor(log2 Dk), each product at
 *     most 2^127), the two ways an f32 dot product reaches inf.
 *   - The rows meet other rows with values of every sign, but those products stay far
 *     below FLT_MAX (under 1e25 a term: 2^66 x 133120): huge finite scores, for which
 *     huge_qk (set by the injection) restricts the check to the positions of non-finite
 *     values, as it does for the injected pair.
 * It runs after everything else is drawn and takes its bytes only where a case qualifies,
 * so inputs found before it keep their meaning when the byte is even (0 when the input is
 * used up). Indices come from the case's own extents, not the tensors' (an extent changed
 * after allocation by perturb stays inside the buffer). */
static void draw_score_overflow(fz_case *c, fz_src *s) {
    const fz_injection *inj = NULL;
    for (int n = 0; n < c->n_inj && inj == NULL; n++)
        if (c->inj[n].kind >= 3 && c->inj[n].tensor <= 1)
            inj = &c->inj[n];
    const int wide_q = c->q.t.dtype == SDPA_F32 || c->q.t.dtype == SDPA_BF16;
    const int wide_k = c->k.t.dtype == SDPA_F32 || c->k.t.dtype == SDPA_BF16;
    if (inj == NULL || !wide_q || !wide_k || c->q.t.data == NULL || c->k.t.data == NULL ||
        !fz_fillable(&c->q) || !fz_fillable(&c->k) || c->Lq <= 0 || c->Lk <= 0 || c->Dk <= 0 ||
        c->Hq <= 0 || c->Hkv <= 0)
        return;
    const unsigned x = take(s);
    if (x % 2 == 0)
        return;
    const unsigned y = take(s);
    const int64_t g = c->Hq / c->Hkv > 0 ? c->Hq / c->Hkv : 1;
    int64_t *iq = c->inf_q, *ik = c->inf_k;
    if (inj->tensor == 0) {
        iq[0] = inj->at[0], iq[1] = inj->at[1], iq[2] = inj->at[2];
        ik[0] = iq[0], ik[1] = iq[1] * c->Hkv / c->Hq, ik[2] = (int64_t)y % c->Lk;
    } else {
        ik[0] = inj->at[0], ik[1] = inj->at[1], ik[2] = inj->at[2];
        iq[0] = ik[0], iq[1] = ik[1] * g + (int64_t)(x >> 3) % g, iq[2] = (int64_t)y % c->Lq;
    }
    int a = 66, b = 66;
    if (x >> 2 & 1u && c->Dk >= 8) {
        int e = 0;
        while ((int64_t)2 << e <= c->Dk)
            e++; /* floor(log2 Dk) */
        a = (130 - e) / 2;
        b = 130 - e - a;
    }
    const double sign = inj->kind == 3 ? 1.0 : -1.0, other = x >> 1 & 1u ? -1.0 : 1.0;
    c->inf_qv = ldexp(inj->tensor == 0 ? sign : other, a);
    c->inf_kv = ldexp(inj->tensor == 0 ? other : sign, b);
    for (int64_t d = 0; d < c->Dk; d++) {
        tu_set(&c->q.t, iq[0], iq[1], iq[2], d, c->inf_qv);
        tu_set(&c->k.t, ik[0], ik[1], ik[2], d, c->inf_kv);
    }
    c->score_inf = 1;
    c->huge_qk = 1;
}

/* Changes one extent of one tensor after its allocation (rare): every such change breaks an
 * equality between tensors, so the call must fail, without touching the smaller memory. */
static void perturb(fz_case *c, fz_src *s) {
    static const int64_t odd[4] = {0, -1, (int64_t)1 << 31, 65537};
    fz_tensor *const all[5] = {&c->q, &c->k, &c->v, &c->out, &c->lse};
    fz_tensor *f = all[take(s) % (c->lse.used ? 5 : 4)];
    const int d = (int)(take(s) % 4);
    const unsigned how = take(s) % 6;
    const int64_t was = f->t.shape[d];
    const int64_t now = how == 0 ? was + 1 : how == 1 ? was - 1 : odd[how - 2];
    f->t.shape[d] = now;
    f->perturbd = d;
    f->perturbv = now;
    if (f == &c->k && d == 1) {
        /* Hkv +-1 may still divide Hq: legal for sdpa_weights, which would then read k past
         * its memory (the caller's fault). sdpa_forward compares it with v. */
        fz_note_bad(c, FZ_BAD_FWD, "k.shape[1] changed");
        c->skip_weights = 1;
    } else if (f == &c->q || f == &c->k) {
        fz_note_bad(c, FZ_BAD_COMMON, "q or k extent changed");
    } else {
        fz_note_bad(c, FZ_BAD_FWD, "v, out or lse extent changed");
    }
}

/* The NULLs of the rare draw below, by its value: the context, a tensor pointer (whole) or a
 * tensor's data pointer, where that tensor is passed at all. */
static const struct {
    int tensor; /* FZ_Q..., or -1 for the context */
    int whole;
    fz_bad bad;
    const char *why;
} nulls[9] = {
    {-1, 1, FZ_BAD_COMMON, "ctx NULL"},       {FZ_Q, 1, FZ_BAD_COMMON, "q NULL"},
    {FZ_K, 0, FZ_BAD_COMMON, "k.data NULL"},  {FZ_V, 1, FZ_BAD_FWD, "v NULL"},
    {FZ_OUT, 0, FZ_BAD_FWD, "out.data NULL"}, {FZ_OUT, 1, FZ_BAD_FWD, "out NULL"},
    {FZ_LSE, 0, FZ_BAD_FWD, "lse.data NULL"}, {FZ_MASK, 0, FZ_BAD_PARAMS, "mask.data NULL"},
    {FZ_W, 1, FZ_BAD_W, "weights NULL"},
};

/* Points output f into `into` (an input's or the other output's data). A layout drawn
 * misaligned stays misaligned (one byte past), so that the mark fz_alloc_tensor noted for it
 * still holds: aliased onto the aligned data, a misaligned `out` would be valid as the input
 * sdpa_backward reads, which the case would then count as invalid. Nothing is read through
 * it: the call refuses the misalignment or the alias first. */
static void alias_onto(fz_tensor *f, void *into) {
    f->t.data = (char *)into + (f->ly.misalign ? 1 : 0);
    f->alias = 1;
}

/* NULLs, aliasing and wrong extents (rare). */
static void draw_oddities(fz_case *c, fz_src *s) {
    fz_tensor *const all[FZ_N_TENSORS] = {&c->q, &c->k, &c->v, &c->mask, &c->out, &c->lse, &c->w};
    const unsigned odd = take(s);
    if (odd % 64 == 63) {
        const unsigned x = take(s) % 12;
        if (x == 9) {
            c->params_null = 1; /* valid: the defaults */
        } else if (x > 9) {
            perturb(c, s);
        } else if (nulls[x].tensor < 0) {
            c->ctx_null = 1;
            fz_note_bad(c, nulls[x].bad, nulls[x].why);
        } else if (all[nulls[x].tensor]->used) {
            fz_tensor *f = all[nulls[x].tensor];
            if (nulls[x].whole)
                f->null_tensor = 1;
            else
                f->t.data = NULL;
            fz_note_bad(c, nulls[x].bad, nulls[x].why);
        }
    } else if (odd % 64 == 62) {
        /* an output pointing into an input or into the other output */
        const unsigned which = take(s) % 6;
        fz_tensor *victim = which == 1 ? &c->k : which == 2 ? &c->v : &c->q;
        if (which == 3 && c->mask.used)
            victim = &c->mask;
        if (which == 4 && c->lse.used) {
            alias_onto(&c->lse, c->out.t.data);
            fz_note_bad(c, FZ_BAD_OUT, "lse aliases out");
        } else if (which == 5) {
            alias_onto(&c->w, (take(s) & 1u) ? c->q.t.data : c->k.t.data);
            fz_note_bad(c, FZ_BAD_W, "weights alias q or k");
        } else {
            alias_onto(&c->out, victim->t.data);
            fz_note_bad(c, FZ_BAD_OUT, "out aliases an input");
        }
    }
}

void fz_draw_case(fz_case *c, const uint8_t *data, size_t size, int best_isa) {
    fz_src src = {data, data + size};
    fz_src *s = &src;
    memset(c, 0, sizeof *c);
    c->q.name = "q", c->k.name = "k", c->v.name = "v", c->mask.name = "mask";
    c->out.name = "out", c->lse.name = "lse", c->w.name = "w";
    c->dout.name = "dout", c->dq.name = "dq", c->dk.name = "dk", c->dv.name = "dv";
    c->blse.name = "lse (backward)";
    fz_tensor *const all[FZ_N_ALL] = {&c->q, &c->k,    &c->v,  &c->mask, &c->out, &c->lse,
                                      &c->w, &c->dout, &c->dq, &c->dk,   &c->dv,  &c->blse};
    for (int i = 0; i < FZ_N_ALL; i++) {
        all[i]->perturbd = -1;
        all[i]->is_input = i < 4 || i == FZ_DOUT;
    }

    dtypes dt;
    draw_problem(c, s, &dt);
    draw_threads(c, s, best_isa);
    const unsigned long long seed_hi = take16(s), seed_lo = take16(s);
    const unsigned long long seed = seed_hi << 16 | seed_lo;
    tu_rng rng = {seed};
    draw_tensors(c, s, &dt);
    draw_mask(c, s);
    draw_alibi(c, s);
    draw_values(c, s, &rng);
    const int valid_values = fz_fillable(&c->q) && fz_fillable(&c->k) && fz_fillable(&c->v);
    draw_specials(c, s, valid_values, dt.out);
    draw_oddities(c, s);
    draw_score_overflow(c, s);
    if (c->params_null) {
        /* NULL params means the defaults: the case describes what the calls see */
        memset(&c->params, 0, sizeof c->params);
        c->mask.used = 0;
    }
    fz_draw_backward(c, s, &rng);
    fz_draw_kv(c, s);
}

void fz_free_case(fz_case *c) {
    fz_tensor *const all[FZ_N_ALL] = {&c->q, &c->k,    &c->v,  &c->mask, &c->out, &c->lse,
                                      &c->w, &c->dout, &c->dq, &c->dk,   &c->dv,  &c->blse};
    for (int i = 0; i < FZ_N_ALL; i++)
        free(all[i]->buf);
    free(c->slopes_buf);
}
