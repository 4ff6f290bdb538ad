/*
 * fuzz_api_kv.c — the API fuzz target's KV-cache call (issue 13): sdpa_forward_kv on a case
 * that sdpa_forward accepted, with the case's q, out, lse and params (plus drawn sinks), and
 * its k and v either as they are (the plain layout, with ragged lengths) or scattered into a
 * pool of pages through a shuffled block table (fz_draw_kv in fuzz_api_draw_leftover.c says
 * which). Every array it builds is malloc'ed at exactly its size: the pools (pages no length
 * reaches, and rows past a sequence's keys, hold NaN), the block table (entries no length reads
 * are -1 or out of range), the lengths, and a mask widened to the pages' capacity where needed
 * (NaN past the keys). So ASan sees a read past any of them, and a read of what no length reaches
 * shows as NaN.
 *
 * Invariants (a violation aborts with the case, as in fuzz_api.c):
 *   - with one length or entry made invalid (kv_bad), the call fails with SDPA_ERR_INDEX (or
 *     SDPA_ERR_PARAM for max_pages < 1), a message naming it and its value, out and lse
 *     untouched; an out-of-range entry that no length reads, and max_pages < 1 without a block
 *     table, are accepted;
 *   - otherwise the call succeeds, writes nothing outside out's and lse's elements and no
 *     input, and each sequence b passes the rule against the golden of its own slices (the
 *     reference on q, k, v and the mask cut to seqlens_q[b] queries and seqlens_k[b] keys,
 *     the sink joined to the baseline afterwards), or, where the inputs hold NaN, Inf or huge
 *     values, has non-finite values exactly where that golden has them; rows past a
 *     sequence's queries, and rows that see no key, are exactly 0 with LSE -inf or the sink;
 *   - another thread count gives the same bytes.
 */
#include "fuzz_api.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the call receives, built from the case. */
typedef struct kv_args {
    int paged;
    int64_t cap, max_pages, n_pages, page;
    int64_t len_k[4], len_q[4]; /* the lengths in effect */
    int32_t *sk, *sq, *table;   /* exact-size arrays: B, B, B x max_pages */
    sdpa_tensor kpool, vpool;   /* paged: pools in exact-size buffers */
    unsigned char *kbuf, *vbuf;
    size_t kbytes, vbytes;
    sdpa_tensor wide; /* the mask widened to the capacity (wbuf != NULL) */
    unsigned char *wbuf;
    size_t wbytes;
    sdpa_params params;
    const sdpa_params *pr;
    sdpa_kv_cache kc;
    sdpa_status want; /* SDPA_OK, or the status of the invalid length or entry */
    char want_msg[128];
} kv_args;

static void *kv_alloc(size_t n) {
    void *p = malloc(n > 0 ? n : 1);
    if (p == NULL)
        fz_violation("out of memory for %zu bytes (the generator's fault)", n);
    return p;
}

/* A pool of n pages of `page` rows of d features for kv heads, in dtype dt, exactly sized,
 * every byte 0xFF (NaN in every float dtype). */
static sdpa_tensor make_pool(const fz_case *c, sdpa_dtype dt, int64_t n, int64_t page, int64_t d,
                             unsigned char **buf, size_t *bytes) {
    sdpa_tensor t;
    memset(&t, 0, sizeof t);
    const int64_t h = c->Hkv;
    *bytes = (size_t)(n * h * page * d) * sdpa_dtype_size(dt);
    *buf = kv_alloc(*bytes);
    memset(*buf, 0xFF, *bytes);
    t.data = *buf;
    t.dtype = dt;
    t.shape[0] = n, t.shape[1] = h, t.shape[2] = page, t.shape[3] = d;
    if (c->kv_blhd)
        t.stride[0] = page * h * d, t.stride[1] = d, t.stride[2] = h * d, t.stride[3] = 1;
    else
        t.stride[0] = h * page * d, t.stride[1] = page * d, t.stride[2] = d, t.stride[3] = 1;
    return t;
}

/* A copy of the case's mask with its last extent the capacity (when it is not 1): values for
 * the keys [0, Lk), and past them NaN (additive) or 1 (bool), which no length reaches. */
static void widen_mask(const fz_case *c, kv_args *a) {
    const sdpa_tensor *m = &c->mask.t;
    sdpa_tensor *w = &a->wide;
    *w = *m;
    w->shape[3] = a->cap;
    w->stride[3] = 1;
    w->stride[2] = a->cap;
    w->stride[1] = w->shape[2] * a->cap;
    w->stride[0] = w->shape[1] * w->stride[1];
    a->wbytes = (size_t)(w->shape[0] * w->stride[0]) * sdpa_dtype_size(m->dtype);
    a->wbuf = kv_alloc(a->wbytes);
    w->data = a->wbuf;
    for (int64_t b = 0; b < w->shape[0]; b++)
        for (int64_t h = 0; h < w->shape[1]; h++)
            for (int64_t i = 0; i < w->shape[2]; i++)
                for (int64_t j = 0; j < a->cap; j++)
                    tu_set(w, b, h, i, j,
                           j < m->shape[3]         ? tu_get(m, b, h, i, j)
                           : m->dtype == SDPA_BOOL ? 1.0
                                                   : NAN);
}

/* Builds the arguments: lengths, pools and block table, the widened mask, params with sinks,
 * and the invalid length or entry the case asks for (with the status it must give). */
static void build(fz_case *c, kv_args *a) {
    memset(a, 0, sizeof *a);
    const int64_t B = c->B, Lk = c->Lk;
    tu_rng r = {0x6b76ull << 32 | c->kv_seed};
    a->paged = c->kv_page > 0;
    a->page = c->kv_page;
    a->max_pages = a->paged ? (Lk + a->page - 1) / a->page + c->kv_more : 0;
    a->cap = a->paged ? a->max_pages * a->page : Lk;
    /* every sequence full (seqlens_k NULL) only where the capacity is the keys k holds */
    const int no_sk = c->kv_no_sk && a->cap == Lk;
    for (int64_t b = 0; b < B; b++) {
        a->len_k[b] = c->kv_no_sk ? Lk : c->kv_sk[b];
        a->len_q[b] = c->kv_no_sq ? c->Lq : c->kv_sq[b];
    }
    a->sk = kv_alloc((size_t)B * sizeof(int32_t));
    a->sq = kv_alloc((size_t)B * sizeof(int32_t));
    for (int64_t b = 0; b < B; b++) {
        a->sk[b] = (int32_t)a->len_k[b];
        a->sq[b] = (int32_t)a->len_q[b];
    }
    a->kc.k = &c->k.t;
    a->kc.v = &c->v.t;
    a->kc.seqlens_k = no_sk ? NULL : a->sk;
    a->kc.seqlens_q = c->kv_no_sq ? NULL : a->sq;
    if (a->paged) {
        int64_t used = 0;
        for (int64_t b = 0; b < B; b++)
            used += (a->len_k[b] + a->page - 1) / a->page;
        a->n_pages = used + c->kv_spare > 0 ? used + c->kv_spare : 1;
        /* the pages in a shuffled order */
        int32_t *perm = kv_alloc((size_t)a->n_pages * sizeof *perm);
        for (int64_t n = 0; n < a->n_pages; n++)
            perm[n] = (int32_t)n;
        for (int64_t n = a->n_pages - 1; n > 0; n--) {
            const int64_t m = (int64_t)(tu_next(&r) % (uint64_t)(n + 1));
            const int32_t x = perm[n];
            perm[n] = perm[m];
            perm[m] = x;
        }
        a->kpool = make_pool(c, c->k.t.dtype, a->n_pages, a->page, c->Dk, &a->kbuf, &a->kbytes);
        a->vpool = make_pool(c, c->v.t.dtype, a->n_pages, a->page, c->Dv, &a->vbuf, &a->vbytes);
        a->table = kv_alloc((size_t)(B * a->max_pages) * sizeof(int32_t));
        static const int32_t unused[4] = {-1, -1, INT32_MIN, INT32_MAX};
        int64_t next = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t e = 0; e < a->max_pages; e++) {
                int32_t *entry = &a->table[b * a->max_pages + e];
                if (e * a->page >= a->len_k[b]) {
                    /* never read: -1, or a value out of range */
                    const unsigned u = (unsigned)(tu_next(&r) & 3u);
                    *entry = u == 1 ? (int32_t)a->n_pages : unused[u];
                    continue;
                }
                *entry = perm[next++];
                for (int64_t h = 0; h < c->Hkv; h++)
                    for (int64_t j = e * a->page; j < a->len_k[b] && j < (e + 1) * a->page; j++) {
                        for (int64_t d = 0; d < c->Dk; d++)
                            tu_set(&a->kpool, *entry, h, j - e * a->page, d,
                                   tu_get(&c->k.t, b, h, j, d));
                        for (int64_t d = 0; d < c->Dv; d++)
                            tu_set(&a->vpool, *entry, h, j - e * a->page, d,
                                   tu_get(&c->v.t, b, h, j, d));
                    }
            }
        free(perm);
        a->kc.k = &a->kpool;
        a->kc.v = &a->vpool;
        a->kc.block_table = a->table;
        a->kc.max_pages = a->max_pages;
    }
    a->pr = fz_params(c);
    if (a->pr != NULL) {
        a->params = *a->pr;
        if (c->kv_sinks)
            a->params.sinks = c->kv_sink;
        if (a->params.mask != NULL && c->mask.t.shape[3] != 1 && a->cap != Lk) {
            widen_mask(c, a);
            a->params.mask = &a->wide;
        }
        a->pr = &a->params;
    }

    /* one length or entry made invalid (or an unread entry out of range, which is valid) */
    a->want = SDPA_OK;
    const unsigned at = c->kv_bad_at;
    const int64_t b = (int64_t)(at % (unsigned)B);
    switch (c->kv_bad) {
    case 1:
    case 2: {
        const int32_t x = c->kv_bad == 1 ? ((at >> 2 & 1u) ? INT32_MAX : (int32_t)(a->cap + 1))
                                         : ((at >> 2 & 1u) ? INT32_MIN : -1 - (int32_t)(at >> 3));
        a->sk[b] = x;
        a->kc.seqlens_k = a->sk;
        a->want = SDPA_ERR_INDEX;
        snprintf(a->want_msg, sizeof a->want_msg, "cache.seqlens_k[%lld]=%ld is outside",
                 (long long)b, (long)x);
        break;
    }
    case 3:
    case 4: {
        const int32_t x = c->kv_bad == 3 ? (int32_t)(c->Lq + 1 + (int64_t)(at >> 2))
                                         : ((at >> 2 & 1u) ? INT32_MIN : -1);
        a->sq[b] = x;
        a->kc.seqlens_q = a->sq;
        a->want = SDPA_ERR_INDEX;
        snprintf(a->want_msg, sizeof a->want_msg,
                 "cache.seqlens_q[%lld]=%ld is outside [0, Lq=", (long long)b, (long)x);
        break;
    }
    case 5:
    case 6: {
        if (!a->paged)
            break;
        /* 5: an entry that sequence bb's length reads; 6: one it does not */
        for (int64_t n = 0; n < B; n++) {
            const int64_t bb = (b + n) % B;
            const int64_t used = (a->len_k[bb] + a->page - 1) / a->page;
            const int64_t lo = c->kv_bad == 5 ? 0 : used, hi = c->kv_bad == 5 ? used : a->max_pages;
            if (lo >= hi)
                continue;
            const int64_t e = lo + (int64_t)(at >> 2) % (hi - lo);
            const int32_t x = (at & 3u) == 0   ? -1
                              : (at & 3u) == 1 ? (int32_t)a->n_pages
                              : (at & 3u) == 2 ? INT32_MIN
                                               : INT32_MAX;
            a->table[bb * a->max_pages + e] = x;
            if (c->kv_bad == 5) {
                a->want = SDPA_ERR_INDEX;
                snprintf(a->want_msg, sizeof a->want_msg,
                         "cache.block_table[%lld][%lld]=%ld is outside [0, n_pages=%lld)",
                         (long long)bb, (long long)e, (long)x, (long long)a->n_pages);
            }
            break;
        }
        break;
    }
    case 7:
        /* ignored without a block table */
        a->kc.max_pages = -(int64_t)(at % 3);
        if (a->paged) {
            a->want = SDPA_ERR_PARAM;
            snprintf(a->want_msg, sizeof a->want_msg, "cache.max_pages=%lld must be >= 1",
                     (long long)a->kc.max_pages);
        }
        break;
    default:
        break;
    }
}

static void release(kv_args *a) {
    free(a->sk);
    free(a->sq);
    free(a->table);
    free(a->kbuf);
    free(a->vbuf);
    free(a->wbuf);
}

/* A view of t at batch b (unless t broadcasts it) with extent 1 there. */
static sdpa_tensor at_batch(const sdpa_tensor *t, int64_t b) {
    sdpa_tensor v = *t;
    if (t->shape[0] != 1)
        v.data = (char *)t->data + b * t->stride[0] * (int64_t)sdpa_dtype_size(t->dtype);
    v.shape[0] = 1;
    return v;
}

/* Whether row i of a sequence of sq queries and sk keys sees key j by the window rule. */
static int seq_visible(const fz_case *c, int64_t sq, int64_t sk, int64_t i, int64_t j) {
    const sdpa_params *p = &c->params;
    const int64_t off = p->align == SDPA_ALIGN_BOTTOM_RIGHT ? sk - sq : 0;
    const int64_t rel = j - (i + off);
    const int64_t wl = p->use_window ? p->window_left : -1;
    const int64_t wr = p->causal ? 0 : p->use_window ? p->window_right : -1;
    return !((wl >= 0 && rel < -wl) || (wr >= 0 && rel > wr));
}

/* The oracle's arrays over (B, Hq, Lq, Dv) and (B, Hq, Lq). */
typedef struct kv_want {
    double *o, *l, *lp_o, *lp_l;
    unsigned char *empty, *ill;
} kv_want;

/* Sequence b's golden (the reference on its slices, with the sinks), the same without sinks
 * (which rows see no key), and the baseline (tu_naive_forward in out's dtype, the sink joined
 * afterwards); rows past its queries, or all rows when it has no key: 0 and -inf or the sink. */
static void sequence_oracle(fz_case *c, sdpa_ctx *ctx, const kv_args *a, int64_t b, kv_want *w) {
    const int64_t sq = a->len_q[b], sk = a->len_k[b], Hq = c->Hq, Lq = c->Lq, Dv = c->Dv;
    const float *sinks = a->pr != NULL ? a->pr->sinks : NULL;
    for (int64_t h = 0; h < Hq; h++)
        for (int64_t i = 0; i < Lq; i++) {
            const int64_t row = (b * Hq + h) * Lq + i;
            w->empty[row] = 1;
            w->ill[row] = 0;
            w->l[row] = w->lp_l[row] = sinks != NULL ? (double)sinks[h] : -INFINITY;
            for (int64_t d = 0; d < Dv; d++)
                w->o[row * Dv + d] = w->lp_o[row * Dv + d] = 0.0;
        }
    if (sq == 0 || sk == 0)
        return;
    sdpa_tensor q = at_batch(&c->q.t, b), k = at_batch(&c->k.t, b), v = at_batch(&c->v.t, b);
    q.shape[2] = sq;
    k.shape[2] = sk;
    v.shape[2] = sk;
    sdpa_params p = a->pr != NULL ? *a->pr : (sdpa_params){0};
    sdpa_tensor m;
    if (p.mask != NULL) {
        m = at_batch(&c->mask.t, b); /* the case's mask: the keys [0, Lk) */
        if (m.shape[2] != 1)
            m.shape[2] = sq;
        if (m.shape[3] != 1)
            m.shape[3] = sk;
        p.mask = &m;
    }
    sdpa_params ns = p;
    ns.sinks = NULL;
    tu_tensor go = tu_alloc(SDPA_F32, 1, Hq, sq, Dv, TU_BHLD, 0, 0);
    tu_tensor gl = tu_alloc(SDPA_F32, 1, Hq, sq, 1, TU_BHLD, 0, 0);
    tu_tensor gl0 = tu_alloc(SDPA_F32, 1, Hq, sq, 1, TU_BHLD, 0, 0);
    sdpa_status st = tu_golden_forward(ctx, &q, &k, &v, &ns, &go.t, &gl0.t);
    if (st == SDPA_OK && p.sinks != NULL)
        st = tu_golden_forward(ctx, &q, &k, &v, &p, &go.t, &gl.t);
    if (st != SDPA_OK)
        fz_violation("the golden of sequence %lld refused its slices: %s: %s", (long long)b,
                     sdpa_status_name(st), sdpa_ctx_last_error(ctx));
    double *lo = kv_alloc((size_t)(Hq * sq * Dv) * sizeof(double));
    double *ll = kv_alloc((size_t)(Hq * sq) * sizeof(double));
    tu_naive_forward(&q, &k, &v, &ns, fz_lp_dtype(c), lo, ll);
    const int additive = p.mask != NULL && p.mask->dtype != SDPA_BOOL;
    for (int64_t h = 0; h < Hq; h++)
        for (int64_t i = 0; i < sq; i++) {
            const int64_t row = (b * Hq + h) * Lq + i, src = h * sq + i;
            w->empty[row] = tu_get(&gl0.t, 0, h, i, 0) == -INFINITY;
            w->l[row] = tu_get(p.sinks != NULL ? &gl.t : &gl0.t, 0, h, i, 0);
            double *lp_row = lo + src * Dv;
            double lp_lse = ll[src];
            if (p.sinks != NULL && p.sinks[h] != -INFINITY && !isnan(lp_lse)) {
                /* the sink joined to the baseline: O exp(lse - lse'), lse' = log(e^lse + e^s) */
                const double s = (double)p.sinks[h];
                if (lp_lse == -INFINITY) {
                    lp_lse = s;
                } else {
                    const double top = fmax(lp_lse, s);
                    const double x = exp(lp_lse - top), sum = x + exp(s - top);
                    for (int64_t d = 0; d < Dv; d++)
                        lp_row[d] = tu_round(fz_lp_dtype(c), lp_row[d] * (x / sum));
                    lp_lse = (double)(float)(top + log(sum));
                }
            }
            w->lp_l[row] = lp_lse;
            for (int64_t d = 0; d < Dv; d++) {
                w->o[row * Dv + d] = tu_get(&go.t, 0, h, i, d);
                w->lp_o[row * Dv + d] = lp_row[d];
            }
            /* ill-conditioned in f32 by its mask (fz_ill_rows), by the sequence's positions */
            if (!additive)
                continue;
            int seen = 0, all_low = 1, any_high = 0;
            for (int64_t j = 0; j < sk; j++) {
                if (!seq_visible(c, sq, sk, i, j))
                    continue;
                const double x = tu_mask_at(p.mask, 0, h, i, j);
                if (x == -INFINITY)
                    continue;
                seen = 1;
                all_low &= x <= -1e8;
                any_high |= x >= 1e8;
            }
            w->ill[row] = (unsigned char)(seen && (all_low || any_high));
        }
    free(lo);
    free(ll);
    tu_free(&go);
    tu_free(&gl);
    tu_free(&gl0);
}

static int kv_call(fz_case *c, sdpa_ctx *ctx, const kv_args *a) {
    return (int)sdpa_forward_kv(ctx, &c->q.t, &a->kc, a->pr, &c->out.t,
                                c->lse.used ? &c->lse.t : NULL);
}

void fz_check_kv(fz_case *c, sdpa_ctx *ctx, sdpa_ctx *ctx2) {
    kv_args a;
    build(c, &a);
    const size_t rows = (size_t)(c->B * c->Hq * c->Lq), n_out = rows * (size_t)c->Dv;
    /* copies of what the call must not write */
    const size_t n_idx = (size_t)c->B * sizeof(int32_t);
    const size_t n_tab = a.paged ? (size_t)(c->B * a.max_pages) * sizeof(int32_t) : 0;
    unsigned char *keep = kv_alloc(2 * n_idx + n_tab + a.kbytes + a.vbytes + a.wbytes);
    unsigned char *at = keep;
    memcpy(at, a.sk, n_idx), at += n_idx;
    memcpy(at, a.sq, n_idx), at += n_idx;
    if (n_tab)
        memcpy(at, a.table, n_tab), at += n_tab;
    if (a.kbytes)
        memcpy(at, a.kbuf, a.kbytes), at += a.kbytes;
    if (a.vbytes)
        memcpy(at, a.vbuf, a.vbytes), at += a.vbytes;
    if (a.wbytes)
        memcpy(at, a.wbuf, a.wbytes);
    fz_snapshot snap;
    fz_take_snapshot(c, &snap);

    fz_fill_canary(&c->out);
    fz_fill_canary(&c->lse);
    const sdpa_status st = (sdpa_status)kv_call(c, ctx, &a);
    fz_check_snapshot(c, &snap, "sdpa_forward_kv");
    at = keep;
    int same = memcmp(at, a.sk, n_idx) == 0 && memcmp(at + n_idx, a.sq, n_idx) == 0;
    at += 2 * n_idx;
    same &= n_tab == 0 || memcmp(at, a.table, n_tab) == 0;
    at += n_tab;
    same &= a.kbytes == 0 || memcmp(at, a.kbuf, a.kbytes) == 0;
    at += a.kbytes;
    same &= a.vbytes == 0 || memcmp(at, a.vbuf, a.vbytes) == 0;
    at += a.vbytes;
    same &= a.wbytes == 0 || memcmp(at, a.wbuf, a.wbytes) == 0;
    if (!same)
        fz_violation("sdpa_forward_kv wrote into its lengths, block table, pools or mask");
    fz_free_snapshot(&snap);
    free(keep);

    if (a.want != SDPA_OK) {
        const char *err = sdpa_ctx_last_error(ctx);
        if (st != a.want || strstr(err, a.want_msg) == NULL)
            fz_violation("sdpa_forward_kv with an invalid length or entry returned %s (\"%s\"); "
                         "expected %s and \"%s\"",
                         sdpa_status_name(st), err, sdpa_status_name(a.want), a.want_msg);
        if (!fz_is_canary(&c->out) || (c->lse.used && !fz_is_canary(&c->lse)))
            fz_violation("sdpa_forward_kv failed with %s but wrote into an output",
                         sdpa_status_name(st));
        release(&a);
        return;
    }
    if (st != SDPA_OK)
        fz_violation("sdpa_forward_kv refused a valid cache (page %lld, max_pages %lld, %lld "
                     "pages): %s: %s",
                     (long long)a.page, (long long)a.max_pages, (long long)a.n_pages,
                     sdpa_status_name(st), sdpa_ctx_last_error(ctx));
    fz_check_gaps(&c->out, "sdpa_forward_kv");
    fz_check_gaps(&c->lse, "sdpa_forward_kv");

    /* each sequence against the golden of its own slices */
    kv_want w;
    w.o = kv_alloc(n_out * sizeof(double));
    w.lp_o = kv_alloc(n_out * sizeof(double));
    w.l = kv_alloc(rows * sizeof(double));
    w.lp_l = kv_alloc(rows * sizeof(double));
    w.empty = kv_alloc(rows);
    w.ill = kv_alloc(rows);
    for (int64_t b = 0; b < c->B; b++)
        sequence_oracle(c, ctx, &a, b, &w);
    double *t_o = tu_to_doubles(&c->out.t);
    double *t_l = c->lse.used ? tu_to_doubles(&c->lse.t) : NULL;
    if (c->nonfinite || c->huge_qk || c->huge_v) {
        fz_check_positions("kv out", t_o, w.o, n_out);
        if (t_l != NULL)
            fz_check_positions("kv lse", t_l, w.l, rows);
    } else {
        double noise_o, noise_l;
        fz_f32_noise(c, &noise_o, &noise_l);
        const double k = fz_rule_k(fz_lp_dtype(c));
        if (!fz_rule_ok("kv out", t_o, w.lp_o, w.o, n_out, c->out.t.dtype, k, noise_o, w.ill,
                        (size_t)c->Dv))
            fz_violation("sdpa_forward_kv's out fails the rule against the golden of each "
                         "sequence (figures above)");
        if (t_l != NULL &&
            !fz_rule_ok("kv lse", t_l, w.lp_l, w.l, rows, SDPA_F32, k, noise_l, w.ill, 1))
            fz_violation("sdpa_forward_kv's lse fails the rule against the golden of each "
                         "sequence (figures above)");
    }
    for (size_t r = 0; r < rows; r++) {
        if (!w.empty[r])
            continue;
        for (int64_t d = 0; d < c->Dv; d++)
            if (t_o[r * (size_t)c->Dv + (size_t)d] != 0.0)
                fz_violation("sdpa_forward_kv: row %zu sees no key but out[%lld] = %g", r,
                             (long long)d, t_o[r * (size_t)c->Dv + (size_t)d]);
        if (t_l != NULL && !(t_l[r] == w.l[r]))
            fz_violation("sdpa_forward_kv: row %zu sees no key but lse = %g, not %g", r, t_l[r],
                         w.l[r]);
    }

    /* another thread count: the same bytes */
    unsigned char *ref_o = kv_alloc(c->out.bytes), *ref_l = kv_alloc(c->lse.bytes);
    memcpy(ref_o, c->out.buf, c->out.bytes);
    if (c->lse.used)
        memcpy(ref_l, c->lse.buf, c->lse.bytes);
    fz_fill_canary(&c->out);
    fz_fill_canary(&c->lse);
    if (kv_call(c, ctx2, &a) != SDPA_OK)
        fz_violation("sdpa_forward_kv failed on another thread count: %s",
                     sdpa_ctx_last_error(ctx2));
    if (memcmp(ref_o, c->out.buf, c->out.bytes) != 0 ||
        (c->lse.used && memcmp(ref_l, c->lse.buf, c->lse.bytes) != 0))
        fz_violation("sdpa_forward_kv: out or lse differs on another thread count");

    free(ref_o);
    free(ref_l);
    free(t_o);
    free(t_l);
    free(w.o);
    free(w.lp_o);
    free(w.l);
    free(w.lp_l);
    free(w.empty);
    free(w.ill);
    release(&a);
}
