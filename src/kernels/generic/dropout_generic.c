/*
 * dropout_generic.c — dropout's factors for one row of keys in portable C (ukernels.h,
 * dropout_row): one Philox4x32-10 call (sdpa__dropout_draws4, core/philox.c) per four keys.
 * It is the statement of what the vectorised entries (dropout_<isa>.c) compute, and the entry
 * of any table that has none of its own.
 */
#include "../ukernels.h"

#include "../../core/philox.h"

void sdpa__dropout_row_generic(const uint32_t key[2], int64_t b, int64_t h, int64_t i, int64_t j0,
                               int64_t n, uint64_t threshold, float keep_scale, float *z) {
    for (int64_t jj = 0; jj < n;) {
        const int64_t j = j0 + jj;
        uint32_t draw[4];
        sdpa__dropout_draws4(key, b, h, i, j / 4, draw);
        /* the first call may start inside its four keys (j0 % 4 != 0), the last end inside */
        for (int64_t t = j % 4; t < 4 && jj < n; t++, jj++)
            z[jj] = (uint64_t)draw[t] < threshold ? keep_scale : 0.0f;
    }
}
