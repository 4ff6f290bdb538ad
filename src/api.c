/*
 * api.c — the public entry points: validate, choose an implementation from the kernel
 * table, run it (sdpa_merge has a single one, src/attn/merge.c). On any failure the outputs
 * are untouched (validation writes nothing, and implementations may fail only before they
 * write, with SDPA_ERR_NOMEM). A context serves one call at a time: a call that finds it busy
 * returns SDPA_ERR_BUSY without touching it. Also the placed forward and backward of
 * core/placement.h, which run inside a call that already holds the context.
 */
#include "context.h"

#include "attn/merge.h"
#include "core/placement.h"
#include "core/services.h"
#include "core/validate.h"

/* status, noting impl as the one that ran when the public call succeeded
 * (sdpa_ctx_last_kernel; a ring's placed steps are not public calls: place != NULL). */
static sdpa_status ran(sdpa_ctx *ctx, const sdpa__impl *impl, const sdpa__placement *place,
                       sdpa_status status) {
    if (status == SDPA_OK && place == NULL)
        atomic_store_explicit(&ctx->last, impl, memory_order_relaxed);
    return status;
}

/* Moves p's blocks to where place says they sit in their sequences. */
static void apply_placement(const sdpa__placement *place, sdpa__problem *p) {
    p->off = place->off;
    p->window_left = place->window_left;
    p->window_right = place->window_right;
    p->alibi_step = place->alibi_step;
    p->alibi_shift = place->alibi_shift;
}

/* The forward of sdpa_forward and sdpa__forward_placed (place NULL: the public one), on a
 * claimed context. */
static sdpa_status forward(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                           const sdpa_tensor *v, const sdpa_params *params,
                           const sdpa__placement *place, sdpa_tensor *out, sdpa_tensor *lse) {
    sdpa__problem p;
    sdpa_status st = sdpa__check_forward(ctx, q, k, v, params, out, lse, &p);
    if (st != SDPA_OK)
        return st;
    if (place != NULL)
        apply_placement(place, &p);
    const sdpa__impl *impl = sdpa__select(ctx->features, ctx->cap, SDPA__OP_FORWARD, &p);
    return ran(ctx, impl, place, impl->forward(impl, ctx, &p, out, lse));
}

/* The backward of sdpa_backward and sdpa__backward_placed, likewise. */
static sdpa_status backward(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                            const sdpa_tensor *v, const sdpa_tensor *out, const sdpa_tensor *lse,
                            const sdpa_tensor *dout, const sdpa_params *params,
                            const sdpa__placement *place, sdpa_tensor *dq, sdpa_tensor *dk,
                            sdpa_tensor *dv) {
    sdpa__problem p;
    sdpa_status st = sdpa__check_backward(ctx, q, k, v, out, lse, dout, params, dq, dk, dv, &p);
    if (st != SDPA_OK)
        return st;
    if (place != NULL)
        apply_placement(place, &p);
    const sdpa__impl *impl = sdpa__select(ctx->features, ctx->cap, SDPA__OP_BACKWARD, &p);
    return ran(ctx, impl, place, impl->backward(impl, ctx, &p, out, lse, dout, dq, dk, dv));
}

sdpa_status sdpa_forward(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                         const sdpa_tensor *v, const sdpa_params *params, sdpa_tensor *out,
                         sdpa_tensor *lse) {
    if (ctx == NULL)
        return SDPA_ERR_NULL;
    if (sdpa__claim(ctx))
        return SDPA_ERR_BUSY;
    return sdpa__release(ctx, forward(ctx, q, k, v, params, NULL, out, lse));
}

sdpa_status sdpa__forward_placed(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                                 const sdpa_tensor *v, const sdpa_params *params,
                                 const sdpa__placement *place, sdpa_tensor *out, sdpa_tensor *lse) {
    return forward(ctx, q, k, v, params, place, out, lse);
}

sdpa_status sdpa_forward_kv(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_kv_cache *cache,
                            const sdpa_params *params, sdpa_tensor *out, sdpa_tensor *lse) {
    if (ctx == NULL)
        return SDPA_ERR_NULL;
    if (sdpa__claim(ctx))
        return SDPA_ERR_BUSY;
    sdpa__problem p;
    sdpa_status st = sdpa__check_forward_kv(ctx, q, cache, params, out, lse, &p);
    if (st != SDPA_OK)
        return sdpa__release(ctx, st);
    const sdpa__impl *impl = sdpa__select(ctx->features, ctx->cap, SDPA__OP_FORWARD, &p);
    return sdpa__release(ctx, ran(ctx, impl, NULL, impl->forward(impl, ctx, &p, out, lse)));
}

sdpa_status sdpa_weights(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                         const sdpa_params *params, sdpa_tensor *weights) {
    if (ctx == NULL)
        return SDPA_ERR_NULL;
    if (sdpa__claim(ctx))
        return SDPA_ERR_BUSY;
    sdpa__problem p;
    sdpa_status st = sdpa__check_weights(ctx, q, k, params, weights, &p);
    if (st != SDPA_OK)
        return sdpa__release(ctx, st);
    const sdpa__impl *impl = sdpa__select(ctx->features, ctx->cap, SDPA__OP_WEIGHTS, &p);
    return sdpa__release(ctx, ran(ctx, impl, NULL, impl->weights(impl, ctx, &p, weights)));
}

sdpa_status sdpa_backward(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                          const sdpa_tensor *v, const sdpa_tensor *out, const sdpa_tensor *lse,
                          const sdpa_tensor *dout, const sdpa_params *params, sdpa_tensor *dq,
                          sdpa_tensor *dk, sdpa_tensor *dv) {
    if (ctx == NULL)
        return SDPA_ERR_NULL;
    if (sdpa__claim(ctx))
        return SDPA_ERR_BUSY;
    return sdpa__release(ctx, backward(ctx, q, k, v, out, lse, dout, params, NULL, dq, dk, dv));
}

sdpa_status sdpa__backward_placed(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                                  const sdpa_tensor *v, const sdpa_tensor *out,
                                  const sdpa_tensor *lse, const sdpa_tensor *dout,
                                  const sdpa_params *params, const sdpa__placement *place,
                                  sdpa_tensor *dq, sdpa_tensor *dk, sdpa_tensor *dv) {
    return backward(ctx, q, k, v, out, lse, dout, params, place, dq, dk, dv);
}

sdpa_status sdpa_merge(sdpa_ctx *ctx, int64_t n_parts, const sdpa_tensor *outs,
                       const sdpa_tensor *lses, sdpa_tensor *out, sdpa_tensor *lse) {
    if (ctx == NULL)
        return SDPA_ERR_NULL;
    if (sdpa__claim(ctx))
        return SDPA_ERR_BUSY;
    sdpa_status st = sdpa__check_merge(ctx, n_parts, outs, lses, out, lse);
    if (st != SDPA_OK)
        return sdpa__release(ctx, st);
    return sdpa__release(ctx, sdpa__merge(ctx, n_parts, outs, lses, out, lse));
}
