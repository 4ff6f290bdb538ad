/*
 * consumer.c — a program written the way a user of an installed sdpa writes one: it includes
 * <sdpa.h> and links the library found through pkg-config or find_package(sdpa), nothing from
 * the source tree. It computes attention on a 2-token example whose result is worked out by
 * hand below and exits non-zero if anything differs, so run_install_test.sh can tell a broken
 * installation (missing symbol, wrong header, unusable package files) from a working one.
 */
#include <sdpa.h>

#include <stdio.h>
#include <string.h>

/* The logarithms the example needs, as constants: the program then needs nothing but sdpa
 * and libc, so a link line without -lm proves the package's own flags are enough. */
#define LN2 0.69314718055994530942
#define LN3 1.09861228866810969140
#define LN4 1.38629436111989061883

static int failures;

static void expect_near(const char *what, double got, double want) {
    const double diff = got > want ? got - want : want - got;
    if (!(diff <= 1e-6)) {
        fprintf(stderr, "consumer: %s = %.9g, expected %.9g\n", what, got, want);
        failures++;
    }
}

int main(void) {
    /* The header this program was compiled with and the library it runs with must agree. */
    char want_version[32];
    snprintf(want_version, sizeof want_version, "%d.%d.%d", SDPA_VERSION_MAJOR, SDPA_VERSION_MINOR,
             SDPA_VERSION_PATCH);
    if (strcmp(sdpa_version(), want_version) != 0 || sdpa_version_number() != SDPA_VERSION_NUMBER) {
        fprintf(stderr, "consumer: library version %s, header version %s\n", sdpa_version(),
                want_version);
        failures++;
    }

    /*
     * Two tokens, head dimension 2, scale 1 (set explicitly, so the scores are plain dot
     * products):
     *     K = [[1, 0], [0, 1]]       V = [[1, 2], [3, 4]]
     *     q0 = [0, 0]     scores [0, 0]      weights [1/2, 1/2]  out [2, 3]      lse ln 2
     *     q1 = [0, ln 3]  scores [0, ln 3]   weights [1/4, 3/4]  out [2.5, 3.5]  lse ln 4
     * (for q1: exp(0) + exp(ln 3) = 4, so the weights are 1/4 and 3/4, and
     *  out = 1/4 [1, 2] + 3/4 [3, 4] = [10/4, 14/4]).
     */
    float q[4] = {0.0f, 0.0f, 0.0f, (float)LN3};
    float k[4] = {1.0f, 0.0f, 0.0f, 1.0f};
    float v[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    float o[4] = {0};
    float l[2] = {0};
    sdpa_tensor tq = sdpa_tensor_bhld(q, SDPA_F32, 1, 1, 2, 2);
    sdpa_tensor tk = sdpa_tensor_bhld(k, SDPA_F32, 1, 1, 2, 2);
    sdpa_tensor tv = sdpa_tensor_bhld(v, SDPA_F32, 1, 1, 2, 2);
    sdpa_tensor to = sdpa_tensor_bhld(o, SDPA_F32, 1, 1, 2, 2);
    sdpa_tensor tl = sdpa_tensor_bhld(l, SDPA_F32, 1, 1, 2, 1);
    sdpa_params params = {0};
    params.scale = 1.0f;

    sdpa_ctx_params cp = {0};
    cp.n_threads = 1;
    sdpa_ctx *ctx = NULL;
    sdpa_status st = sdpa_ctx_create(&cp, &ctx);
    if (st != SDPA_OK) {
        fprintf(stderr, "consumer: sdpa_ctx_create: %s\n", sdpa_status_str(st));
        return 1;
    }
    st = sdpa_forward(ctx, &tq, &tk, &tv, &params, &to, &tl);
    if (st != SDPA_OK) {
        fprintf(stderr, "consumer: sdpa_forward: %s (%s)\n", sdpa_status_name(st),
                sdpa_ctx_last_error(ctx));
        sdpa_ctx_destroy(ctx);
        return 1;
    }
    sdpa_ctx_destroy(ctx);

    expect_near("out[0][0]", o[0], 2.0);
    expect_near("out[0][1]", o[1], 3.0);
    expect_near("out[1][0]", o[2], 2.5);
    expect_near("out[1][1]", o[3], 3.5);
    expect_near("lse[0]", l[0], LN2);
    expect_near("lse[1]", l[1], LN4);

    if (failures != 0)
        return 1;
    printf("consumer: sdpa %s works (out [[2, 3], [2.5, 3.5]], lse [ln 2, ln 4])\n",
           sdpa_version());
    return 0;
}
