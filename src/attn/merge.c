/*
 * merge.c — sdpa_merge: partial results (O_p, LSE_p) over disjoint key sets combined into the
 * result over their union, row by row (merge.h states the formula).
 *
 * Each row is independent: its parts are widened to f32 into the worker's scratch (only those
 * whose LSE is finite: the others are never read), merged in double by sdpa__merge_row in
 * part order, and rounded once to out's dtype. Rows go to the context's threads in blocks
 * whose size depends only on the shapes, and no row's arithmetic depends on which thread
 * runs it, so the results are bitwise identical for any n_threads.
 */
#include "merge.h"

#include "../core/half.h"
#include "../core/problem.h"
#include "../core/services.h"
#include "../kernels/ukernels.h"
#include "tile.h"

#include <math.h>

/* About this many part values are widened per task: big enough to amortise a task's cost,
 * small enough to share a decode step's few rows among threads. */
enum { TASK_VALUES = 16384, MAX_TASK_ROWS = 256 };

double sdpa__merge_row(int64_t n, int64_t d, const float *o, int64_t ldo, const double *lse,
                       double *dst) {
    /* 1. M, the largest LSE; a NaN or +inf one makes the row NaN */
    double m = -INFINITY;
    for (int64_t p = 0; p < n; p++) {
        const double x = lse[p];
        if (isnan(x) || x == INFINITY) {
            for (int64_t c = 0; c < d; c++)
                dst[c] = NAN;
            return NAN;
        }
        if (x > m)
            m = x;
    }
    /* every part empty or fully masked: the union is too */
    if (m == -INFINITY) {
        for (int64_t c = 0; c < d; c++)
            dst[c] = 0.0;
        return -INFINITY;
    }
    /* 2. sum_p w_p O_p and sum_p w_p with w_p = exp(LSE_p - M) <= 1, in part order */
    for (int64_t c = 0; c < d; c++)
        dst[c] = 0.0;
    double l = 0.0;
    for (int64_t p = 0; p < n; p++) {
        if (lse[p] == -INFINITY)
            continue;
        const double w = exp(lse[p] - m);
        const float *o_p = o + p * ldo;
        l += w;
        for (int64_t c = 0; c < d; c++)
            dst[c] += w * (double)o_p[c];
    }
    /* 3. normalise: l >= 1, since the part that holds M has w = 1 */
    for (int64_t c = 0; c < d; c++)
        dst[c] /= l;
    return m + log(l);
}

typedef struct merge_plan {
    int64_t n, B, H, L, D;
    int64_t task_rows; /* rows per task */
    const sdpa_tensor *outs, *lses;
    sdpa_tensor *out, *lse;
    size_t per_worker; /* bytes of scratch per worker */
    char *scratch;
} merge_plan;

/* One worker's scratch: the merged row (D doubles), the parts' LSEs (n doubles) and their
 * rows widened (n x D f32). */
static void worker_scratch(const merge_plan *pl, int worker, double **dst, double **lses,
                           float **rows) {
    char *base = pl->scratch + (size_t)worker * pl->per_worker;
    *dst = (double *)base;
    *lses = *dst + pl->D;
    *rows = (float *)(*lses + pl->n);
}

static void merge_task(void *arg, int64_t task, int worker) {
    const merge_plan *pl = arg;
    double *dst, *lses;
    float *rows;
    worker_scratch(pl, worker, &dst, &lses, &rows);
    const int64_t total = pl->B * pl->H * pl->L, r0 = task * pl->task_rows;
    const int64_t r1 = r0 + pl->task_rows < total ? r0 + pl->task_rows : total;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t b = r / (pl->H * pl->L), h = r / pl->L % pl->H, i = r % pl->L;
        for (int64_t p = 0; p < pl->n; p++) {
            const sdpa_tensor *lp = &pl->lses[p], *op = &pl->outs[p];
            lses[p] = ((const float *)lp->data)[sdpa__offset(lp, b, h, i, 0)];
            if (isfinite(lses[p]))
                sdpa__load_row_generic((int)op->dtype, pl->D, sdpa__row_at(op, b, h, i),
                                       op->stride[3], rows + p * pl->D);
        }
        const double m = sdpa__merge_row(pl->n, pl->D, rows, pl->D, lses, dst);
        for (int64_t c = 0; c < pl->D; c++)
            sdpa__store(pl->out->data, pl->out->dtype, sdpa__offset(pl->out, b, h, i, c), dst[c]);
        if (pl->lse != NULL)
            ((float *)pl->lse->data)[sdpa__offset(pl->lse, b, h, i, 0)] = (float)m;
    }
}

sdpa_status sdpa__merge(sdpa_ctx *ctx, int64_t n_parts, const sdpa_tensor *outs,
                        const sdpa_tensor *lses, sdpa_tensor *out, sdpa_tensor *lse) {
    _Static_assert(SDPA__ELEM_F32 == (int)SDPA_F32 && SDPA__ELEM_F16 == (int)SDPA_F16 &&
                       SDPA__ELEM_BF16 == (int)SDPA_BF16,
                   "the widening entry's element codes are sdpa_dtype values");
    merge_plan pl;
    pl.n = n_parts;
    pl.B = out->shape[0];
    pl.H = out->shape[1];
    pl.L = out->shape[2];
    pl.D = out->shape[3];
    pl.outs = outs;
    pl.lses = lses;
    pl.out = out;
    pl.lse = lse;
    /* per worker: D + n doubles, then n x D floats, every size checked (n_parts is the
     * caller's) */
    const size_t workers = (size_t)sdpa__n_workers(ctx);
    size_t values, per, bytes;
    if (__builtin_mul_overflow((size_t)n_parts, (size_t)pl.D + 2, &values) ||
        __builtin_mul_overflow(values, sizeof(float), &per) ||
        __builtin_add_overflow(per, (size_t)pl.D * sizeof(double) + 63, &per) ||
        __builtin_mul_overflow(per / 64 * 64, workers, &bytes))
        return sdpa__fail(ctx, SDPA_ERR_NOMEM,
                          "merge: scratch for %lld parts of %lld values per worker overflows "
                          "size_t",
                          (long long)n_parts, (long long)pl.D);
    pl.per_worker = per / 64 * 64;
    pl.scratch = sdpa__alloc(ctx, bytes, 64);
    if (pl.scratch == NULL)
        return sdpa__fail(ctx, SDPA_ERR_NOMEM, "merge: no memory for %zu bytes", bytes);
    const int64_t row_values = (int64_t)values; /* n x (D + 2): about what one row reads */
    pl.task_rows = row_values >= TASK_VALUES ? 1 : TASK_VALUES / row_values;
    if (pl.task_rows > MAX_TASK_ROWS)
        pl.task_rows = MAX_TASK_ROWS;
    const int64_t total = pl.B * pl.H * pl.L;
    sdpa__parallel_for(ctx, (total + pl.task_rows - 1) / pl.task_rows, merge_task, &pl);
    sdpa__free(ctx, pl.scratch);
    return SDPA_OK;
}
