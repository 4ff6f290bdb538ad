/*
 * test_ring.c — libsdpa_mpi (sdpa_mpi.h) under `mpirun -np P`, P = 1 to 4 (tests/CMakeLists.txt
 * registers one test per P). Every rank builds the same gathered problem from one seed, takes
 * its own rows by the layout's definition (written out again here, independently of
 * src/mpi/layout.c), and runs the ring. Its rows must then pass testing.md's rule against the
 * golden (the reference, in double, on the gathered sequence): forward O and LSE with the
 * same-precision naive forward as the baseline (k = 3 for f32, 2 for f16/bf16), gradients with
 * the single-process sdpa_backward on the gathered sequence as the baseline (k = 8 for f32, 3
 * for f16/bf16). Cases: every layout, causal in both alignments, Lq != Lk, windows, ALiBi,
 * softcap, GQA and MQA, Dk != Dv, f16 and bf16, two batches, (B, L, H, D) views, and lengths
 * not divisible by P or beyond the ring's chunk of rows. Then: bitwise the same results for
 * another thread count and on a repeated call; and the errors (a bad argument on one rank,
 * arguments that differ between ranks, a wrong local length, what the ring does not offer),
 * the same status on every rank, the outputs untouched.
 *
 * Rank 0 prints the cases; the other ranks print only their failures (stderr). Every rank
 * exits non-zero on a failure, so mpirun does.
 */
#include "check.h"
#include "testutil.h"

#include "sdpa_mpi.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int n_ranks, rank;

/* ---- the layouts, from their definitions in sdpa_mpi.h -------------------------------------- */

/* Contiguous runs here are uneven on purpose: rank r holds floor((r+1) L / P) - floor(r L / P). */
static int64_t local_len(sdpa_mpi_layout layout, int r, int64_t len) {
    const int64_t p = n_ranks;
    if (layout == SDPA_MPI_STRIPED)
        return (len - r + p - 1) / p;
    if (layout == SDPA_MPI_ZIGZAG) {
        const int64_t a = r, z = 2 * p - 1 - r;
        return ((a + 1) * len / (2 * p) - a * len / (2 * p)) +
               ((z + 1) * len / (2 * p) - z * len / (2 * p));
    }
    return (r + 1) * len / p - r * len / p;
}

/* The global position of row i of rank r. */
static int64_t global_pos(sdpa_mpi_layout layout, int r, int64_t len, int64_t i) {
    const int64_t p = n_ranks;
    if (layout == SDPA_MPI_STRIPED)
        return r + i * p;
    if (layout == SDPA_MPI_ZIGZAG) {
        const int64_t a = r, z = 2 * p - 1 - r;
        const int64_t n_a = (a + 1) * len / (2 * p) - a * len / (2 * p);
        return i < n_a ? a * len / (2 * p) + i : z * len / (2 * p) + (i - n_a);
    }
    return r * len / p + i;
}

/* ---- one case ------------------------------------------------------------------------------ */

typedef struct ring_case {
    const char *name;
    tu_dims d;
    sdpa_mpi_layout layout;
    int causal, bottom_right;
    int64_t window_left, window_right; /* both -1: no window */
    float softcap;
    int alibi;
    sdpa_dtype dt; /* q, k, v, out, dout and the gradients */
    tu_layout tl;  /* of the local tensors */
    int threads;   /* of each rank's context */
} ring_case;

static ring_case basic(const char *name, sdpa_mpi_layout layout, int causal, int64_t l) {
    ring_case c;
    memset(&c, 0, sizeof c);
    c.name = name;
    c.d = (tu_dims){1, 2, 2, l, l, 16, 16};
    c.layout = layout;
    c.causal = causal;
    c.window_left = c.window_right = -1;
    c.dt = SDPA_F32;
    c.threads = 1;
    return c;
}

typedef struct gathered {
    tu_tensor q, k, v, dout;
    float slopes[16];
    sdpa_params p;
} gathered;

static void gathered_make(const ring_case *c, gathered *g) {
    tu_rng r = {0x5eed + (uint64_t)c->d.Lq * 31 + (uint64_t)c->d.Hq};
    const tu_dims d = c->d;
    g->q = tu_alloc(c->dt, d.B, d.Hq, d.Lq, d.Dk, TU_BHLD, 0, 0);
    g->k = tu_alloc(c->dt, d.B, d.Hkv, d.Lk, d.Dk, TU_BHLD, 0, 0);
    g->v = tu_alloc(c->dt, d.B, d.Hkv, d.Lk, d.Dv, TU_BHLD, 0, 0);
    g->dout = tu_alloc(c->dt, d.B, d.Hq, d.Lq, d.Dv, TU_BHLD, 0, 0);
    tu_fill_randn(&g->q, &r, 1.0, 0.0);
    tu_fill_randn(&g->k, &r, 1.0, 0.0);
    tu_fill_randn(&g->v, &r, 1.0, 0.0);
    tu_fill_randn(&g->dout, &r, 1.0, 0.0);
    memset(&g->p, 0, sizeof g->p);
    g->p.causal = c->causal;
    g->p.align = c->bottom_right ? SDPA_ALIGN_BOTTOM_RIGHT : SDPA_ALIGN_TOP_LEFT;
    if (c->window_left >= 0 || c->window_right >= 0) {
        g->p.use_window = 1;
        g->p.window_left = c->window_left;
        g->p.window_right = c->window_right;
    }
    g->p.softcap = c->softcap;
    if (c->alibi) {
        for (int h = 0; h < 16; h++)
            g->slopes[h] = 0.5f / (float)(h + 1);
        g->p.alibi_slopes = g->slopes;
    }
}

static void gathered_free(gathered *g) {
    tu_free(&g->q);
    tu_free(&g->k);
    tu_free(&g->v);
    tu_free(&g->dout);
}

/* Rank r's rows of src (a gathered tensor of length len along L) into a new local tensor. */
static tu_tensor take_rows(const ring_case *c, const sdpa_tensor *src, int64_t len) {
    const int64_t n = local_len(c->layout, rank, len);
    tu_tensor t = tu_alloc(src->dtype, src->shape[0], src->shape[1], n, src->shape[3], c->tl,
                           c->tl == TU_BLHD ? 1 : 0, 1);
    for (int64_t b = 0; b < src->shape[0]; b++)
        for (int64_t h = 0; h < src->shape[1]; h++)
            for (int64_t i = 0; i < n; i++)
                for (int64_t e = 0; e < src->shape[3]; e++)
                    tu_set(&t.t, b, h, i, e,
                           tu_get(src, b, h, global_pos(c->layout, rank, len, i), e));
    return t;
}

/* This rank's rows of a gathered array of doubles (B, H, len, D) as a local array. */
static double *rows_of_doubles(const ring_case *c, const double *all, int64_t B, int64_t H,
                               int64_t len, int64_t D) {
    const int64_t n = local_len(c->layout, rank, len);
    double *out = malloc((size_t)(B * H * n * D) * sizeof(double));
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t i = 0; i < n; i++)
            memcpy(out + (bh * n + i) * D,
                   all + (bh * len + global_pos(c->layout, rank, len, i)) * D,
                   (size_t)D * sizeof(double));
    return out;
}

static double k_forward(sdpa_dtype dt) {
    return dt == SDPA_F32 ? 3.0 : 2.0;
}

static double k_gradient(sdpa_dtype dt) {
    return dt == SDPA_F32 ? 8.0 : 3.0;
}

static double nmse_gate(sdpa_dtype dt) {
    return dt == SDPA_F32 ? 1e-10 : dt == SDPA_F16 ? 1e-6 : 5e-5;
}

/* The rule on this rank's rows of one output: test (local tensor), lp and golden (gathered). */
static int rule_rows(const ring_case *c, const char *what, const sdpa_tensor *test,
                     const double *lp_all, const double *gold_all, int64_t len, double k,
                     double gate) {
    const int64_t B = test->shape[0], H = test->shape[1], D = test->shape[3];
    double *t = tu_to_doubles(test);
    double *lp = rows_of_doubles(c, lp_all, B, H, len, D);
    double *gold = rows_of_doubles(c, gold_all, B, H, len, D);
    char label[160];
    snprintf(label, sizeof label, "%s %s (rank %d)", c->name, what, rank);
    const int ok =
        tu_rule(label, t, lp, gold, (size_t)(B * H * test->shape[2] * D), test->dtype, k, gate);
    free(t);
    free(lp);
    free(gold);
    return ok;
}

/* The golden gradients: the reference backward (in double) on the gathered sequence, given
 * the golden forward's out and lse, as doubles (caller frees). */
static void golden_backward(gathered *g, tu_tensor *go, tu_tensor *gl, double **gq, double **gk,
                            double **gv) {
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_GENERIC);
    const sdpa_tensor *q = &g->q.t, *k = &g->k.t, *v = &g->v.t;
    tu_tensor dq =
        tu_alloc(SDPA_F32, q->shape[0], q->shape[1], q->shape[2], q->shape[3], TU_BHLD, 0, 0);
    tu_tensor dk =
        tu_alloc(SDPA_F32, k->shape[0], k->shape[1], k->shape[2], k->shape[3], TU_BHLD, 0, 0);
    tu_tensor dv =
        tu_alloc(SDPA_F32, v->shape[0], v->shape[1], v->shape[2], v->shape[3], TU_BHLD, 0, 0);
    const sdpa_status st =
        tu_golden_backward(ctx, q, k, v, &go->t, &gl->t, &g->dout.t, &g->p, &dq.t, &dk.t, &dv.t);
    CHECK_MSG(st == SDPA_OK, "golden backward: %s", sdpa_ctx_last_error(ctx));
    *gq = tu_to_doubles(&dq.t);
    *gk = tu_to_doubles(&dk.t);
    *gv = tu_to_doubles(&dv.t);
    tu_free(&dq);
    tu_free(&dk);
    tu_free(&dv);
    sdpa_ctx_destroy(ctx);
}

static sdpa_ctx *ctx_of(int threads) {
    return tu_ctx(threads, SDPA_ISA_AUTO);
}

/* Runs a case: the forward and the backward on the ring, checked against the golden; then the
 * same bytes, forward and backward, with another thread count. */
static void run_case(const ring_case *c) {
    const tu_dims d = c->d;
    gathered g;
    gathered_make(c, &g);
    sdpa_ctx *ctx = ctx_of(c->threads);

    /* the golden, the naive baseline and the single-process run, on the gathered sequence */
    tu_tensor go = tu_alloc(SDPA_F32, d.B, d.Hq, d.Lq, d.Dv, TU_BHLD, 0, 0);
    tu_tensor gl = tu_alloc(SDPA_F32, d.B, d.Hq, d.Lq, 1, TU_BHLD, 0, 0);
    CHECK(tu_golden_forward(ctx, &g.q.t, &g.k.t, &g.v.t, &g.p, &go.t, &gl.t) == SDPA_OK);
    double *lp_o = malloc((size_t)(d.B * d.Hq * d.Lq * d.Dv) * sizeof(double));
    double *lp_l = malloc((size_t)(d.B * d.Hq * d.Lq) * sizeof(double));
    tu_naive_forward(&g.q.t, &g.k.t, &g.v.t, &g.p, (int)c->dt, lp_o, lp_l);
    double *ref_o = tu_to_doubles(&go.t), *ref_l = tu_to_doubles(&gl.t);

    /* the single process: forward (its out and lse feed its backward) and backward */
    tu_tensor so = tu_alloc(c->dt, d.B, d.Hq, d.Lq, d.Dv, TU_BHLD, 0, 0);
    tu_tensor sl = tu_alloc(SDPA_F32, d.B, d.Hq, d.Lq, 1, TU_BHLD, 0, 0);
    tu_tensor sdq = tu_alloc(c->dt, d.B, d.Hq, d.Lq, d.Dk, TU_BHLD, 0, 0);
    tu_tensor sdk = tu_alloc(c->dt, d.B, d.Hkv, d.Lk, d.Dk, TU_BHLD, 0, 0);
    tu_tensor sdv = tu_alloc(c->dt, d.B, d.Hkv, d.Lk, d.Dv, TU_BHLD, 0, 0);
    CHECK(sdpa_forward(ctx, &g.q.t, &g.k.t, &g.v.t, &g.p, &so.t, &sl.t) == SDPA_OK);
    CHECK(sdpa_backward(ctx, &g.q.t, &g.k.t, &g.v.t, &so.t, &sl.t, &g.dout.t, &g.p, &sdq.t, &sdk.t,
                        &sdv.t) == SDPA_OK);

    /* the ring */
    tu_tensor q = take_rows(c, &g.q.t, d.Lq), k = take_rows(c, &g.k.t, d.Lk);
    tu_tensor v = take_rows(c, &g.v.t, d.Lk), dout = take_rows(c, &g.dout.t, d.Lq);
    const int64_t nq = q.t.shape[2], nk = k.t.shape[2];
    tu_tensor o = tu_alloc(c->dt, d.B, d.Hq, nq, d.Dv, c->tl, 0, 0);
    tu_tensor l = tu_alloc(SDPA_F32, d.B, d.Hq, nq, 1, TU_BHLD, 0, 0);
    tu_tensor dq = tu_alloc(c->dt, d.B, d.Hq, nq, d.Dk, c->tl, 0, 0);
    tu_tensor dk = tu_alloc(c->dt, d.B, d.Hkv, nk, d.Dk, c->tl, 0, 0);
    tu_tensor dv = tu_alloc(c->dt, d.B, d.Hkv, nk, d.Dv, c->tl, 2, 0);
    sdpa_mpi_step steps[8];
    sdpa_mpi_stats stats = {steps, 8, 0, 0, 0, 0, 0};
    sdpa_status st = sdpa_mpi_forward(ctx, MPI_COMM_WORLD, c->layout, &q.t, &k.t, &v.t, &g.p, &o.t,
                                      &l.t, &stats);
    CHECK_MSG(st == SDPA_OK, "%s: forward %s: %s", c->name, sdpa_status_name(st),
              sdpa_ctx_last_error(ctx));
    CHECK_INT_EQ(stats.n_steps, n_ranks);
    if (st == SDPA_OK) {
        CHECK(rule_rows(c, "O", &o.t, lp_o, ref_o, d.Lq, k_forward(c->dt), nmse_gate(c->dt)));
        CHECK(rule_rows(c, "LSE", &l.t, lp_l, ref_l, d.Lq, k_forward(c->dt), 0.0));
    }
    /* the backward takes the ring's own out and lse */
    st = sdpa_mpi_backward(ctx, MPI_COMM_WORLD, c->layout, &q.t, &k.t, &v.t, &o.t, &l.t, &dout.t,
                           &g.p, &dq.t, &dk.t, &dv.t, &stats);
    CHECK_MSG(st == SDPA_OK, "%s: backward %s: %s", c->name, sdpa_status_name(st),
              sdpa_ctx_last_error(ctx));
    if (st == SDPA_OK) {
        double *gq, *gk, *gv;
        golden_backward(&g, &go, &gl, &gq, &gk, &gv);
        double *bq = tu_to_doubles(&sdq.t), *bk = tu_to_doubles(&sdk.t),
               *bv = tu_to_doubles(&sdv.t);
        const double kg = k_gradient(c->dt);
        CHECK(rule_rows(c, "dQ", &dq.t, bq, gq, d.Lq, kg, 0.0));
        CHECK(rule_rows(c, "dK", &dk.t, bk, gk, d.Lk, kg, 0.0));
        CHECK(rule_rows(c, "dV", &dv.t, bv, gv, d.Lk, kg, nmse_gate(c->dt)));
        free(gq);
        free(gk);
        free(gv);
        free(bq);
        free(bk);
        free(bv);
    }

    /* another thread count, twice: the same bytes */
    sdpa_ctx *ctx3 = ctx_of(3);
    tu_tensor o3 = tu_alloc(c->dt, d.B, d.Hq, nq, d.Dv, c->tl, 0, 0);
    tu_tensor l3 = tu_alloc(SDPA_F32, d.B, d.Hq, nq, 1, TU_BHLD, 0, 0);
    CHECK(sdpa_mpi_forward(ctx3, MPI_COMM_WORLD, c->layout, &q.t, &k.t, &v.t, &g.p, &o3.t, &l3.t,
                           NULL) == SDPA_OK);
    CHECK_MSG(memcmp(o.buf, o3.buf, o.bytes) == 0 && memcmp(l.buf, l3.buf, l.bytes) == 0,
              "%s: the forward differs between 1 and 3 threads", c->name);
    tu_tensor dq3 = tu_alloc(c->dt, d.B, d.Hq, nq, d.Dk, c->tl, 0, 0);
    tu_tensor dk3 = tu_alloc(c->dt, d.B, d.Hkv, nk, d.Dk, c->tl, 0, 0);
    tu_tensor dv3 = tu_alloc(c->dt, d.B, d.Hkv, nk, d.Dv, c->tl, 2, 0);
    CHECK(sdpa_mpi_backward(ctx3, MPI_COMM_WORLD, c->layout, &q.t, &k.t, &v.t, &o.t, &l.t, &dout.t,
                            &g.p, &dq3.t, &dk3.t, &dv3.t, NULL) == SDPA_OK);
    CHECK_MSG(memcmp(dq.buf, dq3.buf, dq.bytes) == 0 && memcmp(dk.buf, dk3.buf, dk.bytes) == 0 &&
                  memcmp(dv.buf, dv3.buf, dv.bytes) == 0,
              "%s: the backward differs between 1 and 3 threads", c->name);
    sdpa_ctx_destroy(ctx3);
    tu_free(&o3);
    tu_free(&l3);
    tu_free(&dq3);
    tu_free(&dk3);
    tu_free(&dv3);

    free(lp_o);
    free(lp_l);
    free(ref_o);
    free(ref_l);
    tu_free(&go);
    tu_free(&gl);
    tu_free(&so);
    tu_free(&sl);
    tu_free(&sdq);
    tu_free(&sdk);
    tu_free(&sdv);
    tu_free(&q);
    tu_free(&k);
    tu_free(&v);
    tu_free(&dout);
    tu_free(&o);
    tu_free(&l);
    tu_free(&dq);
    tu_free(&dk);
    tu_free(&dv);
    sdpa_ctx_destroy(ctx);
    gathered_free(&g);
}

/* ---- the sweep ----------------------------------------------------------------------------- */

static void test_layouts(void) {
    static const sdpa_mpi_layout layouts[3] = {SDPA_MPI_CONTIGUOUS, SDPA_MPI_STRIPED,
                                               SDPA_MPI_ZIGZAG};
    static const char *const names[2][3] = {
        {"contiguous", "striped", "zigzag"},
        {"contiguous causal", "striped causal", "zigzag causal"}};
    for (int causal = 0; causal < 2; causal++)
        for (int l = 0; l < 3; l++) {
            ring_case c = basic(names[causal][l], layouts[l], causal, 67);
            run_case(&c);
        }
}

static void test_alignment_and_lengths(void) {
    ring_case c = basic("contiguous bottom-right Lq<Lk", SDPA_MPI_CONTIGUOUS, 1, 0);
    c.d.Lq = 40;
    c.d.Lk = 97;
    c.bottom_right = 1;
    run_case(&c);
    c.name = "striped bottom-right Lq<Lk";
    c.layout = SDPA_MPI_STRIPED;
    run_case(&c);
    c.name = "zigzag bottom-right Lq>Lk";
    c.layout = SDPA_MPI_ZIGZAG;
    c.d.Lq = 83;
    c.d.Lk = 31;
    run_case(&c);
    c = basic("zigzag top-left Lq>Lk", SDPA_MPI_ZIGZAG, 1, 0);
    c.d.Lq = 83;
    c.d.Lk = 31;
    run_case(&c);
    /* beyond the ring's chunk of 512 query rows on each rank */
    c = basic("contiguous causal long", SDPA_MPI_CONTIGUOUS, 1, 1100 * (int64_t)n_ranks + 3);
    c.d = (tu_dims){1, 1, 1, c.d.Lq, c.d.Lk, 8, 8};
    run_case(&c);
}

static void test_windows_alibi_softcap(void) {
    static const sdpa_mpi_layout layouts[3] = {SDPA_MPI_CONTIGUOUS, SDPA_MPI_STRIPED,
                                               SDPA_MPI_ZIGZAG};
    for (int l = 0; l < 3; l++) {
        ring_case c = basic("window 9,3 + ALiBi + softcap", layouts[l], 0, 71);
        c.window_left = 9;
        c.window_right = 3;
        c.alibi = 1;
        c.softcap = 5.0f;
        run_case(&c);
        c.name = "causal window 5 + ALiBi";
        c.causal = 1;
        c.window_left = 5;
        c.window_right = -1;
        c.softcap = 0.0f;
        run_case(&c);
        c = basic("ALiBi bottom-right Lq<Lk", layouts[l], 1, 0);
        c.d.Lq = 29;
        c.d.Lk = 90;
        c.bottom_right = 1;
        c.alibi = 1;
        run_case(&c);
        c = basic("right window only", layouts[l], 0, 50);
        c.window_right = 4;
        run_case(&c);
    }
}

static void test_heads_dims_dtypes(void) {
    ring_case c = basic("GQA 4/2 zigzag causal", SDPA_MPI_ZIGZAG, 1, 101);
    c.d.Hq = 4;
    c.d.Hkv = 2;
    run_case(&c);
    c.name = "MQA 4/1 striped";
    c.d.Hkv = 1;
    c.layout = SDPA_MPI_STRIPED;
    c.causal = 0;
    run_case(&c);
    c = basic("Dk 24 != Dv 40, B=2, BLHD", SDPA_MPI_CONTIGUOUS, 1, 45);
    c.d.B = 2;
    c.d.Dk = 24;
    c.d.Dv = 40;
    c.tl = TU_BLHD;
    run_case(&c);
    c = basic("f16 zigzag causal", SDPA_MPI_ZIGZAG, 1, 77);
    c.dt = SDPA_F16;
    run_case(&c);
    c.name = "bf16 striped ALiBi";
    c.dt = SDPA_BF16;
    c.layout = SDPA_MPI_STRIPED;
    c.alibi = 1;
    run_case(&c);
    c = basic("2 threads a rank", SDPA_MPI_ZIGZAG, 1, 130);
    c.threads = 2;
    run_case(&c);
}

/* ---- errors -------------------------------------------------------------------------------- */

/* Runs the forward with this rank's arguments; every rank must get `want` with `part` in the
 * message and its outputs untouched. */
static void expect_forward(const char *what, sdpa_mpi_layout layout, const sdpa_tensor *q,
                           const sdpa_tensor *k, const sdpa_tensor *v, const sdpa_params *p,
                           tu_tensor *o, MPI_Comm comm, sdpa_status want, const char *part) {
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    tu_fill_canary(o);
    const sdpa_status st = sdpa_mpi_forward(ctx, comm, layout, q, k, v, p, &o->t, NULL, NULL);
    CHECK_MSG(st == want, "%s: %s, want %s (%s)", what, sdpa_status_name(st),
              sdpa_status_name(want), sdpa_ctx_last_error(ctx));
    CHECK_STR_CONTAINS(sdpa_ctx_last_error(ctx), part);
    CHECK_MSG(tu_is_canary(o), "%s: out was written", what);
    sdpa_ctx_destroy(ctx);
}

static void test_errors(void) {
    ring_case c = basic("errors", SDPA_MPI_STRIPED, 1, 20 * (int64_t)n_ranks + 1);
    gathered g;
    gathered_make(&c, &g);
    tu_tensor q = take_rows(&c, &g.q.t, c.d.Lq), k = take_rows(&c, &g.k.t, c.d.Lk);
    tu_tensor v = take_rows(&c, &g.v.t, c.d.Lk);
    const int64_t nq = q.t.shape[2];
    tu_tensor o = tu_alloc(SDPA_F32, 1, 2, nq, 16, TU_BHLD, 0, 0);
    const int last = n_ranks - 1;

    /* a bad argument on the last rank only: its status and message, on every rank */
    tu_tensor bad = tu_alloc(SDPA_F32, 1, 2, nq, 16 + (rank == last), TU_BHLD, 0, 0);
    char part[64];
    snprintf(part, sizeof part, "rank %d: out.shape[3]", last);
    expect_forward("bad out on one rank", c.layout, &q.t, &k.t, &v.t, &g.p, &bad, MPI_COMM_WORLD,
                   SDPA_ERR_SHAPE, part);
    tu_free(&bad);

    /* what the ring does not offer */
    sdpa_params pm = g.p;
    pm.dropout_p = 0.5f;
    expect_forward("dropout", c.layout, &q.t, &k.t, &v.t, &pm, &o, MPI_COMM_WORLD,
                   SDPA_ERR_UNSUPPORTED, "dropout");
    pm = g.p;
    const float sinks[2] = {0.0f, 1.0f};
    pm.sinks = sinks;
    expect_forward("sinks", c.layout, &q.t, &k.t, &v.t, &pm, &o, MPI_COMM_WORLD,
                   SDPA_ERR_UNSUPPORTED, "sinks");
    expect_forward("layout 7", (sdpa_mpi_layout)7, &q.t, &k.t, &v.t, &g.p, &o, MPI_COMM_WORLD,
                   SDPA_ERR_PARAM, "layout=7");
    expect_forward("no communicator", c.layout, &q.t, &k.t, &v.t, &g.p, &o, MPI_COMM_NULL,
                   SDPA_ERR_NULL, "MPI_COMM_NULL");

    if (n_ranks > 1) {
        /* a local length the layout does not give: two rows short on rank 0 (one short would
         * be the layout of a shorter sequence) */
        sdpa_tensor q_short = q.t, o_short = o.t;
        if (rank == 0) {
            q_short.shape[2] -= 2;
            o_short.shape[2] -= 2;
        }
        tu_tensor o2 = o;
        o2.t = o_short;
        expect_forward("wrong local length", c.layout, &q_short, &k.t, &v.t, &g.p, &o2,
                       MPI_COMM_WORLD, SDPA_ERR_SHAPE, "striped layout");

        /* parameters that differ: causal on rank 0 only, then the scale on the last rank */
        pm = g.p;
        pm.causal = rank == 0;
        expect_forward("causal differs", c.layout, &q.t, &k.t, &v.t, &pm, &o, MPI_COMM_WORLD,
                       SDPA_ERR_MISMATCH, "causal");
        pm = g.p;
        pm.scale = rank == last ? 0.5f : 0.0f;
        expect_forward("scale differs", c.layout, &q.t, &k.t, &v.t, &pm, &o, MPI_COMM_WORLD,
                       SDPA_ERR_MISMATCH, "scale");
        /* a layout that differs */
        expect_forward("layout differs", rank == 0 ? SDPA_MPI_CONTIGUOUS : SDPA_MPI_STRIPED, &q.t,
                       &k.t, &v.t, &g.p, &o, MPI_COMM_WORLD, SDPA_ERR_MISMATCH, "layout");
    }

    /* the backward refuses a missing lse on every rank */
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    tu_tensor dq = tu_alloc(SDPA_F32, 1, 2, nq, 16, TU_BHLD, 0, 0);
    tu_tensor dk = tu_alloc(SDPA_F32, 1, 2, k.t.shape[2], 16, TU_BHLD, 0, 0);
    tu_tensor dv = tu_alloc(SDPA_F32, 1, 2, k.t.shape[2], 16, TU_BHLD, 0, 0);
    tu_fill_canary(&dq);
    sdpa_status st = sdpa_mpi_backward(ctx, MPI_COMM_WORLD, c.layout, &q.t, &k.t, &v.t, &o.t, NULL,
                                       &o.t, &g.p, &dq.t, &dk.t, &dv.t, NULL);
    CHECK_MSG(st == SDPA_ERR_NULL, "backward without lse: %s", sdpa_status_name(st));
    CHECK(tu_is_canary(&dq));
    CHECK(sdpa_mpi_forward(NULL, MPI_COMM_WORLD, c.layout, &q.t, &k.t, &v.t, &g.p, &o.t, NULL,
                           NULL) == SDPA_ERR_NULL);
    CHECK(strcmp(sdpa_mpi_layout_name(SDPA_MPI_ZIGZAG), "zigzag") == 0);
    CHECK(strcmp(sdpa_status_name(SDPA_ERR_MISMATCH), "SDPA_ERR_MISMATCH") == 0);
    sdpa_ctx_destroy(ctx);
    tu_free(&dq);
    tu_free(&dk);
    tu_free(&dv);
    tu_free(&q);
    tu_free(&k);
    tu_free(&v);
    tu_free(&o);
    gathered_free(&g);
}

/* Scratch through a counting allocator: every block freed after a call, and a rank that runs
 * out of memory makes every rank fail with SDPA_ERR_NOMEM, outputs untouched. (Open MPI's own
 * allocations are not the library's, so LeakSanitizer is off for these tests; this is the
 * ring's leak check.) */
static void test_memory(void) {
    ring_case c = basic("memory", SDPA_MPI_ZIGZAG, 1, 33 * (int64_t)n_ranks);
    gathered g;
    gathered_make(&c, &g);
    tu_tensor q = take_rows(&c, &g.q.t, c.d.Lq), k = take_rows(&c, &g.k.t, c.d.Lk);
    tu_tensor v = take_rows(&c, &g.v.t, c.d.Lk), dout = take_rows(&c, &g.dout.t, c.d.Lq);
    const int64_t nq = q.t.shape[2], nk = k.t.shape[2];
    tu_tensor o = tu_alloc(SDPA_F32, 1, 2, nq, 16, TU_BHLD, 0, 0);
    tu_tensor l = tu_alloc(SDPA_F32, 1, 2, nq, 1, TU_BHLD, 0, 0);
    tu_tensor dq = tu_alloc(SDPA_F32, 1, 2, nq, 16, TU_BHLD, 0, 0);
    tu_tensor dk = tu_alloc(SDPA_F32, 1, 2, nk, 16, TU_BHLD, 0, 0);
    tu_tensor dv = tu_alloc(SDPA_F32, 1, 2, nk, 16, TU_BHLD, 0, 0);
    tu_failing_alloc fa = {0};
    sdpa_ctx_params cp = {0};
    cp.n_threads = 1;
    cp.allocator = tu_failing_allocator(&fa);
    sdpa_ctx *ctx = NULL;
    CHECK(sdpa_ctx_create(&cp, &ctx) == SDPA_OK);
    const long before = fa.outstanding;
    sdpa_mpi_stats stats = {NULL, 0, 0, 0, 0, 0, 0};
    CHECK(sdpa_mpi_forward(ctx, MPI_COMM_WORLD, c.layout, &q.t, &k.t, &v.t, &g.p, &o.t, &l.t,
                           &stats) == SDPA_OK);
    CHECK(stats.scratch_bytes > 0 && stats.n_steps == n_ranks);
    CHECK(sdpa_mpi_backward(ctx, MPI_COMM_WORLD, c.layout, &q.t, &k.t, &v.t, &o.t, &l.t, &dout.t,
                            &g.p, &dq.t, &dk.t, &dv.t, NULL) == SDPA_OK);
    CHECK_MSG(fa.outstanding == before, "%ld blocks left allocated", fa.outstanding - before);
    /* the last rank runs out of memory: everyone fails, nothing written, nothing leaked */
    tu_fill_canary(&o);
    tu_fill_canary(&dq);
    fa.fail = rank == n_ranks - 1;
    sdpa_status st =
        sdpa_mpi_forward(ctx, MPI_COMM_WORLD, c.layout, &q.t, &k.t, &v.t, &g.p, &o.t, &l.t, NULL);
    CHECK_MSG(st == SDPA_ERR_NOMEM, "forward without memory: %s", sdpa_status_name(st));
    st = sdpa_mpi_backward(ctx, MPI_COMM_WORLD, c.layout, &q.t, &k.t, &v.t, &o.t, &l.t, &dout.t,
                           &g.p, &dq.t, &dk.t, &dv.t, NULL);
    CHECK_MSG(st == SDPA_ERR_NOMEM, "backward without memory: %s", sdpa_status_name(st));
    CHECK(tu_is_canary(&o) && tu_is_canary(&dq));
    fa.fail = 0;
    CHECK_MSG(fa.outstanding == before, "%ld blocks left allocated", fa.outstanding - before);
    sdpa_ctx_destroy(ctx);
    tu_free(&q);
    tu_free(&k);
    tu_free(&v);
    tu_free(&dout);
    tu_free(&o);
    tu_free(&l);
    tu_free(&dq);
    tu_free(&dk);
    tu_free(&dv);
    gathered_free(&g);
}

int main(int argc, char **argv) {
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "test_ring: MPI_Init_thread failed\n");
        return 1;
    }
    MPI_Comm_size(MPI_COMM_WORLD, &n_ranks);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank != 0 && freopen("/dev/null", "w", stdout) == NULL)
        return 1;
    printf("test_ring: %d rank%s\n", n_ranks, n_ranks == 1 ? "" : "s");
    const int failed = CHECK_RUN(argc, argv, CASE(test_layouts), CASE(test_alignment_and_lengths),
                                 CASE(test_windows_alibi_softcap), CASE(test_heads_dims_dtypes),
                                 CASE(test_errors), CASE(test_memory));
    /* every rank learns whether any failed, so the exit status agrees */
    int any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return any;
}
