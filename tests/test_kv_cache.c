/*
 * test_kv_cache.c — sdpa_forward_kv (ragged and paged KV caches, sdpa.h "KV caches") and
 * attention sinks (sdpa_params.sinks, sdpa.h "Attention sinks"), issue 13 items 3 to 5.
 *
 *   - Paged and ragged caches against the reference by testing.md's rule. A plain cache is
 *     built, then scattered into a pool of pages through a shuffled block table (unused entries
 *     -1, unused pages and rows past every length NaN, so that a read of them shows); the
 *     golden is the reference (tu_golden_forward) run per sequence on views of the plain cache
 *     of seqlens_q[b] queries and seqlens_k[b] keys, checked itself against the naive double
 *     implementation; the baseline is the naive one in f32. Batches of mixed lengths (0 keys,
 *     1, page boundaries +-1, around the split-KV chunks of 512), page sizes 16, 64 and 256,
 *     GQA ratios 1, 4 and 8, f32, f16 and bf16 caches under f32 queries, chunked prefill
 *     (seqlens_q < Lq: rows past it exactly 0 with LSE -inf, or the sink), causal bottom-right
 *     and top-left per sequence, windows, ALiBi, softcap, additive and bool masks indexed by
 *     the sequence's own positions, sinks; the plain layout with seqlens too. Every ISA level
 *     the CPU has; sdpa_forward per sequence on the plain slices passes the same rule.
 *   - Determinism: bitwise the same for n_threads 1, 2, 3 and 7 on a paged batch.
 *   - Sinks through sdpa_forward against a computation written here (the denominator gets
 *     exp(sink_h)): split and non-split paths, a sink far above every score, -inf sinks (the
 *     bits of no sinks), fully masked rows (O = 0, LSE = sink); sdpa_weights (rows sum to less
 *     than 1, p = exp(s - lse)); sdpa_backward: the reference against central differences in
 *     double on a tiny problem, the tiled backward against the reference by the gradient rule.
 *   - Bad inputs of sdpa_forward_kv: the exact status, the message naming the argument and its
 *     value, canary-filled out and lse untouched, inputs unwritten.
 */
#include "check.h"
#include "testutil.h"

#include "../src/core/validate.h"
#include "../src/ref/ref.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers ------------------------------------------------------------------------ */

static void *xmalloc(size_t n) {
    void *p = malloc(n > 0 ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "test_kv_cache: out of memory\n");
        exit(2);
    }
    return p;
}

/* A view of t moved to batch b (unless t broadcasts it), with extent 1 there. */
static sdpa_tensor batch_view(const sdpa_tensor *t, int64_t b) {
    sdpa_tensor v = *t;
    if (t->shape[0] != 1)
        v.data = (char *)t->data + b * t->stride[0] * (int64_t)sdpa_dtype_size(t->dtype);
    v.shape[0] = 1;
    return v;
}

/* Joins sink sigma to a row (out[dv], lse) computed without it, in double: the algebra of
 * sdpa.h's Semantics, O' = O exp(lse - lse'), lse' = log(exp(lse) + exp(sigma)); the values
 * are rounded to lp (-1: kept). A row with no key gets lse' = sigma and stays 0. */
static void join_sink(double sigma, double *out, int64_t dv, double *lse, int lp) {
    if (sigma == -INFINITY || isnan(*lse))
        return;
    if (*lse == -INFINITY) {
        *lse = sigma;
        return;
    }
    const double top = fmax(*lse, sigma);
    const double a = exp(*lse - top), sum = a + exp(sigma - top);
    for (int64_t d = 0; d < dv; d++)
        out[d] = tu_round(lp, out[d] * (a / sum));
    *lse = tu_acc_round(lp, top + log(sum));
}

/* The registered fast implementations; levels the CPU lacks are reported once by main. */
static tu_impl g_impls[TU_MAX_IMPLS];
static int g_n_impls;

/* ======================================================================================== */
/* 1. Paged and ragged caches against the reference                                          */
/* ======================================================================================== */

enum { MAXB = 16 };
enum { MASK_NONE, MASK_ADD, MASK_BOOL_BCAST };

typedef struct kv_case {
    const char *what;
    int64_t B, Hq, Hkv, Lq, Dk, Dv;
    int64_t page;      /* 0: the plain layout (no block table) */
    int64_t cap;       /* keys a sequence may hold: Lk (plain) or max_pages x page (paged) */
    int blhd;          /* the cache (plain tensor or pool) in (B, L, H, D) order */
    sdpa_dtype kv_dt;  /* K and V; q and out are f32 */
    int32_t sk[MAXB];  /* seqlens_k */
    int32_t sq[MAXB];  /* seqlens_q */
    int no_sk, no_sq;  /* pass NULL instead (every sequence full) */
    int causal, align; /* align: SDPA_ALIGN_* */
    int64_t window_left, window_right; /* used when use_window */
    int use_window;
    float softcap;
    int mask, alibi, sinks;
    uint64_t seed;
} kv_case;

/* The tensors of a case: q, the plain cache (rows past a sequence's length NaN), the paged
 * cache built from it, the mask, slopes, sinks and the descriptor. */
typedef struct kv_bufs {
    tu_tensor q, k, v;      /* q (B, Hq, Lq, Dk); k, v the plain cache (B, Hkv, cap, D) */
    tu_tensor kpool, vpool; /* paged: (n_pages, Hkv, page, D) */
    int32_t *table;         /* paged: B x max_pages */
    int64_t n_pages, max_pages;
    tu_tensor mask, o, lse; /* o (B, Hq, Lq, Dv) and lse (B, Hq, Lq, 1), f32 */
    float slopes[64], sinks[64];
    sdpa_params p;
    sdpa_kv_cache cache;
    int64_t sk[MAXB], sq[MAXB]; /* the lengths in effect */
} kv_bufs;

static void kv_build(const kv_case *c, kv_bufs *t) {
    memset(t, 0, sizeof *t);
    tu_rng r = {c->seed};
    const tu_layout ly = c->blhd ? TU_BLHD : TU_BHLD;
    const int64_t cap = c->cap;
    for (int64_t b = 0; b < c->B; b++) {
        t->sk[b] = c->no_sk ? cap : c->sk[b];
        t->sq[b] = c->no_sq ? c->Lq : c->sq[b];
    }
    /* q: rows past seqlens_q NaN (never read) */
    t->q = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, c->Dk, TU_BHLD, 0, 0);
    memset(t->q.buf, 0xFF, t->q.bytes);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < t->sq[b]; i++)
                for (int64_t d = 0; d < c->Dk; d++)
                    tu_set(&t->q.t, b, h, i, d, tu_randn(&r));
    /* the plain cache: rows past seqlens_k NaN (never read) */
    t->k = tu_alloc(c->kv_dt, c->B, c->Hkv, cap, c->Dk, ly, 0, 0);
    t->v = tu_alloc(c->kv_dt, c->B, c->Hkv, cap, c->Dv, ly, 0, 0);
    memset(t->k.buf, 0xFF, t->k.bytes);
    memset(t->v.buf, 0xFF, t->v.bytes);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hkv; h++)
            for (int64_t j = 0; j < t->sk[b]; j++) {
                for (int64_t d = 0; d < c->Dk; d++)
                    tu_set(&t->k.t, b, h, j, d, tu_randn(&r));
                for (int64_t d = 0; d < c->Dv; d++)
                    tu_set(&t->v.t, b, h, j, d, tu_randn(&r));
            }
    t->cache.k = &t->k.t;
    t->cache.v = &t->v.t;
    if (c->page > 0) {
        /* the pool: the pages a sequence's length uses, three spare ones, in shuffled order */
        t->max_pages = cap / c->page;
        int64_t used = 0;
        for (int64_t b = 0; b < c->B; b++)
            used += (t->sk[b] + c->page - 1) / c->page;
        t->n_pages = used + 3;
        int32_t *perm = xmalloc((size_t)t->n_pages * sizeof *perm);
        for (int64_t n = 0; n < t->n_pages; n++)
            perm[n] = (int32_t)n;
        for (int64_t n = t->n_pages - 1; n > 0; n--) {
            const int64_t m = (int64_t)(tu_next(&r) % (uint64_t)(n + 1));
            const int32_t x = perm[n];
            perm[n] = perm[m];
            perm[m] = x;
        }
        t->table = xmalloc((size_t)(c->B * t->max_pages) * sizeof *t->table);
        t->kpool = tu_alloc(c->kv_dt, t->n_pages, c->Hkv, c->page, c->Dk, ly, 0, 0);
        t->vpool = tu_alloc(c->kv_dt, t->n_pages, c->Hkv, c->page, c->Dv, ly, 0, 0);
        memset(t->kpool.buf, 0xFF, t->kpool.bytes);
        memset(t->vpool.buf, 0xFF, t->vpool.bytes);
        int64_t next = 0;
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t e = 0; e < t->max_pages; e++) {
                int32_t *entry = &t->table[b * t->max_pages + e];
                *entry = -1;
                if (e * c->page >= t->sk[b])
                    continue;
                *entry = perm[next++];
                for (int64_t h = 0; h < c->Hkv; h++)
                    for (int64_t j = e * c->page; j < t->sk[b] && j < (e + 1) * c->page; j++) {
                        for (int64_t d = 0; d < c->Dk; d++)
                            tu_set(&t->kpool.t, *entry, h, j - e * c->page, d,
                                   tu_get(&t->k.t, b, h, j, d));
                        for (int64_t d = 0; d < c->Dv; d++)
                            tu_set(&t->vpool.t, *entry, h, j - e * c->page, d,
                                   tu_get(&t->v.t, b, h, j, d));
                    }
            }
        free(perm);
        t->cache.k = &t->kpool.t;
        t->cache.v = &t->vpool.t;
        t->cache.block_table = t->table;
        t->cache.max_pages = t->max_pages;
    }
    t->o = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, c->Dv, TU_BHLD, 0, 0);
    t->lse = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, 1, TU_BHLD, 0, 0);

    t->p.causal = c->causal;
    t->p.align = (sdpa_align)c->align;
    t->p.use_window = c->use_window;
    t->p.window_left = c->window_left;
    t->p.window_right = c->window_right;
    t->p.softcap = c->softcap;
    if (c->mask == MASK_ADD) {
        /* (B, Hq, Lq, cap): biases and -inf holes where a sequence has the query and the key,
         * NaN where it has not (never read) */
        t->mask = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, cap, TU_BHLD, 0, 0);
        memset(t->mask.buf, 0xFF, t->mask.bytes);
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t h = 0; h < c->Hq; h++)
                for (int64_t i = 0; i < t->sq[b]; i++)
                    for (int64_t j = 0; j < t->sk[b]; j++)
                        tu_set(&t->mask.t, b, h, i, j,
                               tu_uniform(&r) < 0.2 ? -INFINITY : 0.5 * tu_randn(&r));
        t->p.mask = &t->mask.t;
    } else if (c->mask == MASK_BOOL_BCAST) {
        /* (B, 1, Lq, cap), broadcast over the heads */
        t->mask = tu_alloc(SDPA_BOOL, c->B, 1, c->Lq, cap, TU_BHLD, 0, 0);
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t i = 0; i < c->Lq; i++)
                for (int64_t j = 0; j < cap; j++)
                    tu_set(&t->mask.t, b, 0, i, j, tu_uniform(&r) >= 0.25);
        t->p.mask = &t->mask.t;
    }
    if (c->alibi) {
        for (int64_t h = 0; h < c->Hq && h < 64; h++)
            t->slopes[h] = (float)pow(2.0, -8.0 * (double)(h + 1) / (double)c->Hq);
        t->p.alibi_slopes = t->slopes;
    }
    if (c->sinks) {
        for (int64_t h = 0; h < c->Hq && h < 64; h++)
            t->sinks[h] = h % 3 == 1 ? -INFINITY : (float)(2.0 * tu_uniform(&r) - 0.5);
        t->p.sinks = t->sinks;
    }
}

static void kv_free(kv_bufs *t) {
    tu_tensor *all[] = {&t->q, &t->k, &t->v, &t->kpool, &t->vpool, &t->mask, &t->o, &t->lse};
    for (size_t n = 0; n < sizeof all / sizeof all[0]; n++)
        tu_free(all[n]);
    free(t->table);
}

/* The descriptor of a case, with its lengths in int32 arrays the caller owns. */
static sdpa_kv_cache kv_desc(const kv_case *c, const kv_bufs *t, int32_t *sk, int32_t *sq) {
    sdpa_kv_cache kc = t->cache;
    for (int64_t b = 0; b < c->B; b++) {
        sk[b] = (int32_t)t->sk[b];
        sq[b] = (int32_t)t->sq[b];
    }
    kc.seqlens_k = c->no_sk ? NULL : sk;
    kc.seqlens_q = c->no_sq ? NULL : sq;
    return kc;
}

/* The per-sequence oracles of a case, (B, Hq, Lq, Dv) and (B, Hq, Lq) doubles: the golden (the
 * reference on sequence b's views), the naive double result and the naive f32 baseline (both
 * with the sink joined afterwards), and whether a row sees no key (naive LSE -inf before the
 * sink, or a query or key count of 0). */
typedef struct kv_oracle {
    double *g_o, *g_l, *n_o, *n_l, *lp_o, *lp_l;
    unsigned char *empty;
} kv_oracle;

/* Sequence b's problem as plain tensors: q (1, Hq, sq, Dk), k and v (1, Hkv, sk, D), and params
 * with the mask cut to (.., sq, sk). */
static void seq_views(const kv_bufs *t, int64_t b, sdpa_tensor *q, sdpa_tensor *k, sdpa_tensor *v,
                      sdpa_tensor *mask, sdpa_params *p) {
    *q = batch_view(&t->q.t, b);
    q->shape[2] = t->sq[b];
    *k = batch_view(&t->k.t, b);
    k->shape[2] = t->sk[b];
    *v = batch_view(&t->v.t, b);
    v->shape[2] = t->sk[b];
    *p = t->p;
    if (t->p.mask != NULL) {
        *mask = batch_view(t->p.mask, b);
        if (mask->shape[2] != 1)
            mask->shape[2] = t->sq[b];
        mask->shape[3] = t->sk[b];
        p->mask = mask;
    }
}

static int kv_oracles(const kv_case *c, const kv_bufs *t, sdpa_ctx *ctx, kv_oracle *o) {
    const size_t n_out = (size_t)(c->B * c->Hq * c->Lq * c->Dv),
                 n_l = (size_t)(c->B * c->Hq * c->Lq);
    o->g_o = xmalloc(n_out * sizeof(double));
    o->n_o = xmalloc(n_out * sizeof(double));
    o->lp_o = xmalloc(n_out * sizeof(double));
    o->g_l = xmalloc(n_l * sizeof(double));
    o->n_l = xmalloc(n_l * sizeof(double));
    o->lp_l = xmalloc(n_l * sizeof(double));
    o->empty = xmalloc(n_l);
    int ok = 1;
    for (int64_t b = 0; b < c->B; b++) {
        const int64_t sq = t->sq[b], sk = t->sk[b];
        /* rows the sequence lacks, and every row of a sequence without keys: 0 and -inf */
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->Lq; i++) {
                const size_t row = (size_t)((b * c->Hq + h) * c->Lq + i);
                o->empty[row] = 1;
                o->g_l[row] = o->n_l[row] = o->lp_l[row] = -INFINITY;
                for (int64_t d = 0; d < c->Dv; d++)
                    o->g_o[row * (size_t)c->Dv + (size_t)d] =
                        o->n_o[row * (size_t)c->Dv + (size_t)d] =
                            o->lp_o[row * (size_t)c->Dv + (size_t)d] = 0.0;
            }
        if (sq > 0 && sk > 0) {
            sdpa_tensor q, k, v, mask;
            sdpa_params p;
            seq_views(t, b, &q, &k, &v, &mask, &p);
            tu_tensor go = tu_alloc(SDPA_F32, 1, c->Hq, sq, c->Dv, TU_BHLD, 0, 0);
            tu_tensor gl = tu_alloc(SDPA_F32, 1, c->Hq, sq, 1, TU_BHLD, 0, 0);
            const sdpa_status st = tu_golden_forward(ctx, &q, &k, &v, &p, &go.t, &gl.t);
            if (st != SDPA_OK) {
                printf("    %s: the golden of sequence %lld: %s: %s\n", c->what, (long long)b,
                       sdpa_status_name(st), sdpa_ctx_last_error(ctx));
                ok = 0;
            }
            const size_t m = (size_t)(c->Hq * sq);
            double *nd = xmalloc(m * (size_t)c->Dv * sizeof(double)),
                   *nl = xmalloc(m * sizeof(double));
            double *ld = xmalloc(m * (size_t)c->Dv * sizeof(double)),
                   *ll = xmalloc(m * sizeof(double));
            sdpa_params pn = p;
            pn.sinks = NULL; /* tu_naive_forward knows no sinks: joined below */
            tu_naive_forward(&q, &k, &v, &pn, -1, nd, nl);
            tu_naive_forward(&q, &k, &v, &pn, SDPA_F32, ld, ll);
            for (int64_t h = 0; h < c->Hq; h++)
                for (int64_t i = 0; i < sq; i++) {
                    const size_t src = (size_t)(h * sq + i);
                    const size_t row = (size_t)((b * c->Hq + h) * c->Lq + i);
                    o->empty[row] = nl[src] == -INFINITY;
                    if (p.sinks != NULL) {
                        join_sink((double)p.sinks[h], nd + src * (size_t)c->Dv, c->Dv, &nl[src],
                                  -1);
                        join_sink((double)p.sinks[h], ld + src * (size_t)c->Dv, c->Dv, &ll[src],
                                  SDPA_F32);
                    }
                    o->g_l[row] = tu_get(&gl.t, 0, h, i, 0);
                    o->n_l[row] = nl[src];
                    o->lp_l[row] = ll[src];
                    for (int64_t d = 0; d < c->Dv; d++) {
                        const size_t at = row * (size_t)c->Dv + (size_t)d;
                        o->g_o[at] = tu_get(&go.t, 0, h, i, d);
                        o->n_o[at] = nd[src * (size_t)c->Dv + (size_t)d];
                        o->lp_o[at] = ld[src * (size_t)c->Dv + (size_t)d];
                    }
                }
            free(nd);
            free(nl);
            free(ld);
            free(ll);
            tu_free(&go);
            tu_free(&gl);
        }
        /* a row with no key has the sink's LSE */
        if (t->p.sinks != NULL)
            for (int64_t h = 0; h < c->Hq; h++)
                for (int64_t i = 0; i < c->Lq; i++) {
                    const size_t row = (size_t)((b * c->Hq + h) * c->Lq + i);
                    if (i >= sq || sk == 0)
                        o->g_l[row] = o->n_l[row] = o->lp_l[row] = (double)t->p.sinks[h];
                }
    }
    return ok;
}

static void kv_oracle_free(kv_oracle *o) {
    free(o->g_o);
    free(o->g_l);
    free(o->n_o);
    free(o->n_l);
    free(o->lp_o);
    free(o->lp_l);
    free(o->empty);
}

/* |x - g| within an f32 ulp of g (both computed in double, x rounded once to f32), non-finite
 * values equal. */
static int within_ulp(const char *what, const double *x, const double *g, size_t n) {
    size_t bad = 0, at = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(g[i]) || !isfinite(x[i])) {
            if (!((isnan(g[i]) && isnan(x[i])) || g[i] == x[i]))
                bad++, at = i;
            continue;
        }
        if (fabs(x[i] - g[i]) > 0x1p-23 * fabs(g[i]) + 0x1p-140)
            bad++, at = i;
    }
    if (bad)
        printf("    %s: %zu differ, e.g. [%zu] %.9g vs %.9g\n", what, bad, at, x[at], g[at]);
    return bad == 0;
}

/* Rows that see no key: O exactly 0 and LSE exactly what the golden says (-inf or the sink). */
static int empty_rows_exact(const char *what, const double *o, const double *l, const kv_oracle *g,
                            size_t rows, int64_t dv) {
    size_t bad = 0;
    for (size_t r = 0; r < rows; r++) {
        if (!g->empty[r])
            continue;
        for (int64_t d = 0; d < dv; d++)
            bad += o[r * (size_t)dv + (size_t)d] != 0.0;
        bad += !(l[r] == g->g_l[r]);
    }
    if (bad)
        printf("    %s: %zu values of rows without keys are not 0 / the sink's LSE\n", what, bad);
    return bad == 0;
}

/* The rule on out and lse (f32 outputs: k = 3, NMSE gate 1e-10 on O) and the empty rows. */
static int kv_rule(const char *what, const double *o, const double *l, const kv_oracle *g,
                   size_t n_out, size_t n_l, int64_t dv) {
    char name[128];
    snprintf(name, sizeof name, "%s out", what);
    const int a = tu_rule(name, o, g->lp_o, g->g_o, n_out, SDPA_F32, 3.0, 1e-10);
    snprintf(name, sizeof name, "%s lse", what);
    const int b = tu_rule(name, l, g->lp_l, g->g_l, n_l, SDPA_F32, 3.0, 0.0);
    if (!b) /* where: the first rows off by more than a rounding, or non-finite elsewhere */
        for (size_t r = 0, shown = 0; r < n_l && shown < 6; r++) {
            const double x = l[r], y = g->g_l[r];
            const int off = !isfinite(x) || !isfinite(y) ? !(x == y || (isnan(x) && isnan(y)))
                                                         : fabs(x - y) > 1e-4 * (1.0 + fabs(y));
            if (off) {
                printf("      lse[%zu] = %.9g, golden %.9g\n", r, x, y);
                shown++;
            }
        }
    return a && b && empty_rows_exact(what, o, l, g, n_l, dv);
}

/* sdpa_forward per sequence on the plain slices, gathered into (B, Hq, Lq, Dv) like
 * sdpa_forward_kv's output; rows a sequence lacks take the golden's values. */
static int per_sequence_forward(const kv_case *c, const kv_bufs *t, sdpa_ctx *ctx,
                                const kv_oracle *g, double *o, double *l) {
    const size_t n_out = (size_t)(c->B * c->Hq * c->Lq * c->Dv),
                 n_l = (size_t)(c->B * c->Hq * c->Lq);
    memcpy(o, g->g_o, n_out * sizeof *o);
    memcpy(l, g->g_l, n_l * sizeof *l);
    for (int64_t b = 0; b < c->B; b++) {
        const int64_t sq = t->sq[b];
        if (sq == 0 || t->sk[b] == 0)
            continue;
        sdpa_tensor q, k, v, mask;
        sdpa_params p;
        seq_views(t, b, &q, &k, &v, &mask, &p);
        tu_tensor so = tu_alloc(SDPA_F32, 1, c->Hq, sq, c->Dv, TU_BHLD, 0, 0);
        tu_tensor sl = tu_alloc(SDPA_F32, 1, c->Hq, sq, 1, TU_BHLD, 0, 0);
        const sdpa_status st = sdpa_forward(ctx, &q, &k, &v, &p, &so.t, &sl.t);
        if (st != SDPA_OK) {
            printf("    sdpa_forward of sequence %lld: %s: %s\n", (long long)b,
                   sdpa_status_name(st), sdpa_ctx_last_error(ctx));
            tu_free(&so);
            tu_free(&sl);
            return 0;
        }
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < sq; i++) {
                const size_t row = (size_t)((b * c->Hq + h) * c->Lq + i);
                l[row] = tu_get(&sl.t, 0, h, i, 0);
                for (int64_t d = 0; d < c->Dv; d++)
                    o[row * (size_t)c->Dv + (size_t)d] = tu_get(&so.t, 0, h, i, d);
            }
        tu_free(&so);
        tu_free(&sl);
    }
    return 1;
}

/* One case: the golden against the naive double result, then at every ISA level the CPU has
 * sdpa_forward_kv (and sdpa_forward per sequence) by the rule. @return 1 if all agree. */
static int run_kv_case(const kv_case *c) {
    kv_bufs t;
    kv_build(c, &t);
    const size_t n_out = (size_t)(c->B * c->Hq * c->Lq * c->Dv),
                 n_l = (size_t)(c->B * c->Hq * c->Lq);
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    kv_oracle g;
    int ok = kv_oracles(c, &t, ctx, &g);
    sdpa_ctx_destroy(ctx);
    ok = ok && within_ulp("reference out vs naive", g.g_o, g.n_o, n_out) &&
         within_ulp("reference lse vs naive", g.g_l, g.n_l, n_l);
    printf("    %-64s reference %s\n", c->what, ok ? "ok" : "MISMATCH");

    int32_t sk[MAXB], sq[MAXB];
    const sdpa_kv_cache kc = kv_desc(c, &t, sk, sq);
    double *o2 = xmalloc(n_out * sizeof(double)), *l2 = xmalloc(n_l * sizeof(double));
    for (int n = 0; n < g_n_impls; n++) {
        if (!g_impls[n].runs)
            continue;
        ctx = tu_ctx(0, g_impls[n].level);
        tu_fill_canary(&t.o);
        tu_fill_canary(&t.lse);
        const sdpa_status st = sdpa_forward_kv(ctx, &t.q.t, &kc, &t.p, &t.o.t, &t.lse.t);
        char what[160];
        if (st != SDPA_OK) {
            printf("    %s [%s]: sdpa_forward_kv: %s: %s\n", c->what, g_impls[n].name,
                   sdpa_status_name(st), sdpa_ctx_last_error(ctx));
            ok = 0;
        } else {
            double *o = tu_to_doubles(&t.o.t), *l = tu_to_doubles(&t.lse.t);
            snprintf(what, sizeof what, "[%s] kv", g_impls[n].name);
            if (!kv_rule(what, o, l, &g, n_out, n_l, c->Dv)) {
                printf("    %s [%s]: sdpa_forward_kv FAILS THE RULE\n", c->what, g_impls[n].name);
                ok = 0;
            }
            free(o);
            free(l);
        }
        snprintf(what, sizeof what, "[%s] per sequence", g_impls[n].name);
        if (!per_sequence_forward(c, &t, ctx, &g, o2, l2) ||
            !kv_rule(what, o2, l2, &g, n_out, n_l, c->Dv)) {
            printf("    %s [%s]: sdpa_forward per sequence FAILS THE RULE\n", c->what,
                   g_impls[n].name);
            ok = 0;
        }
        sdpa_ctx_destroy(ctx);
    }
    free(o2);
    free(l2);
    kv_oracle_free(&g);
    kv_free(&t);
    return ok;
}

static kv_case decode_case(const char *what, int64_t B, int64_t hq, int64_t hkv, int64_t page,
                           int64_t cap, sdpa_dtype dt, const int32_t *lens, uint64_t seed) {
    kv_case c;
    memset(&c, 0, sizeof c);
    c.what = what;
    c.B = B;
    c.Hq = hq;
    c.Hkv = hkv;
    c.Lq = 1;
    c.Dk = 32;
    c.Dv = 24;
    c.page = page;
    c.cap = cap;
    c.kv_dt = dt;
    for (int64_t b = 0; b < B; b++) {
        c.sk[b] = lens[b];
        c.sq[b] = 1;
    }
    c.align = SDPA_ALIGN_BOTTOM_RIGHT;
    c.seed = seed;
    return c;
}

/* Gives case n of a sweep its features, in turn: none; causal and a window with sinks; ALiBi,
 * softcap and an additive mask; causal, a bool mask and sinks. */
static void vary_features(kv_case *c, int n) {
    switch (n % 4) {
    case 1:
        c->causal = 1;
        c->use_window = 1;
        c->window_left = 300;
        c->window_right = -1;
        c->sinks = 1;
        break;
    case 2:
        c->alibi = 1;
        c->softcap = 8.0f;
        c->mask = MASK_ADD;
        break;
    case 3:
        c->causal = 1;
        c->mask = MASK_BOOL_BCAST;
        c->sinks = 1;
        c->alibi = 1;
        break;
    default:
        break;
    }
}

static const char *feature_name(int n) {
    static const char *const names[4] = {"plain", "causal+window+sinks", "alibi+softcap+mask",
                                         "causal+bool mask+sinks+alibi"};
    return names[n % 4];
}

/* Decode (Lq = 1) on paged caches: page sizes 16, 64 and 256, GQA ratios 1, 4 and 8, f32, f16
 * and bf16. Four sequences of two kv heads are 8 tasks, so a capacity of 2048 keys is split
 * into 4 chunks of 512: lengths at the chunk boundaries +-1, at page boundaries +-1, 0 and
 * 1 key, and the full capacity. */
static void test_paged_decode(void) {
    static const int64_t pages[3] = {16, 64, 256};
    static const int64_t ratios[3] = {1, 4, 8};
    static const sdpa_dtype dts[3] = {SDPA_F32, SDPA_F16, SDPA_BF16};
    int n = 0;
    for (int a = 0; a < 3; a++)
        for (int g = 0; g < 3; g++, n++) {
            const int64_t P = pages[a];
            /* chunk boundaries (512, 1024, 1536) +-1, page boundaries +-1, 0, 1, full */
            const int32_t d = (int32_t)(n % 3) - 1;
            const int32_t lens[8] = {(int32_t)(512 + d),         (int32_t)(1024 - d),
                                     (int32_t)(P - 1 + (n % 3)), n % 2 ? 0 : 1,
                                     (int32_t)(1536 + d),        2048,
                                     (int32_t)(3 * P + d),       (int32_t)(2 * P)};
            char what[128];
            snprintf(what, sizeof what, "paged decode page %lld ratio %lld %s %s", (long long)P,
                     (long long)ratios[g], sdpa_dtype_name(dts[(a + g) % 3]), feature_name(n));
            /* B = 4 sequences of 2 kv heads, or 8 of 1 (both 8 tasks) */
            const int64_t hkv = n % 2 ? 1 : 2, B = 8 / hkv;
            kv_case c = decode_case(what, B, hkv * ratios[g], hkv, P, 2048, dts[(a + g) % 3], lens,
                                    1000 + (uint64_t)n);
            c.blhd = n % 2;
            vary_features(&c, n);
            CHECK_MSG(run_kv_case(&c), "%s", what);
        }
}

/* Mixed lengths on a batch of 10 (20 tasks: two chunks), and one of 13 sequences of one kv head
 * (no split); seqlens_k NULL (every sequence full) and seqlens_q NULL. */
static void test_paged_mixed(void) {
    static const int32_t lens[13] = {0, 1, 15, 16, 17, 63, 64, 65, 255, 256, 257, 700, 1000};
    int n = 0;
    for (int64_t P = 16; P <= 256; P *= 4, n++) {
        char what[128];
        snprintf(what, sizeof what, "paged mixed B=10 page %lld f16 %s", (long long)P,
                 feature_name(n + 1));
        kv_case c = decode_case(what, 10, 8, 2, P, 1024, SDPA_F16, lens + 3, 2000 + (uint64_t)n);
        vary_features(&c, n + 1);
        c.no_sq = 1;
        CHECK_MSG(run_kv_case(&c), "%s", what);
    }
    kv_case c = decode_case("paged B=13 page 64 ratio 4 bf16, alibi+softcap+mask", 13, 4, 1, 64,
                            1024, SDPA_BF16, lens, 2100);
    vary_features(&c, 2);
    CHECK(run_kv_case(&c));
    c = decode_case("paged B=3 every sequence full (seqlens_k NULL) page 16", 3, 8, 2, 16, 528,
                    SDPA_F32, lens, 2200);
    c.no_sk = 1;
    c.sinks = 1;
    CHECK(run_kv_case(&c));
}

/* Chunked prefill: several queries per sequence, seqlens_q < Lq (rows past it 0 and -inf or
 * the sink), causal bottom-right per sequence (a sequence with fewer keys than queries has
 * fully masked rows), windows, ALiBi, softcap, masks; query blocks of the kernel cut by the
 * lengths (ratio 8: 16 positions a block). */
static void test_chunked_prefill(void) {
    static const int64_t pages[3] = {16, 64, 256};
    static const int64_t ratios[3] = {1, 4, 8};
    for (int n = 0; n < 6; n++) {
        kv_case c;
        memset(&c, 0, sizeof c);
        char what[128];
        const int64_t P = pages[n % 3], ratio = ratios[(n + n / 3) % 3];
        snprintf(what, sizeof what, "chunked prefill page %lld ratio %lld %s", (long long)P,
                 (long long)ratio, feature_name(n));
        c.what = what;
        c.B = 4;
        c.Hkv = 2;
        c.Hq = 2 * ratio;
        c.Lq = 40;
        c.Dk = 24;
        c.Dv = 40;
        c.page = P;
        c.cap = 1024;
        c.kv_dt = n % 3 == 0 ? SDPA_F32 : n % 3 == 1 ? SDPA_F16 : SDPA_BF16;
        const int32_t sq[4] = {40, 17, 0, 16}, sk[4] = {600, 17, 300, 9};
        memcpy(c.sq, sq, sizeof sq);
        memcpy(c.sk, sk, sizeof sk);
        c.causal = 1;
        c.align = SDPA_ALIGN_BOTTOM_RIGHT;
        c.blhd = n % 2;
        c.seed = 3000 + (uint64_t)n;
        vary_features(&c, n);
        c.causal = 1;
        CHECK_MSG(run_kv_case(&c), "%s", what);
    }
}

/* The case with 1 and 2 threads (each worker's widened head, flash.c WIDE_MIN_BLOCKS) bitwise
 * with 32 threads (too few query blocks a worker for it: tiles widened as read), at every
 * level, whatever the cores. */
static int widened_bitwise(const kv_case *c) {
    kv_bufs t;
    kv_build(c, &t);
    int32_t sk[MAXB], sq[MAXB];
    const sdpa_kv_cache kc = kv_desc(c, &t, sk, sq);
    tu_tensor o2 = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, c->Dv, TU_BHLD, 0, 0);
    tu_tensor l2 = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, 1, TU_BHLD, 0, 0);
    int ok = 1;
    for (int n = 0; n < g_n_impls; n++) {
        if (!g_impls[n].runs)
            continue;
        sdpa_ctx *ctx = tu_ctx(32, g_impls[n].level);
        ok &= sdpa_forward_kv(ctx, &t.q.t, &kc, &t.p, &t.o.t, &t.lse.t) == SDPA_OK;
        sdpa_ctx_destroy(ctx);
        for (int threads = 1; threads <= 2; threads++) {
            ctx = tu_ctx(threads, g_impls[n].level);
            tu_fill_canary(&o2);
            tu_fill_canary(&l2);
            const int same = sdpa_forward_kv(ctx, &t.q.t, &kc, &t.p, &o2.t, &l2.t) == SDPA_OK &&
                             memcmp(t.o.buf, o2.buf, o2.bytes) == 0 &&
                             memcmp(t.lse.buf, l2.buf, l2.bytes) == 0;
            if (!same)
                printf("    %s [%s]: %d threads differ from 32\n", c->what, g_impls[n].name,
                       threads);
            ok &= same;
            sdpa_ctx_destroy(ctx);
        }
    }
    tu_free(&o2);
    tu_free(&l2);
    kv_free(&t);
    return ok;
}

/* Chunked prefill long enough that each kv head has 4 or more query blocks (ratio 8: 16
 * positions a block: 13 blocks, two per worker up to 6 workers), so that the half-precision
 * cache is read from each worker's widened head (flash.c, WIDE_MIN_BLOCKS): through the block
 * table with pages 16 and 64, and the plain layout with ragged lengths, in both alignments;
 * against the reference, and bitwise the tiles widened as read. One kv head, so that a
 * worker's next head is another sequence's. */
static void test_chunked_prefill_widened(void) {
    for (int n = 0; n < 3; n++) {
        kv_case c;
        memset(&c, 0, sizeof c);
        c.what = n == 0   ? "long chunked prefill f16, page 16, causal bottom-right"
                 : n == 1 ? "long chunked prefill bf16, page 64, window and softcap, (B, L, H, D)"
                          : "long chunked prefill f16, plain ragged, top-left causal, mask";
        c.B = 4;
        c.Hkv = 1;
        c.Hq = 8;
        c.Lq = 200;
        c.Dk = 24;
        c.Dv = 40;
        c.page = n == 0 ? 16 : n == 1 ? 64 : 0;
        c.cap = 1024;
        c.kv_dt = n == 1 ? SDPA_BF16 : SDPA_F16;
        const int32_t sq[4] = {200, 70, 0, 150}, sk[4] = {700, 70, 300, 140};
        memcpy(c.sq, sq, sizeof sq);
        memcpy(c.sk, sk, sizeof sk);
        c.causal = 1;
        c.align = n == 2 ? SDPA_ALIGN_TOP_LEFT : SDPA_ALIGN_BOTTOM_RIGHT;
        c.blhd = n == 1;
        c.seed = 3100 + (uint64_t)n;
        if (n == 1) {
            c.use_window = 1;
            c.window_left = 40;
            c.window_right = 0;
            c.softcap = 20.0f;
        }
        if (n == 2)
            c.mask = MASK_ADD;
        CHECK_MSG(run_kv_case(&c), "%s", c.what);
        CHECK_MSG(widened_bitwise(&c), "%s", c.what);
    }
}

/* The plain layout with seqlens (no block table): rows past a length are NaN and never read;
 * decode across the chunks and prefill, causal in both alignments. */
static void test_plain_ragged(void) {
    static const int32_t lens[6] = {0, 1, 700, 1023, 1024, 1100};
    kv_case c = decode_case("plain ragged decode f32 (B, L, H, D), causal+window+sinks", 6, 8, 1, 0,
                            1100, SDPA_F32, lens, 4000);
    c.blhd = 1;
    vary_features(&c, 1);
    CHECK(run_kv_case(&c));
    c = decode_case("plain ragged decode bf16, alibi+softcap+mask", 6, 4, 1, 0, 1100, SDPA_BF16,
                    lens, 4001);
    vary_features(&c, 2);
    CHECK(run_kv_case(&c));
    c = decode_case("plain ragged prefill f16, top-left causal, mask, sinks", 3, 6, 2, 0, 300,
                    SDPA_F16, lens, 4002);
    c.Lq = 20;
    const int32_t sq[3] = {20, 0, 7}, sk[3] = {300, 50, 5};
    memcpy(c.sq, sq, sizeof sq);
    memcpy(c.sk, sk, sizeof sk);
    c.causal = 1;
    c.align = SDPA_ALIGN_TOP_LEFT;
    c.mask = MASK_ADD;
    c.sinks = 1;
    CHECK(run_kv_case(&c));
    c.what = "plain ragged prefill f16, window (3, 2) bottom-right, seqlens_q NULL";
    c.causal = 0;
    c.align = SDPA_ALIGN_BOTTOM_RIGHT;
    c.use_window = 1;
    c.window_left = 3;
    c.window_right = 2;
    c.no_sq = 1;
    c.sinks = 0;
    CHECK(run_kv_case(&c));
}

/* ======================================================================================== */
/* 2. Determinism                                                                            */
/* ======================================================================================== */

/* A paged batch, split into chunks: bitwise the same out and lse for 1, 2, 3 and 7 threads at
 * every ISA level, and on a second call. */
static void test_determinism(void) {
    static const int32_t lens[4] = {1500, 3, 1025, 2048};
    kv_case c = decode_case("determinism", 4, 8, 2, 64, 2048, SDPA_F16, lens, 5000);
    c.Lq = 3;
    for (int b = 0; b < 4; b++)
        c.sq[b] = b == 1 ? 2 : 3;
    c.causal = 1;
    c.sinks = 1;
    c.mask = MASK_ADD;
    kv_bufs t;
    kv_build(&c, &t);
    int32_t sk[MAXB], sq[MAXB];
    const sdpa_kv_cache kc = kv_desc(&c, &t, sk, sq);
    static const int threads[4] = {1, 2, 3, 7};
    unsigned char *ref_o = xmalloc(t.o.bytes), *ref_l = xmalloc(t.lse.bytes);
    for (int n = 0; n < g_n_impls; n++) {
        if (!g_impls[n].runs)
            continue;
        int same = 1;
        for (int a = 0; a < 4; a++) {
            sdpa_ctx *ctx = tu_ctx(threads[a], g_impls[n].level);
            for (int rep = 0; rep < (a == 0 ? 2 : 1); rep++) {
                tu_fill_canary(&t.o);
                tu_fill_canary(&t.lse);
                CHECK_INT_EQ(sdpa_forward_kv(ctx, &t.q.t, &kc, &t.p, &t.o.t, &t.lse.t), SDPA_OK);
                if (a == 0 && rep == 0) {
                    memcpy(ref_o, t.o.buf, t.o.bytes);
                    memcpy(ref_l, t.lse.buf, t.lse.bytes);
                } else {
                    same &= memcmp(ref_o, t.o.buf, t.o.bytes) == 0 &&
                            memcmp(ref_l, t.lse.buf, t.lse.bytes) == 0;
                }
            }
            sdpa_ctx_destroy(ctx);
        }
        printf("    [%s] threads 1, 2, 3, 7: %s\n", g_impls[n].name,
               same ? "bitwise equal" : "DIFFER");
        CHECK_MSG(same, "[%s] sdpa_forward_kv differs between thread counts", g_impls[n].name);
    }
    free(ref_o);
    free(ref_l);
    kv_free(&t);
}

/* ======================================================================================== */
/* 3. Attention sinks                                                                        */
/* ======================================================================================== */

/* A problem in doubles, contiguous (B, H, L, D), for the computation written here from
 * sdpa.h's text: s_ij = softcap(scale q_i . k_j) + mask_ij over the keys causal (with its
 * alignment) and the mask leave visible, and sink_h one more term of the denominator. */
typedef struct sk_prob {
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    const double *q, *k, *v;
    const double *mask; /* NULL or (B, Hq, Lq, Lk) additive; -inf hides */
    const float *sinks; /* NULL or Hq */
    double scale, softcap;
    int causal, bottom_right;
} sk_prob;

/* Row (b, h, i)'s scores s[j] (-inf: hidden) and scaled products x[j], in double (lp = -1) or
 * rounded to lp with f32 sums. @return the largest of the visible scores and the sink (-inf if
 * there is neither); *any: whether a key is visible. */
static double sk_scores(const sk_prob *p, int lp, int64_t b, int64_t h, int64_t i, double *s,
                        double *x, int *any) {
    const int64_t hk = h / (p->Hq / p->Hkv), off = p->bottom_right ? p->Lk - p->Lq : 0;
    double m = p->sinks != NULL ? (double)p->sinks[h] : -INFINITY;
    *any = 0;
    for (int64_t j = 0; j < p->Lk; j++) {
        s[j] = -INFINITY;
        if (p->causal && j > i + off)
            continue;
        const double mv =
            p->mask != NULL ? p->mask[((b * p->Hq + h) * p->Lq + i) * p->Lk + j] : 0.0;
        if (mv == -INFINITY)
            continue;
        double dot = 0.0;
        for (int64_t d = 0; d < p->Dk; d++)
            dot = tu_acc_round(lp, dot + p->q[((b * p->Hq + h) * p->Lq + i) * p->Dk + d] *
                                             p->k[((b * p->Hkv + hk) * p->Lk + j) * p->Dk + d]);
        x[j] = tu_round(lp, p->scale * dot);
        const double c =
            p->softcap > 0.0 ? tu_round(lp, p->softcap * tanh(x[j] / p->softcap)) : x[j];
        s[j] = tu_round(lp, c + mv);
        *any = 1;
        if (s[j] > m)
            m = s[j];
    }
    return m;
}

/* The denominator of a row: exp(sink - m) + sum_j exp(s_j - m). */
static double sk_sum(const sk_prob *p, int lp, int64_t h, const double *s, double m) {
    double sum = p->sinks != NULL && p->sinks[h] != -INFINITY ? exp((double)p->sinks[h] - m) : 0.0;
    for (int64_t j = 0; j < p->Lk; j++)
        if (s[j] != -INFINITY)
            sum = tu_acc_round(lp, sum + tu_acc_round(lp, exp(s[j] - m)));
    return sum;
}

/* out (B, Hq, Lq, Dv), lse (B, Hq, Lq), and empty (NULL or B*Hq*Lq flags: no visible key). */
static void sk_forward(const sk_prob *p, int lp, double *out, double *lse, unsigned char *empty) {
    double *s = xmalloc((size_t)p->Lk * sizeof *s), *x = xmalloc((size_t)p->Lk * sizeof *x);
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t h = 0; h < p->Hq; h++) {
            const int64_t hk = h / (p->Hq / p->Hkv);
            for (int64_t i = 0; i < p->Lq; i++) {
                const int64_t row = (b * p->Hq + h) * p->Lq + i;
                int any;
                const double m = sk_scores(p, lp, b, h, i, s, x, &any);
                if (empty != NULL)
                    empty[row] = (unsigned char)!any;
                double *o = out + row * p->Dv;
                for (int64_t d = 0; d < p->Dv; d++)
                    o[d] = 0.0;
                if (m == -INFINITY) {
                    lse[row] = -INFINITY;
                    continue;
                }
                const double sum = sk_sum(p, lp, h, s, m);
                for (int64_t d = 0; d < p->Dv; d++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < p->Lk; j++)
                        if (s[j] != -INFINITY)
                            acc = tu_acc_round(
                                lp, acc + tu_round(lp, exp(s[j] - m) / sum) *
                                              p->v[((b * p->Hkv + hk) * p->Lk + j) * p->Dv + d]);
                    o[d] = tu_round(lp, acc);
                }
                lse[row] = tu_acc_round(lp, m + log(sum));
            }
        }
    free(s);
    free(x);
}

/* The gradients of L = sum dout . O (dq like q, dk like k, dv like v; GQA heads summed):
 *   P_ij = exp(s_ij - LSE_i) (the sink in LSE), D_i = dO_i . O_i, dS_ij = P_ij (dO_i . v_j - D_i),
 *   dX_ij = dS_ij softcap'(x_ij), dQ_i = scale sum_j dX_ij k_j, dK_j = scale sum_i dX_ij q_i,
 *   dV_j = sum_i P_ij dO_i. */
static void sk_backward(const sk_prob *p, const double *dout, int lp, double *dq, double *dk,
                        double *dv) {
    double *s = xmalloc((size_t)p->Lk * sizeof *s), *x = xmalloc((size_t)p->Lk * sizeof *x);
    double *pr = xmalloc((size_t)p->Lk * sizeof *pr), *o = xmalloc((size_t)p->Dv * sizeof *o);
    memset(dk, 0, (size_t)(p->B * p->Hkv * p->Lk * p->Dk) * sizeof *dk);
    memset(dv, 0, (size_t)(p->B * p->Hkv * p->Lk * p->Dv) * sizeof *dv);
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t h = 0; h < p->Hq; h++) {
            const int64_t hk = h / (p->Hq / p->Hkv);
            for (int64_t i = 0; i < p->Lq; i++) {
                const int64_t row = (b * p->Hq + h) * p->Lq + i;
                double *dq_i = dq + row * p->Dk;
                const double *q_i = p->q + row * p->Dk, *do_i = dout + row * p->Dv;
                for (int64_t d = 0; d < p->Dk; d++)
                    dq_i[d] = 0.0;
                int any;
                const double m = sk_scores(p, lp, b, h, i, s, x, &any);
                if (!any)
                    continue;
                const double sum = sk_sum(p, lp, h, s, m);
                for (int64_t j = 0; j < p->Lk; j++)
                    pr[j] = s[j] == -INFINITY ? 0.0 : tu_round(lp, exp(s[j] - m) / sum);
                double delta = 0.0;
                for (int64_t d = 0; d < p->Dv; d++) {
                    o[d] = 0.0;
                    for (int64_t j = 0; j < p->Lk; j++)
                        if (s[j] != -INFINITY)
                            o[d] = tu_acc_round(
                                lp,
                                o[d] + pr[j] * p->v[((b * p->Hkv + hk) * p->Lk + j) * p->Dv + d]);
                    delta = tu_acc_round(lp, delta + do_i[d] * tu_round(lp, o[d]));
                }
                for (int64_t j = 0; j < p->Lk; j++) {
                    if (s[j] == -INFINITY)
                        continue;
                    const double *k_j = p->k + ((b * p->Hkv + hk) * p->Lk + j) * p->Dk;
                    const double *v_j = p->v + ((b * p->Hkv + hk) * p->Lk + j) * p->Dv;
                    double *dk_j = dk + ((b * p->Hkv + hk) * p->Lk + j) * p->Dk;
                    double *dv_j = dv + ((b * p->Hkv + hk) * p->Lk + j) * p->Dv;
                    double dp = 0.0;
                    for (int64_t d = 0; d < p->Dv; d++) {
                        dp = tu_acc_round(lp, dp + do_i[d] * v_j[d]);
                        dv_j[d] = tu_acc_round(lp, dv_j[d] + pr[j] * do_i[d]);
                    }
                    double dx = tu_round(lp, pr[j] * (dp - delta));
                    if (p->softcap > 0.0) {
                        const double th = tanh(x[j] / p->softcap);
                        dx = tu_round(lp, dx * (1.0 - th * th));
                    }
                    for (int64_t d = 0; d < p->Dk; d++) {
                        dq_i[d] = tu_acc_round(lp, dq_i[d] + p->scale * dx * k_j[d]);
                        dk_j[d] = tu_acc_round(lp, dk_j[d] + p->scale * dx * q_i[d]);
                    }
                }
                for (int64_t d = 0; d < p->Dk; d++)
                    dq_i[d] = tu_round(lp, dq_i[d]);
            }
        }
    for (int64_t n = 0; n < p->B * p->Hkv * p->Lk * p->Dk; n++)
        dk[n] = tu_round(lp, dk[n]);
    for (int64_t n = 0; n < p->B * p->Hkv * p->Lk * p->Dv; n++)
        dv[n] = tu_round(lp, dv[n]);
    free(s);
    free(x);
    free(pr);
    free(o);
}

/* The tensors of a sinks case (plain sdpa_forward). */
typedef struct sk_case {
    const char *what;
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    sdpa_dtype dt, kv_dt; /* q, out, dout and gradients; k and v */
    int causal, bottom_right;
    float softcap;
    int mask;        /* an additive mask: holes, and every 7th row hidden whole */
    float sinks[16]; /* Hq sinks */
    uint64_t seed;
} sk_case;

typedef struct sk_bufs {
    tu_tensor q, k, v, o, lse, mask, dout;
    double *qd, *kd, *vd, *md, *doutd;
    sdpa_params p;
    sk_prob pb;
} sk_bufs;

static void sk_build(const sk_case *c, sk_bufs *t) {
    memset(t, 0, sizeof *t);
    tu_rng r = {c->seed};
    t->q = tu_alloc(c->dt, c->B, c->Hq, c->Lq, c->Dk, TU_BHLD, 0, 0);
    t->k = tu_alloc(c->kv_dt, c->B, c->Hkv, c->Lk, c->Dk, TU_BHLD, 0, 0);
    t->v = tu_alloc(c->kv_dt, c->B, c->Hkv, c->Lk, c->Dv, TU_BHLD, 0, 0);
    t->o = tu_alloc(c->dt, c->B, c->Hq, c->Lq, c->Dv, TU_BHLD, 0, 0);
    t->lse = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, 1, TU_BHLD, 0, 0);
    t->dout = tu_alloc(c->dt, c->B, c->Hq, c->Lq, c->Dv, TU_BHLD, 0, 0);
    tu_fill_randn(&t->q, &r, 1.0, 0.0);
    tu_fill_randn(&t->k, &r, 1.0, 0.0);
    tu_fill_randn(&t->v, &r, 1.0, 0.0);
    tu_fill_randn(&t->dout, &r, 1.0, 0.0);
    t->p.causal = c->causal;
    t->p.align = c->bottom_right ? SDPA_ALIGN_BOTTOM_RIGHT : SDPA_ALIGN_TOP_LEFT;
    t->p.softcap = c->softcap;
    t->p.sinks = c->sinks;
    if (c->mask) {
        t->mask = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, c->Lk, TU_BHLD, 0, 0);
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t h = 0; h < c->Hq; h++)
                for (int64_t i = 0; i < c->Lq; i++)
                    for (int64_t j = 0; j < c->Lk; j++)
                        tu_set(&t->mask.t, b, h, i, j,
                               i % 7 == 3 || tu_uniform(&r) < 0.2 ? -INFINITY : 0.5 * tu_randn(&r));
        t->p.mask = &t->mask.t;
        t->md = tu_to_doubles(&t->mask.t);
    }
    t->qd = tu_to_doubles(&t->q.t);
    t->kd = tu_to_doubles(&t->k.t);
    t->vd = tu_to_doubles(&t->v.t);
    t->doutd = tu_to_doubles(&t->dout.t);
    sk_prob *pb = &t->pb;
    pb->B = c->B, pb->Hq = c->Hq, pb->Hkv = c->Hkv, pb->Lq = c->Lq, pb->Lk = c->Lk;
    pb->Dk = c->Dk, pb->Dv = c->Dv;
    pb->q = t->qd, pb->k = t->kd, pb->v = t->vd, pb->mask = t->md, pb->sinks = c->sinks;
    pb->scale = 1.0 / sqrt((double)c->Dk);
    pb->softcap = (double)c->softcap;
    pb->causal = c->causal;
    pb->bottom_right = c->bottom_right;
}

static void sk_free(sk_bufs *t) {
    tu_tensor *all[] = {&t->q, &t->k, &t->v, &t->o, &t->lse, &t->mask, &t->dout};
    for (size_t n = 0; n < sizeof all / sizeof all[0]; n++)
        tu_free(all[n]);
    free(t->qd);
    free(t->kd);
    free(t->vd);
    free(t->md);
    free(t->doutd);
}

/* sdpa_forward with sinks at every ISA level against the computation above, by the rule; the
 * reference (tu_golden_forward) within an f32 ulp of it; rows that see no key exactly 0 with
 * LSE = the sink. */
static int run_sink_forward(const sk_case *c) {
    sk_bufs t;
    sk_build(c, &t);
    const size_t n_out = (size_t)(c->B * c->Hq * c->Lq * c->Dv),
                 n_l = (size_t)(c->B * c->Hq * c->Lq);
    double *g_o = xmalloc(n_out * sizeof(double)), *g_l = xmalloc(n_l * sizeof(double));
    double *lp_o = xmalloc(n_out * sizeof(double)), *lp_l = xmalloc(n_l * sizeof(double));
    unsigned char *empty = xmalloc(n_l);
    sk_forward(&t.pb, -1, g_o, g_l, empty);
    sk_forward(&t.pb, (int)c->dt, lp_o, lp_l, NULL);

    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    int ok = tu_golden_forward(ctx, &t.q.t, &t.k.t, &t.v.t, &t.p, &t.o.t, &t.lse.t) == SDPA_OK;
    if (ok) {
        double *o = tu_to_doubles(&t.o.t), *l = tu_to_doubles(&t.lse.t);
        if (c->dt == SDPA_F32)
            ok = within_ulp("reference out vs sinks in double", o, g_o, n_out);
        ok = within_ulp("reference lse vs sinks in double", l, g_l, n_l) && ok;
        free(o);
        free(l);
    }
    sdpa_ctx_destroy(ctx);
    printf("    %-64s reference %s\n", c->what, ok ? "ok" : "MISMATCH");

    const double kf = c->dt == SDPA_F32 ? 3.0 : 2.0;
    const double gate = c->dt == SDPA_F32 ? 1e-10 : c->dt == SDPA_F16 ? 1e-6 : 5e-5;
    for (int n = 0; n < g_n_impls; n++) {
        if (!g_impls[n].runs)
            continue;
        ctx = tu_ctx(0, g_impls[n].level);
        tu_fill_canary(&t.o);
        tu_fill_canary(&t.lse);
        const sdpa_status st = sdpa_forward(ctx, &t.q.t, &t.k.t, &t.v.t, &t.p, &t.o.t, &t.lse.t);
        CHECK_INT_EQ(st, SDPA_OK);
        double *o = tu_to_doubles(&t.o.t), *l = tu_to_doubles(&t.lse.t);
        char what[128];
        snprintf(what, sizeof what, "[%s] sinks out", g_impls[n].name);
        int good = tu_rule(what, o, lp_o, g_o, n_out, c->dt, kf, gate);
        snprintf(what, sizeof what, "[%s] sinks lse", g_impls[n].name);
        good = tu_rule(what, l, lp_l, g_l, n_l, SDPA_F32, 3.0, 0.0) && good;
        size_t bad_rows = 0;
        for (size_t r = 0; r < n_l; r++) {
            if (!empty[r])
                continue;
            for (int64_t d = 0; d < c->Dv; d++)
                bad_rows += o[r * (size_t)c->Dv + (size_t)d] != 0.0;
            bad_rows += !(l[r] == (double)c->sinks[r / (size_t)c->Lq % (size_t)c->Hq]);
        }
        if (bad_rows)
            printf("    [%s] %zu values of rows without keys are not 0 / the sink\n",
                   g_impls[n].name, bad_rows);
        if (!good || bad_rows) {
            printf("    %s [%s] FAILS\n", c->what, g_impls[n].name);
            ok = 0;
        }
        free(o);
        free(l);
        sdpa_ctx_destroy(ctx);
    }
    free(g_o);
    free(g_l);
    free(lp_o);
    free(lp_l);
    free(empty);
    sk_free(&t);
    return ok;
}

static sk_case sink_case(const char *what, int64_t B, int64_t hq, int64_t hkv, int64_t lq,
                         int64_t lk, int64_t d, uint64_t seed) {
    sk_case c;
    memset(&c, 0, sizeof c);
    c.what = what;
    c.B = B;
    c.Hq = hq;
    c.Hkv = hkv;
    c.Lq = lq;
    c.Lk = lk;
    c.Dk = c.Dv = d;
    c.dt = c.kv_dt = SDPA_F32;
    c.seed = seed;
    static const float pattern[8] = {0.5f, -INFINITY, 2.0f, -1.0f, 4.0f, 0.0f, -INFINITY, 1.5f};
    for (int h = 0; h < 16; h++)
        c.sinks[h] = pattern[h % 8];
    return c;
}

/* The tiled forward's two ways of finishing a row with a sink: once per row (no split), once
 * after the chunks' merge (split-KV: Lq = 1 and thousands of keys). */
static void test_sinks_forward(void) {
    sk_case c = sink_case("sinks: no split, causal bottom-right, mask (every 7th row hidden)", 2, 4,
                          2, 37, 75, 32, 6000);
    c.causal = c.bottom_right = 1;
    c.mask = 1;
    CHECK(run_sink_forward(&c));
    c = sink_case("sinks: no split, Lq > Lk bottom-right (7 rows without keys)", 1, 8, 2, 37, 30,
                  16, 6001);
    c.causal = c.bottom_right = 1;
    CHECK(run_sink_forward(&c));
    c = sink_case("sinks: no split, softcap 5 (the sink is not capped), bf16", 2, 4, 1, 20, 60, 24,
                  6002);
    c.softcap = 5.0f;
    c.dt = c.kv_dt = SDPA_BF16;
    for (int h = 0; h < 4; h++)
        c.sinks[h] = h == 1 ? 7.0f : c.sinks[h];
    CHECK(run_sink_forward(&c));
    c = sink_case("sinks: split Lq=1 Lk=2500 ratio 4, f16 cache", 1, 8, 2, 1, 2500, 64, 6003);
    c.kv_dt = SDPA_F16;
    CHECK(run_sink_forward(&c));
    c = sink_case("sinks: split Lq=2 Lk=2048 causal bottom-right, mask", 1, 4, 1, 2, 2048, 32,
                  6004);
    c.causal = c.bottom_right = 1;
    c.mask = 1;
    CHECK(run_sink_forward(&c));
}

/* A sink far above every score: O is that far below V (exp(s - sink)), LSE the sink to f32's
 * precision; at 1e30 and FLT_MAX the weights are exactly 0 and LSE exactly the sink. */
static void test_sinks_far_above(void) {
    static const float big[4] = {80.0f, 1e30f, FLT_MAX, 60.0f};
    for (int split = 0; split < 2; split++) {
        sk_case c = split ? sink_case("far sinks, split", 1, 4, 2, 1, 3000, 32, 6100)
                          : sink_case("far sinks, no split", 2, 4, 2, 9, 40, 32, 6101);
        memcpy(c.sinks, big, sizeof big);
        sk_bufs t;
        sk_build(&c, &t);
        const size_t n_l = (size_t)(c.B * c.Hq * c.Lq);
        double *g_o = xmalloc(n_l * (size_t)c.Dv * sizeof(double)),
               *g_l = xmalloc(n_l * sizeof(double));
        sk_forward(&t.pb, -1, g_o, g_l, NULL);
        for (int n = 0; n < g_n_impls; n++) {
            if (!g_impls[n].runs)
                continue;
            sdpa_ctx *ctx = tu_ctx(0, g_impls[n].level);
            CHECK_INT_EQ(sdpa_forward(ctx, &t.q.t, &t.k.t, &t.v.t, &t.p, &t.o.t, &t.lse.t),
                         SDPA_OK);
            size_t bad = 0;
            double worst = 0.0;
            for (size_t r = 0; r < n_l; r++) {
                const int64_t h = (int64_t)(r / (size_t)c.Lq % (size_t)c.Hq);
                const double lse = ((const float *)t.lse.t.data)[r];
                bad += !(lse == (double)c.sinks[h]);
                double row_max = 0.0;
                for (int64_t d = 0; d < c.Dv; d++)
                    row_max = fmax(row_max, fabs(g_o[r * (size_t)c.Dv + (size_t)d]));
                for (int64_t d = 0; d < c.Dv; d++) {
                    const double got = ((float *)t.o.t.data)[r * (size_t)c.Dv + (size_t)d];
                    const double want = g_o[r * (size_t)c.Dv + (size_t)d];
                    if (c.sinks[h] >= 1e30f) {
                        bad += got != 0.0;
                    } else {
                        const double e = fabs(got - want) / row_max;
                        worst = fmax(worst, e);
                        bad += !(e <= 1e-5) || !(row_max > 0.0);
                    }
                }
            }
            printf("    [%s] %s: worst error of O relative to its row %.2e\n", g_impls[n].name,
                   c.what, worst);
            CHECK_MSG(bad == 0, "[%s] %s: %zu values off", g_impls[n].name, c.what, bad);
            sdpa_ctx_destroy(ctx);
        }
        free(g_o);
        free(g_l);
        sk_free(&t);
    }
}

/* -inf on every head: the bits of no sinks at all, on every path (reference included). */
static void test_sinks_minus_inf(void) {
    for (int split = 0; split < 2; split++) {
        sk_case c = split ? sink_case("-inf sinks, split", 1, 8, 2, 1, 2100, 40, 6200)
                          : sink_case("-inf sinks, no split, mask", 2, 4, 2, 30, 50, 40, 6201);
        c.mask = !split;
        c.causal = c.bottom_right = 1;
        for (int h = 0; h < 16; h++)
            c.sinks[h] = -INFINITY;
        sk_bufs t;
        sk_build(&c, &t);
        tu_tensor o2 = tu_alloc(SDPA_F32, c.B, c.Hq, c.Lq, c.Dv, TU_BHLD, 0, 0);
        tu_tensor l2 = tu_alloc(SDPA_F32, c.B, c.Hq, c.Lq, 1, TU_BHLD, 0, 0);
        sdpa_params none = t.p;
        none.sinks = NULL;
        for (int n = -1; n < g_n_impls; n++) {
            if (n >= 0 && !g_impls[n].runs)
                continue;
            sdpa_ctx *ctx = tu_ctx(0, n < 0 ? SDPA_ISA_AUTO : g_impls[n].level);
            sdpa_status a, b;
            if (n < 0) { /* the reference */
                a = tu_golden_forward(ctx, &t.q.t, &t.k.t, &t.v.t, &t.p, &t.o.t, &t.lse.t);
                b = tu_golden_forward(ctx, &t.q.t, &t.k.t, &t.v.t, &none, &o2.t, &l2.t);
            } else {
                a = sdpa_forward(ctx, &t.q.t, &t.k.t, &t.v.t, &t.p, &t.o.t, &t.lse.t);
                b = sdpa_forward(ctx, &t.q.t, &t.k.t, &t.v.t, &none, &o2.t, &l2.t);
            }
            CHECK(a == SDPA_OK && b == SDPA_OK);
            const int same =
                memcmp(t.o.buf, o2.buf, o2.bytes) == 0 && memcmp(t.lse.buf, l2.buf, l2.bytes) == 0;
            const char *name = n < 0 ? "reference" : g_impls[n].name;
            printf("    [%s] %s: %s\n", name, c.what, same ? "bitwise no sinks" : "DIFFERS");
            CHECK_MSG(same, "[%s] %s differs from no sinks", name, c.what);
            sdpa_ctx_destroy(ctx);
        }
        tu_free(&o2);
        tu_free(&l2);
        sk_free(&t);
    }
}

/* sdpa_weights with sinks: p_ij = exp(s_ij - LSE_i) with the sink in LSE, so a row sums to
 * 1 - exp(sink - LSE) < 1; rows without keys are 0; a -inf sink sums to 1. */
static void test_sinks_weights(void) {
    sk_case c = sink_case("weights", 2, 4, 2, 9, 20, 16, 6300);
    c.mask = 1;
    c.causal = c.bottom_right = 1;
    sk_bufs t;
    sk_build(&c, &t);
    const size_t n_l = (size_t)(c.B * c.Hq * c.Lq);
    double *g_o = xmalloc(n_l * (size_t)c.Dv * sizeof(double)),
           *g_l = xmalloc(n_l * sizeof(double));
    unsigned char *empty = xmalloc(n_l);
    sk_forward(&t.pb, -1, g_o, g_l, empty);
    tu_tensor w = tu_alloc(SDPA_F32, c.B, c.Hq, c.Lq, c.Lk, TU_BHLD, 0, 0);
    sdpa_ctx *ctx = tu_ctx(0, SDPA_ISA_AUTO);
    CHECK_INT_EQ(sdpa_weights(ctx, &t.q.t, &t.k.t, &t.p, &w.t), SDPA_OK);
    double *s = xmalloc((size_t)c.Lk * sizeof *s), *x = xmalloc((size_t)c.Lk * sizeof *x);
    size_t bad = 0, below_one = 0, finite_rows = 0;
    double worst = 0.0;
    for (int64_t b = 0; b < c.B; b++)
        for (int64_t h = 0; h < c.Hq; h++)
            for (int64_t i = 0; i < c.Lq; i++) {
                const size_t row = (size_t)((b * c.Hq + h) * c.Lq + i);
                int any;
                sk_scores(&t.pb, -1, b, h, i, s, x, &any);
                double sum = 0.0;
                for (int64_t j = 0; j < c.Lk; j++) {
                    const double got = tu_get(&w.t, b, h, i, j);
                    const double want = s[j] == -INFINITY ? 0.0 : exp(s[j] - g_l[row]);
                    const double rel = fabs(got - want) / (want + 1e-40);
                    worst = rel > worst ? rel : worst;
                    /* the tiled path forms the score, its exp and the factor 1 / l in
                     * f32 (about 5 ulp here): 16 ulp of the weight */
                    bad += !(fabs(got - want) <= 0x1p-19 * want + 1e-40);
                    sum += got;
                }
                const double sink = (double)c.sinks[h];
                if (!any) {
                    bad += sum != 0.0;
                } else if (sink == -INFINITY) {
                    bad += !(fabs(sum - 1.0) <= 1e-6);
                } else {
                    finite_rows++;
                    below_one += sum < 1.0;
                    bad += !(fabs(sum - (1.0 - exp(sink - g_l[row]))) <= 1e-6);
                }
            }
    printf(
        "    weights: %zu rows with a finite sink, %zu sum below 1; %zu values off, worst %.3g\n",
        finite_rows, below_one, bad, worst);
    CHECK(bad == 0);
    CHECK(finite_rows > 0 && below_one == finite_rows);
    free(s);
    free(x);
    free(g_o);
    free(g_l);
    free(empty);
    tu_free(&w);
    sdpa_ctx_destroy(ctx);
    sk_free(&t);
}

/* The reference backward (in double) on c's problem, into f32 gradients it allocates.
 * @return 1, or 0 (with a message) on failure. */
static int ref_backward(sdpa_ctx *ctx, sk_bufs *t, const sk_case *c, tu_tensor *dq, tu_tensor *dk,
                        tu_tensor *dv) {
    *dq = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, c->Dk, TU_BHLD, 0, 0);
    *dk = tu_alloc(SDPA_F32, c->B, c->Hkv, c->Lk, c->Dk, TU_BHLD, 0, 0);
    *dv = tu_alloc(SDPA_F32, c->B, c->Hkv, c->Lk, c->Dv, TU_BHLD, 0, 0);
    sdpa__problem p;
    sdpa_status st = sdpa__check_backward(ctx, &t->q.t, &t->k.t, &t->v.t, &t->o.t, &t->lse.t,
                                          &t->dout.t, &t->p, &dq->t, &dk->t, &dv->t, &p);
    if (st == SDPA_OK)
        st = sdpa__ref_backward(ctx, &p, &t->dout.t, &dq->t, &dk->t, &dv->t);
    if (st != SDPA_OK)
        printf("    reference backward: %s: %s\n", sdpa_status_name(st), sdpa_ctx_last_error(ctx));
    return st == SDPA_OK;
}

/* The backward with sinks. On tiny problems the gradients written here are checked against
 * central differences of the forward written here (f64, eps 1e-6, relative error <= 1e-6), and
 * the reference backward against them to f32's rounding; then the tiled backward at every ISA
 * level against the reference by testing.md's rule for gradients (k = 8 for f32, 3 for bf16;
 * NMSE gate on dV only), with this file's backward in the storage precision as the baseline,
 * and dq = 0 exactly in rows without keys. */
static void test_sinks_backward(void) {
    /* 1. tiny problems: the gradients of L = sum dout . O by central differences */
    for (int n = 0; n < 2; n++) {
        sk_case c = sink_case(n ? "tiny: softcap 2, sinks 3 and -inf" : "tiny: causal, mask, sinks",
                              1, 2, 1, 3, 4, 3, 6400 + (uint64_t)n);
        c.Dv = 2;
        if (n == 0) {
            c.causal = c.bottom_right = 1;
            c.mask = 1; /* row 3 of 7 does not exist here: hide row 1 of head 0 by hand below */
            c.sinks[0] = 0.7f;
            c.sinks[1] = -0.3f;
        } else {
            c.softcap = 2.0f;
            c.sinks[0] = 3.0f;
            c.sinks[1] = -INFINITY;
        }
        sk_bufs t;
        sk_build(&c, &t);
        if (n == 0) {
            for (int64_t j = 0; j < c.Lk; j++) {
                tu_set(&t.mask.t, 0, 0, 1, j, -INFINITY);
                t.md[(0 * c.Hq + 0) * c.Lq * c.Lk + 1 * c.Lk + j] = -INFINITY;
            }
        }
        const size_t nq = (size_t)(c.Hq * c.Lq * c.Dk), nk = (size_t)(c.Hkv * c.Lk * c.Dk),
                     nv = (size_t)(c.Hkv * c.Lk * c.Dv), no = (size_t)(c.Hq * c.Lq * c.Dv);
        double *dq = xmalloc(nq * sizeof(double)), *dk = xmalloc(nk * sizeof(double)),
               *dv = xmalloc(nv * sizeof(double));
        sk_backward(&t.pb, t.doutd, -1, dq, dk, dv);
        double *o = xmalloc(no * sizeof(double)),
               *l = xmalloc((size_t)(c.Hq * c.Lq) * sizeof(double));
        double *const params[3] = {t.qd, t.kd, t.vd}, *const grads[3] = {dq, dk, dv};
        const size_t sizes[3] = {nq, nk, nv};
        static const char *const names[3] = {"dq", "dk", "dv"};
        for (int a = 0; a < 3; a++) {
            double worst = 0.0, scale = 0.0;
            for (size_t e = 0; e < sizes[a]; e++) {
                const double keep = params[a][e], eps = 1e-6;
                double loss[2];
                for (int side = 0; side < 2; side++) {
                    params[a][e] = keep + (side ? -eps : eps);
                    sk_forward(&t.pb, -1, o, l, NULL);
                    loss[side] = 0.0;
                    for (size_t m = 0; m < no; m++)
                        loss[side] += t.doutd[m] * o[m];
                }
                params[a][e] = keep;
                const double fd = (loss[0] - loss[1]) / (2.0 * eps);
                worst = fmax(worst, fabs(fd - grads[a][e]));
                scale = fmax(scale, fabs(fd));
            }
            printf("    %s: %s analytic vs central differences: %.2e of %.2e\n", c.what, names[a],
                   worst, scale);
            CHECK_MSG(worst <= 1e-6 * scale, "%s: %s off the central differences", c.what,
                      names[a]);
        }
        /* the reference backward against the analytic gradients, to f32's rounding */
        sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
        CHECK_INT_EQ(sdpa_forward(ctx, &t.q.t, &t.k.t, &t.v.t, &t.p, &t.o.t, &t.lse.t), SDPA_OK);
        tu_tensor rq, rk, rv;
        if (ref_backward(ctx, &t, &c, &rq, &rk, &rv)) {
            const tu_tensor *const ref[3] = {&rq, &rk, &rv};
            for (int a = 0; a < 3; a++) {
                double *r = tu_to_doubles(&ref[a]->t);
                size_t bad = 0;
                for (size_t e = 0; e < sizes[a]; e++)
                    bad += !(fabs(r[e] - grads[a][e]) <= 0x1p-23 * fabs(grads[a][e]) + 1e-12);
                CHECK_MSG(bad == 0, "%s: the reference's %s: %zu values off", c.what, names[a],
                          bad);
                free(r);
            }
        }
        tu_free(&rq);
        tu_free(&rk);
        tu_free(&rv);
        sdpa_ctx_destroy(ctx);
        free(dq);
        free(dk);
        free(dv);
        free(o);
        free(l);
        sk_free(&t);
    }

    /* 2. the tiled backward against the reference */
    for (int n = 0; n < 3; n++) {
        sk_case c =
            n == 0   ? sink_case("tiled backward: causal, mask, sinks", 2, 4, 2, 70, 130, 32, 6500)
            : n == 1 ? sink_case("tiled backward: GQA 4, softcap, sinks, bf16", 1, 8, 2, 33, 97, 24,
                                 6501)
                     : sink_case("tiled backward: Lq=1, Lk=600, sinks", 2, 8, 1, 1, 600, 16, 6502);
        if (n == 0) {
            c.causal = c.bottom_right = 1;
            c.mask = 1;
            c.Dv = 24;
        } else if (n == 1) {
            c.softcap = 4.0f;
            c.dt = c.kv_dt = SDPA_BF16;
        }
        sk_bufs t;
        sk_build(&c, &t);
        const size_t nq = (size_t)(c.B * c.Hq * c.Lq * c.Dk),
                     nk = (size_t)(c.B * c.Hkv * c.Lk * c.Dk),
                     nv = (size_t)(c.B * c.Hkv * c.Lk * c.Dv), n_l = (size_t)(c.B * c.Hq * c.Lq);
        double *lq = xmalloc(nq * sizeof(double)), *lk = xmalloc(nk * sizeof(double)),
               *lv = xmalloc(nv * sizeof(double));
        sk_backward(&t.pb, t.doutd, (int)c.dt, lq, lk, lv);
        /* the rows without keys, from the forward written here */
        double *fo = xmalloc((size_t)(c.B * c.Hq * c.Lq * c.Dv) * sizeof(double));
        double *gl = xmalloc(n_l * sizeof(double));
        unsigned char *empty = xmalloc(n_l);
        sk_forward(&t.pb, -1, fo, gl, empty);
        free(fo);
        sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
        tu_tensor rq, rk, rv;
        CHECK_INT_EQ(tu_golden_forward(ctx, &t.q.t, &t.k.t, &t.v.t, &t.p, &t.o.t, &t.lse.t),
                     SDPA_OK);
        const int have_ref = ref_backward(ctx, &t, &c, &rq, &rk, &rv);
        CHECK(have_ref);
        sdpa_ctx_destroy(ctx);
        double *g[3] = {tu_to_doubles(&rq.t), tu_to_doubles(&rk.t), tu_to_doubles(&rv.t)};
        const double *lp[3] = {lq, lk, lv};
        const size_t sizes[3] = {nq, nk, nv};
        static const char *const names[3] = {"dq", "dk", "dv"};
        const double kf = c.dt == SDPA_F32 ? 8.0 : 3.0;
        const double gate = c.dt == SDPA_F32 ? 1e-10 : 5e-5;
        tu_tensor dq = tu_alloc(c.dt, c.B, c.Hq, c.Lq, c.Dk, TU_BHLD, 0, 0);
        tu_tensor dk = tu_alloc(c.dt, c.B, c.Hkv, c.Lk, c.Dk, TU_BHLD, 0, 0);
        tu_tensor dv = tu_alloc(c.dt, c.B, c.Hkv, c.Lk, c.Dv, TU_BHLD, 0, 0);
        const tu_tensor *const out[3] = {&dq, &dk, &dv};
        for (int m = 0; m < g_n_impls && have_ref; m++) {
            if (!g_impls[m].runs)
                continue;
            ctx = tu_ctx(0, g_impls[m].level);
            CHECK_INT_EQ(sdpa_forward(ctx, &t.q.t, &t.k.t, &t.v.t, &t.p, &t.o.t, &t.lse.t),
                         SDPA_OK);
            CHECK_INT_EQ(sdpa_backward(ctx, &t.q.t, &t.k.t, &t.v.t, &t.o.t, &t.lse.t, &t.dout.t,
                                       &t.p, &dq.t, &dk.t, &dv.t),
                         SDPA_OK);
            int good = 1;
            for (int a = 0; a < 3; a++) {
                double *x = tu_to_doubles(&out[a]->t);
                char what[128];
                snprintf(what, sizeof what, "[%s] %s %s", g_impls[m].name, c.what, names[a]);
                good &= tu_rule(what, x, lp[a], g[a], sizes[a], c.dt, kf, a == 2 ? gate : 0.0);
                if (a == 0)
                    for (size_t r = 0; r < n_l; r++)
                        for (int64_t d = 0; d < c.Dk && empty[r]; d++)
                            good &= x[r * (size_t)c.Dk + (size_t)d] == 0.0;
                free(x);
            }
            CHECK_MSG(good, "[%s] %s fails the rule", g_impls[m].name, c.what);
            sdpa_ctx_destroy(ctx);
        }
        for (int a = 0; a < 3; a++)
            free(g[a]);
        tu_free(&dq);
        tu_free(&dk);
        tu_free(&dv);
        tu_free(&rq);
        tu_free(&rk);
        tu_free(&rv);
        free(lq);
        free(lk);
        free(lv);
        free(gl);
        free(empty);
        sk_free(&t);
    }
}

/* ======================================================================================== */
/* 4. Bad inputs of sdpa_forward_kv                                                          */
/* ======================================================================================== */

/* The baseline: two sequences of 5 and 9 keys in a pool of 5 pages of 4 keys, 3 entries a
 * sequence (capacity 12), 2 and 3 of Lq = 3 queries; and a plain cache of 9 keys. */
enum {
    XB = 2,
    XHQ = 4,
    XHKV = 2,
    XLQ = 3,
    XDK = 8,
    XDV = 6,
    XPAGE = 4,
    XMAXP = 3,
    XNP = 5,
    XLK = 9
};

typedef struct bx {
    sdpa_ctx *ctx;
    tu_tensor q, kpool, vpool, kplain, vplain, out, lse, mask;
    int32_t table[XB * XMAXP], sk[XB], sq[XB];
    float sinks[XHQ];
    sdpa_params p;
    sdpa_kv_cache kc;
    const sdpa_kv_cache *kcp;
    unsigned char *snap[5];
    unsigned char *base_out, *base_lse; /* the baseline's result */
} bx;

static tu_tensor *bx_input(bx *f, int i) {
    tu_tensor *in[5] = {&f->q, &f->kpool, &f->vpool, &f->kplain, &f->vplain};
    return in[i];
}

static void bx_reset(bx *f) {
    static const int32_t table[XB * XMAXP] = {3, 0, -1, 1, 4, 2};
    memcpy(f->table, table, sizeof table);
    f->sk[0] = 5;
    f->sk[1] = 9;
    f->sq[0] = 2;
    f->sq[1] = 3;
    for (int h = 0; h < XHQ; h++)
        f->sinks[h] = 0.25f * (float)h;
    memset(&f->p, 0, sizeof f->p);
    f->p.causal = 1;
    f->p.align = SDPA_ALIGN_BOTTOM_RIGHT;
    f->kc = (sdpa_kv_cache){&f->kpool.t, &f->vpool.t, f->sk, f->sq, f->table, XMAXP};
    f->kcp = &f->kc;
    tu_fill_canary(&f->out);
    tu_fill_canary(&f->lse);
}

static void bx_init(bx *f) {
    memset(f, 0, sizeof *f);
    f->ctx = tu_ctx(1, SDPA_ISA_AUTO);
    tu_rng r = {0xb0b};
    f->q = tu_alloc(SDPA_F32, XB, XHQ, XLQ, XDK, TU_BHLD, 0, 0);
    f->kpool = tu_alloc(SDPA_F32, XNP, XHKV, XPAGE, XDK, TU_BHLD, 0, 0);
    f->vpool = tu_alloc(SDPA_F32, XNP, XHKV, XPAGE, XDV, TU_BHLD, 0, 0);
    f->kplain = tu_alloc(SDPA_F32, XB, XHKV, XLK, XDK, TU_BHLD, 0, 0);
    f->vplain = tu_alloc(SDPA_F32, XB, XHKV, XLK, XDV, TU_BHLD, 0, 0);
    f->out = tu_alloc(SDPA_F32, XB, XHQ, XLQ, XDV, TU_BHLD, 0, 0);
    f->lse = tu_alloc(SDPA_F32, XB, XHQ, XLQ, 1, TU_BHLD, 0, 0);
    f->mask = tu_alloc(SDPA_F32, XB, XHQ, XLQ, XLK, TU_BHLD, 0, 0);
    for (int i = 0; i < 5; i++)
        tu_fill_randn(bx_input(f, i), &r, 1.0, 0.0);
    for (int i = 0; i < 5; i++) {
        const tu_tensor *t = bx_input(f, i);
        f->snap[i] = xmalloc(t->bytes);
        memcpy(f->snap[i], t->buf, t->bytes);
    }
    bx_reset(f);
    CHECK_INT_EQ(sdpa_forward_kv(f->ctx, &f->q.t, f->kcp, &f->p, &f->out.t, &f->lse.t), SDPA_OK);
    f->base_out = xmalloc(f->out.bytes);
    f->base_lse = xmalloc(f->lse.bytes);
    memcpy(f->base_out, f->out.buf, f->out.bytes);
    memcpy(f->base_lse, f->lse.buf, f->lse.bytes);
    bx_reset(f);
}

static void bx_free(bx *f) {
    tu_tensor *all[] = {&f->q,      &f->kpool, &f->vpool, &f->kplain,
                        &f->vplain, &f->out,   &f->lse,   &f->mask};
    for (size_t n = 0; n < sizeof all / sizeof all[0]; n++)
        tu_free(all[n]);
    for (int i = 0; i < 5; i++)
        free(f->snap[i]);
    free(f->base_out);
    free(f->base_lse);
    sdpa_ctx_destroy(f->ctx);
}

/* Calls sdpa_forward_kv on the fixture as a case left it: the status; the message (when msg
 * is not NULL); on failure out and lse byte-for-byte as they were (the canary, or what the case
 * put there) and, on success with `same`, the baseline's bits; inputs never written. */
static void expect_kv(bx *f, sdpa_status want, const char *msg, int same, int line) {
    unsigned char *before_o = xmalloc(f->out.bytes), *before_l = xmalloc(f->lse.bytes);
    memcpy(before_o, f->out.buf, f->out.bytes);
    memcpy(before_l, f->lse.buf, f->lse.bytes);
    /* a message that is not the one expected, so that a leftover cannot pass */
    (void)sdpa_forward(f->ctx, NULL, NULL, NULL, NULL, NULL, NULL);
    int32_t table[XB * XMAXP], sk[XB], sq[XB];
    memcpy(table, f->table, sizeof table);
    memcpy(sk, f->sk, sizeof sk);
    memcpy(sq, f->sq, sizeof sq);
    const sdpa_status got = sdpa_forward_kv(f->ctx, &f->q.t, f->kcp, &f->p, &f->out.t, &f->lse.t);
    const char *err = sdpa_ctx_last_error(f->ctx);
    CHECK_MSG(got == want, "line %d: sdpa_forward_kv returned %s, expected %s (\"%s\")", line,
              sdpa_status_name(got), sdpa_status_name(want), err);
    if (msg != NULL)
        CHECK_MSG(strstr(err, msg) != NULL, "line %d: message \"%s\" lacks \"%s\"", line, err, msg);
    if (want != SDPA_OK) {
        CHECK_MSG(memcmp(before_o, f->out.buf, f->out.bytes) == 0,
                  "line %d: out written although the call failed", line);
        CHECK_MSG(memcmp(before_l, f->lse.buf, f->lse.bytes) == 0,
                  "line %d: lse written although the call failed", line);
    } else if (same) {
        CHECK_MSG(memcmp(f->base_out, f->out.buf, f->out.bytes) == 0 &&
                      memcmp(f->base_lse, f->lse.buf, f->lse.bytes) == 0,
                  "line %d: the result differs from the baseline's", line);
    }
    for (int i = 0; i < 5; i++)
        CHECK_MSG(memcmp(bx_input(f, i)->buf, f->snap[i], bx_input(f, i)->bytes) == 0,
                  "line %d: input %d written", line, i);
    CHECK_MSG(memcmp(table, f->table, sizeof table) == 0 && memcmp(sk, f->sk, sizeof sk) == 0 &&
                  memcmp(sq, f->sq, sizeof sq) == 0,
              "line %d: the lengths or the block table were written", line);
    free(before_o);
    free(before_l);
}

#define EXPECT_KV(f, st, msg) expect_kv((f), (st), (msg), 0, __LINE__)
#define EXPECT_KV_SAME(f) expect_kv((f), SDPA_OK, NULL, 1, __LINE__)

static void test_bad_descriptor(void) {
    bx f;
    bx_init(&f);
    f.kcp = NULL;
    EXPECT_KV(&f, SDPA_ERR_NULL, "cache is NULL");
    bx_reset(&f);
    f.kc.max_pages = 0;
    EXPECT_KV(&f, SDPA_ERR_PARAM, "cache.max_pages=0 must be >= 1 with a block table");
    f.kc.max_pages = -1;
    EXPECT_KV(&f, SDPA_ERR_PARAM, "cache.max_pages=-1 must be >= 1");
    f.kc.max_pages = (int64_t)1 << 30; /* x 4 keys a page: past SDPA_MAX_EXTENT */
    EXPECT_KV(&f, SDPA_ERR_DIM, "cache.max_pages=1073741824 x page size k.shape[2]=4 keys exceeds");
    bx_reset(&f);
    f.kc.k = NULL;
    EXPECT_KV(&f, SDPA_ERR_NULL, "k is NULL");
    bx_reset(&f);
    sdpa_tensor v4 = f.vpool.t;
    v4.shape[0] = XNP - 1; /* pools of different sizes */
    f.kc.v = &v4;
    EXPECT_KV(&f, SDPA_ERR_SHAPE, "v.shape[0]=4 but k.shape[0]=5");
    bx_reset(&f);
    f.p.dropout_p = 0.5f;
    EXPECT_KV(&f, SDPA_ERR_PARAM, "params.dropout_p=0.5: sdpa_forward_kv has no dropout");
    bx_reset(&f);
    f.p.mask = &f.mask.t; /* (.., 9): the plain cache's width, not the pages' capacity 12 */
    EXPECT_KV(&f, SDPA_ERR_BROADCAST, "mask.shape[3]=9 is neither 1 nor Lk=12");
    bx_reset(&f);
    EXPECT_KV_SAME(&f);
    bx_free(&f);
}

static void test_bad_lengths(void) {
    bx f;
    bx_init(&f);
    f.sk[1] = -1;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.seqlens_k[1]=-1 is outside [0, 12]");
    f.sk[1] = INT32_MIN;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.seqlens_k[1]=-2147483648 is outside [0, 12]");
    bx_reset(&f);
    f.sk[0] = 13; /* one past the capacity of 3 pages of 4 */
    EXPECT_KV(
        &f, SDPA_ERR_INDEX,
        "cache.seqlens_k[0]=13 is outside [0, 12], the pages' capacity max_pages x page size");
    f.sk[0] = INT32_MAX;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.seqlens_k[0]=2147483647 is outside [0, 12]");
    bx_reset(&f);
    f.sq[1] = 4;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.seqlens_q[1]=4 is outside [0, Lq=3]");
    f.sq[1] = -1;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.seqlens_q[1]=-1 is outside [0, Lq=3]");
    bx_reset(&f);
    /* the plain layout: the capacity is k.shape[2] */
    f.kc = (sdpa_kv_cache){&f.kplain.t, &f.vplain.t, f.sk, f.sq, NULL, 0};
    f.sk[1] = XLK + 1;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.seqlens_k[1]=10 is outside [0, 9], the k.shape[2]");
    f.sk[1] = XLK;
    EXPECT_KV(&f, SDPA_OK, NULL);
    f.kc.max_pages = -5; /* ignored without a block table */
    EXPECT_KV(&f, SDPA_OK, NULL);
    bx_free(&f);
}

static void test_bad_block_table(void) {
    bx f;
    bx_init(&f);
    /* sequence 1 has 9 keys: its entries 0..2 are read */
    f.table[1 * XMAXP + 2] = -1;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.block_table[1][2]=-1 is outside [0, n_pages=5)");
    f.table[1 * XMAXP + 2] = XNP;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.block_table[1][2]=5 is outside [0, n_pages=5)");
    f.table[1 * XMAXP + 2] = INT32_MIN;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.block_table[1][2]=-2147483648 is outside");
    bx_reset(&f);
    f.table[0] = XNP + 100;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.block_table[0][0]=105 is outside [0, n_pages=5)");
    bx_reset(&f);
    /* entries past a sequence's last page are never read: any value is accepted, and the
     * result is the baseline's bit for bit */
    f.table[0 * XMAXP + 2] = XNP;
    EXPECT_KV_SAME(&f);
    f.table[0 * XMAXP + 2] = INT32_MIN;
    EXPECT_KV_SAME(&f);
    f.table[0 * XMAXP + 2] = INT32_MAX;
    EXPECT_KV_SAME(&f);
    /* a longer sequence reads it */
    f.sk[0] = 9;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.block_table[0][2]=2147483647 is outside");
    bx_reset(&f);
    /* a sequence without keys reads no entry */
    f.sk[0] = 0;
    f.table[0] = f.table[1] = f.table[2] = -7;
    EXPECT_KV(&f, SDPA_OK, NULL);
    bx_reset(&f);
    /* seqlens_k NULL: every sequence full, every entry read */
    f.kc.seqlens_k = NULL;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.block_table[0][2]=-1 is outside [0, n_pages=5)");
    f.table[2] = 2;
    f.table[1 * XMAXP + 2] = 0; /* pages shared by two sequences are legal */
    EXPECT_KV(&f, SDPA_OK, NULL);
    bx_free(&f);
}

/* Aligned storage for the misaligned and the aliasing cases. */
typedef union bx_store {
    int32_t i[64];
    float f[64];
    unsigned char c[256];
} bx_store;

static void test_bad_pointers(void) {
    bx f;
    bx_init(&f);
    bx_store st;
    memset(&st, 0, sizeof st);
    /* misaligned lengths and table (their values copied there, in case one were read) */
    memcpy(st.c + 1, f.sk, sizeof f.sk);
    f.kc.seqlens_k = (const int32_t *)(const void *)(st.c + 1);
    EXPECT_KV(&f, SDPA_ERR_PARAM, "is not aligned to 4-byte integers");
    EXPECT_KV(&f, SDPA_ERR_PARAM, "cache.seqlens_k=");
    bx_reset(&f);
    memcpy(st.c + 2, f.sq, sizeof f.sq);
    f.kc.seqlens_q = (const int32_t *)(const void *)(st.c + 2);
    EXPECT_KV(&f, SDPA_ERR_PARAM, "cache.seqlens_q=");
    bx_reset(&f);
    memcpy(st.c + 3, f.table, sizeof f.table);
    f.kc.block_table = (const int32_t *)(const void *)(st.c + 3);
    EXPECT_KV(&f, SDPA_ERR_PARAM, "cache.block_table=");
    bx_reset(&f);
    /* out over the block table, lse over the lengths */
    memcpy(f.out.buf, f.table, sizeof f.table);
    f.kc.block_table = (const int32_t *)f.out.buf;
    EXPECT_KV(&f, SDPA_ERR_ALIAS, "overlaps cache.block_table");
    EXPECT_KV(&f, SDPA_ERR_ALIAS, "out (bytes");
    bx_reset(&f);
    memcpy(f.lse.buf, f.sk, sizeof f.sk);
    f.kc.seqlens_k = (const int32_t *)f.lse.buf;
    EXPECT_KV(&f, SDPA_ERR_ALIAS, "lse (bytes");
    EXPECT_KV(&f, SDPA_ERR_ALIAS, "overlaps cache.seqlens_k");
    bx_reset(&f);
    memcpy((char *)f.out.buf + f.out.bytes - sizeof f.sq, f.sq, sizeof f.sq);
    f.kc.seqlens_q = (const int32_t *)(const void *)((char *)f.out.buf + f.out.bytes - sizeof f.sq);
    EXPECT_KV(&f, SDPA_ERR_ALIAS, "overlaps cache.seqlens_q");
    bx_reset(&f);
    /* a lengths array just past out's bytes is apart from it */
    int32_t *apart = xmalloc(f.out.bytes + sizeof f.sq);
    memcpy(apart, f.out.buf, f.out.bytes);
    memcpy((char *)apart + f.out.bytes, f.sq, sizeof f.sq);
    tu_tensor keep = f.out;
    f.out.t.data = apart;
    f.out.buf = apart;
    f.kc.seqlens_q = (const int32_t *)(const void *)((char *)apart + f.out.bytes);
    EXPECT_KV(&f, SDPA_OK, NULL);
    f.out = keep;
    free(apart);
    bx_free(&f);
}

static void test_bad_sinks(void) {
    bx f;
    bx_init(&f);
    f.p.sinks = f.sinks;
    EXPECT_KV(&f, SDPA_OK, NULL);
    f.sinks[1] = NAN;
    EXPECT_KV(&f, SDPA_ERR_PARAM, "params.sinks[1]=nan must be finite, or -inf for no sink");
    f.sinks[1] = 0.0f;
    f.sinks[2] = INFINITY;
    EXPECT_KV(&f, SDPA_ERR_PARAM, "params.sinks[2]=inf must be finite, or -inf for no sink");
    f.sinks[2] = -INFINITY; /* no sink on that head */
    EXPECT_KV(&f, SDPA_OK, NULL);
    f.sinks[3] = -NAN;
    EXPECT_KV(&f, SDPA_ERR_PARAM, "params.sinks[3]=");
    bx_reset(&f);
    bx_store st;
    memset(&st, 0, sizeof st);
    memcpy(st.c + 1, f.sinks, sizeof f.sinks);
    f.p.sinks = (const float *)(const void *)(st.c + 1);
    EXPECT_KV(&f, SDPA_ERR_PARAM, "params.sinks=");
    EXPECT_KV(&f, SDPA_ERR_PARAM, "is not aligned to 4-byte floats");
    bx_reset(&f);
    /* sinks inside out */
    memcpy(f.out.buf, f.sinks, sizeof f.sinks);
    f.p.sinks = (const float *)f.out.buf;
    EXPECT_KV(&f, SDPA_ERR_ALIAS, "overlaps params.sinks");
    bx_reset(&f);

    /* the other entry points refuse the same sinks */
    f.sinks[0] = NAN;
    f.p.sinks = f.sinks;
    tu_tensor q = tu_alloc(SDPA_F32, 1, XHQ, 2, XDK, TU_BHLD, 0, 0);
    tu_tensor k = tu_alloc(SDPA_F32, 1, XHKV, 3, XDK, TU_BHLD, 0, 0);
    tu_tensor v = tu_alloc(SDPA_F32, 1, XHKV, 3, XDV, TU_BHLD, 0, 0);
    tu_tensor o = tu_alloc(SDPA_F32, 1, XHQ, 2, XDV, TU_BHLD, 0, 0);
    tu_tensor w = tu_alloc(SDPA_F32, 1, XHQ, 2, 3, TU_BHLD, 0, 0);
    tu_fill_canary(&o);
    tu_fill_canary(&w);
    CHECK_INT_EQ(sdpa_forward(f.ctx, &q.t, &k.t, &v.t, &f.p, &o.t, NULL), SDPA_ERR_PARAM);
    CHECK_STR_CONTAINS(sdpa_ctx_last_error(f.ctx), "params.sinks[0]=nan");
    CHECK_INT_EQ(sdpa_weights(f.ctx, &q.t, &k.t, &f.p, &w.t), SDPA_ERR_PARAM);
    CHECK_STR_CONTAINS(sdpa_ctx_last_error(f.ctx), "params.sinks[0]=nan");
    CHECK(tu_is_canary(&o) && tu_is_canary(&w));
    tu_free(&q);
    tu_free(&k);
    tu_free(&v);
    tu_free(&o);
    tu_free(&w);
    bx_free(&f);
}

int main(int argc, char **argv) {
    tu_report_impls();
    g_n_impls = tu_impls(g_impls);
    return CHECK_RUN(argc, argv, CASE(test_paged_decode), CASE(test_paged_mixed),
                     CASE(test_chunked_prefill), CASE(test_chunked_prefill_widened),
                     CASE(test_plain_ragged), CASE(test_determinism), CASE(test_sinks_forward),
                     CASE(test_sinks_far_above), CASE(test_sinks_minus_inf),
                     CASE(test_sinks_weights), CASE(test_sinks_backward), CASE(test_bad_descriptor),
                     CASE(test_bad_lengths), CASE(test_bad_block_table), CASE(test_bad_pointers),
                     CASE(test_bad_sinks));
}
