/*
 * fuzz_npy_header.c — libFuzzer target: npy_parse_header (cli/npy.h) on arbitrary bytes.
 *
 * The bytes are parsed twice, without and with allow_bf16. Checked, beyond what the sanitizers
 * see: a failure leaves a message that starts with the file name; a success describes a
 * consistent array (version, rank, extents, count = product of the shape, bytes = count times
 * the element size, data offset = the end of the header inside the input); and allowing bf16
 * only ever adds bf16 arrays, never changes another verdict.
 */
#include "fuzz_npy.h"

static void check_header(const npy_header *h, const uint8_t *data, size_t size) {
    require(h->minor == 0 && h->major >= 1 && h->major <= 3);
    require(h->dtype == SDPA_F32 || h->dtype == SDPA_F16 || h->dtype == SDPA_BF16 ||
            h->dtype == SDPA_BOOL);
    require_array(h->dtype, h->ndim, h->shape, h->count, h->data_bytes);
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
        rc[allow] = npy_parse_header(data, size, allow, fuzz_npy_name, &h[allow], err[allow],
                                     sizeof err[allow]);
        require(rc[allow] == 0 || rc[allow] == -1);
        if (rc[allow] == 0)
            check_header(&h[allow], data, size);
        else
            require_names_file(err[allow]);
    }
    if (rc[0] == 0)
        require(rc[1] == 0 && h[1].dtype == h[0].dtype && h[1].ndim == h[0].ndim &&
                memcmp(h[1].shape, h[0].shape, sizeof h[0].shape) == 0 &&
                h[1].data_offset == h[0].data_offset);
    else if (rc[1] == 0)
        require(h[1].dtype == SDPA_BF16);
    return 0;
}
