/*
 * test_semantics.c — the contract of sdpa.h, case by case, against the independent naive
 * implementation in testutil.c (materialised S and P, in double). Both implement the
 * semantics from the header's text, separately: masks of every kind and broadcast shape,
 * causal in both alignments, sliding windows, ALiBi, softcap, GQA/MQA, Dk != Dv, Lq != Lk,
 * custom scales, f32/f16/bf16 storage, layouts and strides, fully masked rows and NaN.
 *
 * The check is elementwise: the library's output, rounded once from double to its dtype, must
 * be within one unit in the last place of the naive double result (both compute in double,
 * so anything more is a semantic difference, not rounding).
 */
#include "check.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum mask_kind { MASK_NONE, MASK_BOOL, MASK_F32, MASK_F16, MASK_BF16 };

typedef struct sem_case {
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    sdpa_dtype dt;    /* q, k, v, out */
    sdpa_dtype kv_dt; /* k, v when mixed (else = dt) */
    tu_layout layout;
    int64_t pad, offset; /* row padding and base offset of every tensor */
    sdpa_params params;  /* mask and alibi filled by run_case */
    int mask;            /* enum mask_kind */
    int bcast;           /* bit i: mask extent i is 1 */
    double mask_hole;    /* probability that a mask entry hides its key */
    int alibi;
    double q_scale, k_scale, shift;
    int lp_f32; /* the baseline keeps scores in f32 (values whose products overflow the dtype) */
    uint64_t seed;
} sem_case;

static sem_case base_case(int64_t lq, int64_t lk, int64_t d) {
    sem_case c;
    memset(&c, 0, sizeof c);
    c.B = 1;
    c.Hq = c.Hkv = 2;
    c.Lq = lq;
    c.Lk = lk;
    c.Dk = c.Dv = d;
    c.dt = c.kv_dt = SDPA_F32;
    c.mask_hole = 0.3;
    c.q_scale = c.k_scale = 1.0;
    c.seed = 1;
    return c;
}

/* Relative size of one unit in the last place of a dtype. */
static double ulp_rel(sdpa_dtype dt) {
    return dt == SDPA_F32 ? 0x1p-23 : dt == SDPA_F16 ? 0x1p-10 : 0x1p-7;
}

/* Smallest subnormal of a dtype: absolute slack near zero. */
static double tiny(sdpa_dtype dt) {
    return dt == SDPA_F32 ? 0x1p-149 : dt == SDPA_F16 ? 0x1p-24 : 0x1p-133;
}

/* Elementwise: same non-finite positions; |x - g| <= ulp(g) otherwise. Prints the worst. */
static int close_enough(const char *what, const double *x, const double *g, size_t n,
                        sdpa_dtype dt) {
    double worst = 0.0;
    size_t bad = 0, at = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(g[i]) || !isfinite(x[i])) {
            if (!((isnan(g[i]) && isnan(x[i])) || g[i] == x[i])) {
                bad++;
                at = i;
            }
            continue;
        }
        const double e = fabs(x[i] - g[i]) / (ulp_rel(dt) * fabs(g[i]) + tiny(dt));
        if (e > worst) {
            worst = e;
            if (e > 1.0) {
                bad++;
                at = i;
            }
        }
    }
    if (bad)
        printf("    %s: %zu mismatches, e.g. [%zu] %.9g vs %.9g (worst %.2f ulp)\n", what, bad, at,
               x[at], g[at], worst);
    return bad == 0;
}

/* Fully masked rows (LSE -inf in the naive result) must be exactly +-0 in every column. */
static int masked_rows_exact(const double *got, const double *want_lse, size_t n_lse, int64_t dv) {
    for (size_t row = 0; row < n_lse; row++)
        if (want_lse[row] == -INFINITY)
            for (int64_t d = 0; d < dv; d++)
                if (got[row * (size_t)dv + (size_t)d] != 0.0)
                    return 0;
    return 1;
}

/* Runs one case: the reference against the naive double implementation (to an ulp), then
 * sdpa_forward at every ISA level the CPU has against the rule. @return 1 if all agree. */
static int run_case(const char *name, const sem_case *c) {
    tu_rng r = {c->seed};
    tu_tensor q = tu_alloc(c->dt, c->B, c->Hq, c->Lq, c->Dk, c->layout, c->pad, c->offset);
    tu_tensor k = tu_alloc(c->kv_dt, c->B, c->Hkv, c->Lk, c->Dk, c->layout, c->pad, c->offset);
    tu_tensor v = tu_alloc(c->kv_dt, c->B, c->Hkv, c->Lk, c->Dv, c->layout, c->pad, c->offset);
    tu_tensor o = tu_alloc(c->dt, c->B, c->Hq, c->Lq, c->Dv, c->layout, c->pad, c->offset);
    tu_tensor l = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, 1, TU_BHLD, 0, 0);
    tu_fill_randn(&q, &r, c->q_scale, c->shift);
    tu_fill_randn(&k, &r, c->k_scale, c->shift);
    tu_fill_randn(&v, &r, 1.0, 0.0);

    sdpa_params p = c->params;
    tu_tensor m = {0};
    if (c->mask != MASK_NONE) {
        static const sdpa_dtype mdt[] = {SDPA_BOOL, SDPA_BOOL, SDPA_F32, SDPA_F16, SDPA_BF16};
        const int64_t e[4] = {(c->bcast & 1) ? 1 : c->B, (c->bcast & 2) ? 1 : c->Hq,
                              (c->bcast & 4) ? 1 : c->Lq, (c->bcast & 8) ? 1 : c->Lk};
        m = tu_alloc(mdt[c->mask], e[0], e[1], e[2], e[3], TU_BHLD, 0, 0);
        for (int64_t a = 0; a < e[0]; a++)
            for (int64_t b = 0; b < e[1]; b++)
                for (int64_t i = 0; i < e[2]; i++)
                    for (int64_t j = 0; j < e[3]; j++) {
                        const int hole = tu_uniform(&r) < c->mask_hole;
                        const double add = hole ? -INFINITY : tu_randn(&r);
                        tu_set(&m.t, a, b, i, j, c->mask == MASK_BOOL ? !hole : add);
                    }
        /* extents of 1 may carry any stride: make it a strange one */
        for (int d = 0; d < 4; d++)
            if (e[d] == 1)
                m.t.stride[d] = 12345;
        p.mask = &m.t;
    }
    float *slopes = NULL;
    if (c->alibi) {
        slopes = malloc((size_t)c->Hq * sizeof *slopes);
        for (int64_t h = 0; h < c->Hq; h++)
            slopes[h] = (float)pow(2.0, -8.0 * (double)(h + 1) / (double)c->Hq);
        p.alibi_slopes = slopes;
    }

    const size_t n_out = (size_t)(c->B * c->Hq * c->Lq * c->Dv);
    const size_t n_lse = (size_t)(c->B * c->Hq * c->Lq);
    double *want = malloc(n_out * sizeof *want), *want_lse = malloc(n_lse * sizeof *want_lse);
    double *lp = malloc(n_out * sizeof *lp), *lp_lse = malloc(n_lse * sizeof *lp_lse);
    tu_naive_forward(&q.t, &k.t, &v.t, &p, -1, want, want_lse);
    tu_naive_forward(&q.t, &k.t, &v.t, &p, c->lp_f32 ? (int)SDPA_F32 : (int)c->dt, lp, lp_lse);

    /* 1. the reference, called directly, within an ulp of the naive double result */
    sdpa_ctx *ctx = tu_ctx(0, SDPA_ISA_AUTO);
    sdpa_status st = tu_golden_forward(ctx, &q.t, &k.t, &v.t, &p, &o.t, &l.t);
    int ok = st == SDPA_OK;
    if (!ok)
        printf("    %s: status %s: %s\n", name, sdpa_status_name(st), sdpa_ctx_last_error(ctx));
    if (ok) {
        double *got = tu_to_doubles(&o.t), *got_lse = tu_to_doubles(&l.t);
        ok = close_enough("out", got, want, n_out, c->dt) &&
             close_enough("lse", got_lse, want_lse, n_lse, SDPA_F32) &&
             masked_rows_exact(got, want_lse, n_lse, c->Dv);
        free(got);
        free(got_lse);
    }
    printf("    %-60s reference %s\n", name, ok ? "ok" : "MISMATCH");

    /* 2. every ISA level the CPU has, through the public API, by testing.md's rule with the
     * naive double result as golden and the same-precision naive result as baseline */
    sdpa_ctx_destroy(ctx);
    tu_impl impls[TU_MAX_IMPLS];
    const int n_impls = tu_impls(impls);
    for (int t = 0; t < n_impls; t++) {
        /* (said once, by tu_report_impls in main: what the CPU lacks, what a table leaves to
         * the one below it) */
        if (!impls[t].runs || !tu_impl_takes(&impls[t], &q.t, &k.t, &v.t, &p, &o.t))
            continue;
        const char *isa = impls[t].name;
        ctx = tu_ctx(0, impls[t].level);
        tu_fill_canary(&o);
        st = sdpa_forward(ctx, &q.t, &k.t, &v.t, &p, &o.t, &l.t);
        CHECK_MSG(st != SDPA_OK || strcmp(sdpa_ctx_last_kernel(ctx), isa) == 0,
                  "%s: ran %s, not %s", name, sdpa_ctx_last_kernel(ctx), isa);
        if (st != SDPA_OK) {
            printf("    %s [%s]: status %s: %s\n", name, isa, sdpa_status_name(st),
                   sdpa_ctx_last_error(ctx));
            ok = 0;
        } else {
            double *got = tu_to_doubles(&o.t), *got_lse = tu_to_doubles(&l.t);
            const double kf = c->dt == SDPA_F32 ? 3.0 : 2.0;
            const double gate = c->dt == SDPA_F32 ? 1e-10 : c->dt == SDPA_F16 ? 1e-6 : 5e-5;
            char what[96];
            snprintf(what, sizeof what, "[%s] out", isa);
            const int good_out = tu_rule(what, got, lp, want, n_out, c->dt, kf, gate);
            snprintf(what, sizeof what, "[%s] lse", isa);
            const int good_lse = tu_rule(what, got_lse, lp_lse, want_lse, n_lse, SDPA_F32, 3.0, 0);
            const int good_rows = masked_rows_exact(got, want_lse, n_lse, c->Dv);
            if (!(good_out && good_lse && good_rows)) {
                printf("    %-60s [%s] FAILS THE RULE\n", name, isa);
                ok = 0;
            }
            free(got);
            free(got_lse);
        }
        sdpa_ctx_destroy(ctx);
    }
    free(want);
    free(want_lse);
    free(lp);
    free(lp_lse);
    free(slopes);
    tu_free(&q);
    tu_free(&k);
    tu_free(&v);
    tu_free(&o);
    tu_free(&l);
    tu_free(&m);
    return ok;
}

static void test_head_dims(void) {
    static const int64_t dk[] = {1,  2,  3,  7,  8,  9,   15,  16,  17,  31,  32,  33,  59,
                                 63, 64, 65, 80, 96, 111, 127, 128, 129, 160, 192, 203, 256};
    for (size_t n = 0; n < sizeof dk / sizeof dk[0]; n++) {
        sem_case c = base_case(9, 13, dk[n]);
        c.seed = (uint64_t)n;
        char name[64];
        snprintf(name, sizeof name, "Dk=Dv=%lld", (long long)dk[n]);
        CHECK(run_case(name, &c));
    }
    static const int64_t pairs[][2] = {{64, 32}, {32, 128}, {128, 64}, {192, 128},
                                       {17, 33}, {256, 1},  {1, 256}};
    for (size_t n = 0; n < sizeof pairs / sizeof pairs[0]; n++) {
        sem_case c = base_case(7, 11, pairs[n][0]);
        c.Dv = pairs[n][1];
        char name[64];
        snprintf(name, sizeof name, "Dk=%lld Dv=%lld", (long long)pairs[n][0],
                 (long long)pairs[n][1]);
        CHECK(run_case(name, &c));
    }
}

static void test_lengths(void) {
    static const int64_t lens[][2] = {{1, 1},     {1, 2},     {2, 1},    {1, 239},  {239, 1},
                                      {3, 799},   {799, 3},   {17, 127}, {127, 17}, {113, 203},
                                      {127, 513}, {129, 129}, {63, 65},  {267, 514}};
    for (size_t n = 0; n < sizeof lens / sizeof lens[0]; n++) {
        for (int causal = 0; causal < 2; causal++) {
            sem_case c = base_case(lens[n][0], lens[n][1], 16);
            c.Hq = c.Hkv = 1;
            c.params.causal = causal;
            c.params.align = n % 2 ? SDPA_ALIGN_BOTTOM_RIGHT : SDPA_ALIGN_TOP_LEFT;
            char name[80];
            snprintf(name, sizeof name, "Lq=%lld Lk=%lld causal=%d align=%d", (long long)lens[n][0],
                     (long long)lens[n][1], causal, (int)c.params.align);
            CHECK(run_case(name, &c));
        }
    }
}

static void test_heads_and_batch(void) {
    static const int64_t heads[][2] = {{1, 1}, {6, 6}, {6, 2}, {6, 1}, {8, 2}, {12, 4}, {32, 8}};
    for (size_t n = 0; n < sizeof heads / sizeof heads[0]; n++) {
        for (int64_t b = 1; b <= 3; b++) {
            sem_case c = base_case(5, 6, 8);
            c.B = b;
            c.Hq = heads[n][0];
            c.Hkv = heads[n][1];
            c.alibi = (int)(n % 2);
            char name[80];
            snprintf(name, sizeof name, "B=%lld Hq=%lld Hkv=%lld alibi=%d", (long long)b,
                     (long long)c.Hq, (long long)c.Hkv, c.alibi);
            CHECK(run_case(name, &c));
        }
    }
}

/* Every mask kind at every broadcast shape [B|1] x [Hq|1] x [Lq|1] x [Lk|1]. */
static void test_masks(void) {
    static const char *const kinds[] = {"", "bool", "f32", "f16", "bf16"};
    for (int kind = MASK_BOOL; kind <= MASK_BF16; kind++) {
        for (int bcast = 0; bcast < 16; bcast++) {
            sem_case c = base_case(6, 9, 8);
            c.B = 2;
            c.Hq = 3;
            c.Hkv = 1;
            c.mask = kind;
            c.bcast = bcast;
            c.seed = (uint64_t)(kind * 16 + bcast);
            char name[80];
            snprintf(name, sizeof name, "mask %s shape %s,%s,%s,%s", kinds[kind],
                     bcast & 1 ? "1" : "B", bcast & 2 ? "1" : "Hq", bcast & 4 ? "1" : "Lq",
                     bcast & 8 ? "1" : "Lk");
            CHECK(run_case(name, &c));
        }
    }
    /* finite -1e9 instead of -inf: hides nothing by rule, but weighs ~0 */
    sem_case c = base_case(8, 8, 4);
    c.mask = MASK_F32;
    c.mask_hole = 0.0;
    CHECK(run_case("additive mask without holes", &c));
}

static void test_causal_and_windows(void) {
    static const int64_t lens[][2] = {{5, 12}, {9, 9}, {12, 5}};
    static const int64_t windows[][2] = {{-1, -1}, {0, 0},     {2, 0},  {0, 3},
                                         {5, 5},   {100, 100}, {-1, 2}, {3, -1}};
    for (size_t n = 0; n < 3; n++)
        for (int align = 0; align < 2; align++)
            for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++)
                for (int causal = 0; causal < 2; causal++) {
                    sem_case c = base_case(lens[n][0], lens[n][1], 8);
                    c.params.align = (sdpa_align)align;
                    c.params.causal = causal;
                    c.params.use_window = 1;
                    c.params.window_left = windows[w][0];
                    c.params.window_right = windows[w][1];
                    c.alibi = (int)(w % 3 == 1);
                    c.Hq = w % 2 ? 6 : 2; /* GQA groups of 3 on odd windows */
                    char name[96];
                    snprintf(name, sizeof name,
                             "Lq=%lld Lk=%lld align=%d window=(%lld,%lld) causal=%d",
                             (long long)c.Lq, (long long)c.Lk, align, (long long)windows[w][0],
                             (long long)windows[w][1], causal);
                    CHECK(run_case(name, &c));
                }
}

static void test_softcap_scale_alibi(void) {
    static const float caps[] = {0.5f, 5.0f, 30.0f};
    static const float scales[] = {0.0f, 1.0f, -0.3f, 1e-30f, 3.0f};
    for (size_t a = 0; a < 3; a++)
        for (size_t s = 0; s < 5; s++) {
            sem_case c = base_case(7, 10, 16);
            c.params.softcap = caps[a];
            c.params.scale = scales[s];
            c.alibi = (int)(s % 2);
            c.mask = s >= 3 ? MASK_F32 : MASK_NONE; /* s == 3: mask and ALiBi together */
            c.q_scale = 5.0;
            char name[80];
            snprintf(name, sizeof name, "softcap=%g scale=%g alibi=%d", (double)caps[a],
                     (double)scales[s], c.alibi);
            CHECK(run_case(name, &c));
        }
}

static void test_dtypes_and_inputs(void) {
    static const sdpa_dtype dts[] = {SDPA_F32, SDPA_F16, SDPA_BF16};
    static const char *const names[] = {"f32", "f16", "bf16"};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            sem_case c = base_case(9, 17, 24);
            c.dt = dts[a];
            c.kv_dt = dts[b];
            c.mask = MASK_BOOL;
            c.params.causal = 1;
            char name[64];
            snprintf(name, sizeof name, "q/out %s, k/v %s", names[a], names[b]);
            CHECK(run_case(name, &c));
        }
    sem_case c = base_case(11, 13, 32);
    c.q_scale = 5.0;
    c.k_scale = 3.0; /* peaky softmax */
    CHECK(run_case("peaky: q x5, k x3", &c));
    c = base_case(11, 13, 32);
    c.q_scale = c.k_scale = 0.0;
    c.shift = 0.5; /* constant rows: uniform weights */
    CHECK(run_case("constant rows", &c));
    c = base_case(6, 7, 16);
    c.dt = c.kv_dt = SDPA_F16;
    c.q_scale = c.k_scale = 0.0;
    c.shift = 65504.0; /* f16 max: scores ~1.7e10 must live in wide floats, no NaN; a
                        * baseline rounding them to f16 would overflow, so it keeps f32 */
    c.lp_f32 = 1;
    CHECK(run_case("f16 inputs at 65504", &c));
    c.dt = c.kv_dt = SDPA_BF16;
    c.shift = 133120.0;
    CHECK(run_case("bf16 inputs at 133120", &c));
}

/* (B, L, H, D) layout, padded rows, odd base offsets: the same bits as contiguous. */
static void test_layouts(void) {
    static const struct {
        tu_layout layout;
        int64_t pad, offset;
        const char *name;
    } ls[] = {{TU_BLHD, 0, 0, "BLHD"},
              {TU_BHLD, 5, 0, "row stride D+5"},
              {TU_BHLD, 0, 3, "odd base offset"},
              {TU_BLHD, 3, 1, "BLHD, padded, offset"}};
    for (size_t n = 0; n < sizeof ls / sizeof ls[0]; n++)
        for (int d = 0; d < 3; d++) {
            const sdpa_dtype dt = d == 0 ? SDPA_F32 : d == 1 ? SDPA_F16 : SDPA_BF16;
            sem_case c = base_case(9, 14, 12);
            c.B = 2;
            c.Hq = 4;
            c.dt = c.kv_dt = dt;
            c.layout = ls[n].layout;
            c.pad = ls[n].pad;
            c.offset = ls[n].offset;
            c.mask = MASK_F16;
            char name[64];
            snprintf(name, sizeof name, "%s %s", ls[n].name, sdpa_dtype_name(dt));
            CHECK(run_case(name, &c));
        }
}

/* Stride 0 on B and H of K/V (one head broadcast everywhere) gives the bits of the same
 * values copied out. */
static void test_stride_zero_inputs(void) {
    enum { B = 2, H = 3, L = 5, D = 4 };
    tu_rng r = {7};
    tu_tensor q = tu_alloc(SDPA_F32, B, H, L, D, TU_BHLD, 0, 0);
    tu_tensor k1 = tu_alloc(SDPA_F32, 1, 1, L, D, TU_BHLD, 0, 0);
    tu_tensor v1 = tu_alloc(SDPA_F32, 1, 1, L, D, TU_BHLD, 0, 0);
    tu_tensor kf = tu_alloc(SDPA_F32, B, H, L, D, TU_BHLD, 0, 0);
    tu_tensor vf = tu_alloc(SDPA_F32, B, H, L, D, TU_BHLD, 0, 0);
    tu_tensor o1 = tu_alloc(SDPA_F32, B, H, L, D, TU_BHLD, 0, 0);
    tu_tensor o2 = tu_alloc(SDPA_F32, B, H, L, D, TU_BHLD, 0, 0);
    tu_fill_randn(&q, &r, 1, 0);
    tu_fill_randn(&k1, &r, 1, 0);
    tu_fill_randn(&v1, &r, 1, 0);
    /* k1 and v1 seen as (B, H, L, D) with stride 0 on B and H, and copied out into kf, vf */
    sdpa_tensor kb = k1.t, vb = v1.t;
    kb.shape[0] = vb.shape[0] = B;
    kb.shape[1] = vb.shape[1] = H;
    kb.stride[0] = kb.stride[1] = vb.stride[0] = vb.stride[1] = 0;
    tu_copy(&kf.t, &kb);
    tu_copy(&vf.t, &vb);
    sdpa_ctx *ctx = tu_ctx(0, SDPA_ISA_AUTO);
    CHECK_INT_EQ(sdpa_forward(ctx, &q.t, &kb, &vb, NULL, &o1.t, NULL), SDPA_OK);
    CHECK_INT_EQ(sdpa_forward(ctx, &q.t, &kf.t, &vf.t, NULL, &o2.t, NULL), SDPA_OK);
    CHECK(memcmp(o1.buf, o2.buf, o1.bytes) == 0);
    /* negative strides: K and V read back to front equal the reversed copies (krev and vrev
     * hold the rows of kf and vf last to first, written through the reversed views) */
    tu_tensor krev = tu_alloc(SDPA_F32, B, H, L, D, TU_BHLD, 0, 0);
    tu_tensor vrev = tu_alloc(SDPA_F32, B, H, L, D, TU_BHLD, 0, 0);
    sdpa_tensor kr = krev.t, vr = vrev.t;
    kr.data = (float *)krev.t.data + (L - 1) * D;
    vr.data = (float *)vrev.t.data + (L - 1) * D;
    kr.stride[2] = vr.stride[2] = -D;
    tu_copy(&kr, &kf.t);
    tu_copy(&vr, &vf.t);
    CHECK_INT_EQ(sdpa_forward(ctx, &q.t, &kr, &vr, NULL, &o1.t, NULL), SDPA_OK);
    CHECK(memcmp(o1.buf, o2.buf, o1.bytes) == 0);
    sdpa_ctx_destroy(ctx);
    tu_free(&q);
    tu_free(&k1);
    tu_free(&v1);
    tu_free(&kf);
    tu_free(&vf);
    tu_free(&o1);
    tu_free(&o2);
    tu_free(&krev);
    tu_free(&vrev);
}

/* Rows with no visible key: O = 0 exactly, LSE = -inf, never NaN. run_case checks exact
 * zeros wherever the naive LSE is -inf. */
static void test_fully_masked_rows(void) {
    sem_case br = base_case(10, 4, 8);
    br.params.causal = 1;
    br.params.align = SDPA_ALIGN_BOTTOM_RIGHT;
    CHECK(run_case("bottom-right causal, Lq > Lk", &br));

    sem_case w = base_case(10, 4, 8);
    w.params.use_window = 1;
    w.params.window_left = 0;
    w.params.window_right = 0;
    CHECK(run_case("window excluding all keys of rows 4..9", &w));

    /* an explicit check with a mask whose 4th rows and one row are all -inf */
    enum { L = 8, D = 4 };
    tu_rng r = {11};
    tu_problem pb = tu_problem_new((tu_dims){1, 1, 1, L, L, D, D}, &r);
    tu_tensor m = tu_alloc(SDPA_F32, 1, 1, L, L, TU_BHLD, 0, 0);
    tu_tensor mb = tu_alloc(SDPA_BOOL, 1, 1, L, L, TU_BHLD, 0, 0);
    for (int i = 0; i < L; i++)
        for (int j = 0; j < L; j++) {
            tu_set(&m.t, 0, 0, i, j, i == 5 ? -INFINITY : 0.0);
            tu_set(&mb.t, 0, 0, i, j, i % 4 != 0);
        }
    sdpa_ctx *ctx = tu_ctx(0, SDPA_ISA_AUTO);
    pb.p.mask = &m.t;
    CHECK_INT_EQ(tu_problem_forward(ctx, &pb), SDPA_OK);
    for (int i = 0; i < L; i++) {
        const double li = tu_get(&pb.lse.t, 0, 0, i, 0);
        CHECK(i == 5 ? li == -INFINITY : isfinite(li));
        for (int d = 0; d < D; d++)
            CHECK(i == 5 ? tu_get(&pb.o.t, 0, 0, i, d) == 0.0
                         : isfinite(tu_get(&pb.o.t, 0, 0, i, d)));
    }
    pb.p.mask = &mb.t;
    CHECK_INT_EQ(tu_problem_forward(ctx, &pb), SDPA_OK);
    for (int i = 0; i < L; i++) {
        CHECK((i % 4 == 0) == (tu_get(&pb.lse.t, 0, 0, i, 0) == -INFINITY));
        for (int d = 0; d < D; d++)
            CHECK(i % 4 == 0 ? tu_get(&pb.o.t, 0, 0, i, d) == 0.0
                             : isfinite(tu_get(&pb.o.t, 0, 0, i, d)));
    }
    sdpa_ctx_destroy(ctx);
    tu_problem_free(&pb);
    tu_free(&m);
    tu_free(&mb);
}

/* NaN goes exactly where it can be seen (causal top-left, L = 6, D = 4). */
static void test_nan_policy(void) {
    enum { L = 6, D = 4 };
    tu_rng r = {5};
    tu_problem pb = tu_problem_new((tu_dims){1, 1, 1, L, L, D, D}, &r);
    sdpa_ctx *ctx = tu_ctx(0, SDPA_ISA_AUTO);
    pb.p.causal = 1;

    /* NaN in query row 2: only row 2 is NaN (all columns, and its LSE). */
    tu_set(&pb.q.t, 0, 0, 2, 1, NAN);
    CHECK_INT_EQ(tu_problem_forward(ctx, &pb), SDPA_OK);
    for (int i = 0; i < L; i++) {
        CHECK((i == 2) == (isnan(tu_get(&pb.lse.t, 0, 0, i, 0)) != 0));
        for (int d = 0; d < D; d++)
            CHECK((i == 2) == (isnan(tu_get(&pb.o.t, 0, 0, i, d)) != 0));
    }
    /* NaN in key row 3: rows 3..5 see it (causal) and are NaN; rows 0..2 stay finite. */
    tu_fill_randn(&pb.q, &r, 1, 0);
    tu_set(&pb.k.t, 0, 0, 3, 0, NAN);
    CHECK_INT_EQ(tu_problem_forward(ctx, &pb), SDPA_OK);
    for (int i = 0; i < L; i++)
        for (int d = 0; d < D; d++)
            CHECK((i >= 3) == (isnan(tu_get(&pb.o.t, 0, 0, i, d)) != 0));
    /* NaN in value row 4, column 1: exactly O[4.., 1] is NaN. */
    tu_fill_randn(&pb.k, &r, 1, 0);
    tu_set(&pb.v.t, 0, 0, 4, 1, NAN);
    CHECK_INT_EQ(tu_problem_forward(ctx, &pb), SDPA_OK);
    for (int i = 0; i < L; i++) {
        CHECK(isfinite(tu_get(&pb.lse.t, 0, 0, i, 0)));
        for (int d = 0; d < D; d++)
            CHECK((i >= 4 && d == 1) == (isnan(tu_get(&pb.o.t, 0, 0, i, d)) != 0));
    }
    /* Inf and NaN in K and V of a key hidden by a bool mask: no effect at all. */
    tu_fill_randn(&pb.v, &r, 1, 0);
    tu_tensor m = tu_alloc(SDPA_BOOL, 1, 1, 1, L, TU_BHLD, 0, 0);
    for (int j = 0; j < L; j++)
        tu_set(&m.t, 0, 0, 0, j, j != 0);
    tu_set(&pb.k.t, 0, 0, 0, 2, INFINITY);
    tu_set(&pb.v.t, 0, 0, 0, 3, NAN);
    pb.p.causal = 0;
    pb.p.mask = &m.t;
    CHECK_INT_EQ(tu_problem_forward(ctx, &pb), SDPA_OK);
    for (int i = 0; i < L; i++)
        for (int d = 0; d < D; d++)
            CHECK(isfinite(tu_get(&pb.o.t, 0, 0, i, d)));
    /* A +inf or NaN additive bias makes its row NaN; -inf hides. */
    tu_set(&pb.k.t, 0, 0, 0, 2, 0.5);
    tu_set(&pb.v.t, 0, 0, 0, 3, 0.5);
    tu_tensor a = tu_alloc(SDPA_F32, 1, 1, L, L, TU_BHLD, 0, 0);
    tu_set(&a.t, 0, 0, 1, 2, INFINITY);
    tu_set(&a.t, 0, 0, 3, 0, NAN);
    tu_set(&a.t, 0, 0, 4, 4, -INFINITY);
    pb.p.mask = &a.t;
    CHECK_INT_EQ(tu_problem_forward(ctx, &pb), SDPA_OK);
    for (int i = 0; i < L; i++)
        CHECK((i == 1 || i == 3) == (isnan(tu_get(&pb.o.t, 0, 0, i, 0)) != 0));
    /* A -inf bias hides its key before the score is formed: a NaN query row whose every key
     * is hidden that way is fully masked (0, LSE -inf), not NaN (found by the API fuzzer). */
    for (int j = 0; j < L; j++)
        for (int i = 0; i < L; i++)
            tu_set(&a.t, 0, 0, i, j, i == 2 ? -INFINITY : 0.0);
    tu_set(&pb.q.t, 0, 0, 2, 0, NAN);
    CHECK_INT_EQ(tu_problem_forward(ctx, &pb), SDPA_OK);
    CHECK(tu_get(&pb.o.t, 0, 0, 2, 0) == 0.0 && tu_get(&pb.lse.t, 0, 0, 2, 0) == -INFINITY);
    sdpa_tensor o_ref = pb.o.t;
    CHECK_INT_EQ(tu_golden_forward(ctx, &pb.q.t, &pb.k.t, &pb.v.t, &pb.p, &o_ref, &pb.lse.t),
                 SDPA_OK);
    CHECK(tu_get(&pb.o.t, 0, 0, 2, 0) == 0.0 && tu_get(&pb.lse.t, 0, 0, 2, 0) == -INFINITY);
    sdpa_ctx_destroy(ctx);
    tu_problem_free(&pb);
    tu_free(&m);
    tu_free(&a);
}

/* Split-KV (planned in flash_plan.c, merged in flash.c): a problem of fewer than 32 (batch, kv
 * head, query block) tasks -- a decode step -- cuts its keys into chunks of at least 512 and merges
 * the chunks' partial results. Key counts around the chunk sizes, GQA ratios 1, 4 and 8, f16 and
 * bf16 caches under f32 queries, and the features that leave a chunk without a visible key for some
 * rows: a mask with holes and whole heads hidden, bottom-right causal and windows with a few query
 * rows, ALiBi and softcap. */
static void test_split_kv(void) {
    static const int64_t keys[] = {1023, 1024, 1025, 2047, 2049, 4097};
    static const int64_t groups[] = {1, 4, 8};
    for (size_t a = 0; a < sizeof keys / sizeof keys[0]; a++)
        for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
            sem_case c = base_case(1, keys[a], 64);
            c.Hkv = 2;
            c.Hq = 2 * groups[g];
            c.kv_dt = a % 3 == 0 ? SDPA_F32 : a % 3 == 1 ? SDPA_F16 : SDPA_BF16;
            c.lp_f32 = 1; /* the baseline of f32 queries keeps f32 scores */
            c.seed = 100 + a * 3 + g;
            char name[80];
            snprintf(name, sizeof name, "split: Lq=1 Lk=%lld Hq=%lld Hkv=2 kv %s", (long long)c.Lk,
                     (long long)c.Hq, sdpa_dtype_name(c.kv_dt));
            CHECK(run_case(name, &c));
        }
    sem_case c = base_case(3, 3000, 40);
    c.Hq = 4;
    c.Hkv = 1;
    c.params.causal = 1;
    c.params.align = SDPA_ALIGN_BOTTOM_RIGHT;
    CHECK(run_case("split: Lq=3 Lk=3000 causal bottom-right", &c));
    c.params.use_window = 1;
    c.params.window_left = 100; /* only the last chunk holds visible keys */
    c.alibi = 1;
    c.params.softcap = 20.0f;
    CHECK(run_case("split: window 100, ALiBi, softcap", &c));
    c = base_case(2, 2500, 32);
    c.Hq = 4;
    c.Hkv = 2;
    c.mask = MASK_F32;
    c.mask_hole = 0.995; /* most chunks see nothing */
    CHECK(run_case("split: additive mask, 99.5 % holes", &c));
    c.mask_hole = 1.0; /* no row sees a key: 0 and -inf from chunks that are all empty */
    CHECK(run_case("split: every key hidden", &c));
    c.mask = MASK_BOOL;
    c.mask_hole = 0.3;
    c.bcast = 1 | 4;
    CHECK(run_case("split: bool mask, broadcast over B and Lq", &c));
}

int main(int argc, char **argv) {
    tu_report_impls();
    return CHECK_RUN(argc, argv, CASE(test_head_dims), CASE(test_lengths),
                     CASE(test_heads_and_batch), CASE(test_masks), CASE(test_causal_and_windows),
                     CASE(test_softcap_scale_alibi), CASE(test_dtypes_and_inputs),
                     CASE(test_layouts), CASE(test_stride_zero_inputs),
                     CASE(test_fully_masked_rows), CASE(test_nan_policy), CASE(test_split_kv));
}
