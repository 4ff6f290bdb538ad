/*
 * npy.c — the strict .npy reader and writer of the sdpa command (contract in npy.h): loading
 * a whole array after the header that npy_header.c parses, converting it to f32, and writing
 * arrays exactly as numpy does; with the helpers both files use (npy_internal.h).
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* fstat, fileno */
#endif

#include "npy.h"
#include "npy_internal.h"

#include "args.h"
#include "outputs.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

const unsigned char npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

/* numpy pads the header so that the data starts at a multiple of this many bytes. */
#define NPY_ALIGN 64
/* numpy leaves room for the growth axis (the first, in C order) to reach this many digits,
 * so that a header can be rewritten in place when an array is appended to. */
#define NPY_GROWTH_DIGITS 21

static const char *display_name(const char *name) {
    return name != NULL ? name : "(buffer)";
}

void npy_set_err(char *err, size_t errlen, const char *name, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cli_verror(err, errlen, display_name(name), fmt, ap);
    va_end(ap);
}

int npy_check_extent(int ndim, const int64_t *shape, size_t esize, int64_t *count, size_t *bytes) {
    int64_t span = (int64_t)esize, n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return -1;
        if (shape[i] == 0) {
            n = 0;
            continue;
        }
        if (span > INT64_MAX / shape[i])
            return -1;
        span *= shape[i];
        if (n != 0)
            n *= shape[i]; /* n <= span / esize, so this cannot overflow */
    }
    if ((uint64_t)span > (uint64_t)SIZE_MAX)
        return -1;
    *count = n;
    *bytes = (size_t)n * esize;
    return 0;
}

void npy_format_shape(char *out, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(out, cap, "(");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, i == 0 ? "%" PRId64 : ", %" PRId64, shape[i]);
    if (n < cap)
        snprintf(out + n, cap - n, ndim == 1 ? ",)" : ")");
}

/* ---- loading --------------------------------------------------------------------------- */

/* Compares the bytes the file has after its header with the bytes the header promises. */
static int check_data_size(const npy_header *h, size_t have, const char *name, char *err,
                           size_t errlen) {
    if (have == h->data_bytes)
        return 0;
    char s[NPY_SHAPE_CHARS];
    npy_format_shape(s, sizeof s, h->ndim, h->shape);
    if (have < h->data_bytes)
        npy_set_err(err, errlen, name,
                    "truncated .npy file: shape %s needs %zu bytes of data, the file has %zu", s,
                    h->data_bytes, have);
    else
        npy_set_err(err, errlen, name,
                    "%zu unexpected bytes after the data (shape %s needs %zu bytes); the file "
                    "is not a single .npy array",
                    have - h->data_bytes, s, h->data_bytes);
    return -1;
}

/* An integer keep-mask read under NPY_INT_MASK: its h->int_bytes-byte integers become bool
 * bytes, in place (element i moves down to byte i), when every one is 0 or 1. Anything else
 * is refused with the first offending element: such a file is not a keep-mask, and reading
 * it as one (or as a bias) would be a guess. */
static int int_mask_to_bool(const npy_header *h, npy_array *a, const char *name, char *err,
                            size_t errlen) {
    if (h->int_bytes == 0)
        return 0;
    unsigned char *p = a->data;
    const size_t k = (size_t)h->int_bytes;
    for (int64_t i = 0; i < a->count; i++) {
        uint64_t u = 0;
        for (size_t b = 0; b < k; b++)
            u |= (uint64_t)p[(size_t)i * k + b] << (8 * b);
        if (u > 1) {
            /* the element's index as a tuple, and its value as numpy would print it */
            int64_t idx[NPY_MAX_DIMS], rest = i;
            for (int d = a->ndim - 1; d >= 0; d--) {
                idx[d] = a->shape[d] > 0 ? rest % a->shape[d] : 0;
                rest = a->shape[d] > 0 ? rest / a->shape[d] : 0;
            }
            char at[NPY_SHAPE_CHARS];
            npy_format_shape(at, sizeof at, a->ndim, idx);
            const int neg = h->int_signed && (u >> (8 * k - 1)) & 1;
            const int64_t sv = neg ? (int64_t)(u | (k < 8 ? ~UINT64_C(0) << (8 * k) : 0)) : 0;
            char val[32];
            if (neg)
                snprintf(val, sizeof val, "%" PRId64, sv);
            else
                snprintf(val, sizeof val, "%" PRIu64, u);
            npy_set_err(err, errlen, name,
                        "an integer mask must hold only 0 and 1 (a keep-mask: 1 = attend), but the "
                        "element at %s is %s; save an additive mask with arr.astype('<f4')",
                        a->ndim > 0 ? at : "()", val);
            return -1;
        }
        p[i] = (unsigned char)u;
    }
    a->nbytes = (size_t)a->count;
    return 0;
}

/* Fills out with an allocated buffer of h->data_bytes (at least 1 byte, so that data is never
 * NULL on success, even for an empty array). */
static int alloc_array(const npy_header *h, const char *name, npy_array *out, char *err,
                       size_t errlen) {
    out->data = malloc(h->data_bytes > 0 ? h->data_bytes : 1);
    if (out->data == NULL) {
        npy_set_err(err, errlen, name, "cannot allocate %zu bytes for the data", h->data_bytes);
        return -1;
    }
    out->dtype = h->dtype;
    out->ndim = h->ndim;
    memcpy(out->shape, h->shape, sizeof h->shape);
    out->count = h->count;
    out->nbytes = h->data_bytes;
    return 0;
}

int npy_load_buffer(const unsigned char *buf, size_t len, int flags, const char *name,
                    npy_array *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    npy_header h;
    if (npy_parse_header(buf, len, flags, name, &h, err, errlen) != 0)
        return -1;
    if (check_data_size(&h, len - h.data_offset, name, err, errlen) != 0)
        return -1;
    if (alloc_array(&h, name, out, err, errlen) != 0)
        return -1;
    memcpy(out->data, buf + h.data_offset, h.data_bytes);
    if (int_mask_to_bool(&h, out, name, err, errlen) != 0) {
        npy_free(out);
        return -1;
    }
    return 0;
}

int npy_load(const char *path, int flags, npy_array *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        npy_set_err(err, errlen, path, "cannot open: %s", strerror(errno));
        return -1;
    }
    struct stat st;
    const int have_stat = fstat(fileno(f), &st) == 0;
    if (have_stat && S_ISDIR(st.st_mode)) {
        npy_set_err(err, errlen, path, "is a directory, not a .npy file");
        fclose(f);
        return -1;
    }
    /* The header: its fixed prefix first, which says how long the rest is. The length is
     * checked against NPY_MAX_HEADER (by npy_parse_header on the prefix alone) before the
     * buffer for the whole header is allocated. */
    unsigned char prefix[12];
    const size_t got = fread(prefix, 1, sizeof prefix, f);
    npy_header h;
    unsigned char *head = NULL;
    size_t head_len = got;
    int rc = -1;
    if (got >= 10 && memcmp(prefix, npy_magic, sizeof npy_magic) == 0 &&
        (prefix[6] == 1 || got == 12)) {
        const size_t pre = prefix[6] == 1 ? 10 : 12;
        uint32_t hlen = (uint32_t)prefix[8] | (uint32_t)prefix[9] << 8;
        if (pre == 12)
            hlen |= (uint32_t)prefix[10] << 16 | (uint32_t)prefix[11] << 24;
        if (hlen <= NPY_MAX_HEADER && prefix[7] == 0 && prefix[6] <= 3) {
            const size_t want = pre + hlen;
            head = malloc(want);
            if (head == NULL) {
                npy_set_err(err, errlen, path, "out of memory");
                goto done;
            }
            /* For version 1.0 the prefix read may already hold header (or even data) bytes. */
            head_len = got < want ? got : want;
            memcpy(head, prefix, head_len);
            if (want > head_len)
                head_len += fread(head + head_len, 1, want - head_len, f);
        }
    }
    if (npy_parse_header(head != NULL ? head : prefix, head_len, flags, path, &h, err, errlen) != 0)
        goto done;
    /* The stream now stands at the data, without a seek (so pipes work too): the header was
     * read whole and no further, since a valid header has at least 2 bytes and the 12-byte
     * prefix of a 1.0 file therefore never reaches into the data. */
    /* For a regular file, compare its size with the header's promise before allocating, so
     * that a lying header gets its message rather than an attempt at a huge allocation. */
    if (have_stat && S_ISREG(st.st_mode)) {
        const uint64_t size = (uint64_t)st.st_size;
        const uint64_t have = size > h.data_offset ? size - h.data_offset : 0;
        if (have > SIZE_MAX) {
            npy_set_err(err, errlen, path, "the file is too large for this machine");
            goto done;
        }
        if (check_data_size(&h, (size_t)have, path, err, errlen) != 0)
            goto done;
    }
    if (alloc_array(&h, path, out, err, errlen) != 0)
        goto done;
    const size_t n = fread(out->data, 1, h.data_bytes, f);
    if (n < h.data_bytes && ferror(f)) {
        npy_set_err(err, errlen, path, "read error: %s", strerror(errno));
        goto done;
    }
    /* A file that is not regular (a pipe), or one that changed since fstat: count what is
     * there to give the same messages as above. */
    size_t extra = 0;
    while (n == h.data_bytes && fgetc(f) != EOF && extra < SIZE_MAX - h.data_bytes)
        extra++;
    if (check_data_size(&h, n + extra, path, err, errlen) != 0 ||
        int_mask_to_bool(&h, out, path, err, errlen) != 0)
        goto done;
    rc = 0;
done:
    if (rc != 0)
        npy_free(out);
    free(head);
    fclose(f);
    return rc;
}

void npy_free(npy_array *a) {
    if (a == NULL)
        return;
    free(a->data);
    a->data = NULL;
    a->nbytes = 0;
}

/* binary16 scaled by hand: exact for every value, subnormals, infinities and NaN included.
 * The command's one f16 decoder; the library's (src/core/half.h) is internal, and the
 * command is a client of sdpa.h only. */
static float half_to_float(uint16_t h) {
    const int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    const double val = exp == 0    ? ldexp((double)man, -24) /* zero or subnormal */
                       : exp == 31 ? (man ? NAN : INFINITY)
                                   : ldexp((double)(man | 0x400), exp - 25);
    return (float)(h >> 15 ? -val : val);
}

int npy_to_f32(const npy_array *a, float *dst) {
    if (a->dtype != SDPA_F32 && a->dtype != SDPA_F16)
        return -1;
    for (int64_t i = 0; i < a->count; i++)
        dst[i] = a->dtype == SDPA_F32 ? ((const float *)a->data)[i]
                                      : half_to_float(((const uint16_t *)a->data)[i]);
    return 0;
}

/* ---- saving ---------------------------------------------------------------------------- */

/* Formats the whole header (magic to the final newline) exactly as numpy 1.24+ writes it:
 * "{'descr': ..., 'fortran_order': False, 'shape': ..., }", spaces for the growth axis to
 * reach NPY_GROWTH_DIGITS digits, then spaces and '\n' up to a multiple of NPY_ALIGN bytes
 * (numpy always adds at least one space, so an already aligned length gains NPY_ALIGN).
 * @return the header's length in bytes. */
static size_t format_header(unsigned char *out, size_t cap, const char *descr, int ndim,
                            const int64_t *shape) {
    char shape_s[NPY_SHAPE_CHARS];
    npy_format_shape(shape_s, sizeof shape_s, ndim, shape);
    char dict[NPY_MAX_DIMS * 22 + 128];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                     descr, shape_s);
    if (ndim > 0) {
        char first[24];
        const int digits = snprintf(first, sizeof first, "%" PRId64, shape[0]);
        for (int i = digits; i < NPY_GROWTH_DIGITS; i++)
            dict[n++] = ' ';
        dict[n] = '\0';
    }
    /* Version 1.0 holds header lengths up to 65535; NPY_MAX_DIMS keeps ours under 512, so
     * the 2.0 branch is only there to follow numpy's rule. */
    size_t prefix = 10;
    size_t hlen = (size_t)n + 1;
    size_t pad = NPY_ALIGN - (prefix + hlen) % NPY_ALIGN;
    if (hlen + pad > 65535) {
        prefix = 12;
        pad = NPY_ALIGN - (prefix + hlen) % NPY_ALIGN;
    }
    const size_t total = prefix + hlen + pad;
    if (total > cap)
        return 0;
    const size_t field = hlen + pad;
    memcpy(out, npy_magic, sizeof npy_magic);
    out[6] = prefix == 10 ? 1 : 2;
    out[7] = 0;
    for (size_t i = 0; i < prefix - 8; i++)
        out[8 + i] = (unsigned char)(field >> (8 * i));
    memcpy(out + prefix, dict, (size_t)n);
    memset(out + prefix + (size_t)n, ' ', pad);
    out[total - 1] = '\n';
    return total;
}

/* Writes bool data with every true byte as 1, the only value numpy's bool holds. */
static int write_bool(FILE *f, const unsigned char *data, size_t n) {
    unsigned char chunk[4096];
    while (n > 0) {
        const size_t m = n < sizeof chunk ? n : sizeof chunk;
        for (size_t i = 0; i < m; i++)
            chunk[i] = data[i] != 0;
        if (fwrite(chunk, 1, m, f) != m)
            return -1;
        data += m;
        n -= m;
    }
    return 0;
}

/* The header of an array, or a message (without a file name) saying why it cannot be saved.
 * @return its length, or 0. */
static size_t header_for(const npy_out *a, unsigned char *header, size_t cap, size_t *bytes,
                         char *err, size_t errlen) {
    const char *descr = a->dtype == SDPA_F32    ? "<f4"
                        : a->dtype == SDPA_F16  ? "<f2"
                        : a->dtype == SDPA_BF16 ? "<V2"
                        : a->dtype == SDPA_BOOL ? "|b1"
                                                : NULL;
    int64_t count;
    if (descr == NULL) {
        snprintf(err, errlen, "cannot save dtype %d", (int)a->dtype);
        return 0;
    }
    if (a->ndim < 0 || a->ndim > NPY_MAX_DIMS) {
        snprintf(err, errlen, "cannot save %d dimensions (0 to %d)", a->ndim, NPY_MAX_DIMS);
        return 0;
    }
    if (npy_check_extent(a->ndim, a->shape, sdpa_dtype_size(a->dtype), &count, bytes) != 0) {
        snprintf(err, errlen, "cannot save: negative or overflowing shape");
        return 0;
    }
    if (a->data == NULL && *bytes > 0) {
        snprintf(err, errlen, "cannot save: no data");
        return 0;
    }
    const size_t len = format_header(header, cap, descr, a->ndim, a->shape);
    if (len == 0)
        snprintf(err, errlen, "cannot save: header too long");
    return len;
}

int npy_write(FILE *f, const void *arg, char *err, size_t errlen) {
    const npy_out *a = arg;
    unsigned char header[1024];
    size_t bytes = 0;
    const size_t header_len = header_for(a, header, sizeof header, &bytes, err, errlen);
    if (header_len == 0)
        return -1;
    if (fwrite(header, 1, header_len, f) != header_len)
        return 0; /* the caller sees ferror */
    if (bytes > 0) {
        if (a->dtype == SDPA_BOOL)
            (void)write_bool(f, a->data, bytes);
        else
            (void)fwrite(a->data, 1, bytes, f);
    }
    return 0;
}

int npy_save(const char *path, sdpa_dtype dtype, int ndim, const int64_t *shape, const void *data,
             char *err, size_t errlen) {
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (ndim > 0 && shape == NULL) {
        npy_set_err(err, errlen, path, "cannot save %d dimensions without a shape", ndim);
        return -1;
    }
    npy_out a = {dtype, ndim, {0}, data};
    for (int d = 0; d < ndim && d < NPY_MAX_DIMS; d++)
        a.shape[d] = shape[d];
    /* refused before the file system is touched */
    unsigned char header[1024];
    size_t bytes;
    char why[256];
    if (header_for(&a, header, sizeof header, &bytes, why, sizeof why) == 0) {
        npy_set_err(err, errlen, path, "%s", why);
        return -1;
    }
    return outputs_write_one(path, npy_write, &a, err, errlen);
}
