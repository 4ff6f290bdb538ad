/*
 * test_kv_prefill.c — sdpa_forward_kv on chunked prefill (issue 13 items 3 and 5): several
 * queries per sequence, seqlens_q < Lq (rows past it exactly 0 with LSE -inf, or the sink),
 * causal bottom-right and top-left per sequence (a sequence with fewer keys than queries has
 * fully masked rows), windows, ALiBi, softcap and masks, on paged caches of pages 16, 64 and
 * 256 and the plain ragged layout, f32, f16 and bf16 caches, against the reference per
 * sequence by testing.md's rule, at every ISA level the CPU has (kv_fixture.h: the case, its
 * caches, its oracles and run_kv_case; decode is test_kv_cache.c's).
 *   - Query blocks of the kernel cut by the lengths (ratio 8: 16 positions a block).
 *   - Long enough that a worker's widened head (flash_plan.c, WIDE_MIN_BLOCKS) reads the
 *     half-precision cache: bitwise the tiles widened as read.
 */
#include "kv_fixture.h"

/* Chunked prefill: several queries per sequence, seqlens_q < Lq (rows past it 0 and -inf or
 * the sink), causal bottom-right per sequence (a sequence with fewer keys than queries has
 * fully masked rows), windows, ALiBi, softcap, masks; query blocks of the kernel cut by the
 * lengths (ratio 8: 16 positions a block). */
static void test_chunked_prefill(void) {
    static const int64_t pages[3] = {16, 64, 256};
    static const int64_t ratios[3] = {1, 4, 8};
    for (int n = 0; n < 6; n++) {
        kv_case c;
        memset(&c, 0, sizeof c);
        char what[128];
        const int64_t P = pages[n % 3], ratio = ratios[(n + n / 3) % 3];
        snprintf(what, sizeof what, "chunked prefill page %lld ratio %lld %s", (long long)P,
                 (long long)ratio, feature_name(n));
        c.what = what;
        c.B = 4;
        c.Hkv = 2;
        c.Hq = 2 * ratio;
        c.Lq = 40;
        c.Dk = 24;
        c.Dv = 40;
        c.page = P;
        c.cap = 1024;
        c.kv_dt = n % 3 == 0 ? SDPA_F32 : n % 3 == 1 ? SDPA_F16 : SDPA_BF16;
        const int32_t sq[4] = {40, 17, 0, 16}, sk[4] = {600, 17, 300, 9};
        memcpy(c.sq, sq, sizeof sq);
        memcpy(c.sk, sk, sizeof sk);
        c.causal = 1;
        c.align = SDPA_ALIGN_BOTTOM_RIGHT;
        c.blhd = n % 2;
        c.seed = 3000 + (uint64_t)n;
        vary_features(&c, n);
        c.causal = 1;
        CHECK_MSG(run_kv_case(&c), "%s", what);
    }
}

/* The case with 1 and 2 threads (each worker's widened head, flash_plan.c WIDE_MIN_BLOCKS) bitwise
 * with 32 threads (too few query blocks a worker for it: tiles widened as read), at every
 * level, whatever the cores. */
static int widened_bitwise(const kv_case *c) {
    kv_bufs t;
    kv_build(c, &t);
    int32_t sk[MAXB], sq[MAXB];
    const sdpa_kv_cache kc = kv_desc(c, &t, sk, sq);
    tu_tensor o2 = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, c->Dv, TU_BHLD, 0, 0);
    tu_tensor l2 = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, 1, TU_BHLD, 0, 0);
    int ok = 1;
    for (int n = 0; n < g_n_impls; n++) {
        if (!g_impls[n].runs || !tu_impl_takes_kv(&g_impls[n], &t.q.t, &kc, &t.p, &t.o.t))
            continue; /* (f32 queries: not flash-amx's, flash-avx512's under its own name) */
        sdpa_ctx *ctx = tu_ctx(32, g_impls[n].level);
        ok &= sdpa_forward_kv(ctx, &t.q.t, &kc, &t.p, &t.o.t, &t.lse.t) == SDPA_OK;
        sdpa_ctx_destroy(ctx);
        for (int threads = 1; threads <= 2; threads++) {
            ctx = tu_ctx(threads, g_impls[n].level);
            tu_fill_canary(&o2);
            tu_fill_canary(&l2);
            const int same = sdpa_forward_kv(ctx, &t.q.t, &kc, &t.p, &o2.t, &l2.t) == SDPA_OK &&
                             memcmp(t.o.buf, o2.buf, o2.bytes) == 0 &&
                             memcmp(t.lse.buf, l2.buf, l2.bytes) == 0;
            if (!same)
                printf("    %s [%s]: %d threads differ from 32\n", c->what, g_impls[n].name,
                       threads);
            ok &= same;
            sdpa_ctx_destroy(ctx);
        }
    }
    tu_free(&o2);
    tu_free(&l2);
    kv_free(&t);
    return ok;
}

/* Chunked prefill long enough that each kv head has 4 or more query blocks (ratio 8: 16
 * positions a block: 13 blocks, two per worker up to 6 workers), so that the half-precision
 * cache is read from each worker's widened head (flash_plan.c, WIDE_MIN_BLOCKS): through the block
 * table with pages 16 and 64, and the plain layout with ragged lengths, in both alignments;
 * against the reference, and bitwise the tiles widened as read. One kv head, so that a
 * worker's next head is another sequence's. */
static void test_chunked_prefill_widened(void) {
    for (int n = 0; n < 3; n++) {
        kv_case c;
        memset(&c, 0, sizeof c);
        c.what = n == 0   ? "long chunked prefill f16, page 16, causal bottom-right"
                 : n == 1 ? "long chunked prefill bf16, page 64, window and softcap, (B, L, H, D)"
                          : "long chunked prefill f16, plain ragged, top-left causal, mask";
        c.B = 4;
        c.Hkv = 1;
        c.Hq = 8;
        c.Lq = 200;
        c.Dk = 24;
        c.Dv = 40;
        c.page = n == 0 ? 16 : n == 1 ? 64 : 0;
        c.cap = 1024;
        c.kv_dt = n == 1 ? SDPA_BF16 : SDPA_F16;
        const int32_t sq[4] = {200, 70, 0, 150}, sk[4] = {700, 70, 300, 140};
        memcpy(c.sq, sq, sizeof sq);
        memcpy(c.sk, sk, sizeof sk);
        c.causal = 1;
        c.align = n == 2 ? SDPA_ALIGN_TOP_LEFT : SDPA_ALIGN_BOTTOM_RIGHT;
        c.blhd = n == 1;
        c.seed = 3100 + (uint64_t)n;
        if (n == 1) {
            c.use_window = 1;
            c.window_left = 40;
            c.window_right = 0;
            c.softcap = 20.0f;
        }
        if (n == 2)
            c.mask = MASK_ADD;
        CHECK_MSG(run_kv_case(&c), "%s", c.what);
        CHECK_MSG(widened_bitwise(&c), "%s", c.what);
    }
}

int main(int argc, char **argv) {
    tu_report_impls();
    g_n_impls = tu_impls(g_impls);
    return CHECK_RUN(argc, argv, CASE(test_chunked_prefill), CASE(test_chunked_prefill_widened));
}
