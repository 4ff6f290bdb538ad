/*
 * test_seeds.c — the hand-worked numbers of the documents sdpa grew from (shared/seeds/),
 * computed through the public API: softmax([2, 1, 0.1]); the identity Q/K example; softmax
 * saturation at [200, 100, 50] against the scaled scores; and the 4-token walk-through with
 * PyTorch's seed-42 inputs, whose printed weights and outputs the library must reproduce.
 */
#include "check.h"
#include "testutil.h"

#include "../cli/torch_rng.h"

#include <math.h>

/* Attention weights of one query (Dk = 1, q = 1, scale = 1) against keys k: the softmax of k
 * itself. */
static void softmax_via_weights(const float *scores, int n, float *w) {
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    float one = 1.0f;
    sdpa_tensor q = sdpa_tensor_bhld(&one, SDPA_F32, 1, 1, 1, 1);
    sdpa_tensor k = sdpa_tensor_bhld((void *)scores, SDPA_F32, 1, 1, n, 1);
    sdpa_tensor tw = sdpa_tensor_bhld(w, SDPA_F32, 1, 1, 1, n);
    sdpa_params p = {0};
    p.scale = 1.0f;
    CHECK_INT_EQ(sdpa_weights(ctx, &q, &k, &p, &tw), SDPA_OK);
    sdpa_ctx_destroy(ctx);
}

/* seeds/000: scores = [2.0, 1.0, 0.1], softmax(scores) ~ [0.659, 0.242, 0.099]. */
static void test_softmax_2_1_01(void) {
    const float s[3] = {2.0f, 1.0f, 0.1f};
    float w[3];
    softmax_via_weights(s, 3, w);
    CHECK_NEAR(w[0], 0.659, 5e-4);
    CHECK_NEAR(w[1], 0.242, 5e-4);
    CHECK_NEAR(w[2], 0.099, 5e-4);
    const double z = exp(2.0) + exp(1.0) + exp(0.1);
    CHECK_NEAR(w[0], exp(2.0) / z, 1e-7);
    CHECK_NEAR(w[2], exp(0.1) / z, 1e-7);
    CHECK_NEAR((double)w[0] + w[1] + w[2], 1.0, 1e-6);
}

/* seeds/000: Q = K = I(2), so Q K^T = I: each token matches only itself. With scale 1 the
 * weights are softmax([1, 0]); with the default 1/sqrt(2), softmax([0.707, 0]). */
static void test_identity_qk(void) {
    float qk[4] = {1, 0, 0, 1}, v[4] = {10, 20, 30, 40}, w[4], o[4];
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    sdpa_tensor tq = sdpa_tensor_bhld(qk, SDPA_F32, 1, 1, 2, 2);
    sdpa_tensor tv = sdpa_tensor_bhld(v, SDPA_F32, 1, 1, 2, 2);
    sdpa_tensor tw = sdpa_tensor_bhld(w, SDPA_F32, 1, 1, 2, 2);
    sdpa_tensor to = sdpa_tensor_bhld(o, SDPA_F32, 1, 1, 2, 2);
    sdpa_params p = {0};
    p.scale = 1.0f;
    CHECK_INT_EQ(sdpa_weights(ctx, &tq, &tq, &p, &tw), SDPA_OK);
    const double a = exp(1.0) / (exp(1.0) + 1.0); /* 0.7311 */
    CHECK_NEAR(w[0], a, 1e-7);
    CHECK_NEAR(w[1], 1.0 - a, 1e-7);
    CHECK_NEAR(w[2], 1.0 - a, 1e-7);
    CHECK_NEAR(w[3], a, 1e-7);
    CHECK_INT_EQ(sdpa_forward(ctx, &tq, &tq, &tv, &p, &to, NULL), SDPA_OK);
    CHECK_NEAR(o[0], a * 10 + (1 - a) * 30, 1e-5);
    CHECK_NEAR(o[3], (1 - a) * 20 + a * 40, 1e-5);
    CHECK_INT_EQ(sdpa_weights(ctx, &tq, &tq, NULL, &tw), SDPA_OK); /* default scale */
    const double b = exp(1.0 / sqrt(2.0)) / (exp(1.0 / sqrt(2.0)) + 1.0);
    CHECK_NEAR(w[0], b, 1e-7);
    sdpa_ctx_destroy(ctx);
}

/* seeds/004: "why scale". softmax([2, 1, 0.5]) is a soft mix; softmax([200, 100, 50]) is a
 * hard spike (PyTorch prints [1.0, 3.783505853677006e-44, 0.0] in float32); dividing the
 * scores by 100 gives the soft mix back. */
static void test_saturation(void) {
    const float small[3] = {2.0f, 1.0f, 0.5f}, huge[3] = {200.0f, 100.0f, 50.0f};
    float w[3];
    softmax_via_weights(small, 3, w);
    CHECK_NEAR(w[0], 0.6285316944122314, 1e-7);
    CHECK_NEAR(w[1], 0.23122389614582062, 1e-7);
    CHECK_NEAR(w[2], 0.14024437963962555, 1e-7);
    softmax_via_weights(huge, 3, w);
    CHECK(w[0] == 1.0f);
    CHECK(w[1] == 3.783505853677006e-44f); /* exp(-100), a float32 subnormal */
    CHECK(w[2] == 0.0f);                   /* exp(-150) underflows float32 */

    /* The same scores through Q K^T with scale 1/100: the scaled version. */
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    float one = 1.0f, w2[3];
    sdpa_tensor q = sdpa_tensor_bhld(&one, SDPA_F32, 1, 1, 1, 1);
    sdpa_tensor k = sdpa_tensor_bhld((void *)huge, SDPA_F32, 1, 1, 3, 1);
    sdpa_tensor tw = sdpa_tensor_bhld(w2, SDPA_F32, 1, 1, 1, 3);
    sdpa_params p = {0};
    p.scale = 0.01f;
    CHECK_INT_EQ(sdpa_weights(ctx, &q, &k, &p, &tw), SDPA_OK);
    CHECK_NEAR(w2[0], 0.6285316944122314, 1e-6);
    CHECK_NEAR(w2[2], 0.14024437963962555, 1e-6);
    sdpa_ctx_destroy(ctx);
}

/* seeds/002: 4 tokens, d_model 8, torch.manual_seed(42); X, W_Q, W_K, W_V = randn. The
 * document prints (rounded) the weights and the output reproduced below. */
static void test_walkthrough_seed42(void) {
    enum { N = 4, D = 8 };
    float x[N * D], wq[D * D], wk[D * D], wv[D * D], q[N * D], k[N * D], v[N * D];
    torch_rng r;
    torch_rng_seed(&r, 42);
    torch_rng_randn(&r, x, N * D);
    torch_rng_randn(&r, wq, D * D);
    torch_rng_randn(&r, wk, D * D);
    torch_rng_randn(&r, wv, D * D);
    CHECK_NEAR(x[0], 1.9269, 1e-4); /* torch.randn(4, 8)[0, 0] after manual_seed(42) */
    CHECK_NEAR(x[7], -1.6047, 1e-4);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < D; j++) {
            double aq = 0, ak = 0, av = 0;
            for (int m = 0; m < D; m++) {
                aq += (double)x[i * D + m] * wq[m * D + j];
                ak += (double)x[i * D + m] * wk[m * D + j];
                av += (double)x[i * D + m] * wv[m * D + j];
            }
            q[i * D + j] = (float)aq;
            k[i * D + j] = (float)ak;
            v[i * D + j] = (float)av;
        }
    static const double want_w[N][N] = {{1.000, 0.000, 0.000, 0.000},
                                        {0.011, 0.989, 0.000, 0.000},
                                        {0.000, 0.001, 0.979, 0.021},
                                        {0.000, 0.000, 0.993, 0.007}};
    static const double want_o[N][D] = {{-3.69, 0.80, 9.47, -2.52, -6.27, -0.84, -3.96, -3.32},
                                        {-1.78, 5.17, 3.80, 2.56, -3.00, 1.60, 0.38, 5.11},
                                        {-5.22, 3.38, -5.24, 0.90, 3.28, -0.42, 3.67, -0.99},
                                        {-5.21, 3.40, -5.28, 0.90, 3.34, -0.39, 3.69, -1.06}};
    float w[N * N], o[N * D];
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    sdpa_tensor tq = sdpa_tensor_bhld(q, SDPA_F32, 1, 1, N, D);
    sdpa_tensor tk = sdpa_tensor_bhld(k, SDPA_F32, 1, 1, N, D);
    sdpa_tensor tv = sdpa_tensor_bhld(v, SDPA_F32, 1, 1, N, D);
    sdpa_tensor tw = sdpa_tensor_bhld(w, SDPA_F32, 1, 1, N, N);
    sdpa_tensor to = sdpa_tensor_bhld(o, SDPA_F32, 1, 1, N, D);
    CHECK_INT_EQ(sdpa_weights(ctx, &tq, &tk, NULL, &tw), SDPA_OK);
    CHECK_INT_EQ(sdpa_forward(ctx, &tq, &tk, &tv, NULL, &to, NULL), SDPA_OK);
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < N; j++)
            CHECK_NEAR(w[i * N + j], want_w[i][j], 0.0005 + 1e-6);
        for (int d = 0; d < D; d++)
            CHECK_NEAR(o[i * D + d], want_o[i][d], 0.005 + 1e-6);
    }
    sdpa_ctx_destroy(ctx);
}

CHECK_MAIN(CASE(test_softmax_2_1_01), CASE(test_identity_qk), CASE(test_saturation),
           CASE(test_walkthrough_seed42))
