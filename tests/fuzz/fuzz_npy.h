/*
 * fuzz_npy.h — what the two .npy fuzz targets (fuzz_npy_header.c, fuzz_npy_load.c) check
 * alike: a failure leaves a message that starts with the file name, and an accepted array is
 * consistent (rank in range, no negative extent, count = product of the shape, bytes = count
 * times the element size the library gives its dtype). A broken check calls abort(), not
 * assert(): it must hold in release builds of the replay tests too.
 */
#ifndef SDPA_FUZZ_NPY_H
#define SDPA_FUZZ_NPY_H

#include "npy.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The file name the targets give the reader, which its messages must start with. */
static const char fuzz_npy_name[] = "fuzz.npy";

static inline void require(int cond) {
    if (!cond)
        abort();
}

/* err starts with "fuzz.npy:". */
static inline void require_names_file(const char *err) {
    const size_t n = sizeof fuzz_npy_name - 1;
    require(strncmp(err, fuzz_npy_name, n) == 0 && err[n] == ':');
}

/* An accepted array's description is consistent. The reader guarantees that the product of
 * the non-zero extents times the element size fits in int64_t, so the product cannot
 * overflow. */
static inline void require_array(sdpa_dtype dtype, int ndim, const int64_t *shape, int64_t count,
                                 size_t bytes) {
    require(ndim >= 0 && ndim <= NPY_MAX_DIMS);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        require(shape[i] >= 0);
        n *= shape[i];
    }
    require(count == n && bytes == (size_t)n * sdpa_dtype_size(dtype));
}

#endif
