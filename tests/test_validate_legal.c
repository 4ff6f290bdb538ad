/*
 * test_validate_legal.c — legal but tricky arguments the validator must accept, each computed
 * like the naive implementation of testutil.c: negative and zero strides on inputs and
 * outputs, broadcast masks with any stride on unit extents, every mask dtype, negative and
 * denormal scales, Lq > Lk, mixed dtypes and layouts, the largest head dimension, inputs that
 * share memory, and every optional input at once. The fixture is validate_fixture.h.
 */
#include "check.h"
#include "testutil.h"
#include "validate_fixture.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---- legal tricky inputs ------------------------------------------------------------------ */

static void test_ok_negative_input_strides(void) {
    fx f;
    fx_init(&f);
    /* q reversed along L, k reversed along Lk and D, v reversed along every dimension */
    f.q.t.data = (float *)f.q.buf + (NLQ - 1) * NDK;
    f.q.t.stride[2] = -NDK;
    f.k.t.data = (float *)f.k.buf + (NLK - 1) * NDK + NDK - 1;
    f.k.t.stride[2] = -NDK;
    f.k.t.stride[3] = -1;
    f.v.t.data = (float *)f.v.buf + NB * NHKV * NLK * NDV - 1;
    for (int i = 0; i < 4; i++)
        f.v.t.stride[i] = -f.v.t.stride[i];
    f.pr.mask = &f.mask.t;
    f.mask.t.data = (float *)f.mask.buf + (NLK - 1);
    f.mask.t.stride[3] = -1;
    EXPECT_ACCEPTED(&f);
    fx_free(&f);
}

static void test_ok_broadcast_inputs(void) {
    fx f;
    fx_init(&f);
    f.q.t.stride[1] = 0; /* every head asks the same queries */
    f.k.t.stride[0] = 0; /* both batches share batch 0's keys */
    f.v.t.stride[2] = 0; /* one value row for every key */
    f.pr.mask = &f.mask.t;
    f.mask.t.stride[0] = 0;
    f.mask.t.stride[2] = 0;
    EXPECT_ACCEPTED(&f);
    fx_free(&f);
}

static void test_ok_mask_unit_extents(void) {
    static const int64_t shapes[4][4] = {
        {1, 1, NLQ, NLK}, {NB, 1, 1, NLK}, {1, NHQ, NLQ, 1}, {1, 1, 1, 1}};
    static const int64_t strides[4][4] = {{INT64_MAX, INT64_MIN, NLK, 1},
                                          {NLK, -7, INT64_MIN, 1},
                                          {P62, NLQ, 1, -P62},
                                          {INT64_MIN, INT64_MAX, INT64_MIN, INT64_MAX}};
    fx f;
    fx_init(&f);
    for (int c = 0; c < 4; c++) {
        fx_reset(&f);
        f.pr.mask = &f.mask.t;
        memcpy(f.mask.t.shape, shapes[c], sizeof shapes[c]);
        memcpy(f.mask.t.stride, strides[c], sizeof strides[c]);
        EXPECT_ACCEPTED(&f);
    }
    fx_free(&f);
}

static void test_ok_mask_dtypes(void) {
    static const sdpa_dtype dts[3] = {SDPA_BOOL, SDPA_F16, SDPA_BF16};
    tu_rng r = {7};
    fx f;
    fx_init(&f);
    for (int c = 0; c < 3; c++) {
        tu_tensor m = tu_alloc(dts[c], NB, NHQ, NLQ, NLK, TU_BHLD, 0, 0);
        tu_fill_randn(&m, &r, 0.5, 0.0);
        if (dts[c] == SDPA_BOOL)
            for (int64_t j = 1; j < NLK; j += 2)
                tu_set(&m.t, 1, 2, 1, j, 0.0);
        fx_reset(&f);
        f.pr.mask = &m.t;
        EXPECT_ACCEPTED(&f);
        tu_free(&m);
    }
    fx_free(&f);
}

static void test_ok_scale_negative_denormal(void) {
    static const float scales[3] = {-0.5f, 1e-40f, -1e-45f};
    fx f;
    fx_init(&f);
    for (int c = 0; c < 3; c++) {
        fx_reset(&f);
        f.pr.scale = scales[c];
        EXPECT_ACCEPTED(&f);
    }
    fx_free(&f);
}

/* Lq < Lk is the baseline; here Lq > Lk, bottom-right causal, so query 0 sees no key. */
static void test_ok_lq_ne_lk(void) {
    fx f;
    fx_init(&f);
    f.k.t.shape[2] = f.v.t.shape[2] = 2;
    f.w.t.shape[3] = 2;
    f.pr.causal = 1;
    f.pr.align = SDPA_ALIGN_BOTTOM_RIGHT;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    CHECK(tu_get(&f.lse.t, 0, 0, 0, 0) == -INFINITY);
    EXPECT_W(&f, SDPA_OK, NULL);
    CHECK(tu_get(&f.w.t, 1, 3, 0, 0) == 0.0 && tu_get(&f.w.t, 1, 3, 0, 1) == 0.0);
    fx_free(&f);
}

static void test_ok_mixed_dtypes(void) {
    tu_rng r = {11};
    fx f;
    fx_init(&f);
    tu_tensor q = tu_alloc(SDPA_F16, NB, NHQ, NLQ, NDK, TU_BLHD, 1, 3);
    tu_tensor k = tu_alloc(SDPA_BF16, NB, NHKV, NLK, NDK, TU_BHLD, 0, 1);
    tu_tensor m = tu_alloc(SDPA_F16, 1, NHQ, NLQ, NLK, TU_BHLD, 0, 0);
    tu_tensor out = tu_alloc(SDPA_BF16, NB, NHQ, NLQ, NDV, TU_BLHD, 2, 0);
    tu_fill_randn(&q, &r, 1.0, 0.0);
    tu_fill_randn(&k, &r, 1.0, 0.0);
    tu_fill_randn(&m, &r, 0.5, 0.0);
    f.qp = &q.t;
    f.kp = &k.t;
    f.outp = &out.t;
    f.pr.mask = &m.t;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-2, __LINE__); /* out is bf16 */
    EXPECT_W(&f, SDPA_OK, NULL);
    check_rows_sum_to_one(&f, __LINE__);
    tu_free(&q);
    tu_free(&k);
    tu_free(&m);
    tu_free(&out);
    fx_free(&f);
}

static void test_ok_head_dim_max(void) {
    const int64_t d = SDPA_MAX_HEAD_DIM;
    tu_rng r = {13};
    fx f;
    fx_init(&f);
    tu_tensor q = tu_alloc(SDPA_F32, 1, 1, 2, d, TU_BHLD, 0, 0);
    tu_tensor k = tu_alloc(SDPA_F32, 1, 1, 3, d, TU_BHLD, 0, 0);
    tu_tensor v = tu_alloc(SDPA_F32, 1, 1, 3, d, TU_BHLD, 0, 0);
    tu_tensor out = tu_alloc(SDPA_F32, 1, 1, 2, d, TU_BHLD, 0, 0);
    tu_tensor lse = tu_alloc(SDPA_F32, 1, 1, 2, 1, TU_BHLD, 0, 0);
    tu_fill_randn(&q, &r, 0.05, 0.0);
    tu_fill_randn(&k, &r, 0.05, 0.0);
    tu_fill_randn(&v, &r, 1.0, 0.0);
    f.qp = &q.t;
    f.kp = &k.t;
    f.vp = &v.t;
    f.outp = &out.t;
    f.lsep = &lse.t;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    tu_free(&q);
    tu_free(&k);
    tu_free(&v);
    tu_free(&out);
    tu_free(&lse);
    fx_free(&f);
}

/* Outputs may use negative strides and any stride on an extent of 1. */
static void test_ok_output_strides(void) {
    fx f;
    fx_init(&f);
    f.out.t.data = (float *)f.out.buf + (NLQ - 1) * NDV + NDV - 1;
    f.out.t.stride[2] = -NDV;
    f.out.t.stride[3] = -1;
    f.lse.t.data = (float *)f.lse.buf + NB * NHQ * NLQ - 1;
    for (int i = 0; i < 3; i++)
        f.lse.t.stride[i] = -f.lse.t.stride[i];
    f.lse.t.stride[3] = 0;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    fx_reset(&f);
    f.w.t.data = (float *)f.w.buf + NB * NHQ * NLQ * NLK - 1;
    for (int i = 0; i < 4; i++)
        f.w.t.stride[i] = -f.w.t.stride[i];
    EXPECT_W(&f, SDPA_OK, NULL);
    check_rows_sum_to_one(&f, __LINE__);
    /* a (B, L, H, D) output is a permutation, not an overlap */
    fx_reset(&f);
    f.out.t = sdpa_tensor_blhd(f.out.buf, SDPA_F32, NB, NLQ, NHQ, NDV);
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    fx_free(&f);
}

/* Inputs may overlap each other: here q, k, v and the mask are views of one buffer. */
static void test_ok_inputs_share_memory(void) {
    fx f;
    fx_init(&f);
    f.k.t = sdpa_tensor_bhld(f.q.buf, SDPA_F32, NB, NHKV, NLK, NDK);
    f.v.t = sdpa_tensor_bhld((float *)f.q.buf + 3, SDPA_F32, NB, NHKV, NLK, NDV);
    f.mask.t = sdpa_tensor_bhld((float *)f.q.buf + 1, SDPA_F32, NB, NHQ, NLQ, NLK);
    f.pr.mask = &f.mask.t;
    f.pr.alibi_slopes = (const float *)f.q.buf + 7;
    EXPECT_ACCEPTED(&f);
    fx_free(&f);
}

/* Every optional input at once (mask and ALiBi slopes) and both outputs. */
static void test_ok_all_inputs_with_lse(void) {
    fx f;
    fx_init(&f);
    f.pr.mask = &f.mask.t;
    f.pr.alibi_slopes = f.slopes;
    f.pr.causal = 1;
    f.pr.softcap = 5.0f;
    EXPECT_ACCEPTED(&f);
    fx_free(&f);
}

CHECK_MAIN(CASE(test_ok_negative_input_strides), CASE(test_ok_broadcast_inputs),
           CASE(test_ok_mask_unit_extents), CASE(test_ok_mask_dtypes),
           CASE(test_ok_scale_negative_denormal), CASE(test_ok_lq_ne_lk),
           CASE(test_ok_mixed_dtypes), CASE(test_ok_head_dim_max), CASE(test_ok_output_strides),
           CASE(test_ok_inputs_share_memory), CASE(test_ok_all_inputs_with_lse))
