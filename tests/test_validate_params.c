/*
 * test_validate_params.c — the validator's checks of sdpa_params (align, scale, softcap, the
 * window bounds, ALiBi slopes; bounds ignored without use_window) and of the alignment of
 * every data pointer. The fixture is validate_fixture.h.
 */
#include "check.h"
#include "testutil.h"
#include "validate_fixture.h"

#include <math.h>
#include <stdint.h>

/* ---- scalar parameters -------------------------------------------------------------------- */

static void test_param_align(void) {
    fx f;
    fx_init(&f);
    f.pr.align = (sdpa_align)2;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM,
                "params.align=2 is not SDPA_ALIGN_TOP_LEFT (0) or SDPA_ALIGN_BOTTOM_RIGHT (1)");
    fx_reset(&f);
    f.pr.align = (sdpa_align)77;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.align=77 is not");
    fx_free(&f);
}

static void test_param_scale(void) {
    fx f;
    fx_init(&f);
    f.pr.scale = NAN;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.scale=nan is not finite");
    f.pr.scale = INFINITY;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.scale=inf is not finite");
    f.pr.scale = -INFINITY;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.scale=-inf is not finite");
    fx_free(&f);
}

static void test_param_softcap(void) {
    fx f;
    fx_init(&f);
    f.pr.softcap = -1.0f;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.softcap=-1 must be 0 (off) or positive and finite");
    f.pr.softcap = -0.5f;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.softcap=-0.5 must be");
    f.pr.softcap = NAN;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.softcap=nan must be");
    f.pr.softcap = INFINITY;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.softcap=inf must be");
    fx_free(&f);
}

static void test_param_window_left(void) {
    fx f;
    fx_init(&f);
    f.pr.use_window = 1;
    f.pr.window_left = -2;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.window_left=-2 must be -1 (unbounded) or >= 0");
    f.pr.window_left = INT64_MIN;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.window_left=-9223372036854775808 must be");
    fx_free(&f);
}

static void test_param_window_right(void) {
    fx f;
    fx_init(&f);
    f.pr.use_window = 1;
    f.pr.window_right = -2;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.window_right=-2 must be -1 (unbounded) or >= 0");
    f.pr.causal = 1; /* causal does not excuse it */
    f.pr.window_right = INT64_MIN;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.window_right=-9223372036854775808 must be");
    fx_free(&f);
}

/* Without use_window the bounds are ignored; -1 and huge bounds are legal with it. */
static void test_param_window_ignored(void) {
    fx f;
    fx_init(&f);
    f.pr.window_left = -2;
    f.pr.window_right = INT64_MIN;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    EXPECT_W(&f, SDPA_OK, NULL);
    f.pr.causal = 1;
    EXPECT_FWD(&f, SDPA_OK, NULL);
    check_naive(&f, 1e-5, __LINE__);
    fx_reset(&f);
    f.pr.use_window = 1;
    f.pr.window_left = -1;
    f.pr.window_right = INT64_MAX;
    EXPECT_ACCEPTED(&f);
    /* the largest bounds, with off = Lk - Lq = -2 (bottom-right, Lk = 1): still unbounded */
    fx_reset(&f);
    f.k.t.shape[2] = f.v.t.shape[2] = f.w.t.shape[3] = 1;
    f.pr.align = SDPA_ALIGN_BOTTOM_RIGHT;
    f.pr.use_window = 1;
    f.pr.window_left = INT64_MAX;
    f.pr.window_right = INT64_MAX;
    EXPECT_ACCEPTED(&f);
    fx_free(&f);
}

static void test_param_alibi(void) {
    fx f;
    fx_init(&f);
    f.pr.alibi_slopes = f.slopes;
    f.slopes[2] = NAN;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.alibi_slopes[2]=nan is not finite");
    fx_reset(&f);
    f.pr.alibi_slopes = f.slopes;
    f.slopes[NHQ - 1] = INFINITY;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.alibi_slopes[3]=inf is not finite");
    fx_reset(&f);
    f.pr.alibi_slopes = f.slopes;
    f.slopes[0] = -INFINITY;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "params.alibi_slopes[0]=-inf is not finite");
    /* only Hq slopes are read; negative slopes are legal */
    fx_reset(&f);
    f.pr.alibi_slopes = f.slopes;
    f.slopes[NHQ] = NAN;
    f.slopes[1] = -0.25f;
    EXPECT_ACCEPTED(&f);
    fx_free(&f);
}

/* Every data pointer must be aligned to its element size (and the ALiBi slopes to floats). */
static void test_misaligned_data(void) {
    fx f;
    fx_init(&f);
    f.q.t.data = (char *)f.q.t.data + 1;
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "is not aligned to its 4-byte f32 elements");
    fx_reset(&f);
    f.out.t.data = (char *)f.out.t.data + 2;
    EXPECT_FWD(&f, SDPA_ERR_PARAM, "out.data=");
    fx_reset(&f);
    f.pr.alibi_slopes = (const float *)(const void *)((const char *)f.slopes + 2);
    EXPECT_BOTH(&f, SDPA_ERR_PARAM, "is not aligned to 4-byte floats");
    fx_free(&f);
}

CHECK_MAIN(CASE(test_param_align), CASE(test_param_scale), CASE(test_param_softcap),
           CASE(test_param_window_left), CASE(test_param_window_right),
           CASE(test_param_window_ignored), CASE(test_param_alibi), CASE(test_misaligned_data))
