/*
 * internal.h — what the parts of the library share and users never see: the context, the
 * validated problem description every implementation receives, and error reporting.
 *
 * Contract: an sdpa__problem is only ever built by sdpa__check_forward/sdpa__check_weights
 * (validate.c). Implementations may therefore rely on every field being consistent: extents
 * in range, address spans representable, the mask expanded to (B, Hq, Lq, Lk) with stride 0 on
 * broadcast extents, causal folded into window_right, and the scale resolved.
 */
#ifndef SDPA_INTERNAL_H
#define SDPA_INTERNAL_H

#include "sdpa.h"

#include <stddef.h>
#include <stdint.h>

#define SDPA__ERR_LEN 512
#define SDPA__DESCRIBE_LEN 1024

struct sdpa__pool; /* src/thread/pool.h */

struct sdpa_ctx {
    int n_threads;
    struct sdpa__pool *pool; /* n_threads - 1 workers; the calling thread is the last one */
    sdpa_isa cpu_isa;        /* best level the CPU and OS support */
    sdpa_isa isa;            /* level dispatched to, after the caps */
    sdpa_allocator allocator;
    char err[SDPA__ERR_LEN];
    char describe[SDPA__DESCRIBE_LEN];
};

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
    int has_mask;
    sdpa_tensor q, k, v;
    sdpa_tensor mask; /* valid when has_mask: shape (B, Hq, Lq, Lk), broadcast strides 0 */
} sdpa__problem;

/* Records a message in ctx (printf-style) and returns status, so that a check reads
 * `return sdpa__fail(ctx, SDPA_ERR_SHAPE, "k.shape[3]=%lld but ...", ...)`. */
sdpa_status sdpa__fail(sdpa_ctx *ctx, sdpa_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Validates the arguments of sdpa_forward and fills *p. Writes nothing else. */
sdpa_status sdpa__check_forward(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                                const sdpa_tensor *v, const sdpa_params *params,
                                const sdpa_tensor *out, const sdpa_tensor *lse, sdpa__problem *p);

/* Validates the arguments of sdpa_weights and fills *p (p->v is zeroed, Dv = 0). */
sdpa_status sdpa__check_weights(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                                const sdpa_params *params, const sdpa_tensor *weights,
                                sdpa__problem *p);

/* Scratch memory through the context's allocator. align is a power of two <= 4096.
 * sdpa__alloc returns NULL on failure (and for size 0 it allocates 1 byte). */
void *sdpa__alloc(const sdpa_ctx *ctx, size_t size, size_t align);
void sdpa__free(const sdpa_ctx *ctx, void *ptr);

/* The number of workers sdpa__parallel_for may use: per-worker scratch is sized by it. */
int sdpa__n_workers(const sdpa_ctx *ctx);

/* Runs fn(arg, task, worker) once for every task < n_tasks on the context's threads, with
 * worker < sdpa__n_workers(ctx); returns when all are done. Which worker runs which task is
 * unspecified, so results must not depend on it. */
void sdpa__parallel_for(sdpa_ctx *ctx, int64_t n_tasks, void (*fn)(void *, int64_t, int),
                        void *arg);

/* Offset in elements of element (i0, i1, i2, i3) of t. */
static inline int64_t sdpa__offset(const sdpa_tensor *t, int64_t i0, int64_t i1, int64_t i2,
                                   int64_t i3) {
    return i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2] + i3 * t->stride[3];
}

/* Whether key j is visible to query i under the window rule (causal already folded in).
 * The bool and additive masks are applied separately. */
static inline int sdpa__visible(const sdpa__problem *p, int64_t i, int64_t j) {
    const int64_t d = j - (i + p->off);
    if (p->window_left >= 0 && d < -p->window_left)
        return 0;
    if (p->window_right >= 0 && d > p->window_right)
        return 0;
    return 1;
}

#endif /* SDPA_INTERNAL_H */
