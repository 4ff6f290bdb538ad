/*
 * test_validate_ctx.c — the context's checks and promises: sdpa_ctx_create's arguments
 * (thread counts, max_isa, half-set allocator hooks), the caller's allocator used for every
 * byte and freed on destroy, SDPA_ERR_NOMEM at every allocation a call makes (outputs left as
 * they were, nothing leaked), a NULL context, and the status strings.
 */
#include "check.h"
#include "testutil.h"
#include "validate_fixture.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* An allocator that counts, tracks what it handed out, and can fail from (or only at) a given
 * allocation number. */
typedef struct counting {
    long allocs, frees, live;
    long fail_at;  /* -1: never fail */
    int fail_only; /* fail only allocation fail_at, not every one from it */
    int bad_align, bad_free, bad_user;
    void *ptrs[256];
} counting;

static void *count_alloc(size_t size, size_t align, void *user) {
    counting *c = user;
    if (align == 0 || (align & (align - 1)) != 0 || align > 4096)
        c->bad_align++;
    const long n = c->allocs++;
    if (c->fail_at >= 0 && (c->fail_only ? n == c->fail_at : n >= c->fail_at))
        return NULL;
    void *p = NULL;
    if (posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, size) != 0)
        return NULL;
    for (int i = 0; i < 256; i++)
        if (c->ptrs[i] == NULL) {
            c->ptrs[i] = p;
            c->live++;
            return p;
        }
    free(p);
    return NULL;
}

static void count_free(void *ptr, void *user) {
    counting *c = user;
    c->frees++;
    for (int i = 0; i < 256; i++)
        if (c->ptrs[i] == ptr && ptr != NULL) {
            c->ptrs[i] = NULL;
            c->live--;
            free(ptr);
            return;
        }
    c->bad_free++; /* not ours: leave it alone */
}

static sdpa_status count_ctx(counting *c, sdpa_ctx **ctx) {
    sdpa_ctx_params cp;
    memset(&cp, 0, sizeof cp);
    cp.n_threads = 1;
    cp.allocator.alloc = count_alloc;
    cp.allocator.free = count_free;
    cp.allocator.user = c;
    return sdpa_ctx_create(&cp, ctx);
}

static void test_ctx_create_null_out(void) {
    sdpa_ctx_params cp;
    memset(&cp, 0, sizeof cp);
    CHECK_INT_EQ(sdpa_ctx_create(NULL, NULL), SDPA_ERR_NULL);
    CHECK_INT_EQ(sdpa_ctx_create(&cp, NULL), SDPA_ERR_NULL);
}

static void test_ctx_create_defaults(void) {
    sdpa_ctx *ctx = NULL;
    CHECK_INT_EQ(sdpa_ctx_create(NULL, &ctx), SDPA_OK);
    CHECK(ctx != NULL);
    CHECK(sdpa_ctx_n_threads(ctx) >= 1);
    CHECK(strcmp(sdpa_ctx_last_error(ctx), "") == 0);
    sdpa_ctx_destroy(ctx);

    sdpa_ctx_params cp;
    memset(&cp, 0, sizeof cp);
    cp.allocator.user = &cp; /* user alone, without hooks, is ignored */
    CHECK_INT_EQ(sdpa_ctx_create(&cp, &ctx), SDPA_OK);
    sdpa_ctx_destroy(ctx);
}

static void test_ctx_threads(void) {
    static const int bad[] = {-1, SDPA_MAX_THREADS + 1, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sdpa_ctx_params cp;
        memset(&cp, 0, sizeof cp);
        cp.n_threads = bad[i];
        sdpa_ctx *ctx = (sdpa_ctx *)&cp; /* must be overwritten with NULL */
        CHECK_INT_EQ(sdpa_ctx_create(&cp, &ctx), SDPA_ERR_THREADS);
        CHECK(ctx == NULL);
    }
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    CHECK_INT_EQ(sdpa_ctx_n_threads(ctx), 1);
    sdpa_ctx_destroy(ctx);
    ctx = tu_ctx(3, SDPA_ISA_AUTO);
    CHECK_INT_EQ(sdpa_ctx_n_threads(ctx), 3);
    sdpa_ctx_destroy(ctx);
}

static void test_ctx_max_isa(void) {
    static const sdpa_isa bad[] = {(sdpa_isa)99, (sdpa_isa)5, (sdpa_isa)-1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sdpa_ctx_params cp;
        memset(&cp, 0, sizeof cp);
        cp.max_isa = bad[i];
        sdpa_ctx *ctx = (sdpa_ctx *)&cp;
        CHECK_INT_EQ(sdpa_ctx_create(&cp, &ctx), SDPA_ERR_PARAM);
        CHECK(ctx == NULL);
    }
    /* the CPU's own level does not move with the cap, and the kernels never exceed it */
    sdpa_ctx *uncapped = tu_ctx(1, SDPA_ISA_AUTO);
    const sdpa_isa cpu = sdpa_ctx_cpu_isa(uncapped);
    sdpa_ctx_destroy(uncapped);
    CHECK(cpu >= SDPA_ISA_GENERIC && cpu <= SDPA_ISA_AMX);
    for (int cap = SDPA_ISA_AUTO; cap <= SDPA_ISA_AMX; cap++) {
        sdpa_ctx *ctx = tu_ctx(1, (sdpa_isa)cap);
        const sdpa_isa isa = sdpa_ctx_isa(ctx);
        CHECK_MSG(isa >= SDPA_ISA_GENERIC && (cap == SDPA_ISA_AUTO || (int)isa <= cap),
                  "max_isa=%s gave isa=%s", sdpa_isa_name((sdpa_isa)cap), sdpa_isa_name(isa));
        CHECK_MSG(sdpa_ctx_cpu_isa(ctx) == cpu && isa <= cpu, "max_isa=%s: cpu isa %s, isa %s",
                  sdpa_isa_name((sdpa_isa)cap), sdpa_isa_name(sdpa_ctx_cpu_isa(ctx)),
                  sdpa_isa_name(isa));
        sdpa_ctx_destroy(ctx);
    }
    CHECK(sdpa_ctx_cpu_isa(NULL) == SDPA_ISA_GENERIC);
}

/* A problem of B=1 H=2 L=40 D=64 (a shape the AMX table takes) in dtype dt, with its f32
 * output, or a call that fails validation (Dk of K wrong) when `bad`. */
static sdpa_status forward_in(sdpa_ctx *ctx, sdpa_dtype dt, int bad) {
    tu_rng r = {5};
    tu_tensor q = tu_alloc(dt, 1, 2, 40, 64, TU_BHLD, 0, 0);
    tu_tensor k = tu_alloc(dt, 1, 2, 40, bad ? 32 : 64, TU_BHLD, 0, 0);
    tu_tensor v = tu_alloc(dt, 1, 2, 40, 64, TU_BHLD, 0, 0);
    tu_tensor o = tu_alloc(dt, 1, 2, 40, 64, TU_BHLD, 0, 0);
    tu_fill_randn(&q, &r, 1.0, 0.0);
    tu_fill_randn(&k, &r, 1.0, 0.0);
    tu_fill_randn(&v, &r, 1.0, 0.0);
    const sdpa_params p = {0};
    const sdpa_status st = sdpa_forward(ctx, &q.t, &k.t, &v.t, &p, &o.t, NULL);
    tu_free(&q);
    tu_free(&k);
    tu_free(&v);
    tu_free(&o);
    return st;
}

/* sdpa_ctx_last_kernel: "" until a call succeeds, then what ran: the context's forward for
 * a problem it takes, the next one down for the others (the AMX table takes bf16 alone: f32
 * runs flash-avx512, as sdpa_ctx_describe says); a failed call leaves it; sdpa_weights runs
 * the weights line's table. Under a cap below amx the description names no lack of the tile
 * permission (it is never asked for there). */
static void test_ctx_last_kernel(void) {
    CHECK_STR_EQ(sdpa_ctx_last_kernel(NULL), "");
    for (int cap = SDPA_ISA_AUTO; cap <= SDPA_ISA_AMX; cap++) {
        sdpa_ctx *ctx = tu_ctx(2, (sdpa_isa)cap);
        const char *top = sdpa_ctx_kernel(ctx), *desc = sdpa_ctx_describe(ctx);
        const int amx = strncmp(top, "flash-amx", 9) == 0; /* (or its emulation) */
        CHECK_STR_EQ(sdpa_ctx_last_kernel(ctx), "");
        CHECK_INT_EQ(forward_in(ctx, SDPA_BF16, 0), SDPA_OK);
        CHECK_STR_EQ(sdpa_ctx_last_kernel(ctx), top);
        CHECK_INT_EQ(forward_in(ctx, SDPA_F32, 0), SDPA_OK);
        CHECK_STR_EQ(sdpa_ctx_last_kernel(ctx), amx ? "flash-avx512" : top);
        CHECK_MSG(!amx || strstr(desc, "\n          flash-avx512 (the others)\n") != NULL,
                  "describe does not say what runs the others:\n%s", desc);
        CHECK_INT_EQ(forward_in(ctx, SDPA_BF16, 1), SDPA_ERR_SHAPE);
        CHECK_STR_EQ(sdpa_ctx_last_kernel(ctx), amx ? "flash-avx512" : top);
        tu_rng r = {6};
        tu_problem pb = tu_problem_new((tu_dims){1, 2, 2, 8, 8, 16, 16}, &r);
        tu_tensor w = tu_alloc(SDPA_F32, 1, 2, 8, 8, TU_BHLD, 0, 0);
        CHECK_INT_EQ(sdpa_weights(ctx, &pb.q.t, &pb.k.t, &pb.p, &w.t), SDPA_OK);
        char line[64];
        snprintf(line, sizeof line, "weights:  %s\n", sdpa_ctx_last_kernel(ctx));
        CHECK_MSG(strstr(desc, line) != NULL, "weights ran %s, describe says:\n%s",
                  sdpa_ctx_last_kernel(ctx), desc);
        tu_free(&w);
        tu_problem_free(&pb);
        CHECK_MSG(cap == SDPA_ISA_AUTO || cap == SDPA_ISA_AMX ||
                      strstr(desc, "lacks amx_perm") == NULL,
                  "max_isa=%s: %s", sdpa_isa_name((sdpa_isa)cap), desc);
        sdpa_ctx_destroy(ctx);
    }
    /* a call that fails after validation (no memory for its scratch) leaves it too */
    tu_failing_alloc fa = {0};
    sdpa_ctx_params cp = {0};
    cp.n_threads = 1;
    cp.allocator = tu_failing_allocator(&fa);
    sdpa_ctx *ctx = NULL;
    CHECK_INT_EQ(sdpa_ctx_create(&cp, &ctx), SDPA_OK);
    fa.fail = 1;
    CHECK_INT_EQ(forward_in(ctx, SDPA_F32, 0), SDPA_ERR_NOMEM);
    CHECK_STR_EQ(sdpa_ctx_last_kernel(ctx), "");
    fa.fail = 0;
    CHECK_INT_EQ(forward_in(ctx, SDPA_F32, 0), SDPA_OK);
    char was[32];
    snprintf(was, sizeof was, "%s", sdpa_ctx_last_kernel(ctx));
    CHECK(was[0] != '\0');
    fa.fail = 1;
    CHECK_INT_EQ(forward_in(ctx, SDPA_BF16, 0), SDPA_ERR_NOMEM);
    CHECK_STR_EQ(sdpa_ctx_last_kernel(ctx), was);
    fa.fail = 0;
    sdpa_ctx_destroy(ctx);
}

static void test_ctx_allocator_half_set(void) {
    counting c;
    memset(&c, 0, sizeof c);
    c.fail_at = -1;
    for (int which = 0; which < 2; which++) {
        sdpa_ctx_params cp;
        memset(&cp, 0, sizeof cp);
        if (which == 0)
            cp.allocator.alloc = count_alloc;
        else
            cp.allocator.free = count_free;
        cp.allocator.user = &c;
        sdpa_ctx *ctx = (sdpa_ctx *)&cp;
        CHECK_INT_EQ(sdpa_ctx_create(&cp, &ctx), SDPA_ERR_PARAM);
        CHECK(ctx == NULL);
    }
    CHECK_INT_EQ(c.allocs, 0);
    CHECK_INT_EQ(c.frees, 0);
}

static void test_ctx_allocator_used(void) {
    counting c;
    memset(&c, 0, sizeof c);
    c.fail_at = -1;
    sdpa_ctx *ctx = NULL;
    CHECK_INT_EQ(count_ctx(&c, &ctx), SDPA_OK);
    CHECK(c.allocs >= 1); /* the context itself lives in the caller's memory */
    CHECK(c.live >= 1);

    fx f;
    fx_init(&f);
    sdpa_ctx_destroy(f.ctx);
    f.ctx = ctx;
    EXPECT_ACCEPTED(&f);
    fx_free(&f); /* destroys ctx */

    CHECK_INT_EQ(c.live, 0);
    CHECK_INT_EQ(c.frees, c.allocs);
    CHECK_INT_EQ(c.bad_align, 0);
    CHECK_INT_EQ(c.bad_free, 0);
}

static void test_ctx_allocator_fails_at_create(void) {
    counting c;
    memset(&c, 0, sizeof c);
    c.fail_at = 0;
    sdpa_ctx *ctx = (sdpa_ctx *)&c;
    CHECK_INT_EQ(count_ctx(&c, &ctx), SDPA_ERR_NOMEM);
    CHECK(ctx == NULL);
    CHECK(c.allocs >= 1);
    CHECK_INT_EQ(c.live, 0);
}

/* An allocator that starts failing after the context exists: every call either fails with
 * SDPA_ERR_NOMEM, leaving the outputs as they were and freeing what it had got, or succeeds. */
static void nomem(int weights, int fail_only) {
    int n_nomem = 0, done = 0;
    long attempted_first = 0;
    for (long n = 0; n < 64 && !done; n++) {
        counting c;
        memset(&c, 0, sizeof c);
        c.fail_at = -1;
        fx f;
        fx_init(&f);
        sdpa_ctx_destroy(f.ctx);
        f.ctx = NULL;
        CHECK_INT_EQ(count_ctx(&c, &f.ctx), SDPA_OK);
        if (f.ctx == NULL) {
            fx_free(&f);
            return;
        }
        const long base = c.allocs, live = c.live;
        c.fail_at = base + n;
        c.fail_only = fail_only;
        f.pr.mask = &f.mask.t;
        tu_fill_canary(&f.out);
        tu_fill_canary(&f.lse);
        tu_fill_canary(&f.w);
        const sdpa_status st = weights
                                   ? sdpa_weights(f.ctx, f.qp, f.kp, f.prp, f.wp)
                                   : sdpa_forward(f.ctx, f.qp, f.kp, f.vp, f.prp, f.outp, f.lsep);
        if (n == 0)
            attempted_first = c.allocs - base;
        if (st == SDPA_OK) {
            done = 1;
            if (weights)
                check_rows_sum_to_one(&f, __LINE__);
            else
                check_naive(&f, 1e-5, __LINE__);
        } else {
            n_nomem++;
            CHECK_MSG(st == SDPA_ERR_NOMEM, "allocation %ld failing gave %s", n,
                      sdpa_status_name(st));
            CHECK(sdpa_ctx_last_error(f.ctx)[0] != '\0');
            CHECK(tu_is_canary(&f.out));
            CHECK(tu_is_canary(&f.lse));
            CHECK(tu_is_canary(&f.w));
        }
        CHECK_MSG(c.live == live, "allocation %ld failing: %ld blocks leaked", n, c.live - live);
        fx_free(&f);
        CHECK_INT_EQ(c.live, 0);
        CHECK_INT_EQ(c.bad_free, 0);
    }
    CHECK_MSG(done, "never succeeded within 64 allocations");
    /* If the call needs scratch at all, failing every allocation must have given NOMEM. */
    CHECK(n_nomem >= 1 || attempted_first == 0);
}

static void test_nomem_forward(void) {
    nomem(0, 0);
    nomem(0, 1);
}

static void test_nomem_weights(void) {
    nomem(1, 0);
    nomem(1, 1);
}

static void test_ctx_null(void) {
    sdpa_ctx_destroy(NULL);
    CHECK(sdpa_ctx_last_error(NULL) != NULL);
    CHECK(strcmp(sdpa_ctx_last_error(NULL), "") == 0);
}

static void test_status_strings(void) {
#define STATUS_ROW(name, value, text) {name, value, #name, text},
    static const struct {
        sdpa_status st;
        int value;
        const char *name, *text;
    } rows[] = {SDPA_STATUS_LIST(STATUS_ROW)};
#undef STATUS_ROW
    const size_t n = sizeof rows / sizeof rows[0];
    CHECK_INT_EQ(n, 18);
    for (size_t i = 0; i < n; i++) {
        CHECK_INT_EQ(rows[i].st, rows[i].value);
        CHECK_INT_EQ(rows[i].value, -(int)i); /* stable, contiguous values */
        CHECK_MSG(strcmp(sdpa_status_str(rows[i].st), rows[i].text) == 0, "str(%d) = \"%s\"",
                  rows[i].value, sdpa_status_str(rows[i].st));
        CHECK_MSG(strcmp(sdpa_status_name(rows[i].st), rows[i].name) == 0, "name(%d) = \"%s\"",
                  rows[i].value, sdpa_status_name(rows[i].st));
        for (size_t j = 0; j < i; j++)
            CHECK(strcmp(sdpa_status_str(rows[i].st), sdpa_status_str(rows[j].st)) != 0);
    }
    CHECK(strcmp(sdpa_status_str(SDPA_OK), "success") == 0);
    CHECK(strcmp(sdpa_status_str(SDPA_ERR_NOMEM), "out of memory") == 0);
    CHECK(strcmp(sdpa_status_name(SDPA_ERR_SHAPE), "SDPA_ERR_SHAPE") == 0);
    CHECK(strcmp(sdpa_status_name(SDPA_ERR_INTERNAL), "SDPA_ERR_INTERNAL") == 0);
    CHECK(strcmp(sdpa_status_name(SDPA_ERR_BUSY), "SDPA_ERR_BUSY") == 0 && SDPA_ERR_BUSY == -14);
    CHECK(strcmp(sdpa_status_name(SDPA_ERR_INDEX), "SDPA_ERR_INDEX") == 0 && SDPA_ERR_INDEX == -15);
    CHECK(SDPA_ERR_MISMATCH == -16 && SDPA_ERR_MPI == -17);
    static const int unknown[] = {1, -18, 12345, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        CHECK(strcmp(sdpa_status_str((sdpa_status)unknown[i]), "unknown status") == 0);
        CHECK(strcmp(sdpa_status_name((sdpa_status)unknown[i]), "SDPA_UNKNOWN") == 0);
    }
}

CHECK_MAIN(CASE(test_ctx_create_null_out), CASE(test_ctx_create_defaults), CASE(test_ctx_threads),
           CASE(test_ctx_max_isa), CASE(test_ctx_last_kernel), CASE(test_ctx_allocator_half_set),
           CASE(test_ctx_allocator_used), CASE(test_ctx_allocator_fails_at_create),
           CASE(test_nomem_forward), CASE(test_nomem_weights), CASE(test_ctx_null),
           CASE(test_status_strings))
