/*
 * test_validate_tensors.c — the validator's checks of each tensor argument of sdpa_forward and
 * sdpa_weights, alone and against the others: NULL pointers, dtypes, extents below 1 or
 * beyond the limits, shapes that disagree (B, Dk, Hkv, Lk, Dv, out, lse, weights), Hq not a
 * multiple of Hkv, and masks that do not broadcast. The fixture is validate_fixture.h.
 */
#include "check.h"
#include "testutil.h"
#include "validate_fixture.h"

#include <stdint.h>

#define EXT_TOO_BIG (SDPA_MAX_EXTENT + 1)

/* ---- NULL pointers ------------------------------------------------------------------------ */

static void test_null_ctx(void) {
    fx f;
    fx_init(&f);
    CHECK_INT_EQ(sdpa_forward(NULL, f.qp, f.kp, f.vp, f.prp, f.outp, f.lsep), SDPA_ERR_NULL);
    CHECK_INT_EQ(sdpa_weights(NULL, f.qp, f.kp, f.prp, f.wp), SDPA_ERR_NULL);
    CHECK(tu_is_canary(&f.out) && tu_is_canary(&f.lse) && tu_is_canary(&f.w));
    fx_free(&f);
}

static void test_null_tensor(void) {
    fx f;
    fx_init(&f);
    f.qp = NULL;
    EXPECT_BOTH(&f, SDPA_ERR_NULL, "q is NULL");
    fx_reset(&f);
    f.kp = NULL;
    EXPECT_BOTH(&f, SDPA_ERR_NULL, "k is NULL");
    fx_reset(&f);
    f.vp = NULL;
    EXPECT_FWD(&f, SDPA_ERR_NULL, "v is NULL");
    EXPECT_W(&f, SDPA_OK, NULL); /* sdpa_weights has no v */
    fx_reset(&f);
    f.outp = NULL;
    EXPECT_FWD(&f, SDPA_ERR_NULL, "out is NULL");
    fx_reset(&f);
    f.wp = NULL;
    EXPECT_W(&f, SDPA_ERR_NULL, "weights is NULL");
    /* lse, params, params.mask and params.alibi_slopes may be NULL */
    fx_reset(&f);
    f.lsep = NULL;
    f.prp = NULL;
    EXPECT_ACCEPTED(&f);
    fx_free(&f);
}

static void test_null_data(void) {
    static const fx_break rows[] = {
        {FX_Q, BREAK_DATA, 0, 0, ON_BOTH, SDPA_ERR_NULL, "q.data is NULL"},
        {FX_K, BREAK_DATA, 0, 0, ON_BOTH, SDPA_ERR_NULL, "k.data is NULL"},
        {FX_V, BREAK_DATA, 0, 0, ON_FWD, SDPA_ERR_NULL, "v.data is NULL"},
        {FX_OUT, BREAK_DATA, 0, 0, ON_FWD, SDPA_ERR_NULL, "out.data is NULL"},
        {FX_LSE, BREAK_DATA, 0, 0, ON_FWD, SDPA_ERR_NULL, "lse.data is NULL"},
        {FX_W, BREAK_DATA, 0, 0, ON_W, SDPA_ERR_NULL, "weights.data is NULL"},
        {FX_MASK, BREAK_DATA, 0, 0, ON_BOTH, SDPA_ERR_NULL, "mask.data is NULL"},
    };
    EXPECT_BREAKS(rows);
}

/* ---- dtypes ------------------------------------------------------------------------------- */

static void test_dtype_not_float(void) {
    static const fx_break rows[] = {
        {FX_Q, BREAK_DTYPE, 0, 77, ON_BOTH, SDPA_ERR_DTYPE,
         "q.dtype=unknown (77) is not f32, f16 or bf16"},
        {FX_Q, BREAK_DTYPE, 0, SDPA_BOOL, ON_BOTH, SDPA_ERR_DTYPE,
         "q.dtype=bool (3) is not f32, f16 or bf16"},
        {FX_K, BREAK_DTYPE, 0, SDPA_BOOL, ON_BOTH, SDPA_ERR_DTYPE, "k.dtype=bool (3)"},
        {FX_K, BREAK_DTYPE, 0, -1, ON_BOTH, SDPA_ERR_DTYPE, "k.dtype=unknown"},
        {FX_V, BREAK_DTYPE, 0, SDPA_BOOL, ON_FWD, SDPA_ERR_DTYPE, "v.dtype=bool (3)"},
        {FX_V, BREAK_DTYPE, 0, 4, ON_FWD, SDPA_ERR_DTYPE, "v.dtype=unknown (4)"},
        {FX_OUT, BREAK_DTYPE, 0, SDPA_BOOL, ON_FWD, SDPA_ERR_DTYPE,
         "out.dtype=bool (3) is not f32, f16 or bf16"},
        {FX_OUT, BREAK_DTYPE, 0, 77, ON_FWD, SDPA_ERR_DTYPE, "out.dtype=unknown (77)"},
    };
    EXPECT_BREAKS(rows);
}

static void test_dtype_not_f32(void) {
    static const fx_break rows[] = {
        {FX_LSE, BREAK_DTYPE, 0, SDPA_F16, ON_FWD, SDPA_ERR_DTYPE, "lse.dtype=f16 (1) must be f32"},
        {FX_LSE, BREAK_DTYPE, 0, SDPA_BF16, ON_FWD, SDPA_ERR_DTYPE,
         "lse.dtype=bf16 (2) must be f32"},
        {FX_LSE, BREAK_DTYPE, 0, 77, ON_FWD, SDPA_ERR_DTYPE, "lse.dtype=unknown (77) must be f32"},
        {FX_W, BREAK_DTYPE, 0, SDPA_F16, ON_W, SDPA_ERR_DTYPE, "weights.dtype=f16 (1) must be f32"},
        {FX_W, BREAK_DTYPE, 0, SDPA_BF16, ON_W, SDPA_ERR_DTYPE,
         "weights.dtype=bf16 (2) must be f32"},
        {FX_W, BREAK_DTYPE, 0, SDPA_BOOL, ON_W, SDPA_ERR_DTYPE,
         "weights.dtype=bool (3) must be f32"},
    };
    EXPECT_BREAKS(rows);
}

static void test_dtype_mask(void) {
    static const fx_break rows[] = {
        {FX_MASK, BREAK_DTYPE, 0, 77, ON_BOTH, SDPA_ERR_DTYPE,
         "mask.dtype=unknown (77) is not bool, f32, f16 or bf16"},
        {FX_MASK, BREAK_DTYPE, 0, -3, ON_BOTH, SDPA_ERR_DTYPE, "mask.dtype=unknown"},
    };
    EXPECT_BREAKS(rows);
}

/* ---- extents ------------------------------------------------------------------------------ */

static void test_dim_below_one(void) {
    static const fx_break rows[] = {
        {FX_Q, BREAK_SHAPE, 0, 0, ON_BOTH, SDPA_ERR_DIM, "q.shape[0]=0 must be >= 1"},
        {FX_Q, BREAK_SHAPE, 2, -3, ON_BOTH, SDPA_ERR_DIM, "q.shape[2]=-3 must be >= 1"},
        {FX_K, BREAK_SHAPE, 1, 0, ON_BOTH, SDPA_ERR_DIM, "k.shape[1]=0 must be >= 1"},
        /* an empty KV cache is refused too */
        {FX_K, BREAK_SHAPE, 2, 0, ON_BOTH, SDPA_ERR_DIM, "k.shape[2]=0 must be >= 1"},
        {FX_V, BREAK_SHAPE, 2, INT64_MIN, ON_FWD, SDPA_ERR_DIM,
         "v.shape[2]=-9223372036854775808 must be >= 1"},
        {FX_OUT, BREAK_SHAPE, 3, 0, ON_FWD, SDPA_ERR_DIM, "out.shape[3]=0 must be >= 1"},
        {FX_LSE, BREAK_SHAPE, 2, -1, ON_FWD, SDPA_ERR_DIM, "lse.shape[2]=-1 must be >= 1"},
        {FX_LSE, BREAK_SHAPE, 3, 0, ON_FWD, SDPA_ERR_DIM, "lse.shape[3]=0 must be >= 1"},
        {FX_W, BREAK_SHAPE, 1, -1, ON_W, SDPA_ERR_DIM, "weights.shape[1]=-1 must be >= 1"},
        {FX_MASK, BREAK_SHAPE, 3, 0, ON_BOTH, SDPA_ERR_DIM, "mask.shape[3]=0 must be >= 1"},
    };
    EXPECT_BREAKS(rows);
}

static void test_dim_above_max_extent(void) {
    static const fx_break rows[] = {
        {FX_Q, BREAK_SHAPE, 2, EXT_TOO_BIG, ON_BOTH, SDPA_ERR_DIM,
         "q.shape[2]=2147483648 exceeds SDPA_MAX_EXTENT=2147483647"},
        {FX_K, BREAK_SHAPE, 0, INT64_MAX, ON_BOTH, SDPA_ERR_DIM,
         "k.shape[0]=9223372036854775807 exceeds SDPA_MAX_EXTENT"},
        {FX_V, BREAK_SHAPE, 1, EXT_TOO_BIG, ON_FWD, SDPA_ERR_DIM,
         "v.shape[1]=2147483648 exceeds SDPA_MAX_EXTENT"},
        {FX_OUT, BREAK_SHAPE, 0, EXT_TOO_BIG, ON_FWD, SDPA_ERR_DIM,
         "out.shape[0]=2147483648 exceeds SDPA_MAX_EXTENT"},
        {FX_LSE, BREAK_SHAPE, 1, EXT_TOO_BIG, ON_FWD, SDPA_ERR_DIM,
         "lse.shape[1]=2147483648 exceeds SDPA_MAX_EXTENT"},
        {FX_W, BREAK_SHAPE, 3, EXT_TOO_BIG, ON_W, SDPA_ERR_DIM,
         "weights.shape[3]=2147483648 exceeds SDPA_MAX_EXTENT"},
        {FX_MASK, BREAK_SHAPE, 2, EXT_TOO_BIG, ON_BOTH, SDPA_ERR_DIM,
         "mask.shape[2]=2147483648 exceeds SDPA_MAX_EXTENT"},
    };
    EXPECT_BREAKS(rows);
}

/* The limits themselves are legal: the call goes on to the next check. */
static void test_dim_limits_pass(void) {
    fx f;
    fx_init(&f);
    f.q.t.shape[2] = SDPA_MAX_EXTENT;
    f.q.t.stride[2] = 0;
    EXPECT_FWD(&f, SDPA_ERR_SHAPE, "out.shape[2]=3 but q.shape[2]=2147483647");
    EXPECT_W(&f, SDPA_ERR_SHAPE, "weights.shape[2]=3 but q.shape[2]=2147483647");
    fx_reset(&f);
    f.q.t.shape[3] = SDPA_MAX_HEAD_DIM;
    f.q.t.stride[3] = 0;
    EXPECT_BOTH(&f, SDPA_ERR_SHAPE, "k.shape[3]=8 but q.shape[3]=65536");
    fx_free(&f);
}

static void test_dim_above_max_head_dim(void) {
    static const fx_break rows[] = {
        {FX_Q, BREAK_SHAPE, 3, SDPA_MAX_HEAD_DIM + 1, ON_BOTH, SDPA_ERR_DIM,
         "q.shape[3]=65537 exceeds SDPA_MAX_HEAD_DIM=65536"},
        {FX_K, BREAK_SHAPE, 3, SDPA_MAX_HEAD_DIM + 1, ON_BOTH, SDPA_ERR_DIM,
         "k.shape[3]=65537 exceeds SDPA_MAX_HEAD_DIM=65536"},
        {FX_V, BREAK_SHAPE, 3, SDPA_MAX_HEAD_DIM + 1, ON_FWD, SDPA_ERR_DIM,
         "v.shape[3]=65537 exceeds SDPA_MAX_HEAD_DIM=65536"},
        {FX_OUT, BREAK_SHAPE, 3, SDPA_MAX_HEAD_DIM + 1, ON_FWD, SDPA_ERR_DIM,
         "out.shape[3]=65537 exceeds SDPA_MAX_HEAD_DIM=65536"},
        /* the last extent of lse, weights and mask is not a head dimension */
        {FX_LSE, BREAK_SHAPE, 3, SDPA_MAX_HEAD_DIM + 1, ON_FWD, SDPA_ERR_SHAPE,
         "lse.shape[3]=65537 must be 1"},
        {FX_W, BREAK_SHAPE, 3, SDPA_MAX_HEAD_DIM + 1, ON_W, SDPA_ERR_SHAPE,
         "weights.shape[3]=65537 but k.shape[2]=5"},
        {FX_MASK, BREAK_SHAPE, 3, SDPA_MAX_HEAD_DIM + 1, ON_BOTH, SDPA_ERR_BROADCAST,
         "mask.shape[3]=65537 is neither 1 nor Lk=5"},
    };
    EXPECT_BREAKS(rows);
}

/* ---- shape agreement ---------------------------------------------------------------------- */

static void test_shape_batch(void) {
    static const fx_break rows[] = {
        {FX_K, BREAK_SHAPE, 0, 1, ON_BOTH, SDPA_ERR_SHAPE, "k.shape[0]=1 but q.shape[0]=2"},
        {FX_V, BREAK_SHAPE, 0, 1, ON_FWD, SDPA_ERR_SHAPE, "v.shape[0]=1 but k.shape[0]=2"},
        {FX_OUT, BREAK_SHAPE, 0, 1, ON_FWD, SDPA_ERR_SHAPE, "out.shape[0]=1 but q.shape[0]=2"},
        {FX_LSE, BREAK_SHAPE, 0, 1, ON_FWD, SDPA_ERR_SHAPE, "lse.shape[0]=1 but q.shape[0]=2"},
        {FX_W, BREAK_SHAPE, 0, 1, ON_W, SDPA_ERR_SHAPE, "weights.shape[0]=1 but q.shape[0]=2"},
    };
    EXPECT_BREAKS(rows);
}

static void test_shape_head_dim(void) {
    static const fx_break rows[] = {
        {FX_K, BREAK_SHAPE, 3, 7, ON_BOTH, SDPA_ERR_SHAPE, "k.shape[3]=7 but q.shape[3]=8"},
    };
    EXPECT_BREAKS(rows);
}

static void test_shape_kv_heads(void) {
    static const fx_break rows[] = {
        {FX_V, BREAK_SHAPE, 1, 1, ON_FWD, SDPA_ERR_SHAPE, "v.shape[1]=1 but k.shape[1]=2"},
        /* v with the query's heads */
        {FX_V, BREAK_SHAPE, 1, NHQ, ON_FWD, SDPA_ERR_SHAPE, "v.shape[1]=4 but k.shape[1]=2"},
    };
    EXPECT_BREAKS(rows);
}

static void test_shape_lk(void) {
    static const fx_break rows[] = {
        {FX_V, BREAK_SHAPE, 2, 4, ON_FWD, SDPA_ERR_SHAPE, "v.shape[2]=4 but k.shape[2]=5"},
        {FX_W, BREAK_SHAPE, 3, NLQ, ON_W, SDPA_ERR_SHAPE, "weights.shape[3]=3 but k.shape[2]=5"},
    };
    EXPECT_BREAKS(rows);
}

static void test_shape_dv(void) {
    static const fx_break rows[] = {
        /* out sized like q instead of like v */
        {FX_OUT, BREAK_SHAPE, 3, NDK, ON_FWD, SDPA_ERR_SHAPE, "out.shape[3]=8 but v.shape[3]=6"},
    };
    EXPECT_BREAKS(rows);
}

static void test_shape_out(void) {
    static const fx_break rows[] = {
        {FX_OUT, BREAK_SHAPE, 1, NHKV, ON_FWD, SDPA_ERR_SHAPE, "out.shape[1]=2 but q.shape[1]=4"},
        {FX_OUT, BREAK_SHAPE, 2, NLK, ON_FWD, SDPA_ERR_SHAPE, "out.shape[2]=5 but q.shape[2]=3"},
    };
    EXPECT_BREAKS(rows);
}

static void test_shape_lse(void) {
    static const fx_break rows[] = {
        {FX_LSE, BREAK_SHAPE, 1, NHKV, ON_FWD, SDPA_ERR_SHAPE, "lse.shape[1]=2 but q.shape[1]=4"},
        {FX_LSE, BREAK_SHAPE, 2, NLK, ON_FWD, SDPA_ERR_SHAPE, "lse.shape[2]=5 but q.shape[2]=3"},
    };
    EXPECT_BREAKS(rows);
}

static void test_shape_lse_last_not_one(void) {
    fx f;
    fx_init(&f);
    f.lse.t.shape[3] = 2;
    EXPECT_FWD(&f, SDPA_ERR_SHAPE, "lse.shape[3]=2 must be 1");
    fx_reset(&f);
    tu_tensor big = tu_alloc(SDPA_F32, NB, NHQ, NLQ, NDV, TU_BHLD, 0, 0);
    tu_fill_canary(&big);
    f.lsep = &big.t; /* a (B, Hq, Lq, Dv) tensor passed as lse */
    EXPECT_FWD(&f, SDPA_ERR_SHAPE, "lse.shape[3]=6 must be 1");
    CHECK(tu_is_canary(&big));
    tu_free(&big);
    fx_free(&f);
}

static void test_shape_weights(void) {
    static const fx_break rows[] = {
        {FX_W, BREAK_SHAPE, 1, NHKV, ON_W, SDPA_ERR_SHAPE, "weights.shape[1]=2 but q.shape[1]=4"},
        {FX_W, BREAK_SHAPE, 2, NLK, ON_W, SDPA_ERR_SHAPE, "weights.shape[2]=5 but q.shape[2]=3"},
    };
    EXPECT_BREAKS(rows);
}

static void test_heads_not_multiple(void) {
    static const fx_break rows[] = {
        {FX_K, BREAK_SHAPE, 1, 3, ON_BOTH, SDPA_ERR_HEADS,
         "q.shape[1]=4 (Hq) is not a multiple of k.shape[1]=3 (Hkv)"},
        /* more kv heads than query heads */
        {FX_K, BREAK_SHAPE, 1, 8, ON_BOTH, SDPA_ERR_HEADS,
         "q.shape[1]=4 (Hq) is not a multiple of k.shape[1]=8"},
        {FX_Q, BREAK_SHAPE, 1, 3, ON_BOTH, SDPA_ERR_HEADS,
         "q.shape[1]=3 (Hq) is not a multiple of k.shape[1]=2"},
    };
    EXPECT_BREAKS(rows);
}

static void test_mask_not_broadcastable(void) {
    static const fx_break rows[] = {
        {FX_MASK, BREAK_SHAPE, 0, 3, ON_BOTH, SDPA_ERR_BROADCAST,
         "mask.shape[0]=3 is neither 1 nor B=2 (mask shape (3, 4, 3, 5), target (2, 4, 3, 5))"},
        {FX_MASK, BREAK_SHAPE, 1, NHKV, ON_BOTH, SDPA_ERR_BROADCAST,
         "mask.shape[1]=2 is neither 1 nor Hq=4"},
        {FX_MASK, BREAK_SHAPE, 2, 2, ON_BOTH, SDPA_ERR_BROADCAST,
         "mask.shape[2]=2 is neither 1 nor Lq=3"},
        {FX_MASK, BREAK_SHAPE, 3, 4, ON_BOTH, SDPA_ERR_BROADCAST,
         "mask.shape[3]=4 is neither 1 nor Lk=5"},
    };
    EXPECT_BREAKS(rows);
}

CHECK_MAIN(CASE(test_null_ctx), CASE(test_null_tensor), CASE(test_null_data),
           CASE(test_dtype_not_float), CASE(test_dtype_not_f32), CASE(test_dtype_mask),
           CASE(test_dim_below_one), CASE(test_dim_above_max_extent), CASE(test_dim_limits_pass),
           CASE(test_dim_above_max_head_dim), CASE(test_shape_batch), CASE(test_shape_head_dim),
           CASE(test_shape_kv_heads), CASE(test_shape_lk), CASE(test_shape_dv),
           CASE(test_shape_out), CASE(test_shape_lse), CASE(test_shape_lse_last_not_one),
           CASE(test_shape_weights), CASE(test_heads_not_multiple),
           CASE(test_mask_not_broadcastable))
