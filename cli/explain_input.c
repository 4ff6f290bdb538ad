/*
 * explain_input.c — the inputs of the walk-through (explain.h): drawn from a seed exactly as
 * the seeds' PyTorch notebook draws them (torch_rng.c), or loaded from the user's .npy files
 * with every problem reported the way `sdpa explain` reports it.
 */
#include "cli.h"
#include "explain.h"
#include "npy.h"
#include "torch_rng.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* One of the user's matrices, as the messages describe it. */
typedef struct matrix {
    const char *path;
    int rows, cols;
    char shape[NPY_SHAPE_CHARS]; /* "(4, 8)" */
} matrix;

/* Loads one of the user's arrays into dst: rank 2, float32 or float16, at most
 * EXPLAIN_MAX_L x EXPLAIN_MAX_D, finite. Prints the problem to stderr and returns CLI_RUNTIME
 * on any failure. */
static int load_matrix(const char *path, const char *what, float *dst, matrix *m) {
    char err[512];
    npy_array a;
    memset(&a, 0, sizeof a);
    m->path = path;
    if (npy_load(path, 0, &a, err, sizeof err) != 0) {
        fprintf(stderr, "sdpa explain: %s\n", err);
        return CLI_RUNTIME;
    }
    npy_format_shape(m->shape, sizeof m->shape, a.ndim, a.shape);
    int rc = CLI_RUNTIME;
    if (a.ndim != 2)
        fprintf(stderr,
                "sdpa explain: %s: shape %s; explain takes the %s as a rank-2 (L, D) array\n", path,
                m->shape, what);
    else if (a.shape[0] < 1 || a.shape[1] < 1 || a.shape[0] > EXPLAIN_MAX_L ||
             a.shape[1] > EXPLAIN_MAX_D)
        fprintf(stderr,
                "sdpa explain: %s: shape %s; explain shows arrays from 1 x 1 up to %d x %d "
                "('sdpa run' takes any size)\n",
                path, m->shape, EXPLAIN_MAX_L, EXPLAIN_MAX_D);
    else if (npy_to_f32(&a, dst) != 0)
        fprintf(stderr, "sdpa explain: %s: dtype %s; explain takes float32 or float16\n", path,
                sdpa_dtype_name(a.dtype));
    else
        rc = CLI_OK;
    if (rc == CLI_OK) {
        m->rows = (int)a.shape[0];
        m->cols = (int)a.shape[1];
        for (int64_t i = 0; i < a.count; i++)
            /* NaN or Inf would turn every step into NaN: nothing left to explain. */
            if (!isfinite(dst[i])) {
                fprintf(stderr,
                        "sdpa explain: %s: element %lld is %s; explain needs finite numbers\n",
                        path, (long long)i, isnan(dst[i]) ? "NaN" : "infinite");
                rc = CLI_RUNTIME;
                break;
            }
    }
    npy_free(&a);
    return rc;
}

/* Two of the user's arrays that do not fit together: both files and shapes, then why. */
static int disagree(const matrix *a, const matrix *b, const char *why, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static int disagree(const matrix *a, const matrix *b, const char *why, ...) {
    va_list ap;
    va_start(ap, why);
    fprintf(stderr, "sdpa explain: %s has shape %s but %s has shape %s: ", a->path, a->shape,
            b->path, b->shape);
    vfprintf(stderr, why, ap);
    fputc('\n', stderr);
    va_end(ap);
    return CLI_RUNTIME;
}

int explain_load(explain *e) {
    matrix q, k, v;
    int rc;
    e->generated = 0;
    if ((rc = load_matrix(e->qname, "queries", e->q, &q)) != CLI_OK ||
        (rc = load_matrix(e->kname, "keys", e->k, &k)) != CLI_OK ||
        (rc = load_matrix(e->vname, "values", e->v, &v)) != CLI_OK)
        return rc;
    if (q.cols != k.cols)
        return disagree(&q, &k, "queries and keys must have the same d_k (%d vs %d)", q.cols,
                        k.cols);
    if (k.rows != v.rows)
        return disagree(&k, &v, "there must be one value per key (%d keys vs %d values)", k.rows,
                        v.rows);
    e->lq = q.rows;
    e->lk = k.rows;
    e->dk = q.cols;
    e->dv = v.cols;
    return CLI_OK;
}

/* c (n x p) = a (n x m) @ b (m x p), accumulated in double and rounded once to float: Q, K
 * and V are float32 inputs of the library like any other. */
static void matmul(const float *a, const float *b, float *c, int n, int m, int p) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < p; j++) {
            double acc = 0.0;
            for (int t = 0; t < m; t++)
                acc += (double)a[i * m + t] * (double)b[t * p + j];
            c[i * p + j] = (float)acc;
        }
}

/* The notebook's order: X first, then W_Q, W_K, W_V, all from one generator. */
void explain_generate(explain *e, unsigned long long seed, int n, int d_model) {
    static float wq[EXPLAIN_MAX_D * EXPLAIN_MAX_D], wk[EXPLAIN_MAX_D * EXPLAIN_MAX_D],
        wv[EXPLAIN_MAX_D * EXPLAIN_MAX_D];
    const int d = d_model;
    e->generated = 1;
    e->seed = seed;
    e->n_model = d;
    torch_rng r;
    torch_rng_seed(&r, seed);
    torch_rng_randn(&r, e->x, (int64_t)n * d);
    torch_rng_randn(&r, wq, (int64_t)d * d);
    torch_rng_randn(&r, wk, (int64_t)d * d);
    torch_rng_randn(&r, wv, (int64_t)d * d);
    matmul(e->x, wq, e->q, n, d, d);
    matmul(e->x, wk, e->k, n, d, d);
    matmul(e->x, wv, e->v, n, d, d);
    e->lq = e->lk = n;
    e->dk = e->dv = d;
}
