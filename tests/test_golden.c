/*
 * test_golden.c — checks the library against golden results from PyTorch 2.x, read from
 * tests/golden/golden.bin (made by tests/golden/make_golden.py; the format is in
 * tests/golden/README.md). One CHECK case per fixture case:
 *   (a) the reference's output in the storage dtype passes testing.md's rule against PyTorch's
 *       float64 result, with PyTorch's own storage-dtype result as the same-precision baseline;
 *   (b) the reference's F32 output and its LSE lie within 1e-5 (relative) of the float64
 *       output and log-sum-exp, and fully masked rows are exactly 0 with LSE -inf;
 *   (c) sdpa_forward through the public API gives the same bytes as the reference while it
 *       dispatches to the reference, and passes the rule of (a) once it dispatches elsewhere;
 *   (d) sdpa_backward, given sdpa_forward's out and LSE for the same inputs and the fixture's
 *       dout, gives dq, dk and dv (in the storage dtype) that pass testing.md's gradient rule
 *       against PyTorch autograd's float64 gradients, with autograd's storage-dtype gradients
 *       as the baseline; the dq of fully masked rows and the dk, dv of keys no row sees are
 *       exactly 0. This runs on the library as it dispatches and again with the context
 *       capped at each registered fast implementation's level (levels this CPU lacks are
 *       reported as skipped); each capped run also checks its forward output by (a)'s rule.
 * The program fails when the fixture file is missing, damaged or empty.
 */
#include "check.h"
#include "testutil.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SDPA_GOLDEN_DIR
#define SDPA_GOLDEN_DIR "tests/golden" /* tests/CMakeLists.txt passes the real one */
#endif

#define GOLDEN_VERSION 2
#define GOLDEN_FLAG_BACKWARD 1     /* the case carries dout and the gradients */
#define GOLDEN_MAX_EXTENT 4096     /* sanity limits on what a fixture may ask for */
#define GOLDEN_MAX_ELEMS (1 << 22) /* per array */
#define GOLDEN_REL_TOL 1e-5        /* (b): |x - golden| <= tol |golden| + abs floor */
#define GOLDEN_ABS_FLOOR 1e-7      /* for outputs that cancel to nearly 0 */
#define GOLDEN_MASK_NONE (-1)

/* One fixture case; the array pointers point into the loaded file, little-endian. */
typedef struct golden_case {
    char name[65];
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    sdpa_dtype q_dt, k_dt, v_dt, out_dt;
    float scale;
    int32_t causal, align, use_window;
    int64_t window_left, window_right;
    float softcap;
    int32_t alibi;
    int32_t mask_dt; /* GOLDEN_MASK_NONE or an sdpa_dtype */
    int64_t mask_shape[4];
    int32_t n_empty; /* fully masked rows, post-processed to O = 0, LSE = -inf */
    int32_t flags;   /* GOLDEN_FLAG_BACKWARD */
    const unsigned char *q, *k, *v, *slopes, *mask, *out64, *lse64, *out_lp;
    /* with GOLDEN_FLAG_BACKWARD, else NULL: dout in out_dt, the float64 gradients of
     * sum(dout * out) and autograd's gradients in the q, k, v dtypes */
    const unsigned char *dout, *dq64, *dk64, *dv64, *dq_lp, *dk_lp, *dv_lp;
} golden_case;

/* What the program loaded; filled once by main before any case runs. */
static struct {
    unsigned char *file;
    golden_case *cases;
    size_t n_cases;
    char error[256];
    size_t *order; /* fixtures selected by the command-line filter, in order */
    size_t n_order, next;
} golden;

/* ---- reading the little-endian file --------------------------------------------------- */

typedef struct reader {
    const unsigned char *p;
    size_t left;
    int bad;
} reader;

static const unsigned char *take(reader *r, size_t n) {
    if (r->bad || n > r->left) {
        r->bad = 1;
        return NULL;
    }
    const unsigned char *at = r->p;
    r->p += n;
    r->left -= n;
    return at;
}

static uint64_t le_bytes(const unsigned char *p, int n) {
    uint64_t x = 0;
    for (int i = n - 1; i >= 0; i--)
        x = (x << 8) | p[i];
    return x;
}

static uint64_t read_le(reader *r, int n) {
    const unsigned char *p = take(r, (size_t)n);
    return p ? le_bytes(p, n) : 0;
}

static int64_t read_i64(reader *r) {
    return (int64_t)read_le(r, 8);
}

static int32_t read_i32(reader *r) {
    return (int32_t)(uint32_t)read_le(r, 4);
}

static float read_f32(reader *r) {
    const uint32_t u = (uint32_t)read_le(r, 4);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static double f64_at(const unsigned char *base, int64_t i) {
    const uint64_t u = le_bytes(base + 8 * i, 8);
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* Sets golden.error and returns 0. */
static int load_fail(const char *path, const char *what, const char *name) {
    snprintf(golden.error, sizeof golden.error, "%s: %s%s%s", path, what, name ? " in case " : "",
             name ? name : "");
    return 0;
}

static int dtype_ok(int32_t dt) {
    return dt == SDPA_F32 || dt == SDPA_F16 || dt == SDPA_BF16;
}

static int extent_ok(int64_t x) {
    return x >= 1 && x <= GOLDEN_MAX_EXTENT;
}

static int64_t elems4(int64_t a, int64_t b, int64_t c, int64_t d) {
    return a * b * c * d;
}

/* Reads one case record; returns 1 on success. */
static int read_case(reader *r, golden_case *c, const char *path) {
    const unsigned char *name = take(r, 64);
    if (name == NULL)
        return load_fail(path, "truncated case header", NULL);
    memcpy(c->name, name, 64);
    c->name[64] = '\0';
    int64_t *ext[7] = {&c->B, &c->Hq, &c->Hkv, &c->Lq, &c->Lk, &c->Dk, &c->Dv};
    for (int i = 0; i < 7; i++)
        *ext[i] = read_i64(r);
    int32_t dts[4];
    for (int i = 0; i < 4; i++)
        dts[i] = read_i32(r);
    c->scale = read_f32(r);
    c->causal = read_i32(r);
    c->align = read_i32(r);
    c->use_window = read_i32(r);
    c->window_left = read_i64(r);
    c->window_right = read_i64(r);
    c->softcap = read_f32(r);
    c->alibi = read_i32(r);
    c->mask_dt = read_i32(r);
    for (int i = 0; i < 4; i++)
        c->mask_shape[i] = read_i64(r);
    c->n_empty = read_i32(r);
    c->flags = read_i32(r);
    if (r->bad)
        return load_fail(path, "truncated case header", c->name);
    for (int i = 0; i < 7; i++)
        if (!extent_ok(*ext[i]))
            return load_fail(path, "extent out of range", c->name);
    for (int i = 0; i < 4; i++)
        if (!dtype_ok(dts[i]))
            return load_fail(path, "bad dtype", c->name);
    c->q_dt = (sdpa_dtype)dts[0];
    c->k_dt = (sdpa_dtype)dts[1];
    c->v_dt = (sdpa_dtype)dts[2];
    c->out_dt = (sdpa_dtype)dts[3];

    const int64_t nq = elems4(c->B, c->Hq, c->Lq, c->Dk), nk = elems4(c->B, c->Hkv, c->Lk, c->Dk);
    const int64_t nv = elems4(c->B, c->Hkv, c->Lk, c->Dv), no = elems4(c->B, c->Hq, c->Lq, c->Dv);
    if (nq > GOLDEN_MAX_ELEMS || nk > GOLDEN_MAX_ELEMS || nv > GOLDEN_MAX_ELEMS ||
        no > GOLDEN_MAX_ELEMS)
        return load_fail(path, "arrays too large", c->name);
    c->q = take(r, (size_t)nq * sdpa_dtype_size(c->q_dt));
    c->k = take(r, (size_t)nk * sdpa_dtype_size(c->k_dt));
    c->v = take(r, (size_t)nv * sdpa_dtype_size(c->v_dt));
    c->slopes = c->alibi ? take(r, (size_t)c->Hq * 4) : NULL;
    c->mask = NULL;
    if (c->mask_dt != GOLDEN_MASK_NONE) {
        if (!dtype_ok(c->mask_dt) && c->mask_dt != SDPA_BOOL)
            return load_fail(path, "bad mask dtype", c->name);
        for (int i = 0; i < 4; i++)
            if (!extent_ok(c->mask_shape[i]))
                return load_fail(path, "mask extent out of range", c->name);
        const int64_t nm =
            elems4(c->mask_shape[0], c->mask_shape[1], c->mask_shape[2], c->mask_shape[3]);
        if (nm > GOLDEN_MAX_ELEMS)
            return load_fail(path, "mask too large", c->name);
        c->mask = take(r, (size_t)nm * sdpa_dtype_size((sdpa_dtype)c->mask_dt));
    }
    c->out64 = take(r, (size_t)no * 8);
    c->lse64 = take(r, (size_t)(c->B * c->Hq * c->Lq) * 8);
    c->out_lp = take(r, (size_t)no * sdpa_dtype_size(c->out_dt));
    if (c->flags & ~GOLDEN_FLAG_BACKWARD)
        return load_fail(path, "unknown flags", c->name);
    c->dout = c->dq64 = c->dk64 = c->dv64 = c->dq_lp = c->dk_lp = c->dv_lp = NULL;
    if (c->flags & GOLDEN_FLAG_BACKWARD) {
        c->dout = take(r, (size_t)no * sdpa_dtype_size(c->out_dt));
        c->dq64 = take(r, (size_t)nq * 8);
        c->dk64 = take(r, (size_t)nk * 8);
        c->dv64 = take(r, (size_t)nv * 8);
        c->dq_lp = take(r, (size_t)nq * sdpa_dtype_size(c->q_dt));
        c->dk_lp = take(r, (size_t)nk * sdpa_dtype_size(c->k_dt));
        c->dv_lp = take(r, (size_t)nv * sdpa_dtype_size(c->v_dt));
    }
    const unsigned char *end = take(r, 4);
    if (r->bad)
        return load_fail(path, "truncated arrays", c->name);
    if (memcmp(end, "END.", 4) != 0)
        return load_fail(path, "end marker missing (format mismatch)", c->name);
    return 1;
}

/* Loads the whole fixture file into `golden`; returns 1 on success, else sets golden.error. */
static int load_golden(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return load_fail(path, "cannot open (run tests/golden/make_golden.py)", NULL);
    size_t cap = 1 << 16, len = 0;
    golden.file = malloc(cap);
    for (;;) {
        if (golden.file == NULL) {
            fclose(f);
            return load_fail(path, "out of memory", NULL);
        }
        len += fread(golden.file + len, 1, cap - len, f);
        if (len < cap)
            break;
        cap *= 2;
        unsigned char *bigger = realloc(golden.file, cap);
        if (bigger == NULL)
            free(golden.file);
        golden.file = bigger;
    }
    const int read_error = ferror(f);
    fclose(f);
    if (read_error)
        return load_fail(path, "read error", NULL);

    reader r = {golden.file, len, 0};
    const unsigned char *magic = take(&r, 8);
    const uint32_t version = (uint32_t)read_le(&r, 4), n = (uint32_t)read_le(&r, 4);
    if (r.bad || memcmp(magic, "SDPAGOLD", 8) != 0)
        return load_fail(path, "not a golden fixture file (magic)", NULL);
    if (version != GOLDEN_VERSION)
        return load_fail(path, "unknown format version", NULL);
    if (n == 0 || n > 100000)
        return load_fail(path, "bad number of cases", NULL);
    golden.cases = calloc(n, sizeof *golden.cases);
    if (golden.cases == NULL)
        return load_fail(path, "out of memory", NULL);
    for (uint32_t i = 0; i < n; i++)
        if (!read_case(&r, &golden.cases[i], path))
            return 0;
    if (r.left != 0)
        return load_fail(path, "trailing bytes after the last case", NULL);
    golden.n_cases = n;
    return 1;
}

/* ---- building tensors ------------------------------------------------------------------ */

/* A contiguous (B, H, L, D) tensor holding the stored little-endian elements of src. */
static tu_tensor tensor_from(sdpa_dtype dt, int64_t b, int64_t h, int64_t l, int64_t d,
                             const unsigned char *src) {
    tu_tensor t = tu_alloc(dt, b, h, l, d, TU_BHLD, 0, 0);
    const size_t es = sdpa_dtype_size(dt), n = t.bytes / es;
    for (size_t i = 0; i < n; i++) {
        const uint64_t u = le_bytes(src + i * es, (int)es);
        if (dt == SDPA_F32) {
            const uint32_t u32 = (uint32_t)u;
            memcpy((float *)t.buf + i, &u32, 4);
        } else if (dt == SDPA_BOOL) {
            ((unsigned char *)t.buf)[i] = (unsigned char)(u != 0);
        } else {
            ((uint16_t *)t.buf)[i] = (uint16_t)u;
        }
    }
    return t;
}

/* ---- checking one case ----------------------------------------------------------------- */

static void rule_factors(sdpa_dtype dt, double *k, double *nmse_gate) {
    /* testing.md: k for O, and the NMSE gate for O */
    *k = dt == SDPA_F32 ? 3.0 : 2.0;
    *nmse_gate = dt == SDPA_F32 ? 1e-10 : (dt == SDPA_F16 ? 1e-6 : 5e-5);
}

/* testing.md's k for dQ, dK and dV; the NMSE gate (that of O) applies to dV only. */
static double grad_k(sdpa_dtype dt) {
    return dt == SDPA_F32 ? 8.0 : 3.0;
}

/* A contiguous array of n stored float64 values. */
static double *f64_array(const unsigned char *src, int64_t n) {
    double *x = malloc((size_t)n * sizeof *x);
    if (x == NULL) {
        fprintf(stderr, "test_golden: out of memory\n");
        exit(2);
    }
    for (int64_t i = 0; i < n; i++)
        x[i] = f64_at(src, i);
    return x;
}

/* max over i of |x_i - g_i| / (tol |g_i| + floor): <= 1 passes. -inf must meet -inf. */
static double rel_ratio(const double *x, const unsigned char *golden64, int64_t n) {
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double g = f64_at(golden64, i);
        if (!isfinite(g) || !isfinite(x[i])) {
            if (!(g == x[i]))
                return INFINITY;
            continue;
        }
        const double r = fabs(x[i] - g) / (GOLDEN_REL_TOL * fabs(g) + GOLDEN_ABS_FLOOR);
        if (r > worst)
            worst = r;
    }
    return worst;
}

/* Rows of n x width doubles whose golden row is all exact zeros (structural: a fully masked
 * row's dq, or the dk, dv of a key no row sees, as `zero_rows` says) must be exact zeros in
 * `ours` too. @return the number of such rows that are not. */
static int64_t nonzero_rows(const double *ours, const unsigned char *zero_rows, int64_t n,
                            int64_t width) {
    int64_t bad = 0;
    for (int64_t row = 0; row < n; row++) {
        if (!zero_rows[row])
            continue;
        for (int64_t x = 0; x < width; x++)
            if (ours[row * width + x] != 0.0) {
                bad++;
                break;
            }
    }
    return bad;
}

/* (d): sdpa_forward, then sdpa_backward on its out and LSE, on ctx; `label` names the
 * context in the log. With check_forward, the forward output passes (a)'s rule too. */
static void check_backward(const golden_case *c, sdpa_ctx *ctx, const char *label,
                           const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                           const sdpa_params *pr, int check_forward) {
    const int64_t nq = c->B * c->Hq * c->Lq * c->Dk, nk = c->B * c->Hkv * c->Lk * c->Dk;
    const int64_t nv = c->B * c->Hkv * c->Lk * c->Dv, n_out = c->B * c->Hq * c->Lq * c->Dv;
    const int64_t n_rows = c->B * c->Hq * c->Lq, n_keys = c->B * c->Hkv * c->Lk;
    tu_tensor out = tu_alloc(c->out_dt, c->B, c->Hq, c->Lq, c->Dv, TU_BHLD, 0, 0);
    tu_tensor lse = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, 1, TU_BHLD, 0, 0);
    tu_tensor dout = tensor_from(c->out_dt, c->B, c->Hq, c->Lq, c->Dv, c->dout);
    tu_tensor dq = tu_alloc(c->q_dt, c->B, c->Hq, c->Lq, c->Dk, TU_BHLD, 0, 0);
    tu_tensor dk = tu_alloc(c->k_dt, c->B, c->Hkv, c->Lk, c->Dk, TU_BHLD, 0, 0);
    tu_tensor dv = tu_alloc(c->v_dt, c->B, c->Hkv, c->Lk, c->Dv, TU_BHLD, 0, 0);
    tu_tensor dq_lp = tensor_from(c->q_dt, c->B, c->Hq, c->Lq, c->Dk, c->dq_lp);
    tu_tensor dk_lp = tensor_from(c->k_dt, c->B, c->Hkv, c->Lk, c->Dk, c->dk_lp);
    tu_tensor dv_lp = tensor_from(c->v_dt, c->B, c->Hkv, c->Lk, c->Dv, c->dv_lp);
    tu_fill_canary(&dq); /* an element it does not write cannot pass as a zero */
    tu_fill_canary(&dk);
    tu_fill_canary(&dv);

    char what[128];
    sdpa_status st = sdpa_forward(ctx, q, k, v, pr, &out.t, &lse.t);
    CHECK_MSG(st == SDPA_OK, "%s: sdpa_forward (%s): %s: %s", c->name, label, sdpa_status_name(st),
              sdpa_ctx_last_error(ctx));
    if (st == SDPA_OK && check_forward) {
        double kf, gate;
        rule_factors(c->out_dt, &kf, &gate);
        double *ours = tu_to_doubles(&out.t), *golden_out = f64_array(c->out64, n_out);
        tu_tensor lp = tensor_from(c->out_dt, c->B, c->Hq, c->Lq, c->Dv, c->out_lp);
        double *theirs = tu_to_doubles(&lp.t);
        snprintf(what, sizeof what, "sdpa_forward (%s) out %s", label, sdpa_dtype_name(c->out_dt));
        CHECK_MSG(tu_rule(what, ours, theirs, golden_out, (size_t)n_out, c->out_dt, kf, gate),
                  "%s: sdpa_forward (%s) fails the rule", c->name, label);
        free(ours);
        free(golden_out);
        free(theirs);
        tu_free(&lp);
    }
    if (st == SDPA_OK) {
        st = sdpa_backward(ctx, q, k, v, &out.t, &lse.t, &dout.t, pr, &dq.t, &dk.t, &dv.t);
        CHECK_MSG(st == SDPA_OK, "%s: sdpa_backward (%s): %s: %s", c->name, label,
                  sdpa_status_name(st), sdpa_ctx_last_error(ctx));
    }
    if (st == SDPA_OK) {
        struct {
            const char *name;
            tu_tensor *ours, *lp;
            const unsigned char *golden;
            int64_t n;
            double gate;
        } g[3] = {{"dq", &dq, &dq_lp, c->dq64, nq, 0.0},
                  {"dk", &dk, &dk_lp, c->dk64, nk, 0.0},
                  {"dv", &dv, &dv_lp, c->dv64, nv, 0.0}};
        double unused_k;
        rule_factors(c->v_dt, &unused_k, &g[2].gate); /* dV: the NMSE gate of O */
        double *ours[3], *golden_g[3];
        for (int n = 0; n < 3; n++) {
            const sdpa_dtype dt = g[n].ours->t.dtype;
            ours[n] = tu_to_doubles(&g[n].ours->t);
            golden_g[n] = f64_array(g[n].golden, g[n].n);
            double *theirs = tu_to_doubles(&g[n].lp->t);
            snprintf(what, sizeof what, "sdpa_backward (%s) %s %s", label, g[n].name,
                     sdpa_dtype_name(dt));
            CHECK_MSG(tu_rule(what, ours[n], theirs, golden_g[n], (size_t)g[n].n, dt, grad_k(dt),
                              g[n].gate),
                      "%s: %s (%s) fails the gradient rule (k=%g%s)", c->name, g[n].name, label,
                      grad_k(dt), n == 2 ? ", NMSE gated" : "");
            free(theirs);
        }
        /* Structural zeros: a fully masked row's dq (its LSE is -inf); the dk and dv of a key
         * whose golden dv row is 0, i.e. that no row sees (dv_j = sum_i p_ij dout_i). */
        unsigned char *empty_row = calloc((size_t)n_rows, 1), *unseen = calloc((size_t)n_keys, 1);
        int64_t n_empty = 0, n_unseen = 0;
        for (int64_t row = 0; row < n_rows; row++)
            n_empty += empty_row[row] = f64_at(c->lse64, row) == -INFINITY;
        for (int64_t key = 0; key < n_keys; key++) {
            unseen[key] = 1;
            for (int64_t x = 0; x < c->Dv; x++)
                unseen[key] &= golden_g[2][key * c->Dv + x] == 0.0;
            n_unseen += unseen[key];
        }
        const int64_t bad_q = nonzero_rows(ours[0], empty_row, n_rows, c->Dk);
        const int64_t bad_k = nonzero_rows(ours[1], unseen, n_keys, c->Dk);
        const int64_t bad_v = nonzero_rows(ours[2], unseen, n_keys, c->Dv);
        printf("    %-44s fully masked rows %lld, keys no row sees %lld: nonzero %lld/%lld/%lld\n",
               "  structural zeros of dq / dk / dv", (long long)n_empty, (long long)n_unseen,
               (long long)bad_q, (long long)bad_k, (long long)bad_v);
        CHECK_MSG(bad_q == 0, "%s (%s): %lld fully masked rows with dq != 0", c->name, label,
                  (long long)bad_q);
        CHECK_MSG(bad_k == 0 && bad_v == 0,
                  "%s (%s): keys no row sees with dk != 0 (%lld) or dv != 0 (%lld)", c->name, label,
                  (long long)bad_k, (long long)bad_v);
        for (int n = 0; n < 3; n++) {
            free(ours[n]);
            free(golden_g[n]);
        }
        free(empty_row);
        free(unseen);
    }
    tu_tensor *owned[] = {&out, &lse, &dout, &dq, &dk, &dv, &dq_lp, &dk_lp, &dv_lp};
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++)
        tu_free(owned[i]);
}

static void run_fixture(const golden_case *c) {
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    tu_tensor q = tensor_from(c->q_dt, c->B, c->Hq, c->Lq, c->Dk, c->q);
    tu_tensor k = tensor_from(c->k_dt, c->B, c->Hkv, c->Lk, c->Dk, c->k);
    tu_tensor v = tensor_from(c->v_dt, c->B, c->Hkv, c->Lk, c->Dv, c->v);
    tu_tensor lp = tensor_from(c->out_dt, c->B, c->Hq, c->Lq, c->Dv, c->out_lp);
    tu_tensor mask = {0}, slopes = {0};

    sdpa_params pr = {0};
    pr.scale = c->scale;
    pr.causal = c->causal;
    pr.align = c->align ? SDPA_ALIGN_BOTTOM_RIGHT : SDPA_ALIGN_TOP_LEFT;
    pr.use_window = c->use_window;
    pr.window_left = c->window_left;
    pr.window_right = c->window_right;
    pr.softcap = c->softcap;
    if (c->alibi) {
        slopes = tensor_from(SDPA_F32, 1, 1, 1, c->Hq, c->slopes);
        pr.alibi_slopes = slopes.buf;
    }
    if (c->mask != NULL) {
        mask = tensor_from((sdpa_dtype)c->mask_dt, c->mask_shape[0], c->mask_shape[1],
                           c->mask_shape[2], c->mask_shape[3], c->mask);
        pr.mask = &mask.t;
    }

    /* The reference with out in the storage dtype, again with out in F32, then the API. */
    tu_tensor out = tu_alloc(c->out_dt, c->B, c->Hq, c->Lq, c->Dv, TU_BHLD, 0, 0);
    tu_tensor out32 = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, c->Dv, TU_BHLD, 0, 0);
    tu_tensor out_api = tu_alloc(c->out_dt, c->B, c->Hq, c->Lq, c->Dv, TU_BHLD, 0, 0);
    tu_tensor lse = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, 1, TU_BHLD, 0, 0);
    tu_tensor lse2 = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, 1, TU_BHLD, 0, 0);
    tu_tensor lse_api = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, 1, TU_BHLD, 0, 0);
    sdpa_status st = tu_golden_forward(ctx, &q.t, &k.t, &v.t, &pr, &out.t, &lse.t);
    CHECK_MSG(st == SDPA_OK, "reference (out %s): %s: %s", sdpa_dtype_name(c->out_dt),
              sdpa_status_name(st), sdpa_ctx_last_error(ctx));
    st = tu_golden_forward(ctx, &q.t, &k.t, &v.t, &pr, &out32.t, &lse2.t);
    CHECK_MSG(st == SDPA_OK, "reference (out f32): %s: %s", sdpa_status_name(st),
              sdpa_ctx_last_error(ctx));
    st = sdpa_forward(ctx, &q.t, &k.t, &v.t, &pr, &out_api.t, &lse_api.t);
    CHECK_MSG(st == SDPA_OK, "sdpa_forward: %s: %s", sdpa_status_name(st),
              sdpa_ctx_last_error(ctx));

    const int64_t n_out = c->B * c->Hq * c->Lq * c->Dv, n_rows = c->B * c->Hq * c->Lq;
    double *golden_out = malloc((size_t)n_out * sizeof *golden_out);
    for (int64_t i = 0; i < n_out; i++)
        golden_out[i] = f64_at(c->out64, i);
    double *ours = tu_to_doubles(&out.t), *ours32 = tu_to_doubles(&out32.t);
    double *ours_api = tu_to_doubles(&out_api.t), *theirs = tu_to_doubles(&lp.t);
    double *lse_d = tu_to_doubles(&lse.t), *lse2_d = tu_to_doubles(&lse2.t);

    /* (a) testing.md's rule in the storage dtype, torch's result as the baseline */
    double kf, gate;
    rule_factors(c->out_dt, &kf, &gate);
    char what[128];
    snprintf(what, sizeof what, "out %s vs torch f64", sdpa_dtype_name(c->out_dt));
    CHECK_MSG(tu_rule(what, ours, theirs, golden_out, (size_t)n_out, c->out_dt, kf, gate),
              "%s: reference output fails the rule (k=%g, nmse<=%g)", c->name, kf, gate);

    /* (b) F32 output and LSE within 1e-5 relative; fully masked rows exactly 0 / -inf */
    const double r_out = rel_ratio(ours32, c->out64, n_out);
    const double r_lse = rel_ratio(lse_d, c->lse64, n_rows);
    const double r_lse2 = rel_ratio(lse2_d, c->lse64, n_rows);
    printf("    %-44s out f32 %.3f  lse %.3f (of the 1e-5 relative bound)  empty rows %d\n",
           "f32 and lse vs torch f64", r_out, r_lse, (int)c->n_empty);
    CHECK_MSG(r_out <= 1.0, "%s: F32 output off by %.3g x the bound", c->name, r_out);
    CHECK_MSG(r_lse <= 1.0, "%s: LSE off by %.3g x the bound", c->name, r_lse);
    CHECK_MSG(r_lse2 <= 1.0, "%s: LSE (F32 out call) off by %.3g x the bound", c->name, r_lse2);
    int64_t empty_seen = 0, empty_bad = 0;
    for (int64_t row = 0; row < n_rows; row++) {
        if (f64_at(c->lse64, row) != -INFINITY)
            continue;
        empty_seen++;
        for (int64_t d = 0; d < c->Dv; d++)
            empty_bad += ours[row * c->Dv + d] != 0.0 || ours32[row * c->Dv + d] != 0.0;
        empty_bad += lse_d[row] != -INFINITY;
    }
    CHECK_MSG(empty_seen == c->n_empty, "%s: %lld rows with LSE -inf, the header says %d", c->name,
              (long long)empty_seen, (int)c->n_empty);
    CHECK_MSG(empty_bad == 0, "%s: %lld values of fully masked rows are not 0 / -inf", c->name,
              (long long)empty_bad);

    /* (c) the public API: the very bytes of the reference while it dispatches there */
    const int is_ref = strcmp(sdpa_ctx_kernel(ctx), "reference") == 0;
    if (is_ref) {
        CHECK_MSG(memcmp(out_api.buf, out.buf, out.bytes) == 0 &&
                      memcmp(lse_api.buf, lse.buf, lse.bytes) == 0,
                  "%s: sdpa_forward differs from the reference it dispatches to", c->name);
    } else {
        snprintf(what, sizeof what, "sdpa_forward (%s) out %s", sdpa_isa_name(sdpa_ctx_isa(ctx)),
                 sdpa_dtype_name(c->out_dt));
        CHECK_MSG(tu_rule(what, ours_api, theirs, golden_out, (size_t)n_out, c->out_dt, kf, gate),
                  "%s: sdpa_forward fails the rule", c->name);
        double *lse_api_d = tu_to_doubles(&lse_api.t);
        CHECK_MSG(rel_ratio(lse_api_d, c->lse64, n_rows) <= 1.0, "%s: sdpa_forward LSE", c->name);
        free(lse_api_d);
    }
    CHECK_MSG(memcmp(lse2.buf, lse.buf, lse.bytes) == 0,
              "%s: the reference's LSE depends on the output dtype", c->name);

    /* (d) the backward against PyTorch autograd: as the library dispatches, then capped at
     * each registered fast implementation's level */
    CHECK_MSG(c->flags & GOLDEN_FLAG_BACKWARD, "%s: the fixture has no backward arrays", c->name);
    if (c->flags & GOLDEN_FLAG_BACKWARD) {
        char label[64];
        snprintf(label, sizeof label, "auto");
        check_backward(c, ctx, label, &q.t, &k.t, &v.t, &pr, 0);
        tu_impl impls[TU_MAX_IMPLS];
        const int n_impls = tu_impls(impls);
        for (int n = 0; n < n_impls; n++) {
            if (!impls[n].runs) {
                printf("    %-44s skipped: the CPU lacks %s\n", impls[n].name, impls[n].missing);
                continue;
            }
            sdpa_ctx *capped = tu_ctx(1, impls[n].level);
            snprintf(label, sizeof label, "max_isa %s", sdpa_isa_name(impls[n].level));
            check_backward(c, capped, label, &q.t, &k.t, &v.t, &pr, 1);
            sdpa_ctx_destroy(capped);
        }
    }

    free(golden_out);
    free(ours);
    free(ours32);
    free(ours_api);
    free(theirs);
    free(lse_d);
    free(lse2_d);
    tu_tensor *owned[] = {&q,   &k,     &v,       &lp,  &mask, &slopes,
                          &out, &out32, &out_api, &lse, &lse2, &lse_api};
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++)
        tu_free(owned[i]);
    sdpa_ctx_destroy(ctx);
}

/* ---- the cases --------------------------------------------------------------------------- */

/* The file itself: present, readable, of this format, not empty. */
static void test_fixture_file(void) {
    CHECK_MSG(golden.n_cases > 0, "%s", golden.error);
    if (golden.n_cases > 0)
        printf("    %zu fixture cases\n", golden.n_cases);
}

/* Every fixture case runs through this one function, in the order main selected them. */
static void test_next_fixture(void) {
    const golden_case *c = &golden.cases[golden.order[golden.next++]];
    printf("  %s: %s B=%lld Hq=%lld Hkv=%lld Lq=%lld Lk=%lld Dk=%lld Dv=%lld\n", c->name,
           sdpa_dtype_name(c->q_dt), (long long)c->B, (long long)c->Hq, (long long)c->Hkv,
           (long long)c->Lq, (long long)c->Lk, (long long)c->Dk, (long long)c->Dv);
    run_fixture(c);
}

int main(int argc, char **argv) {
    const char *path_env = getenv("SDPA_GOLDEN_FILE");
    const char *path = path_env ? path_env : SDPA_GOLDEN_DIR "/golden.bin";
    const char *filter = argc > 1 ? argv[1] : NULL;
    load_golden(path);

    /* check_run filters by name itself; it is handed the already-filtered list, because the
     * fixture cases share one function that takes the next selected fixture. */
    check_case *cases = malloc((golden.n_cases + 1) * sizeof *cases);
    golden.order = malloc((golden.n_cases + 1) * sizeof *golden.order);
    if (cases == NULL || golden.order == NULL) {
        fprintf(stderr, "test_golden: out of memory\n");
        return 2;
    }
    size_t n = 0;
    if (filter == NULL || strstr("fixture_file", filter) != NULL || golden.n_cases == 0) {
        cases[n].name = "fixture_file";
        cases[n++].fn = test_fixture_file;
    }
    for (size_t i = 0; i < golden.n_cases; i++) {
        if (filter != NULL && strstr(golden.cases[i].name, filter) == NULL)
            continue;
        golden.order[golden.n_order++] = i;
        cases[n].name = golden.cases[i].name;
        cases[n++].fn = test_next_fixture;
    }
    char *no_args[] = {argv[0], NULL};
    const int rc = check_run(cases, n, 1, no_args);
    free(cases);
    free(golden.order);
    free(golden.cases);
    free(golden.file);
    return rc;
}
