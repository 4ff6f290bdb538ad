/*
 * dispatch.c — the registered implementations and the choice among them (see impl.h).
 * To add one, append it to `impls` in increasing order of preference, with the features its
 * code needs and the level a cap compares with (docs/design.md, "How to add a kernel table").
 */
#include "impl.h"

#include "../attn/flash.h"
#include "../ref/ref.h"
#include "features.h"

static sdpa_status ref_forward(const sdpa__impl *self, sdpa_ctx *ctx, const sdpa__problem *p,
                               sdpa_tensor *out, sdpa_tensor *lse) {
    (void)self;
    return sdpa__ref_forward(ctx, p, out, lse);
}

static sdpa_status ref_weights(const sdpa__impl *self, sdpa_ctx *ctx, const sdpa__problem *p,
                               sdpa_tensor *w) {
    (void)self;
    return sdpa__ref_weights(ctx, p, w);
}

static sdpa_status ref_backward(const sdpa__impl *self, sdpa_ctx *ctx, const sdpa__problem *p,
                                const sdpa_tensor *out, const sdpa_tensor *lse,
                                const sdpa_tensor *dout, sdpa_tensor *dq, sdpa_tensor *dk,
                                sdpa_tensor *dv) {
    (void)self;
    (void)out; /* the reference recomputes O and the LSE in double: it trusts no rounded copy */
    (void)lse;
    return sdpa__ref_backward(ctx, p, dout, dq, dk, dv);
}

static const sdpa__impl reference = {.name = "reference",
                                     .level = SDPA_ISA_GENERIC,
                                     .forward = ref_forward,
                                     .weights = ref_weights,
                                     .backward = ref_backward};
static const sdpa__impl flash_generic = {.name = "flash-generic",
                                         .level = SDPA_ISA_GENERIC,
                                         .needs = 0,
                                         .uk = &sdpa__uk_generic,
                                         .forward = sdpa__flash_forward,
                                         .weights = sdpa__flash_weights,
                                         .backward = sdpa__flash_backward};
#if defined(SDPA_HAVE_X86)
static const sdpa__impl flash_avx2 = {.name = "flash-avx2",
                                      .level = SDPA_ISA_AVX2,
                                      .needs = SDPA__NEEDS_AVX2,
                                      .uk = &sdpa__uk_avx2,
                                      .forward = sdpa__flash_forward,
                                      .weights = sdpa__flash_weights,
                                      .backward = sdpa__flash_backward};
static const sdpa__impl flash_avx512 = {.name = "flash-avx512",
                                        .level = SDPA_ISA_AVX512,
                                        .needs = SDPA__NEEDS_AVX512,
                                        .uk = &sdpa__uk_avx512,
                                        .forward = sdpa__flash_forward,
                                        .weights = sdpa__flash_weights,
                                        .backward = sdpa__flash_backward};
#endif
#if defined(SDPA_HAVE_AMX)
/* The forward of bf16 problems only; the rest goes down the list to flash-avx512. */
static int amx_supports(sdpa__op op, const sdpa__problem *p) {
    return op == SDPA__OP_FORWARD && sdpa__flash_mx_fits(&sdpa__mx_amx, p);
}
static const sdpa__impl flash_amx = {
#if defined(SDPA_AMX_EMULATE)
    .name = "flash-amx-emulated",
    .needs = SDPA__NEEDS_AVX512, /* tiles done in C */
#else
    .name = "flash-amx",
    .needs = SDPA__NEEDS_AMX | SDPA__CPU_AVX512_BF16,
#endif
    .level = SDPA_ISA_AMX,
    .uk = &sdpa__uk_avx512,
    .mx = &sdpa__mx_amx,
    .supports = amx_supports,
    .takes = "bf16 Q, K and V, K and V with unit feature stride; Dk a multiple of 32, Dv of 16, "
             "both up to 256",
    .forward = sdpa__flash_forward};
#endif

static const sdpa__impl *const impls[] = {
    &reference,  &flash_generic,
#if defined(SDPA_HAVE_X86)
    &flash_avx2, &flash_avx512,
#endif
#if defined(SDPA_HAVE_AMX)
    &flash_amx,
#endif
};
enum { N_IMPLS = sizeof impls / sizeof impls[0] };

const sdpa__impl *const *sdpa__impls(int *count) {
    *count = N_IMPLS;
    return impls;
}

uint32_t sdpa__impls_needs(void) {
    uint32_t all = 0;
    for (int n = 0; n < N_IMPLS; n++)
        all |= impls[n]->needs;
    return all;
}

int sdpa__impl_offers(const sdpa__impl *impl, sdpa__op op) {
    return op == SDPA__OP_FORWARD   ? impl->forward != NULL
           : op == SDPA__OP_WEIGHTS ? impl->weights != NULL
                                    : impl->backward != NULL;
}

int sdpa__impl_allowed(const sdpa__impl *impl, uint32_t features, sdpa_isa cap) {
    return (impl->needs & ~features) == 0 && (cap == SDPA_ISA_AUTO || impl->level <= cap);
}

const sdpa__impl *sdpa__select(uint32_t features, sdpa_isa cap, sdpa__op op,
                               const sdpa__problem *p) {
    for (int n = N_IMPLS - 1; n > 0; n--) {
        const sdpa__impl *impl = impls[n];
        if (sdpa__impl_offers(impl, op) && sdpa__impl_allowed(impl, features, cap) &&
            (impl->supports == NULL || p == NULL || impl->supports(op, p)))
            return impl;
    }
    return impls[0];
}
