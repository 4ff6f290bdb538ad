/*
 * fuzz_npy_header.c — libFuzzer target: npy_parse_header (cli/npy.h) on arbitrary bytes.
 *
 * The bytes are parsed twice, without and with allow_bf16. Checked, beyond what the sanitizers
 * see: a failure leaves a message that starts with the file name; a success describes a
 * consistent array (version, rank, extents, count = product of the shape, bytes = count times
 * the element size, data offset = the end of the header inside the input); and allowing bf16
 * only ever adds bf16 arrays, never changes another verdict.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include "npy.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char name[] = "fuzz.npy";

/* abort() rather than assert(): the check must hold in release builds of the replay test. */
static void require(int cond) {
    if (!cond)
        abort();
}

static void check_header(const npy_header *h, const uint8_t *data, size_t size) {
    require(h->minor == 0 && h->major >= 1 && h->major <= 3);
    require(h->dtype == SDPA_F32 || h->dtype == SDPA_F16 || h->dtype == SDPA_BF16 ||
            h->dtype == SDPA_BOOL);
    require(h->ndim >= 0 && h->ndim <= NPY_MAX_DIMS);
    /* The parser guarantees that the product of the non-zero extents times the element
     * size fits in int64_t, so this product cannot overflow. */
    int64_t count = 1;
    for (int i = 0; i < h->ndim; i++) {
        require(h->shape[i] >= 0);
        count *= h->shape[i];
    }
    require(h->count == count);
    const size_t esize = h->dtype == SDPA_F32 ? 4 : h->dtype == SDPA_BOOL ? 1 : 2;
    require(h->data_bytes == (size_t)count * esize);
    const size_t prefix = h->major == 1 ? 10 : 12;
    size_t hlen = (size_t)data[8] | (size_t)data[9] << 8;
    if (h->major != 1)
        hlen |= (size_t)data[10] << 16 | (size_t)data[11] << 24;
    require(hlen <= NPY_MAX_HEADER && h->data_offset == prefix + hlen && h->data_offset <= size);
    require(data[h->data_offset - 1] == '\n');
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    npy_header h[2];
    char err[2][512];
    int rc[2];
    for (int allow = 0; allow < 2; allow++) {
        err[allow][0] = 'x';
        rc[allow] =
            npy_parse_header(data, size, allow, name, &h[allow], err[allow], sizeof err[allow]);
        require(rc[allow] == 0 || rc[allow] == -1);
        if (rc[allow] == 0)
            check_header(&h[allow], data, size);
        else
            require(strncmp(err[allow], name, sizeof name - 1) == 0 &&
                    err[allow][sizeof name - 1] == ':');
    }
    if (rc[0] == 0)
        require(rc[1] == 0 && h[1].dtype == h[0].dtype && h[1].ndim == h[0].ndim &&
                memcmp(h[1].shape, h[0].shape, sizeof h[0].shape) == 0 &&
                h[1].data_offset == h[0].data_offset);
    else if (rc[1] == 0)
        require(h[1].dtype == SDPA_BF16);
    return 0;
}
