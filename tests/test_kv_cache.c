/*
 * test_kv_cache.c — sdpa_forward_kv (ragged and paged KV caches, sdpa.h "KV caches"), issue 13
 * items 3 and 5: decode; chunked prefill is test_kv_prefill.c's, bad inputs test_kv_bad.c's,
 * attention sinks test_sinks.c's. The case, its caches and its oracles are kv_fixture.h's.
 *
 *   - Paged and ragged caches against the reference by testing.md's rule. A plain cache is
 *     built, then scattered into a pool of pages through a shuffled block table (unused entries
 *     -1, unused pages and rows past every length NaN, so that a read of them shows); the
 *     golden is the reference (tu_golden_forward) run per sequence on views of the plain cache
 *     of seqlens_q[b] queries and seqlens_k[b] keys, checked itself against the naive double
 *     implementation; the baseline is the naive one in f32. Batches of mixed lengths (0 keys,
 *     1, page boundaries +-1, around the split-KV chunks of 512), page sizes 16, 64 and 256,
 *     GQA ratios 1, 4 and 8, f32, f16 and bf16 caches under f32 queries, causal bottom-right
 *     and top-left per sequence, windows, ALiBi, softcap, additive and bool masks indexed by
 *     the sequence's own positions, sinks; the plain layout with seqlens too, prefill
 *     included. Every ISA level the CPU has; sdpa_forward per sequence on the plain slices
 *     passes the same rule.
 *   - Determinism: bitwise the same for n_threads 1, 2, 3 and 7 on a paged batch.
 */
#include "kv_fixture.h"

/* ======================================================================================== */
/* 1. Paged and ragged caches against the reference                                          */
/* ======================================================================================== */

static kv_case decode_case(const char *what, int64_t B, int64_t hq, int64_t hkv, int64_t page,
                           int64_t cap, sdpa_dtype dt, const int32_t *lens, uint64_t seed) {
    kv_case c;
    memset(&c, 0, sizeof c);
    c.what = what;
    c.B = B;
    c.Hq = hq;
    c.Hkv = hkv;
    c.Lq = 1;
    c.Dk = 32;
    c.Dv = 24;
    c.page = page;
    c.cap = cap;
    c.kv_dt = dt;
    for (int64_t b = 0; b < B; b++) {
        c.sk[b] = lens[b];
        c.sq[b] = 1;
    }
    c.align = SDPA_ALIGN_BOTTOM_RIGHT;
    c.seed = seed;
    return c;
}

/* Decode (Lq = 1) on paged caches: page sizes 16, 64 and 256, GQA ratios 1, 4 and 8, f32, f16
 * and bf16. Four sequences of two kv heads are 8 tasks, so a capacity of 2048 keys is split
 * into 4 chunks of 512: lengths at the chunk boundaries +-1, at page boundaries +-1, 0 and
 * 1 key, and the full capacity. */
static void test_paged_decode(void) {
    static const int64_t pages[3] = {16, 64, 256};
    static const int64_t ratios[3] = {1, 4, 8};
    static const sdpa_dtype dts[3] = {SDPA_F32, SDPA_F16, SDPA_BF16};
    int n = 0;
    for (int a = 0; a < 3; a++)
        for (int g = 0; g < 3; g++, n++) {
            const int64_t P = pages[a];
            /* chunk boundaries (512, 1024, 1536) +-1, page boundaries +-1, 0, 1, full */
            const int32_t d = (int32_t)(n % 3) - 1;
            const int32_t lens[8] = {(int32_t)(512 + d),         (int32_t)(1024 - d),
                                     (int32_t)(P - 1 + (n % 3)), n % 2 ? 0 : 1,
                                     (int32_t)(1536 + d),        2048,
                                     (int32_t)(3 * P + d),       (int32_t)(2 * P)};
            char what[128];
            snprintf(what, sizeof what, "paged decode page %lld ratio %lld %s %s", (long long)P,
                     (long long)ratios[g], sdpa_dtype_name(dts[(a + g) % 3]), feature_name(n));
            /* B = 4 sequences of 2 kv heads, or 8 of 1 (both 8 tasks) */
            const int64_t hkv = n % 2 ? 1 : 2, B = 8 / hkv;
            kv_case c = decode_case(what, B, hkv * ratios[g], hkv, P, 2048, dts[(a + g) % 3], lens,
                                    1000 + (uint64_t)n);
            c.blhd = n % 2;
            vary_features(&c, n);
            CHECK_MSG(run_kv_case(&c), "%s", what);
        }
}

/* Mixed lengths on a batch of 10 (20 tasks: two chunks), and one of 13 sequences of one kv head
 * (no split); seqlens_k NULL (every sequence full) and seqlens_q NULL. */
static void test_paged_mixed(void) {
    static const int32_t lens[13] = {0, 1, 15, 16, 17, 63, 64, 65, 255, 256, 257, 700, 1000};
    int n = 0;
    for (int64_t P = 16; P <= 256; P *= 4, n++) {
        char what[128];
        snprintf(what, sizeof what, "paged mixed B=10 page %lld f16 %s", (long long)P,
                 feature_name(n + 1));
        kv_case c = decode_case(what, 10, 8, 2, P, 1024, SDPA_F16, lens + 3, 2000 + (uint64_t)n);
        vary_features(&c, n + 1);
        c.no_sq = 1;
        CHECK_MSG(run_kv_case(&c), "%s", what);
    }
    kv_case c = decode_case("paged B=13 page 64 ratio 4 bf16, alibi+softcap+mask", 13, 4, 1, 64,
                            1024, SDPA_BF16, lens, 2100);
    vary_features(&c, 2);
    CHECK(run_kv_case(&c));
    c = decode_case("paged B=3 every sequence full (seqlens_k NULL) page 16", 3, 8, 2, 16, 528,
                    SDPA_F32, lens, 2200);
    c.no_sk = 1;
    c.sinks = 1;
    CHECK(run_kv_case(&c));
}

/* The plain layout with seqlens (no block table): rows past a length are NaN and never read;
 * decode across the chunks and prefill, causal in both alignments. */
static void test_plain_ragged(void) {
    static const int32_t lens[6] = {0, 1, 700, 1023, 1024, 1100};
    kv_case c = decode_case("plain ragged decode f32 (B, L, H, D), causal+window+sinks", 6, 8, 1, 0,
                            1100, SDPA_F32, lens, 4000);
    c.blhd = 1;
    vary_features(&c, 1);
    CHECK(run_kv_case(&c));
    c = decode_case("plain ragged decode bf16, alibi+softcap+mask", 6, 4, 1, 0, 1100, SDPA_BF16,
                    lens, 4001);
    vary_features(&c, 2);
    CHECK(run_kv_case(&c));
    c = decode_case("plain ragged prefill f16, top-left causal, mask, sinks", 3, 6, 2, 0, 300,
                    SDPA_F16, lens, 4002);
    c.Lq = 20;
    const int32_t sq[3] = {20, 0, 7}, sk[3] = {300, 50, 5};
    memcpy(c.sq, sq, sizeof sq);
    memcpy(c.sk, sk, sizeof sk);
    c.causal = 1;
    c.align = SDPA_ALIGN_TOP_LEFT;
    c.mask = MASK_ADD;
    c.sinks = 1;
    CHECK(run_kv_case(&c));
    c.what = "plain ragged prefill f16, window (3, 2) bottom-right, seqlens_q NULL";
    c.causal = 0;
    c.align = SDPA_ALIGN_BOTTOM_RIGHT;
    c.use_window = 1;
    c.window_left = 3;
    c.window_right = 2;
    c.no_sq = 1;
    c.sinks = 0;
    CHECK(run_kv_case(&c));
}

/* ======================================================================================== */
/* 2. Determinism                                                                            */
/* ======================================================================================== */

/* A paged batch, split into chunks: bitwise the same out and lse for 1, 2, 3 and 7 threads at
 * every ISA level, and on a second call. */
static void test_determinism(void) {
    static const int32_t lens[4] = {1500, 3, 1025, 2048};
    kv_case c = decode_case("determinism", 4, 8, 2, 64, 2048, SDPA_F16, lens, 5000);
    c.Lq = 3;
    for (int b = 0; b < 4; b++)
        c.sq[b] = b == 1 ? 2 : 3;
    c.causal = 1;
    c.sinks = 1;
    c.mask = MASK_ADD;
    kv_bufs t;
    kv_build(&c, &t);
    int32_t sk[MAXB], sq[MAXB];
    const sdpa_kv_cache kc = kv_desc(&c, &t, sk, sq);
    static const int threads[4] = {1, 2, 3, 7};
    unsigned char *ref_o = tu_xmalloc(t.o.bytes), *ref_l = tu_xmalloc(t.lse.bytes);
    for (int n = 0; n < g_n_impls; n++) {
        if (!g_impls[n].runs || !tu_impl_takes_kv(&g_impls[n], &t.q.t, &kc, &t.p, &t.o.t))
            continue; /* (f32 queries: not flash-amx's, flash-avx512's under its own name) */
        int same = 1;
        for (int a = 0; a < 4; a++) {
            sdpa_ctx *ctx = tu_ctx(threads[a], g_impls[n].level);
            for (int rep = 0; rep < (a == 0 ? 2 : 1); rep++) {
                tu_fill_canary(&t.o);
                tu_fill_canary(&t.lse);
                CHECK_INT_EQ(sdpa_forward_kv(ctx, &t.q.t, &kc, &t.p, &t.o.t, &t.lse.t), SDPA_OK);
                if (a == 0 && rep == 0) {
                    memcpy(ref_o, t.o.buf, t.o.bytes);
                    memcpy(ref_l, t.lse.buf, t.lse.bytes);
                } else {
                    same &= memcmp(ref_o, t.o.buf, t.o.bytes) == 0 &&
                            memcmp(ref_l, t.lse.buf, t.lse.bytes) == 0;
                }
            }
            sdpa_ctx_destroy(ctx);
        }
        printf("    [%s] threads 1, 2, 3, 7: %s\n", g_impls[n].name,
               same ? "bitwise equal" : "DIFFER");
        CHECK_MSG(same, "[%s] sdpa_forward_kv differs between thread counts", g_impls[n].name);
    }
    free(ref_o);
    free(ref_l);
    kv_free(&t);
}

int main(int argc, char **argv) {
    tu_report_impls();
    g_n_impls = tu_impls(g_impls);
    return CHECK_RUN(argc, argv, CASE(test_paged_decode), CASE(test_paged_mixed),
                     CASE(test_plain_ragged), CASE(test_determinism));
}
