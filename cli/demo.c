/*
 * demo.c — `sdpa demo`: the seeds' worked example, 4 tokens with d_model = 8 and seed 42,
 * step by step. It is the short version of `sdpa explain`'s walk-through (explain.h): the
 * same inputs, the numbers PyTorch draws after torch.manual_seed(42), the same arithmetic for
 * the scores, and the same library calls for the attention weights (sdpa_weights) and the
 * output (sdpa_forward); only the printout is shorter. It ends with one timed call at a
 * larger shape.
 */
#include "args.h"
#include "bench.h" /* bench_now_s, the clock of the speed line */
#include "cli.h"
#include "explain.h"
#include "torch_rng.h"

#include "sdpa.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { N = 4, DM = 8 };

static const char help[] =
    "usage: sdpa demo\n\n"
    "Walks through scaled dot-product attention on 4 tokens with d_model = 8,\n"
    "the inputs PyTorch draws after torch.manual_seed(42): X, the projections\n"
    "Q, K, V, the scores Q K^T, the scaled scores, the softmax weights (with\n"
    "their row sums) and the output, then times one larger call.";

static void print_matrix(const char *title, const double *m, int rows, int cols) {
    printf("%s (%d x %d) =\n", title, rows, cols);
    for (int i = 0; i < rows; i++) {
        printf("  [");
        for (int j = 0; j < cols; j++)
            printf("%s%7.2f", j ? " " : "", m[i * cols + j]);
        printf(" ]\n");
    }
    printf("\n");
}

static void print_matrix_f(const char *title, const float *m, int rows, int cols) {
    double tmp[N * DM];
    for (int i = 0; i < rows * cols; i++)
        tmp[i] = m[i];
    print_matrix(title, tmp, rows, cols);
}

/* One timed forward pass at a larger shape, so the demo ends with a sense of speed. */
static int speed_line(sdpa_ctx *ctx) {
    enum { H = 8, L = 256, D = 64 };
    static float q[H * L * D], k[H * L * D], v[H * L * D], o[H * L * D];
    torch_rng r;
    torch_rng_seed(&r, 1);
    torch_rng_randn(&r, q, H * L * D);
    torch_rng_randn(&r, k, H * L * D);
    torch_rng_randn(&r, v, H * L * D);
    sdpa_tensor tq = sdpa_tensor_bhld(q, SDPA_F32, 1, H, L, D);
    sdpa_tensor tk = sdpa_tensor_bhld(k, SDPA_F32, 1, H, L, D);
    sdpa_tensor tv = sdpa_tensor_bhld(v, SDPA_F32, 1, H, L, D);
    sdpa_tensor to = sdpa_tensor_bhld(o, SDPA_F32, 1, H, L, D);
    double best = INFINITY;
    for (int rep = 0; rep < 3; rep++) {
        const double t0 = bench_now_s();
        if (sdpa_forward(ctx, &tq, &tk, &tv, NULL, &to, NULL) != SDPA_OK) {
            fprintf(stderr, "sdpa demo: %s\n", sdpa_ctx_last_error(ctx));
            return CLI_RUNTIME;
        }
        const double t = bench_now_s() - t0;
        if (t < best)
            best = t;
    }
    const double flops = 4.0 * H * (double)L * L * D;
    printf("Speed: B=1 H=%d L=%d D=%d f32 in %.2f ms, %.2f GFLOP/s (best of 3; CPU level %s).\n"
           "'sdpa info' shows the kernels; 'make bench' measures properly.\n",
           H, L, D, best * 1e3, flops / best * 1e-9, sdpa_isa_name(sdpa_ctx_isa(ctx)));
    return CLI_OK;
}

int cli_demo(int argc, char **argv) {
    const int prc = cli_no_options("demo", argc, argv, help);
    if (prc >= 0)
        return prc;

    static explain e;
    float weights[N * N], out[N * DM], lse[N];
    memset(&e, 0, sizeof e);
    explain_generate(&e, 42, N, DM);
    explain_compute(&e);

    printf("Scaled dot-product attention, step by step\n"
           "==========================================\n\n"
           "Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V\n\n"
           "1. Four tokens, each an embedding of d_model = %d numbers (torch.manual_seed(42);\n"
           "   X = torch.randn(4, 8)):\n\n",
           DM);
    print_matrix_f("X", e.x, N, DM);

    printf("2. Each token plays three roles. Three learned matrices (random here) project it:\n"
           "   Q = X W_Q (what am I looking for?), K = X W_K (what do I offer to be found\n"
           "   by?), V = X W_V (what do I hand over if chosen?). d_k = d_v = %d.\n\n",
           DM);
    print_matrix_f("Q", e.q, N, DM);
    print_matrix_f("K", e.k, N, DM);
    print_matrix_f("V", e.v, N, DM);

    printf("3. Scores: every query against every key. Entry [i, j] = Q[i] . K[j], how well\n"
           "   token i's question matches token j's label. This is the N^2 part.\n\n");
    print_matrix("scores = Q K^T", e.scores, N, N);

    printf("4. Scale by 1/sqrt(d_k) = 1/%.2f. A dot product of d_k terms of variance 1 has\n"
           "   variance d_k; dividing by sqrt(d_k) brings it back to about 1, so the\n"
           "   softmax is not pushed into saturation.\n\n",
           sqrt((double)DM));
    print_matrix("scaled scores", e.scaled, N, N);

    sdpa_ctx *ctx;
    sdpa_status st = sdpa_ctx_create(NULL, &ctx);
    if (st != SDPA_OK) {
        fprintf(stderr, "sdpa demo: cannot create a context: %s\n", sdpa_status_str(st));
        return CLI_RUNTIME;
    }
    if (explain_library(&e, ctx, weights, out, lse) != SDPA_OK) {
        fprintf(stderr, "sdpa demo: %s\n", sdpa_ctx_last_error(ctx));
        sdpa_ctx_destroy(ctx);
        return CLI_RUNTIME;
    }

    printf("5. Softmax, row by row: weights[i, j] = exp(s_ij) / sum_j exp(s_ij). Each row is\n"
           "   a probability distribution over the keys (sdpa_weights):\n\n");
    printf("weights (%d x %d) =                      row sum\n", N, N);
    for (int i = 0; i < N; i++) {
        double sum = 0.0;
        printf("  [");
        for (int j = 0; j < N; j++) {
            printf("%s%7.3f", j ? " " : "", (double)weights[i * N + j]);
            sum += weights[i * N + j];
        }
        printf(" ]   %.6f\n", sum);
    }
    printf("\n");

    printf("6. Output: each token's new vector is the weighted sum of the values,\n"
           "   out[i] = sum_j weights[i, j] V[j] (sdpa_forward, one fused pass):\n\n");
    print_matrix_f("out", out, N, DM);

    /* weights @ V by hand, on purpose: the check ties sdpa_weights to sdpa_forward, which the
     * walk-through's own output (computed by the library) could not do */
    double max_diff = 0.0;
    for (int i = 0; i < N; i++)
        for (int d = 0; d < DM; d++) {
            double acc = 0.0;
            for (int j = 0; j < N; j++)
                acc += (double)weights[i * N + j] * (double)e.v[j * DM + d];
            const double diff = fabs(acc - (double)out[i * DM + d]);
            if (diff > max_diff)
                max_diff = diff;
        }
    printf("Check: weights @ V by hand vs the fused sdpa_forward: max |difference| = %.2e\n"
           "log-sum-exp of each row (kept for merging and backward): %.3f %.3f %.3f %.3f\n\n",
           max_diff, (double)lse[0], (double)lse[1], (double)lse[2], (double)lse[3]);

    const int rc = speed_line(ctx);
    sdpa_ctx_destroy(ctx);
    return rc;
}
