/*
 * test_kv_bad.c — the bad inputs of sdpa_forward_kv (sdpa.h "KV caches"), issue 13 item 3:
 * the exact status, the message naming the argument and its value, canary-filled out and lse
 * untouched, inputs unwritten.
 */
#include "check.h"
#include "testutil.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The baseline: two sequences of 5 and 9 keys in a pool of 5 pages of 4 keys, 3 entries a
 * sequence (capacity 12), 2 and 3 of Lq = 3 queries; and a plain cache of 9 keys. */
enum {
    XB = 2,
    XHQ = 4,
    XHKV = 2,
    XLQ = 3,
    XDK = 8,
    XDV = 6,
    XPAGE = 4,
    XMAXP = 3,
    XNP = 5,
    XLK = 9
};

typedef struct bx {
    sdpa_ctx *ctx;
    tu_tensor q, kpool, vpool, kplain, vplain, out, lse, mask;
    int32_t table[XB * XMAXP], sk[XB], sq[XB];
    float sinks[XHQ];
    sdpa_params p;
    sdpa_kv_cache kc;
    const sdpa_kv_cache *kcp;
    unsigned char *snap[5];
    unsigned char *base_out, *base_lse; /* the baseline's result */
} bx;

static tu_tensor *bx_input(bx *f, int i) {
    tu_tensor *in[5] = {&f->q, &f->kpool, &f->vpool, &f->kplain, &f->vplain};
    return in[i];
}

static void bx_reset(bx *f) {
    static const int32_t table[XB * XMAXP] = {3, 0, -1, 1, 4, 2};
    memcpy(f->table, table, sizeof table);
    f->sk[0] = 5;
    f->sk[1] = 9;
    f->sq[0] = 2;
    f->sq[1] = 3;
    for (int h = 0; h < XHQ; h++)
        f->sinks[h] = 0.25f * (float)h;
    memset(&f->p, 0, sizeof f->p);
    f->p.causal = 1;
    f->p.align = SDPA_ALIGN_BOTTOM_RIGHT;
    f->kc = (sdpa_kv_cache){&f->kpool.t, &f->vpool.t, f->sk, f->sq, f->table, XMAXP};
    f->kcp = &f->kc;
    tu_fill_canary(&f->out);
    tu_fill_canary(&f->lse);
}

static void bx_init(bx *f) {
    memset(f, 0, sizeof *f);
    f->ctx = tu_ctx(1, SDPA_ISA_AUTO);
    tu_rng r = {0xb0b};
    f->q = tu_alloc(SDPA_F32, XB, XHQ, XLQ, XDK, TU_BHLD, 0, 0);
    f->kpool = tu_alloc(SDPA_F32, XNP, XHKV, XPAGE, XDK, TU_BHLD, 0, 0);
    f->vpool = tu_alloc(SDPA_F32, XNP, XHKV, XPAGE, XDV, TU_BHLD, 0, 0);
    f->kplain = tu_alloc(SDPA_F32, XB, XHKV, XLK, XDK, TU_BHLD, 0, 0);
    f->vplain = tu_alloc(SDPA_F32, XB, XHKV, XLK, XDV, TU_BHLD, 0, 0);
    f->out = tu_alloc(SDPA_F32, XB, XHQ, XLQ, XDV, TU_BHLD, 0, 0);
    f->lse = tu_alloc(SDPA_F32, XB, XHQ, XLQ, 1, TU_BHLD, 0, 0);
    f->mask = tu_alloc(SDPA_F32, XB, XHQ, XLQ, XLK, TU_BHLD, 0, 0);
    for (int i = 0; i < 5; i++)
        tu_fill_randn(bx_input(f, i), &r, 1.0, 0.0);
    for (int i = 0; i < 5; i++) {
        const tu_tensor *t = bx_input(f, i);
        f->snap[i] = tu_xmalloc(t->bytes);
        memcpy(f->snap[i], t->buf, t->bytes);
    }
    bx_reset(f);
    CHECK_INT_EQ(sdpa_forward_kv(f->ctx, &f->q.t, f->kcp, &f->p, &f->out.t, &f->lse.t), SDPA_OK);
    f->base_out = tu_xmalloc(f->out.bytes);
    f->base_lse = tu_xmalloc(f->lse.bytes);
    memcpy(f->base_out, f->out.buf, f->out.bytes);
    memcpy(f->base_lse, f->lse.buf, f->lse.bytes);
    bx_reset(f);
}

static void bx_free(bx *f) {
    tu_tensor *all[] = {&f->q,      &f->kpool, &f->vpool, &f->kplain,
                        &f->vplain, &f->out,   &f->lse,   &f->mask};
    for (size_t n = 0; n < sizeof all / sizeof all[0]; n++)
        tu_free(all[n]);
    for (int i = 0; i < 5; i++)
        free(f->snap[i]);
    free(f->base_out);
    free(f->base_lse);
    sdpa_ctx_destroy(f->ctx);
}

/* Calls sdpa_forward_kv on the fixture as a case left it: the status; the message (when msg
 * is not NULL); on failure out and lse byte-for-byte as they were (the canary, or what the case
 * put there) and, on success with `same`, the baseline's bits; inputs never written. */
static void expect_kv(bx *f, sdpa_status want, const char *msg, int same, int line) {
    unsigned char *before_o = tu_xmalloc(f->out.bytes), *before_l = tu_xmalloc(f->lse.bytes);
    memcpy(before_o, f->out.buf, f->out.bytes);
    memcpy(before_l, f->lse.buf, f->lse.bytes);
    /* a message that is not the one expected, so that a leftover cannot pass */
    (void)sdpa_forward(f->ctx, NULL, NULL, NULL, NULL, NULL, NULL);
    int32_t table[XB * XMAXP], sk[XB], sq[XB];
    memcpy(table, f->table, sizeof table);
    memcpy(sk, f->sk, sizeof sk);
    memcpy(sq, f->sq, sizeof sq);
    const sdpa_status got = sdpa_forward_kv(f->ctx, &f->q.t, f->kcp, &f->p, &f->out.t, &f->lse.t);
    const char *err = sdpa_ctx_last_error(f->ctx);
    CHECK_MSG(got == want, "line %d: sdpa_forward_kv returned %s, expected %s (\"%s\")", line,
              sdpa_status_name(got), sdpa_status_name(want), err);
    if (msg != NULL)
        CHECK_MSG(strstr(err, msg) != NULL, "line %d: message \"%s\" lacks \"%s\"", line, err, msg);
    if (want != SDPA_OK) {
        CHECK_MSG(memcmp(before_o, f->out.buf, f->out.bytes) == 0,
                  "line %d: out written although the call failed", line);
        CHECK_MSG(memcmp(before_l, f->lse.buf, f->lse.bytes) == 0,
                  "line %d: lse written although the call failed", line);
    } else if (same) {
        CHECK_MSG(memcmp(f->base_out, f->out.buf, f->out.bytes) == 0 &&
                      memcmp(f->base_lse, f->lse.buf, f->lse.bytes) == 0,
                  "line %d: the result differs from the baseline's", line);
    }
    for (int i = 0; i < 5; i++)
        CHECK_MSG(memcmp(bx_input(f, i)->buf, f->snap[i], bx_input(f, i)->bytes) == 0,
                  "line %d: input %d written", line, i);
    CHECK_MSG(memcmp(table, f->table, sizeof table) == 0 && memcmp(sk, f->sk, sizeof sk) == 0 &&
                  memcmp(sq, f->sq, sizeof sq) == 0,
              "line %d: the lengths or the block table were written", line);
    free(before_o);
    free(before_l);
}

#define EXPECT_KV(f, st, msg) expect_kv((f), (st), (msg), 0, __LINE__)
#define EXPECT_KV_SAME(f) expect_kv((f), SDPA_OK, NULL, 1, __LINE__)

static void test_bad_descriptor(void) {
    bx f;
    bx_init(&f);
    f.kcp = NULL;
    EXPECT_KV(&f, SDPA_ERR_NULL, "cache is NULL");
    bx_reset(&f);
    f.kc.max_pages = 0;
    EXPECT_KV(&f, SDPA_ERR_PARAM, "cache.max_pages=0 must be >= 1 with a block table");
    f.kc.max_pages = -1;
    EXPECT_KV(&f, SDPA_ERR_PARAM, "cache.max_pages=-1 must be >= 1");
    f.kc.max_pages = (int64_t)1 << 30; /* x 4 keys a page: past SDPA_MAX_EXTENT */
    EXPECT_KV(&f, SDPA_ERR_DIM, "cache.max_pages=1073741824 x page size k.shape[2]=4 keys exceeds");
    bx_reset(&f);
    f.kc.k = NULL;
    EXPECT_KV(&f, SDPA_ERR_NULL, "k is NULL");
    bx_reset(&f);
    sdpa_tensor v4 = f.vpool.t;
    v4.shape[0] = XNP - 1; /* pools of different sizes */
    f.kc.v = &v4;
    EXPECT_KV(&f, SDPA_ERR_SHAPE, "v.shape[0]=4 but k.shape[0]=5");
    bx_reset(&f);
    f.p.dropout_p = 0.5f;
    EXPECT_KV(&f, SDPA_ERR_PARAM, "params.dropout_p=0.5: sdpa_forward_kv has no dropout");
    bx_reset(&f);
    f.p.mask = &f.mask.t; /* (.., 9): the plain cache's width, not the pages' capacity 12 */
    EXPECT_KV(&f, SDPA_ERR_BROADCAST, "mask.shape[3]=9 is neither 1 nor Lk=12");
    bx_reset(&f);
    EXPECT_KV_SAME(&f);
    bx_free(&f);
}

static void test_bad_lengths(void) {
    bx f;
    bx_init(&f);
    f.sk[1] = -1;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.seqlens_k[1]=-1 is outside [0, 12]");
    f.sk[1] = INT32_MIN;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.seqlens_k[1]=-2147483648 is outside [0, 12]");
    bx_reset(&f);
    f.sk[0] = 13; /* one past the capacity of 3 pages of 4 */
    EXPECT_KV(
        &f, SDPA_ERR_INDEX,
        "cache.seqlens_k[0]=13 is outside [0, 12], the pages' capacity max_pages x page size");
    f.sk[0] = INT32_MAX;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.seqlens_k[0]=2147483647 is outside [0, 12]");
    bx_reset(&f);
    f.sq[1] = 4;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.seqlens_q[1]=4 is outside [0, Lq=3]");
    f.sq[1] = -1;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.seqlens_q[1]=-1 is outside [0, Lq=3]");
    bx_reset(&f);
    /* the plain layout: the capacity is k.shape[2] */
    f.kc = (sdpa_kv_cache){&f.kplain.t, &f.vplain.t, f.sk, f.sq, NULL, 0};
    f.sk[1] = XLK + 1;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.seqlens_k[1]=10 is outside [0, 9], the k.shape[2]");
    f.sk[1] = XLK;
    EXPECT_KV(&f, SDPA_OK, NULL);
    f.kc.max_pages = -5; /* ignored without a block table */
    EXPECT_KV(&f, SDPA_OK, NULL);
    bx_free(&f);
}

static void test_bad_block_table(void) {
    bx f;
    bx_init(&f);
    /* sequence 1 has 9 keys: its entries 0..2 are read */
    f.table[1 * XMAXP + 2] = -1;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.block_table[1][2]=-1 is outside [0, n_pages=5)");
    f.table[1 * XMAXP + 2] = XNP;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.block_table[1][2]=5 is outside [0, n_pages=5)");
    f.table[1 * XMAXP + 2] = INT32_MIN;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.block_table[1][2]=-2147483648 is outside");
    bx_reset(&f);
    f.table[0] = XNP + 100;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.block_table[0][0]=105 is outside [0, n_pages=5)");
    bx_reset(&f);
    /* entries past a sequence's last page are never read: any value is accepted, and the
     * result is the baseline's bit for bit */
    f.table[0 * XMAXP + 2] = XNP;
    EXPECT_KV_SAME(&f);
    f.table[0 * XMAXP + 2] = INT32_MIN;
    EXPECT_KV_SAME(&f);
    f.table[0 * XMAXP + 2] = INT32_MAX;
    EXPECT_KV_SAME(&f);
    /* a longer sequence reads it */
    f.sk[0] = 9;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.block_table[0][2]=2147483647 is outside");
    bx_reset(&f);
    /* a sequence without keys reads no entry */
    f.sk[0] = 0;
    f.table[0] = f.table[1] = f.table[2] = -7;
    EXPECT_KV(&f, SDPA_OK, NULL);
    bx_reset(&f);
    /* seqlens_k NULL: every sequence full, every entry read */
    f.kc.seqlens_k = NULL;
    EXPECT_KV(&f, SDPA_ERR_INDEX, "cache.block_table[0][2]=-1 is outside [0, n_pages=5)");
    f.table[2] = 2;
    f.table[1 * XMAXP + 2] = 0; /* pages shared by two sequences are legal */
    EXPECT_KV(&f, SDPA_OK, NULL);
    bx_free(&f);
}

/* Aligned storage for the misaligned and the aliasing cases. */
typedef union bx_store {
    int32_t i[64];
    float f[64];
    unsigned char c[256];
} bx_store;

static void test_bad_pointers(void) {
    bx f;
    bx_init(&f);
    bx_store st;
    memset(&st, 0, sizeof st);
    /* misaligned lengths and table (their values copied there, in case one were read) */
    memcpy(st.c + 1, f.sk, sizeof f.sk);
    f.kc.seqlens_k = (const int32_t *)(const void *)(st.c + 1);
    EXPECT_KV(&f, SDPA_ERR_PARAM, "is not aligned to 4-byte integers");
    EXPECT_KV(&f, SDPA_ERR_PARAM, "cache.seqlens_k=");
    bx_reset(&f);
    memcpy(st.c + 2, f.sq, sizeof f.sq);
    f.kc.seqlens_q = (const int32_t *)(const void *)(st.c + 2);
    EXPECT_KV(&f, SDPA_ERR_PARAM, "cache.seqlens_q=");
    bx_reset(&f);
    memcpy(st.c + 3, f.table, sizeof f.table);
    f.kc.block_table = (const int32_t *)(const void *)(st.c + 3);
    EXPECT_KV(&f, SDPA_ERR_PARAM, "cache.block_table=");
    bx_reset(&f);
    /* out over the block table, lse over the lengths */
    memcpy(f.out.buf, f.table, sizeof f.table);
    f.kc.block_table = (const int32_t *)f.out.buf;
    EXPECT_KV(&f, SDPA_ERR_ALIAS, "overlaps cache.block_table");
    EXPECT_KV(&f, SDPA_ERR_ALIAS, "out (bytes");
    bx_reset(&f);
    memcpy(f.lse.buf, f.sk, sizeof f.sk);
    f.kc.seqlens_k = (const int32_t *)f.lse.buf;
    EXPECT_KV(&f, SDPA_ERR_ALIAS, "lse (bytes");
    EXPECT_KV(&f, SDPA_ERR_ALIAS, "overlaps cache.seqlens_k");
    bx_reset(&f);
    memcpy((char *)f.out.buf + f.out.bytes - sizeof f.sq, f.sq, sizeof f.sq);
    f.kc.seqlens_q = (const int32_t *)(const void *)((char *)f.out.buf + f.out.bytes - sizeof f.sq);
    EXPECT_KV(&f, SDPA_ERR_ALIAS, "overlaps cache.seqlens_q");
    bx_reset(&f);
    /* a lengths array just past out's bytes is apart from it */
    int32_t *apart = tu_xmalloc(f.out.bytes + sizeof f.sq);
    memcpy(apart, f.out.buf, f.out.bytes);
    memcpy((char *)apart + f.out.bytes, f.sq, sizeof f.sq);
    tu_tensor keep = f.out;
    f.out.t.data = apart;
    f.out.buf = apart;
    f.kc.seqlens_q = (const int32_t *)(const void *)((char *)apart + f.out.bytes);
    EXPECT_KV(&f, SDPA_OK, NULL);
    f.out = keep;
    free(apart);
    bx_free(&f);
}

static void test_bad_sinks(void) {
    bx f;
    bx_init(&f);
    f.p.sinks = f.sinks;
    EXPECT_KV(&f, SDPA_OK, NULL);
    f.sinks[1] = NAN;
    EXPECT_KV(&f, SDPA_ERR_PARAM, "params.sinks[1]=nan must be finite, or -inf for no sink");
    f.sinks[1] = 0.0f;
    f.sinks[2] = INFINITY;
    EXPECT_KV(&f, SDPA_ERR_PARAM, "params.sinks[2]=inf must be finite, or -inf for no sink");
    f.sinks[2] = -INFINITY; /* no sink on that head */
    EXPECT_KV(&f, SDPA_OK, NULL);
    f.sinks[3] = -NAN;
    EXPECT_KV(&f, SDPA_ERR_PARAM, "params.sinks[3]=");
    bx_reset(&f);
    bx_store st;
    memset(&st, 0, sizeof st);
    memcpy(st.c + 1, f.sinks, sizeof f.sinks);
    f.p.sinks = (const float *)(const void *)(st.c + 1);
    EXPECT_KV(&f, SDPA_ERR_PARAM, "params.sinks=");
    EXPECT_KV(&f, SDPA_ERR_PARAM, "is not aligned to 4-byte floats");
    bx_reset(&f);
    /* sinks inside out */
    memcpy(f.out.buf, f.sinks, sizeof f.sinks);
    f.p.sinks = (const float *)f.out.buf;
    EXPECT_KV(&f, SDPA_ERR_ALIAS, "overlaps params.sinks");
    bx_reset(&f);

    /* the other entry points refuse the same sinks */
    f.sinks[0] = NAN;
    f.p.sinks = f.sinks;
    tu_tensor q = tu_alloc(SDPA_F32, 1, XHQ, 2, XDK, TU_BHLD, 0, 0);
    tu_tensor k = tu_alloc(SDPA_F32, 1, XHKV, 3, XDK, TU_BHLD, 0, 0);
    tu_tensor v = tu_alloc(SDPA_F32, 1, XHKV, 3, XDV, TU_BHLD, 0, 0);
    tu_tensor o = tu_alloc(SDPA_F32, 1, XHQ, 2, XDV, TU_BHLD, 0, 0);
    tu_tensor w = tu_alloc(SDPA_F32, 1, XHQ, 2, 3, TU_BHLD, 0, 0);
    tu_fill_canary(&o);
    tu_fill_canary(&w);
    CHECK_INT_EQ(sdpa_forward(f.ctx, &q.t, &k.t, &v.t, &f.p, &o.t, NULL), SDPA_ERR_PARAM);
    CHECK_STR_CONTAINS(sdpa_ctx_last_error(f.ctx), "params.sinks[0]=nan");
    CHECK_INT_EQ(sdpa_weights(f.ctx, &q.t, &k.t, &f.p, &w.t), SDPA_ERR_PARAM);
    CHECK_STR_CONTAINS(sdpa_ctx_last_error(f.ctx), "params.sinks[0]=nan");
    CHECK(tu_is_canary(&o) && tu_is_canary(&w));
    tu_free(&q);
    tu_free(&k);
    tu_free(&v);
    tu_free(&o);
    tu_free(&w);
    bx_free(&f);
}

int main(int argc, char **argv) {
    return CHECK_RUN(argc, argv, CASE(test_bad_descriptor), CASE(test_bad_lengths),
                     CASE(test_bad_block_table), CASE(test_bad_pointers), CASE(test_bad_sinks));
}
