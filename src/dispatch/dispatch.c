/*
 * dispatch.c — the registered implementations and the choice among them (see kernels.h).
 * To add an implementation, append it to `impls` in increasing order of preference.
 */
#include "../kernels/kernels.h"

static const sdpa__impl *const impls[] = {
    &sdpa__impl_reference,
};

const sdpa__impl *const *sdpa__impls(int *count) {
    *count = (int)(sizeof impls / sizeof impls[0]);
    return impls;
}

const sdpa__impl *sdpa__select(sdpa_isa isa, const sdpa__problem *p) {
    for (int n = (int)(sizeof impls / sizeof impls[0]) - 1; n > 0; n--) {
        const sdpa__impl *impl = impls[n];
        if (impl->isa <= isa && (impl->supports == NULL || impl->supports(p)))
            return impl;
    }
    return impls[0];
}
