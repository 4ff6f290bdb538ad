/*
 * kv_fixture.h — what test_kv_cache.c and test_kv_prefill.c share: a case of sdpa_forward_kv
 * (kv_case: lengths, page size, layout, dtype, features), its tensors (kv_build: a plain cache
 * with NaN past every length, scattered into a pool of pages through a shuffled block table
 * whose unused entries are -1), the per-sequence oracles (the reference on views of sequence
 * b's seqlens_q[b] queries and seqlens_k[b] keys, the naive double result and the naive f32
 * baseline, the sink joined afterwards), testing.md's rule on out and lse with rows that see
 * no key exactly 0, and run_kv_case, which holds every level the CPU has to it, for
 * sdpa_forward_kv and for sdpa_forward per sequence.
 *
 * Header-only, like backward_fixture.h: each program has its own g_impls, which its main fills
 * before any case runs, and the functions are static inline so that a program that does not
 * use one of them is not warned about it. They print what disagrees and return 0; the CHECKs
 * are the programs'.
 */
#ifndef SDPA_TEST_KV_FIXTURE_H
#define SDPA_TEST_KV_FIXTURE_H

#include "check.h"
#include "testutil.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers ------------------------------------------------------------------------ */

/* A view of t moved to batch b (unless t broadcasts it), with extent 1 there. */
static inline sdpa_tensor batch_view(const sdpa_tensor *t, int64_t b) {
    sdpa_tensor v = *t;
    if (t->shape[0] != 1)
        v.data = (char *)t->data + b * t->stride[0] * (int64_t)sdpa_dtype_size(t->dtype);
    v.shape[0] = 1;
    return v;
}

/* Joins sink sigma to a row (out[dv], lse) computed without it, in double: the algebra of
 * sdpa.h's Semantics, O' = O exp(lse - lse'), lse' = log(exp(lse) + exp(sigma)); the values
 * are rounded to lp (-1: kept). A row with no key gets lse' = sigma and stays 0. */
static inline void join_sink(double sigma, double *out, int64_t dv, double *lse, int lp) {
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

/* ---- a case, its tensors, its oracles and its run ---------------------------------------- */

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

static inline void kv_build(const kv_case *c, kv_bufs *t) {
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
        int32_t *perm = tu_xmalloc((size_t)t->n_pages * sizeof *perm);
        for (int64_t n = 0; n < t->n_pages; n++)
            perm[n] = (int32_t)n;
        for (int64_t n = t->n_pages - 1; n > 0; n--) {
            const int64_t m = (int64_t)(tu_next(&r) % (uint64_t)(n + 1));
            const int32_t x = perm[n];
            perm[n] = perm[m];
            perm[m] = x;
        }
        t->table = tu_xmalloc((size_t)(c->B * t->max_pages) * sizeof *t->table);
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

static inline void kv_free(kv_bufs *t) {
    tu_tensor *all[] = {&t->q, &t->k, &t->v, &t->kpool, &t->vpool, &t->mask, &t->o, &t->lse};
    for (size_t n = 0; n < sizeof all / sizeof all[0]; n++)
        tu_free(all[n]);
    free(t->table);
}

/* The descriptor of a case, with its lengths in int32 arrays the caller owns. */
static inline sdpa_kv_cache kv_desc(const kv_case *c, const kv_bufs *t, int32_t *sk, int32_t *sq) {
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
static inline void seq_views(const kv_bufs *t, int64_t b, sdpa_tensor *q, sdpa_tensor *k,
                             sdpa_tensor *v, sdpa_tensor *mask, sdpa_params *p) {
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

static inline int kv_oracles(const kv_case *c, const kv_bufs *t, sdpa_ctx *ctx, kv_oracle *o) {
    const size_t n_out = (size_t)(c->B * c->Hq * c->Lq * c->Dv),
                 n_l = (size_t)(c->B * c->Hq * c->Lq);
    o->g_o = tu_xmalloc(n_out * sizeof(double));
    o->n_o = tu_xmalloc(n_out * sizeof(double));
    o->lp_o = tu_xmalloc(n_out * sizeof(double));
    o->g_l = tu_xmalloc(n_l * sizeof(double));
    o->n_l = tu_xmalloc(n_l * sizeof(double));
    o->lp_l = tu_xmalloc(n_l * sizeof(double));
    o->empty = tu_xmalloc(n_l);
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
            double *nd = tu_xmalloc(m * (size_t)c->Dv * sizeof(double)),
                   *nl = tu_xmalloc(m * sizeof(double));
            double *ld = tu_xmalloc(m * (size_t)c->Dv * sizeof(double)),
                   *ll = tu_xmalloc(m * sizeof(double));
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

static inline void kv_oracle_free(kv_oracle *o) {
    free(o->g_o);
    free(o->g_l);
    free(o->n_o);
    free(o->n_l);
    free(o->lp_o);
    free(o->lp_l);
    free(o->empty);
}

/* Rows that see no key: O exactly 0 and LSE exactly what the golden says (-inf or the sink). */
static inline int empty_rows_exact(const char *what, const double *o, const double *l,
                                   const kv_oracle *g, size_t rows, int64_t dv) {
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
static inline int kv_rule(const char *what, const double *o, const double *l, const kv_oracle *g,
                          size_t n_out, size_t n_l, int64_t dv) {
    char name[192]; /* what: up to 159 characters (run_kv_case's) */
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
static inline int per_sequence_forward(const kv_case *c, const kv_bufs *t, sdpa_ctx *ctx,
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
static inline int run_kv_case(const kv_case *c) {
    kv_bufs t;
    kv_build(c, &t);
    const size_t n_out = (size_t)(c->B * c->Hq * c->Lq * c->Dv),
                 n_l = (size_t)(c->B * c->Hq * c->Lq);
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    kv_oracle g;
    int ok = kv_oracles(c, &t, ctx, &g);
    sdpa_ctx_destroy(ctx);
    ok = ok && tu_within_ulp("reference out vs naive", g.g_o, g.n_o, n_out) &&
         tu_within_ulp("reference lse vs naive", g.g_l, g.n_l, n_l);
    printf("    %-64s reference %s\n", c->what, ok ? "ok" : "MISMATCH");

    int32_t sk[MAXB], sq[MAXB];
    const sdpa_kv_cache kc = kv_desc(c, &t, sk, sq);
    double *o2 = tu_xmalloc(n_out * sizeof(double)), *l2 = tu_xmalloc(n_l * sizeof(double));
    for (int n = 0; n < g_n_impls; n++) {
        if (!g_impls[n].runs || !tu_impl_takes_kv(&g_impls[n], &t.q.t, &kc, &t.p, &t.o.t))
            continue; /* (f32 queries: not flash-amx's, flash-avx512's under its own name) */
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

/* Gives case n of a sweep its features, in turn: none; causal and a window with sinks; ALiBi,
 * softcap and an additive mask; causal, a bool mask and sinks. */
static inline void vary_features(kv_case *c, int n) {
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

static inline const char *feature_name(int n) {
    static const char *const names[4] = {"plain", "causal+window+sinks", "alibi+softcap+mask",
                                         "causal+bool mask+sinks+alibi"};
    return names[n % 4];
}

#endif
