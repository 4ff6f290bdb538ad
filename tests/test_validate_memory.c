/*
 * test_validate_memory.c — the validator's checks of the memory a call would touch: address
 * spans that overflow int64 (extent x stride, their sum, the bytes) or run off the address
 * space, strides of unit extents ignored, outputs whose elements share memory (stride 0,
 * self-overlap) and outputs that overlap an input or each other, byte-exact at the
 * boundaries. Huge strides are declared on small buffers: the checks must refuse them before
 * memory is touched. The fixture is validate_fixture.h.
 */
#include "check.h"
#include "testutil.h"
#include "validate_fixture.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *arena_new(size_t n) {
    float *a = calloc(n, sizeof *a);
    if (a == NULL) {
        fprintf(stderr, "arena_new: out of memory\n");
        exit(2);
    }
    return a;
}

/* ---- address spans ------------------------------------------------------------------------ */

static void test_overflow_extent_times_stride(void) {
    static const fx_break rows[] = {
        /* 2 x 2^62 = 2^63 */
        {FX_Q, BREAK_STRIDE, 2, P62, ON_BOTH, SDPA_ERR_OVERFLOW,
         "q: the span of dimensions 0..2 overflows int64 (extent 3 x stride "
         "4611686018427387904)"},
        {FX_V, BREAK_STRIDE, 2, INT64_MIN, ON_FWD, SDPA_ERR_OVERFLOW,
         "v: the span of dimensions 0..2 overflows int64 (extent 5 x stride "
         "-9223372036854775808)"},
        {FX_MASK, BREAK_STRIDE, 3, P62, ON_BOTH, SDPA_ERR_OVERFLOW,
         "mask: the span of dimensions 0..3 overflows int64 (extent 5 x stride "
         "4611686018427387904)"},
        {FX_OUT, BREAK_STRIDE, 2, P62, ON_FWD, SDPA_ERR_OVERFLOW,
         "out: the span of dimensions 0..2 overflows int64 (extent 3 x stride "
         "4611686018427387904"},
        {FX_LSE, BREAK_STRIDE, 1, -P62, ON_FWD, SDPA_ERR_OVERFLOW,
         "lse: the span of dimensions 0..1 overflows int64 (extent 4 x stride "
         "-4611686018427387904)"},
        /* 3 x (2^62 - 1) */
        {FX_W, BREAK_STRIDE, 1, INT64_MAX / 2, ON_W, SDPA_ERR_OVERFLOW,
         "weights: the span of dimensions 0..1 overflows int64 (extent 4 x stride "
         "4611686018427387903)"},
    };
    EXPECT_BREAKS(rows);
}

/* Each product fits, their sum does not. */
static void test_overflow_sum_of_extents(void) {
    fx f;
    fx_init(&f);
    f.k.t.stride[1] = P62; /* 1 x 2^62 */
    f.k.t.stride[2] = P60; /* 4 x 2^60 = 2^62: fine alone, 2^63 with the above */
    EXPECT_BOTH(&f, SDPA_ERR_OVERFLOW,
                "k: the span of dimensions 0..2 overflows int64 (extent 5 x stride "
                "1152921504606846976)");
    fx_reset(&f);
    f.q.t.stride[0] = -P62; /* 1 x -2^62, then 2 x -2^62 = INT64_MIN: their sum overflows */
    f.q.t.stride[2] = -P62;
    EXPECT_BOTH(&f, SDPA_ERR_OVERFLOW,
                "q: the span of dimensions 0..2 overflows int64 (extent 3 x stride "
                "-4611686018427387904)");
    fx_free(&f);
}

/* The element span fits in int64, the byte span does not (or elements - 1 overflows). */
static void test_overflow_bytes(void) {
    fx f;
    fx_init(&f);
    f.q.t.stride[3] = INT64_MAX / 8; /* 7 x (2^60 - 1) elements fit; x 4 bytes does not */
    EXPECT_BOTH(&f, SDPA_ERR_OVERFLOW,
                "q: the address span of shape (2, 4, 3, 8) with strides (96, 24, 8, "
                "1152921504606846975) overflows int64 bytes");
    fx_reset(&f);
    f.v.t.stride[0] = INT64_MIN; /* 1 x INT64_MIN fits; the span INT64_MAX + more does not */
    EXPECT_FWD(&f, SDPA_ERR_OVERFLOW,
               "v: the address span of shape (2, 2, 5, 6) with strides "
               "(-9223372036854775808, 30, 6, 1) overflows int64 bytes");
    fx_reset(&f);
    f.q.t.stride[0] = INT64_MAX; /* a span of exactly INT64_MAX + 1 elements */
    f.q.t.stride[1] = f.q.t.stride[2] = f.q.t.stride[3] = 0;
    EXPECT_BOTH(&f, SDPA_ERR_OVERFLOW,
                "q: the address span of shape (2, 4, 3, 8) with strides "
                "(9223372036854775807, 0, 0, 0) overflows int64 bytes");
    fx_reset(&f);
    tu_tensor bm = tu_alloc(SDPA_BOOL, NB, 1, 1, 1, TU_BHLD, 0, 0); /* 1-byte elements */
    bm.t.stride[0] = INT64_MAX; /* INT64_MAX + 1 bytes: only the + 1 overflows */
    f.pr.mask = &bm.t;
    EXPECT_BOTH(&f, SDPA_ERR_OVERFLOW,
                "mask: the address span of shape (2, 1, 1, 1) with "
                "strides (9223372036854775807, 1, 1, 1) overflows");
    tu_free(&bm);
    fx_reset(&f);
    f.w.t.stride[3] = INT64_MAX / 8;
    EXPECT_W(&f, SDPA_ERR_OVERFLOW, "weights: the address span of shape (2, 4, 3, 5)");
    fx_reset(&f);
    f.lse.t.stride[0] = INT64_MAX / 4; /* (2^61 - 1) + 2 x (2^60 - 1) elements: 2^62 + ... */
    f.lse.t.stride[2] = INT64_MAX / 8; /* ... which x 4 bytes overflows */
    EXPECT_FWD(&f, SDPA_ERR_OVERFLOW, "lse: the address span of shape (2, 4, 3, 1)");
    fx_free(&f);
}

/* Spans that fit in int64 but run off either end of the address space. */
static void test_overflow_address_space(void) {
    fx f;
    fx_init(&f);
    f.q.t.data = (void *)(uintptr_t)64; /* a tiny pointer, never dereferenced */
    f.q.t.stride[2] = -100;
    EXPECT_BOTH(&f, SDPA_ERR_OVERFLOW,
                "q: shape (2, 4, 3, 8) with strides (96, 24, -100, 1) reaches 800 bytes below");
    fx_reset(&f);
    f.k.t.stride[2] = -(INT64_C(1) << 58); /* a real pointer, 2^62 bytes below it */
    EXPECT_BOTH(&f, SDPA_ERR_OVERFLOW, "outside the address space");
    fx_reset(&f);
    f.v.t.data = (void *)(UINTPTR_MAX - 255); /* 256 bytes below the top */
    EXPECT_FWD(&f, SDPA_ERR_OVERFLOW, "outside the address space");
    fx_reset(&f);
    f.out.t.data = (void *)(uintptr_t)4096;
    f.out.t.stride[1] = -2048;
    EXPECT_FWD(&f, SDPA_ERR_OVERFLOW,
               "out: shape (2, 4, 3, 6) with strides (72, -2048, 6, 1) reaches 24576 bytes below");
    fx_reset(&f);
    f.pr.mask = &f.mask.t;
    f.mask.t.stride[0] = -(INT64_C(1) << 60);
    EXPECT_BOTH(&f, SDPA_ERR_OVERFLOW, "outside the address space");
    fx_reset(&f);
    f.w.t.data = (void *)(UINTPTR_MAX - 15);
    EXPECT_W(&f, SDPA_ERR_OVERFLOW, "outside the address space");
    fx_free(&f);
}

/* The stride of an extent of 1 is never used, whatever it is. */
static void test_overflow_unit_extent_ignored(void) {
    fx f;
    fx_init(&f);
    f.lse.t.stride[3] = INT64_MIN;
    f.q.t.shape[0] = f.k.t.shape[0] = f.v.t.shape[0] = f.out.t.shape[0] = f.lse.t.shape[0] =
        f.w.t.shape[0] = 1;
    f.q.t.stride[0] = INT64_MAX;
    f.k.t.stride[0] = INT64_MIN;
    f.v.t.stride[0] = P62;
    f.out.t.stride[0] = -P62;
    f.lse.t.stride[0] = INT64_MAX;
    f.w.t.stride[0] = INT64_MIN;
    EXPECT_ACCEPTED(&f);
    fx_free(&f);
}

/* ---- aliasing ----------------------------------------------------------------------------- */

static void test_alias_output_stride_zero(void) {
    static const fx_break rows[] = {
        {FX_OUT, BREAK_STRIDE, 1, 0, ON_FWD, SDPA_ERR_ALIAS,
         "out.stride[1]=0 with out.shape[1]=4: output elements would share memory"},
        {FX_OUT, BREAK_STRIDE, 3, 0, ON_FWD, SDPA_ERR_ALIAS, "out.stride[3]=0 with out.shape[3]=6"},
        {FX_LSE, BREAK_STRIDE, 2, 0, ON_FWD, SDPA_ERR_ALIAS, "lse.stride[2]=0 with lse.shape[2]=3"},
        {FX_W, BREAK_STRIDE, 3, 0, ON_W, SDPA_ERR_ALIAS,
         "weights.stride[3]=0 with weights.shape[3]=5"},
    };
    EXPECT_BREAKS(rows);
}

static void test_alias_output_self_overlap(void) {
    static const fx_break rows[] = {
        /* rows of 6 elements, 3 apart */
        {FX_OUT, BREAK_STRIDE, 2, 3, ON_FWD, SDPA_ERR_ALIAS,
         "out: strides (72, 18, 3, 1) are not provably free of overlap"},
        {FX_OUT, BREAK_STRIDE, 2, -3, ON_FWD, SDPA_ERR_ALIAS,
         "out: strides (72, 18, -3, 1) are not provably free of overlap"},
        /* batch 1 lands on head 1 of batch 0 */
        {FX_OUT, BREAK_STRIDE, 0, 18, ON_FWD, SDPA_ERR_ALIAS,
         "out: strides (18, 18, 6, 1) are not provably free of overlap"},
        {FX_LSE, BREAK_STRIDE, 1, 2, ON_FWD, SDPA_ERR_ALIAS,
         "lse: strides (12, 2, 1, 1) are not provably free of overlap"},
        {FX_W, BREAK_STRIDE, 2, 4, ON_W, SDPA_ERR_ALIAS,
         "weights: strides (60, 15, 4, 1) are not provably free of overlap"},
    };
    EXPECT_BREAKS(rows);
}

static void test_alias_out_overlaps_input(void) {
    fx f;
    fx_init(&f);
    f.out.t.data = f.q.buf;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps q (bytes ");
    CHECK_STR_CONTAINS(sdpa_ctx_last_error(f.ctx), "out (bytes ");
    fx_reset(&f);
    f.out.t.data = (float *)f.k.buf + 10;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps k (bytes ");
    fx_reset(&f);
    f.out.t.data = (float *)f.v.buf + 100; /* overlaps v's tail only */
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps v (bytes ");
    fx_reset(&f);
    f.pr.mask = &f.mask.t;
    f.out.t.data = f.mask.buf;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps mask (bytes ");

    /* ALiBi slopes sharing out's last element, without and then with a mask (the slopes are
     * the 4th or the 5th input); one element further they are fine */
    const size_t n_out = NB * NHQ * NLQ * NDV;
    float *arena = arena_new(n_out + NHQ);
    for (int with_mask = 0; with_mask < 2; with_mask++) {
        fx_reset(&f);
        f.pr.mask = with_mask ? &f.mask.t : NULL;
        f.pr.alibi_slopes = arena + n_out - 1;
        f.out.t.data = arena;
        EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps params.alibi_slopes (bytes ");
        for (size_t i = 0; i < n_out + NHQ; i++)
            CHECK(arena[i] == 0.0f);
    }
    fx_reset(&f);
    arena[n_out] = 0.125f;
    f.pr.alibi_slopes = arena + n_out;
    f.out.t.data = arena;
    f.lsep = NULL;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    free(arena);
    fx_free(&f);
}

/* Byte-exact boundaries: a tensor that ends where the other begins is fine, one element more
 * overlaps. */
static void test_alias_boundaries(void) {
    const size_t n_q = NB * NHQ * NLQ * NDK, n_out = NB * NHQ * NLQ * NDV;
    fx f;
    fx_init(&f);
    float *arena = arena_new(n_q + n_out);
    float *copy = arena_new(n_q + n_out);
    /* q first, then out */
    for (int gap = 0; gap >= -1; gap--) {
        fx_reset(&f);
        memcpy(arena, f.q.buf, n_q * sizeof(float));
        memcpy(copy, arena, (n_q + n_out) * sizeof(float));
        f.q.t.data = arena;
        f.out.t.data = arena + n_q + gap;
        if (gap == 0) {
            EXPECT_FWD(&f, SDPA_OK, NULL);
            check_naive(&f, 1e-5, __LINE__);
        } else {
            EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps q (bytes ");
            CHECK(memcmp(arena, copy, (n_q + n_out) * sizeof(float)) == 0);
        }
    }
    /* out first, then q */
    for (int gap = 0; gap >= -1; gap--) {
        fx_reset(&f);
        memset(arena, 0, (n_q + n_out) * sizeof(float));
        memcpy(arena + n_out + gap, f.q.buf, n_q * sizeof(float));
        memcpy(copy, arena, (n_q + n_out) * sizeof(float));
        f.q.t.data = arena + n_out + gap;
        f.out.t.data = arena;
        if (gap == 0) {
            EXPECT_FWD(&f, SDPA_OK, NULL);
            check_naive(&f, 1e-5, __LINE__);
        } else {
            EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps q (bytes ");
            CHECK(memcmp(arena, copy, (n_q + n_out) * sizeof(float)) == 0);
        }
    }
    /* one byte: a bool mask whose last byte is out's first byte, then the byte before it */
    const size_t n_m = NB * NHQ * NLQ * NLK;
    unsigned char *bytes = calloc(n_m + 4 * n_out + 8, 1);
    if (bytes == NULL)
        exit(2);
    for (int gap = -1; gap <= 0; gap++) {
        fx_reset(&f);
        tu_tensor m = tu_alloc(SDPA_BOOL, NB, NHQ, NLQ, NLK, TU_BHLD, 0, 0);
        m.t.data = bytes + 8 + (gap == 0 ? 0 : 1); /* ends at bytes + 8 + n_m - 1 + (1 or 0) */
        f.pr.mask = &m.t;
        f.out.t.data = bytes + 8 + n_m; /* a multiple of 4: n_m = 120 */
        if (gap == 0) {
            memset(bytes, 1, n_m + 8);
            EXPECT_FWD(&f, SDPA_OK, NULL);
            check_naive(&f, 1e-5, __LINE__);
        } else {
            EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps mask (bytes ");
            for (size_t i = 0; i < n_m + 4 * n_out + 8; i++)
                CHECK(bytes[i] == 0);
        }
        tu_free(&m);
    }
    free(bytes);
    free(copy);
    free(arena);
    fx_free(&f);
}

/* Two interleaved views of one buffer touch distinct elements but share an address range:
 * sdpa.h promises they are refused. */
static void test_alias_interleaved(void) {
    const size_t n_q = NB * NHQ * NLQ * NDK;
    fx f;
    fx_init(&f);
    float *arena = arena_new(2 * n_q);
    for (int i = 0; i < 4; i++)
        f.q.t.stride[i] *= 2;
    f.q.t.data = arena;
    f.out.t.data = arena + 1;
    f.out.t.stride[0] = 2 * NHQ * NLQ * NDK;
    f.out.t.stride[1] = 2 * NLQ * NDK;
    f.out.t.stride[2] = 2 * NDK;
    f.out.t.stride[3] = 2;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps q (bytes ");
    for (size_t i = 0; i < 2 * n_q; i++)
        CHECK(arena[i] == 0.0f);
    free(arena);
    fx_free(&f);
}

static void test_alias_lse_overlaps(void) {
    const size_t n_lse = NB * NHQ * NLQ;
    fx f;
    fx_init(&f);
    f.lse.t.data = f.out.buf;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps out (bytes ");
    CHECK_STR_CONTAINS(sdpa_ctx_last_error(f.ctx), "lse (bytes ");
    fx_reset(&f);
    f.lse.t.data = (float *)f.out.buf + NB * NHQ * NLQ * NDV - 1; /* out's last element */
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "lse (bytes ");
    fx_reset(&f);
    f.lse.t.data = f.q.buf;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps q (bytes ");
    fx_reset(&f);
    f.lse.t.data = f.k.buf;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps k (bytes ");
    fx_reset(&f);
    f.lse.t.data = f.v.buf;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps v (bytes ");
    fx_reset(&f);
    f.pr.mask = &f.mask.t;
    f.lse.t.data = f.mask.buf;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "overlaps mask (bytes ");
    fx_reset(&f);
    float *arena = arena_new(n_lse + NHQ);
    f.pr.alibi_slopes = arena + n_lse - 1;
    f.lse.t.data = arena;
    EXPECT_FWD(&f, SDPA_ERR_ALIAS, "lse (bytes ");
    CHECK_STR_CONTAINS(sdpa_ctx_last_error(f.ctx), "overlaps params.alibi_slopes (bytes ");
    free(arena);
    fx_free(&f);
}

static void test_alias_weights_overlaps(void) {
    const size_t n_w = NB * NHQ * NLQ * NLK;
    fx f;
    fx_init(&f);
    f.w.t.data = f.q.buf;
    EXPECT_W(&f, SDPA_ERR_ALIAS, "overlaps q (bytes ");
    CHECK_STR_CONTAINS(sdpa_ctx_last_error(f.ctx), "weights (bytes ");
    fx_reset(&f);
    f.w.t.data = (float *)f.k.buf + 50;
    EXPECT_W(&f, SDPA_ERR_ALIAS, "overlaps k (bytes ");
    fx_reset(&f);
    f.pr.mask = &f.mask.t;
    f.w.t.data = f.mask.buf;
    EXPECT_W(&f, SDPA_ERR_ALIAS, "overlaps mask (bytes ");
    float *arena = arena_new(n_w + NHQ);
    for (int with_mask = 0; with_mask < 2; with_mask++) {
        fx_reset(&f);
        f.pr.mask = with_mask ? &f.mask.t : NULL;
        f.pr.alibi_slopes = arena + n_w - 1;
        f.w.t.data = arena;
        EXPECT_W(&f, SDPA_ERR_ALIAS, "overlaps params.alibi_slopes (bytes ");
    }
    free(arena);
    fx_free(&f);
}

CHECK_MAIN(CASE(test_overflow_extent_times_stride), CASE(test_overflow_sum_of_extents),
           CASE(test_overflow_bytes), CASE(test_overflow_address_space),
           CASE(test_overflow_unit_extent_ignored), CASE(test_alias_output_stride_zero),
           CASE(test_alias_output_self_overlap), CASE(test_alias_out_overlaps_input),
           CASE(test_alias_boundaries), CASE(test_alias_interleaved), CASE(test_alias_lse_overlaps),
           CASE(test_alias_weights_overlaps))
