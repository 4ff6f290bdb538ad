/*
 * fuzz_api_draw.c — the API fuzz target's input turned into a case: shapes, dtypes, layouts,
 * scalar parameters, threads and ISA cap from the input's tail; tensor values from its head
 * (a PRNG seeded from the tail takes over when the head runs out); then, rarely, special
 * values, NULLs, aliasing and extents changed after allocation. Every argument made invalid
 * on purpose is noted with the calls that must refuse it (fz_note_bad).
 *
 * This is the mapping the committed corpus (tests/fuzz/corpus/api) was found through: the
 * order in which bytes are taken is part of it, and so is every expression that takes two
 * bytes at once (their order is the compiler's; keep them as they are).
 */
#include "fuzz_api.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the input, read from both ends ------------------------------------------------------ */

/* A parameter byte; 0 once the input is used up (so a short input means small defaults). */
static unsigned take(fz_src *s) {
    return s->tail > s->head ? *--s->tail : 0u;
}

static unsigned take16(fz_src *s) {
    const unsigned lo = take(s);
    return lo | take(s) << 8;
}

/* A data byte, or -1 once the parameters and the data have met. */
static int data_byte(fz_src *s) {
    return s->head < s->tail ? *s->head++ : -1;
}

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

static fz_layout draw_layout(fz_src *s) {
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
        const float x = ldexpf(1.0f + (float)take(s) / 256.0f, (int)(take(s) % 10) - 7);
        return kind == 7 ? -x : x;
    }
    if (kind < 10) {
        /* a denormal: exponent bits 0, mantissa from the input, never 0 */
        uint32_t m = (take(s) | take(s) << 8 | (take(s) & 0x7fu) << 16);
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
    if (kind < 13)
        return ldexpf(1.0f + (float)take(s) / 256.0f, (int)(take(s) % 8) - 2);
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
static void fill_float(fz_tensor *f, fz_src *s, tu_rng *r, double mag) {
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
    c->q.ly = draw_layout(s);
    c->k.ly = draw_layout(s);
    c->v.ly = draw_layout(s);
    c->out.ly = draw_layout(s);
    fz_alloc_tensor(c, &c->q, dt->q, shq, 0, FZ_BAD_COMMON, FZ_BAD_COMMON, take(s));
    fz_alloc_tensor(c, &c->k, dt->k, shk, 0, FZ_BAD_COMMON, FZ_BAD_COMMON, take(s));
    fz_alloc_tensor(c, &c->v, dt->v, shv, 0, FZ_BAD_FWD, FZ_BAD_FWD, take(s));
    fz_alloc_tensor(c, &c->out, dt->out, sho, 1, FZ_BAD_FWD, FZ_BAD_OUT, take(s));
    if (c->lse.used) {
        c->lse.ly = draw_layout(s);
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
        c->w.ly = draw_layout(s);
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
    c->mask.ly = draw_layout(s);
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
        fill_float(&c->q, s, rng, ldexp(1.0, (int)(mg % 5) - 2));
    if (fz_fillable(&c->k))
        fill_float(&c->k, s, rng, ldexp(1.0, (int)(mg / 5 % 5) - 2));
    if (fz_fillable(&c->v))
        fill_float(&c->v, s, rng, ldexp(1.0, (int)(mg / 25 % 5) - 2));
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

/* ---- the backward (issue 11) ------------------------------------------------------------- */

/* A gradient tensor's dtype: f32/f16/bf16, one time in 64 one no tensor may have. */
static sdpa_dtype draw_grad_dtype(fz_src *s, fz_case *c, const char *why) {
    static const int bad[4] = {SDPA_BOOL, 4, 7, -1};
    const unsigned x = take(s);
    if (x % 64 == 63) {
        fz_note_bad_status(c, FZ_BAD_BWD, why, SDPA_ERR_DTYPE, ".dtype=");
        return (sdpa_dtype)bad[(x >> 6) % 4];
    }
    return (sdpa_dtype)(x % 3);
}

/* draw_layout's, but what would make the tensor invalid (a huge stride, misaligned data; for
 * an output also a stride 0 and overlapping rows) is kept one time in 4 only, so that four
 * tensors more leave most backward calls valid. */
static fz_layout draw_grad_layout(fz_src *s, int output) {
    fz_layout ly = draw_layout(s);
    const int invalid = ly.huge || ly.misalign || (output && (ly.zero || ly.overlap));
    if (invalid && take(s) % 4 != 3) {
        ly.huge = ly.misalign = 0;
        if (output)
            ly.zero = 0, ly.overlap = 0;
    }
    return ly;
}

/* Dropout (sdpa.h, Dropout) for the backward: a drop probability, a seed and an offset; one
 * time in 64 a dropout_p outside [0, 1), which sdpa_backward must refuse. A valid one is used
 * only where the inputs hold no huge value (the injections of kind 3 and 4): with 1 / (1 - p)
 * up to 1000, out (and what the backward reads from it) would pass f16's range. */
static void draw_dropout(fz_case *c, fz_src *s, int calm) {
    const unsigned pb = take(s);
    const uint32_t lo = take16(s);
    const uint32_t sd = lo | (uint32_t)take16(s) << 16;
    uint64_t offset = take16(s);
    if (pb >> 6 & 1u)
        offset = UINT64_MAX - offset; /* offsets near 2^64 wrap in the key */
    const uint64_t seed = (pb >> 7) ? (uint64_t)sd * 0x9E3779B97F4A7C15u : sd;
    float p;
    if (pb % 64 == 63) {
        static const float bad[6] = {1.0f, -0.25f, NAN, 2.0f, INFINITY, -INFINITY};
        p = bad[take(s) % 6];
        if (!c->params_null)
            fz_note_bad_status(c, FZ_BAD_BWD, "dropout_p outside [0, 1)", SDPA_ERR_PARAM,
                               "params.dropout_p=");
    } else if (pb % 64 == 62) {
        /* valid oddities: a drop chance that rounds to 0 in 2^-32 steps, one far below it,
         * nearly all dropped, and -0 (off) */
        static const float odd[4] = {0x1p-34f, 1e-30f, 0.999f, -0.0f};
        p = odd[take(s) % 4];
    } else {
        p = (float)(1 + pb % 62) / 64.0f;
    }
    const int valid = p >= 0.0f && p < 1.0f;
    if (c->params_null || (valid && !calm))
        return;
    c->drop_p = p;
    c->drop_seed = seed;
    c->drop_offset = offset;
    c->drop_set = 1;
    c->dropout = valid && p > 0.0f;
}

/* The backward's arguments made invalid on purpose (rare): a dout of the wrong shape, an lse
 * of the wrong dtype or shape, an output over an input or another output, a NULL. Each alone
 * has one status and a message naming the argument. */
static void draw_backward_oddity(fz_case *c, fz_src *s) {
    const unsigned x = take(s) % 5, y = take(s);
    if (x == 0) {
        /* dout (B, Hq, Lq, Dk) where Dk != Dv: the classic slip; else an extent + 1 */
        const int d = (int)(y % 4);
        const int64_t was = c->dout.t.shape[d];
        const int64_t now = d == 3 && c->Dk != c->Dv ? c->Dk : was + 1;
        c->dout.t.shape[d] = now;
        c->dout.perturbd = d;
        c->dout.perturbv = now;
        fz_note_bad_status(c, FZ_BAD_BWD, "dout of the wrong shape", SDPA_ERR_SHAPE, "dout.shape[");
    } else if (x == 1) {
        c->lse_odd = 1 + (int)(y % 2);
        fz_note_bad_status(c, FZ_BAD_BWD, "lse (backward) not f32", SDPA_ERR_DTYPE, "lse.dtype=");
    } else if (x == 2) {
        c->lse_odd = 3 + (int)(y % 2);
        fz_note_bad_status(c, FZ_BAD_BWD, "lse (backward) of the wrong shape", SDPA_ERR_SHAPE,
                           c->lse_odd == 3 ? "lse.shape[3]" : "lse.shape[2]");
    } else if (x == 3) {
        /* dq over q, k, v, out, lse or dout; dk over dq; dv over dk */
        fz_tensor *lse = c->lse.used ? &c->lse : &c->blse;
        fz_tensor *const victims[8] = {&c->q, &c->k, &c->v, &c->out, lse, &c->dout, &c->dq, &c->dk};
        const unsigned w = y % 8;
        fz_tensor *victim = victims[w], *f = w == 6 ? &c->dk : w == 7 ? &c->dv : &c->dq;
        f->t.data = victim->t.data;
        f->alias = 1;
        const size_t es = sdpa_dtype_size(f->t.dtype);
        /* misaligned for f's dtype, it is refused for that first (SDPA_ERR_PARAM) */
        const int aligned = es != 0 && (uintptr_t)f->t.data % es == 0;
        fz_note_bad_status(c, FZ_BAD_BWD, "a gradient over an input or another gradient",
                           aligned ? SDPA_ERR_ALIAS : SDPA_OK, f->name);
    } else {
        static const char *const what[4] = {"dout is NULL", "dq.data is NULL", "dk is NULL",
                                            "dv.data is NULL"};
        fz_tensor *const t[4] = {&c->dout, &c->dq, &c->dk, &c->dv};
        const unsigned w = y % 4;
        if (w % 2 == 0)
            t[w]->null_tensor = 1;
        else
            t[w]->t.data = NULL;
        fz_note_bad_status(c, FZ_BAD_BWD, what[w], SDPA_ERR_NULL, what[w]);
    }
}

/* The backward's arguments, drawn after everything else, so that an input found before keeps
 * its meaning for sdpa_forward and sdpa_weights except where it had bytes left over (a valid
 * dropout changes the forward too): an input used up (take gives 0) draws f32 dout and
 * gradients in contiguous (B, H, L, D) layouts, no dropout and nothing invalid. The values of
 * dout come from the head of the input, then from the PRNG, like q's, k's and v's. */
static void draw_backward(fz_case *c, fz_src *s, tu_rng *rng) {
    const size_t before = (size_t)(s->tail - s->head);
    const int64_t sho[4] = {c->B, c->Hq, c->Lq, c->Dv}, shq[4] = {c->B, c->Hq, c->Lq, c->Dk};
    const int64_t shk[4] = {c->B, c->Hkv, c->Lk, c->Dk}, shv[4] = {c->B, c->Hkv, c->Lk, c->Dv};
    const int64_t shl[4] = {c->B, c->Hq, c->Lq, 1};
    fz_tensor *const t[4] = {&c->dout, &c->dq, &c->dk, &c->dv};
    const int64_t *const sh[4] = {sho, shq, shk, shv};
    static const char *const bad_dt[4] = {"dout dtype invalid", "dq dtype invalid",
                                          "dk dtype invalid", "dv dtype invalid"};
    const unsigned bk = take(s);
    for (int n = 0; n < 4; n++) {
        const sdpa_dtype dt = draw_grad_dtype(s, c, bad_dt[n]);
        t[n]->ly = draw_grad_layout(s, n > 0);
        t[n]->used = 1;
        fz_alloc_tensor(c, t[n], dt, sh[n], n > 0, FZ_BAD_BWD, FZ_BAD_BWD, take(s));
    }
    if (!c->lse.used) {
        c->blse.used = 1;
        fz_alloc_tensor(c, &c->blse, SDPA_F32, shl, 1, FZ_BAD_BWD, FZ_BAD_BWD, 0);
        fz_fill_canary(&c->blse); /* defined bytes until a forward writes it */
    }

    /* dout's values: its gaps NaN, as the inputs' */
    const unsigned mg = take(s);
    memset(c->dout.buf, 0xFF, c->dout.bytes);
    if (fz_fillable(&c->dout))
        fill_float(&c->dout, s, rng, ldexp(1.0, (int)(mg % 5) - 2));

    /* dropout one time in 4, in the calm cases only (see draw_dropout) */
    if ((bk & 3u) == 3) {
        int calm = !c->huge_qk && !c->huge_v;
        for (int n = 0; n < c->n_inj; n++)
            calm &= c->inj[n].kind < 3 || c->inj[n].tensor == 3;
        draw_dropout(c, s, calm);
    }

    /* NaN or +-Inf in dout (1 time in 8) */
    if ((bk >> 2 & 7u) == 7 && fz_fillable(&c->dout)) {
        static const double val[3] = {NAN, INFINITY, -INFINITY};
        const double x = val[take(s) % 3];
        int64_t flat = (int64_t)take16(s);
        for (int i = 3; i >= 0; i--) {
            c->dout_inj[i] = flat % c->dout.t.shape[i];
            flat /= c->dout.t.shape[i];
        }
        tu_set(&c->dout.t, c->dout_inj[0], c->dout_inj[1], c->dout_inj[2], c->dout_inj[3], x);
        c->dout_nonfinite = 1;
    }

    if (take(s) % 16 == 15)
        draw_backward_oddity(c, s);
    c->bwd_bytes = before - (size_t)(s->tail - s->head);
}

/* ---- the KV cache (issue 13) ------------------------------------------------------------- */

/* How sdpa_forward_kv is called on the case (fuzz_api_kv.c), drawn after everything else, so
 * that an input found before keeps its meaning; one that is used up (take gives 0) makes no
 * KV call. Three times in four otherwise: a page size (0: the plain layout; 1, 2, 5, 16, 64,
 * 256), the pool's order, spare pages and extra block-table entries, the lengths (seqlens_k in
 * [0, Lk], seqlens_q in [0, Lq], each full one time in 4; NULL one time in 4), one time in 4
 * sinks (-8..8, -inf one time in 256; only with params), and one time in 16 a length or an
 * entry made invalid, or an entry no length reads made out of range (which is valid). */
static void draw_kv(fz_case *c, fz_src *s) {
    const size_t before = (size_t)(s->tail - s->head);
    const unsigned x = take(s);
    if (x % 4 != 0 && c->B <= 3 && c->Hq <= 16) {
        static const int64_t pages[8] = {0, 0, 1, 2, 5, 16, 64, 256};
        c->kv = 1;
        c->kv_page = pages[x >> 2 & 7u];
        c->kv_blhd = x >> 5 & 1u;
        c->kv_no_sk = (x >> 6) == 3;
        const unsigned y = take(s);
        c->kv_spare = (int)(y & 3u);
        c->kv_more = y >> 2 & 1u;
        c->kv_no_sq = (y >> 3 & 3u) == 3;
        for (int64_t b = 0; b < c->B; b++) {
            const unsigned u = take(s), w = take(s);
            c->kv_sk[b] = (int32_t)(u >= 192 ? c->Lk : (int64_t)u % (c->Lk + 1));
            c->kv_sq[b] = (int32_t)(w >= 192 ? c->Lq : (int64_t)w % (c->Lq + 1));
        }
        const unsigned z = take(s);
        if (z % 4 == 3 && !c->params_null) {
            c->kv_sinks = 1;
            for (int64_t h = 0; h < c->Hq; h++) {
                const unsigned w = take(s);
                c->kv_sink[h] = w == 255 ? -INFINITY : ((float)w - 128.0f) / 16.0f;
            }
        }
        const unsigned bad = take(s);
        if (bad % 16 == 15) {
            c->kv_bad = 1 + (int)((bad >> 4) % 7);
            c->kv_bad_at = take(s);
        }
        c->kv_seed = take16(s);
    }
    c->kv_bytes = before - (size_t)(s->tail - s->head);
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
    const unsigned long long seed = (unsigned long long)take16(s) << 16 | take16(s);
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
    draw_backward(c, s, &rng);
    draw_kv(c, s);
}

void fz_free_case(fz_case *c) {
    fz_tensor *const all[FZ_N_ALL] = {&c->q, &c->k,    &c->v,  &c->mask, &c->out, &c->lse,
                                      &c->w, &c->dout, &c->dq, &c->dk,   &c->dv,  &c->blse};
    for (int i = 0; i < FZ_N_ALL; i++)
        free(all[i]->buf);
    free(c->slopes_buf);
}
