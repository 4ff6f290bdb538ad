/*
 * dispatch.c — the registered implementations and the choice among them (see kernels.h).
 * To add an implementation, append it to `impls` in increasing order of preference.
 */
#include "../kernels/kernels.h"

static const sdpa__impl flash_generic = {
    "flash-generic", SDPA_ISA_GENERIC, &sdpa__uk_generic, NULL, sdpa__flash_forward, NULL};
#if defined(SDPA_HAVE_X86)
static const sdpa__impl flash_avx2 = {"flash-avx2", SDPA_ISA_AVX2,       &sdpa__uk_avx2,
                                      NULL,         sdpa__flash_forward, NULL};
static const sdpa__impl flash_avx512 = {"flash-avx512", SDPA_ISA_AVX512,     &sdpa__uk_avx512,
                                        NULL,           sdpa__flash_forward, NULL};
#endif

static const sdpa__impl *const impls[] = {
    &sdpa__impl_reference,
    &flash_generic,
#if defined(SDPA_HAVE_X86)
    &flash_avx2,
    &flash_avx512,
#endif
};

const sdpa__impl *const *sdpa__impls(int *count) {
    *count = (int)(sizeof impls / sizeof impls[0]);
    return impls;
}

const sdpa__impl *sdpa__select(sdpa_isa isa, sdpa__op op, const sdpa__problem *p) {
    for (int n = (int)(sizeof impls / sizeof impls[0]) - 1; n > 0; n--) {
        const sdpa__impl *impl = impls[n];
        const int offers = op == SDPA__OP_FORWARD ? impl->forward != NULL : impl->weights != NULL;
        if (offers && impl->isa <= isa && (impl->supports == NULL || impl->supports(p)))
            return impl;
    }
    return impls[0];
}
