/*
 * problem.h — the validated attention problem every implementation receives, and the one
 * statement of the window rule: which keys a query may see, which keys a block of queries
 * may see, which queries see a block of keys. The reference and every driver ask these
 * functions rather than redo the arithmetic.
 *
 * Contract: an sdpa__problem is only ever built by the validator (validate.h). Implementations
 * may therefore rely on every field being consistent: extents in range, address spans
 * representable, the mask expanded to (B, Hq, Lq, Lk) with stride 0 on broadcast extents,
 * causal folded into window_right, window bounds beyond Lq + Lk made open, and the scale
 * resolved.
 */
#ifndef SDPA_PROBLEM_H
#define SDPA_PROBLEM_H

#include "sdpa.h"

#include <stdint.h>

/* A validated attention problem. Tensors are copies of the caller's views. */
typedef struct sdpa__problem {
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    int64_t group;        /* Hq / Hkv: query head h reads kv head h / group */
    double scale;         /* resolved: never 0 unless the caller asked for a tiny scale */
    double softcap;       /* 0 = off */
    int64_t off;          /* 0 (top-left) or Lk - Lq (bottom-right) */
    int64_t window_left;  /* -1 = open */
    int64_t window_right; /* -1 = open; 0 when causal */
    const float *alibi;   /* NULL or Hq slopes */
    /* ALiBi's distance is |alibi_step (j - i) - off - alibi_shift| (sdpa__alibi_distance):
     * 0 (= 1) and 0 from every public entry point, where it is |j - (i + off)|. A block of a
     * longer sequence whose positions are spaced by a stride (src/mpi/, the striped layout)
     * sets them; its window bounds are then in its own indices (sdpa__place). */
    int64_t alibi_step, alibi_shift;
    /* Dropout of the attention weights (philox.h): 0 = off. Element (b, h, i, j) is kept
     * iff sdpa__dropout_keep(dropout_seed, dropout_offset, b, h, i, j, dropout_p), and kept
     * weights are scaled by 1 / (1 - dropout_p). Zero in a problem that asks for none. */
    double dropout_p; /* in [0, 1] */
    uint64_t dropout_seed, dropout_offset;
    const float *sinks; /* NULL or Hq attention-sink logits (finite or -inf) */
    int has_mask;
    sdpa_tensor q, k, v;
    sdpa_tensor mask; /* valid when has_mask: shape (B, Hq, Lq, Lk), broadcast strides 0 */
    /* A KV cache (sdpa_forward_kv), else NULL and 0. Lq and Lk are then the capacities, and
     * sdpa__seq gives sequence b's own Lq, Lk and off; with block_table, k and v are pools of
     * pages (n_pages, Hkv, page_size, D) and sdpa__kv_offset finds a key's row. */
    const int32_t *seqlens_q, *seqlens_k; /* NULL or B lengths, validated */
    const int32_t *block_table;           /* NULL or B x max_pages, every entry read valid */
    int64_t max_pages, page_size;
    int bottom_right; /* the alignment, for sdpa__seq's off */
} sdpa__problem;

/* Offset in elements of element (i0, i1, i2, i3) of t. */
static inline int64_t sdpa__offset(const sdpa_tensor *t, int64_t i0, int64_t i1, int64_t i2,
                                   int64_t i3) {
    return i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2] + i3 * t->stride[3];
}

/* The problem of sequence b alone where the lengths are ragged (a KV cache with seqlens):
 * *tmp set to p with sequence b's Lq, Lk and off, and returned; otherwise p itself. Every
 * rule below then applies to that sequence's own positions. */
static inline const sdpa__problem *sdpa__seq(const sdpa__problem *p, int64_t b,
                                             sdpa__problem *tmp) {
    if (p->seqlens_q == NULL && p->seqlens_k == NULL)
        return p;
    *tmp = *p;
    tmp->Lq = p->seqlens_q != NULL ? p->seqlens_q[b] : p->Lq;
    tmp->Lk = p->seqlens_k != NULL ? p->seqlens_k[b] : p->Lk;
    tmp->off = p->bottom_right ? tmp->Lk - tmp->Lq : 0;
    return tmp;
}

/* Where row j of (batch or sequence b, kv head hk) of t -- p->k or p->v, or a tensor laid out
 * like them -- starts, in elements: through the block table when the cache is paged. */
static inline int64_t sdpa__kv_offset(const sdpa__problem *p, const sdpa_tensor *t, int64_t b,
                                      int64_t hk, int64_t j) {
    if (p->block_table == NULL)
        return sdpa__offset(t, b, hk, j, 0);
    const int64_t page = p->block_table[b * p->max_pages + j / p->page_size];
    return sdpa__offset(t, page, hk, j % p->page_size, 0);
}

/* The keys query i may see under the window rule (causal folded in): [*lo, *hi], inclusive.
 * An open side is Lq + Lk beyond any key index, so the bounds need no clamping to compare. The
 * bool and additive masks are applied separately. */
static inline void sdpa__row_keys(const sdpa__problem *p, int64_t i, int64_t *lo, int64_t *hi) {
    const int64_t open = p->Lq + p->Lk;
    *lo = p->window_left >= 0 ? i + p->off - p->window_left : -open;
    *hi = p->window_right >= 0 ? i + p->off + p->window_right : open;
}

/* The distance ALiBi multiplies its slope by, for query i and key j: |j - (i + off)| when
 * positions are consecutive. Exact as a float up to 2^24. */
static inline int64_t sdpa__alibi_distance(const sdpa__problem *p, int64_t i, int64_t j) {
    const int64_t step = p->alibi_step > 1 ? p->alibi_step : 1;
    const int64_t d = step * (j - i) - p->off - p->alibi_shift;
    return d < 0 ? -d : d;
}

/* Whether key j is visible to query i under the window rule. */
static inline int sdpa__visible(const sdpa__problem *p, int64_t i, int64_t j) {
    int64_t lo, hi;
    sdpa__row_keys(p, i, &lo, &hi);
    return lo <= j && j <= hi;
}

/* The keys [*ja, *jb) that some query of [i0, i1) may see, within [0, Lk) (empty when
 * *ja >= *jb). Queries are sorted, so these are the first row's lower and the last row's
 * upper bound. */
static inline void sdpa__block_keys(const sdpa__problem *p, int64_t i0, int64_t i1, int64_t *ja,
                                    int64_t *jb) {
    int64_t lo, hi, lo_last, hi_last;
    sdpa__row_keys(p, i0, &lo, &hi);
    sdpa__row_keys(p, i1 - 1, &lo_last, &hi_last);
    *ja = lo > 0 ? lo : 0;
    *jb = hi_last + 1 < p->Lk ? hi_last + 1 : p->Lk;
}

/* Whether every query of [i0, i1) may see every key of [j0, j1) under the window rule. */
static inline int sdpa__block_whole(const sdpa__problem *p, int64_t i0, int64_t i1, int64_t j0,
                                    int64_t j1) {
    int64_t lo, hi, lo_last, hi_last;
    sdpa__row_keys(p, i0, &lo, &hi);
    sdpa__row_keys(p, i1 - 1, &lo_last, &hi_last);
    return j1 - 1 <= hi && j0 >= lo_last;
}

/* The queries [*first, *last) of [i0, i1) that may see some key of [j0, j1) (empty when
 * *first >= *last): query i sees one when its upper bound reaches j0 and its lower bound
 * reaches j1 - 1. */
static inline void sdpa__block_queries(const sdpa__problem *p, int64_t j0, int64_t j1, int64_t i0,
                                       int64_t i1, int64_t *first, int64_t *last) {
    int64_t a = i0, z = i1;
    if (p->window_right >= 0 && j0 - p->off - p->window_right > a)
        a = j0 - p->off - p->window_right;
    if (p->window_left >= 0 && j1 - 1 - p->off + p->window_left + 1 < z)
        z = j1 - 1 - p->off + p->window_left + 1;
    *first = a;
    *last = z;
}

/* The queries [*first, *last) of [i0, i1) that may see every key of [j0, j1) (empty when
 * *first >= *last): query i sees them all when its upper bound reaches j1 - 1 and its lower
 * bound j0. */
static inline void sdpa__block_queries_whole(const sdpa__problem *p, int64_t j0, int64_t j1,
                                             int64_t i0, int64_t i1, int64_t *first,
                                             int64_t *last) {
    int64_t a = i0, z = i1;
    if (p->window_right >= 0 && j1 - 1 - p->off - p->window_right > a)
        a = j1 - 1 - p->off - p->window_right;
    if (p->window_left >= 0 && j0 - p->off + p->window_left + 1 < z)
        z = j0 - p->off + p->window_left + 1;
    *first = a;
    *last = z;
}

#endif /* SDPA_PROBLEM_H */
