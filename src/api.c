/*
 * api.c — the public entry points: validate, choose an implementation from the kernel
 * table, run it (sdpa_merge has a single one, src/attn/merge.c). On any failure the outputs
 * are untouched (validation writes nothing, and implementations may fail only before they
 * write, with SDPA_ERR_NOMEM). A context serves one call at a time: a call that finds it busy
 * returns SDPA_ERR_BUSY without touching it.
 */
#include "context.h"

#include "attn/merge.h"
#include "core/validate.h"

/* Claims ctx for one call. @return 0, or 1 if another call holds it. The acquire pairs with
 * release's store, so each call sees everything the previous one wrote into the context. */
static int claim(sdpa_ctx *ctx) {
    return atomic_exchange_explicit(&ctx->busy, 1, memory_order_acquire);
}

static sdpa_status release(sdpa_ctx *ctx, sdpa_status st) {
    atomic_store_explicit(&ctx->busy, 0, memory_order_release);
    return st;
}

sdpa_status sdpa_forward(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                         const sdpa_tensor *v, const sdpa_params *params, sdpa_tensor *out,
                         sdpa_tensor *lse) {
    if (ctx == NULL)
        return SDPA_ERR_NULL;
    if (claim(ctx))
        return SDPA_ERR_BUSY;
    sdpa__problem p;
    sdpa_status st = sdpa__check_forward(ctx, q, k, v, params, out, lse, &p);
    if (st != SDPA_OK)
        return release(ctx, st);
    const sdpa__impl *impl = sdpa__select(ctx->features, ctx->cap, SDPA__OP_FORWARD, &p);
    return release(ctx, impl->forward(impl, ctx, &p, out, lse));
}

sdpa_status sdpa_forward_kv(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_kv_cache *cache,
                            const sdpa_params *params, sdpa_tensor *out, sdpa_tensor *lse) {
    if (ctx == NULL)
        return SDPA_ERR_NULL;
    if (claim(ctx))
        return SDPA_ERR_BUSY;
    sdpa__problem p;
    sdpa_status st = sdpa__check_forward_kv(ctx, q, cache, params, out, lse, &p);
    if (st != SDPA_OK)
        return release(ctx, st);
    const sdpa__impl *impl = sdpa__select(ctx->features, ctx->cap, SDPA__OP_FORWARD, &p);
    return release(ctx, impl->forward(impl, ctx, &p, out, lse));
}

sdpa_status sdpa_weights(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                         const sdpa_params *params, sdpa_tensor *weights) {
    if (ctx == NULL)
        return SDPA_ERR_NULL;
    if (claim(ctx))
        return SDPA_ERR_BUSY;
    sdpa__problem p;
    sdpa_status st = sdpa__check_weights(ctx, q, k, params, weights, &p);
    if (st != SDPA_OK)
        return release(ctx, st);
    const sdpa__impl *impl = sdpa__select(ctx->features, ctx->cap, SDPA__OP_WEIGHTS, &p);
    return release(ctx, impl->weights(impl, ctx, &p, weights));
}

sdpa_status sdpa_backward(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                          const sdpa_tensor *v, const sdpa_tensor *out, const sdpa_tensor *lse,
                          const sdpa_tensor *dout, const sdpa_params *params, sdpa_tensor *dq,
                          sdpa_tensor *dk, sdpa_tensor *dv) {
    if (ctx == NULL)
        return SDPA_ERR_NULL;
    if (claim(ctx))
        return SDPA_ERR_BUSY;
    sdpa__problem p;
    sdpa_status st = sdpa__check_backward(ctx, q, k, v, out, lse, dout, params, dq, dk, dv, &p);
    if (st != SDPA_OK)
        return release(ctx, st);
    const sdpa__impl *impl = sdpa__select(ctx->features, ctx->cap, SDPA__OP_BACKWARD, &p);
    return release(ctx, impl->backward(impl, ctx, &p, out, lse, dout, dq, dk, dv));
}

sdpa_status sdpa_merge(sdpa_ctx *ctx, int64_t n_parts, const sdpa_tensor *outs,
                       const sdpa_tensor *lses, sdpa_tensor *out, sdpa_tensor *lse) {
    if (ctx == NULL)
        return SDPA_ERR_NULL;
    if (claim(ctx))
        return SDPA_ERR_BUSY;
    sdpa_status st = sdpa__check_merge(ctx, n_parts, outs, lses, out, lse);
    if (st != SDPA_OK)
        return release(ctx, st);
    return release(ctx, sdpa__merge(ctx, n_parts, outs, lses, out, lse));
}
