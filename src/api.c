/*
 * api.c — the public entry points: validate, choose an implementation from the kernel
 * table, run it. On any failure the outputs are untouched (validation writes nothing, and
 * implementations may fail only before they write, with SDPA_ERR_NOMEM).
 */
#include "context.h"

#include "core/validate.h"

sdpa_status sdpa_forward(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                         const sdpa_tensor *v, const sdpa_params *params, sdpa_tensor *out,
                         sdpa_tensor *lse) {
    if (ctx == NULL)
        return SDPA_ERR_NULL;
    sdpa__problem p;
    sdpa_status st = sdpa__check_forward(ctx, q, k, v, params, out, lse, &p);
    if (st != SDPA_OK)
        return st;
    const sdpa__impl *impl = sdpa__select(ctx->features, ctx->cap, SDPA__OP_FORWARD, &p);
    return impl->forward(impl, ctx, &p, out, lse);
}

sdpa_status sdpa_weights(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                         const sdpa_params *params, sdpa_tensor *weights) {
    if (ctx == NULL)
        return SDPA_ERR_NULL;
    sdpa__problem p;
    sdpa_status st = sdpa__check_weights(ctx, q, k, params, weights, &p);
    if (st != SDPA_OK)
        return st;
    const sdpa__impl *impl = sdpa__select(ctx->features, ctx->cap, SDPA__OP_WEIGHTS, &p);
    return impl->weights(impl, ctx, &p, weights);
}
