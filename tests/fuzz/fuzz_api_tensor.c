/*
 * fuzz_api_tensor.c — the API fuzz target's tensors: strides made from a shape and a drawn
 * layout (orders, padded rows, negative, zero and overflowing strides, misaligned data,
 * overlapping output rows), buffers malloc'ed at exactly the bytes the view spans so that
 * ASan sees any access outside it, the map of which of those bytes are elements, and the
 * canary that shows a write outside them.
 */
#include "fuzz_api.h"

#include <stdlib.h>
#include <string.h>

/* The canary byte of outputs: every byte of an output's buffer holds it before a call. */
#define CANARY 0xA5

/* Strides of a view of shape sh under layout ly (huge patterns applied by the caller). */
static void make_strides(const fz_layout *ly, const int64_t sh[4], int64_t st[4]) {
    const int64_t H = sh[1], L = sh[2], D = sh[3];
    if (ly->base == 0) {
        const int64_t row = D + ly->pad;
        st[0] = H * L * row, st[1] = L * row, st[2] = row, st[3] = 1;
    } else if (ly->base == 1) {
        const int64_t row = D + ly->pad;
        st[0] = L * H * row, st[1] = row, st[2] = H * row, st[3] = 1;
    } else {
        const int64_t col = L + ly->pad;
        st[0] = H * D * col, st[1] = D * col, st[2] = 1, st[3] = col;
    }
    for (int i = 0; i < 4; i++) {
        if (ly->zero >> i & 1u)
            st[i] = 0;
        if (ly->neg >> i & 1u)
            st[i] = -st[i];
    }
    if (ly->overlap) {
        st[2] = D - 1;
        st[3] = 1;
    }
}

void fz_alloc_tensor(fz_case *c, fz_tensor *f, sdpa_dtype dt, const int64_t sh[4], int output,
                     fz_bad which, fz_bad as_output, unsigned pick) {
    const fz_layout *ly = &f->ly;
    sdpa_tensor *t = &f->t;
    t->dtype = dt;
    memcpy(t->shape, sh, sizeof t->shape);
    make_strides(ly, sh, t->stride);
    const size_t es = sdpa_dtype_size(dt) ? sdpa_dtype_size(dt) : 4;
    if (output && ly->zero) {
        for (int i = 0; i < 4; i++)
            if ((ly->zero >> i & 1u) && sh[i] > 1)
                fz_note_bad(c, as_output, "output stride 0 over an extent > 1");
    }
    if (output && ly->overlap && sh[2] > 1)
        fz_note_bad(c, as_output, "output rows overlap");
    if (ly->huge) {
        /* the first dimension from `pick` on with an extent that makes the span overflow */
        const int64_t need = ly->huge == 4 ? 3 : 2;
        for (int n = 0; n < 4; n++) {
            const int i = (int)((pick + (unsigned)n) % 4);
            if (sh[i] < need)
                continue;
            /* INT64_MAX, -INT64_MAX, INT64_MIN: the span overflows int64 elements; 2^62 over
             * 3 or more: 2^63; -2^60: fits int64 bytes but reaches 2^60 elements (2^60 to
             * 2^62 bytes) below data, under address 0 on any 64-bit system */
            static const int64_t huge[6] = {0,         INT64_MAX,        -INT64_MAX,
                                            INT64_MIN, (int64_t)1 << 62, -((int64_t)1 << 60)};
            t->stride[i] = huge[ly->huge];
            fz_note_bad(c, which, "a stride whose span overflows");
            f->bytes = es;
            f->buf = malloc(f->bytes);
            t->data = f->buf;
            return;
        }
        f->ly.huge = 0; /* no extent large enough: an ordinary view */
    }
    int64_t lo = 0, hi = 0;
    for (int i = 0; i < 4; i++) {
        const int64_t e = (sh[i] - 1) * t->stride[i];
        if (e < 0)
            lo += e;
        else
            hi += e;
    }
    const size_t mis = ly->misalign ? 1 : 0;
    if (mis && sdpa_dtype_size(dt) >= 2)
        fz_note_bad(c, which, "data not aligned to its element size");
    f->bytes = (size_t)(hi - lo + 1) * es + mis;
    f->buf = malloc(f->bytes);
    if (f->buf == NULL)
        fz_violation("out of memory for %zu bytes (the generator's fault)", f->bytes);
    t->data = f->buf + mis + (size_t)(-lo) * es;
}

/* Marks, in map, the bytes of f's buffer that hold elements of its view. */
static void element_map(const fz_tensor *f, unsigned char *map) {
    const sdpa_tensor *t = &f->t;
    const int64_t es = (int64_t)sdpa_dtype_size(t->dtype);
    const int64_t base = (int64_t)((const unsigned char *)t->data - f->buf);
    memset(map, 0, f->bytes);
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t h = 0; h < t->shape[1]; h++)
            for (int64_t l = 0; l < t->shape[2]; l++)
                for (int64_t d = 0; d < t->shape[3]; d++) {
                    const int64_t o = base + es * (b * t->stride[0] + h * t->stride[1] +
                                                   l * t->stride[2] + d * t->stride[3]);
                    memset(map + o, 1, (size_t)es);
                }
}

/* The views that are not fillable are refused by the library before it reads them. */
int fz_fillable(const fz_tensor *f) {
    const size_t es = sdpa_dtype_size(f->t.dtype);
    return f->used && es != 0 && !f->ly.huge && !(f->ly.misalign && es >= 2);
}

void fz_fill_canary(fz_tensor *f) {
    if (f->buf != NULL)
        memset(f->buf, CANARY, f->bytes);
}

int fz_is_canary(const fz_tensor *f) {
    for (size_t i = 0; i < f->bytes; i++)
        if (f->buf[i] != CANARY)
            return 0;
    return 1;
}

void fz_check_gaps(const fz_tensor *f, const char *call) {
    if (!f->used || f->alias)
        return;
    unsigned char *map = malloc(f->bytes);
    element_map(f, map);
    for (size_t i = 0; i < f->bytes; i++)
        if (!map[i] && f->buf[i] != CANARY)
            fz_violation("%s wrote byte %zu of %s's buffer, outside its elements", call, i,
                         f->name);
    free(map);
}
