/*
 * test_ring_inplace.c — SDPA_MPI_ACCUMULATE_IN_OUTPUT (sdpa_mpi.h) under `mpirun -np P`,
 * P = 1 to 4 (tests/CMakeLists.txt registers one test per P). The flag keeps the ring's running
 * result in the caller's out (forward) or dq (backward) instead of an accumulator in scratch;
 * its contract is that nothing else changes but the memory and what a failure mid-ring leaves.
 *
 * Every rank fills its own blocks from a seed of its rank (the values need not form any
 * particular gathered sequence: both modes see the same ones) and runs each call twice,
 * without the flag into packed outputs and with it into views of other strides: (B, L, H, D)
 * with padded rows, rows and features reversed (negative strides), features two apart. Then:
 * the same bits in every output element, forward (O, LSE) and backward (dQ, dK, dV), for every
 * layout, causal or not, GQA with Dk != Dv, chunks of query rows beyond the ring's 512; the
 * bytes around a strided view untouched; stats.scratch_bytes smaller by exactly the
 * accumulator, B Hq nq Dv x 4 (forward) or B Hq nq Dk x 4 (backward), and unchanged for an
 * f16 output, where the flag changes nothing. Errors found before the ring starts (a bad
 * argument on one rank, an unknown flag, a rank out of memory) leave out and dq untouched on
 * every rank.
 *
 * Rank 0 prints the cases; the other ranks print only their failures (stderr). Every rank
 * exits non-zero on a failure, so mpirun does.
 */
#include "check.h"
#include "testutil.h"

#include "sdpa_mpi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int n_ranks, rank;

static const sdpa_mpi_options in_out = {SDPA_MPI_ACCUMULATE_IN_OUTPUT};

/* Rank r's local length of a sequence of len positions, by sdpa_mpi.h's definitions (uneven
 * contiguous runs on purpose: floor((r+1) L / P) - floor(r L / P)). */
static int64_t local_len(sdpa_mpi_layout layout, int r, int64_t len) {
    const int64_t p = n_ranks;
    if (layout == SDPA_MPI_STRIPED)
        return (len - r + p - 1) / p;
    if (layout == SDPA_MPI_ZIGZAG) {
        const int64_t a = r, z = 2 * p - 1 - r;
        return ((a + 1) * len / (2 * p) - a * len / (2 * p)) +
               ((z + 1) * len / (2 * p) - z * len / (2 * p));
    }
    return (r + 1) * len / p - r * len / p;
}

/* ---- strided outputs ----------------------------------------------------------------------- */

/* How an output view lies in its buffer. */
typedef enum style {
    S_PACKED,      /* (B, H, L, D) contiguous */
    S_BLHD_PADDED, /* (B, L, H, D) with 3 elements after each row and 5 before the first */
    S_REVERSED,    /* (B, H, L, D) with L and D reversed: stride[2] = -D, stride[3] = -1 */
    S_SPACED,      /* (B, H, L, D) with features two elements apart: stride[3] = 2 */
    S_COUNT
} style;

static const char *const style_names[S_COUNT] = {"packed", "BLHD padded", "reversed", "spaced"};

/* A (b, h, l, d) tensor of dtype dt laid out by s, in a buffer of its own filled with the
 * canary. */
static tu_tensor view_alloc(style s, sdpa_dtype dt, int64_t b, int64_t h, int64_t l, int64_t d) {
    if (s == S_PACKED || s == S_BLHD_PADDED) {
        tu_tensor t = s == S_PACKED ? tu_alloc(dt, b, h, l, d, TU_BHLD, 0, 0)
                                    : tu_alloc(dt, b, h, l, d, TU_BLHD, 3, 5);
        tu_fill_canary(&t);
        return t;
    }
    const int64_t spread = s == S_SPACED ? 2 : 1, elems = b * h * l * d * spread;
    tu_tensor t = tu_alloc(dt, 1, 1, 1, elems, TU_BHLD, 0, 0);
    const size_t es = sdpa_dtype_size(dt);
    t.t.shape[0] = b;
    t.t.shape[1] = h;
    t.t.shape[2] = l;
    t.t.shape[3] = d;
    t.t.stride[0] = h * l * d * spread;
    t.t.stride[1] = l * d * spread;
    if (s == S_REVERSED) {
        /* element (b, h, i, e) at b H L D + h L D + (L - 1 - i) D + (D - 1 - e) */
        t.t.stride[2] = -d;
        t.t.stride[3] = -1;
        t.t.data = (char *)t.buf + (size_t)(l * d - 1) * es;
    } else {
        t.t.stride[2] = d * spread;
        t.t.stride[3] = spread;
    }
    tu_fill_canary(&t);
    return t;
}

static int64_t offset_of(const sdpa_tensor *t, int64_t b, int64_t h, int64_t i, int64_t e) {
    return b * t->stride[0] + h * t->stride[1] + i * t->stride[2] + e * t->stride[3];
}

/* @return 1 if every element of a and b (one shape, one dtype) has the same bits. */
static int same_bits(const sdpa_tensor *a, const sdpa_tensor *b) {
    const size_t es = sdpa_dtype_size(a->dtype);
    for (int64_t b0 = 0; b0 < a->shape[0]; b0++)
        for (int64_t h = 0; h < a->shape[1]; h++)
            for (int64_t i = 0; i < a->shape[2]; i++)
                for (int64_t e = 0; e < a->shape[3]; e++)
                    if (memcmp((const char *)a->data + offset_of(a, b0, h, i, e) * (int64_t)es,
                               (const char *)b->data + offset_of(b, b0, h, i, e) * (int64_t)es,
                               es) != 0)
                        return 0;
    return 1;
}

/* @return 1 if every byte of t's buffer outside its elements still holds the canary. */
static int canary_around(const tu_tensor *t) {
    unsigned char *mine = calloc(t->bytes, 1);
    const size_t es = sdpa_dtype_size(t->t.dtype);
    const char *base = t->buf;
    for (int64_t b = 0; b < t->t.shape[0]; b++)
        for (int64_t h = 0; h < t->t.shape[1]; h++)
            for (int64_t i = 0; i < t->t.shape[2]; i++)
                for (int64_t e = 0; e < t->t.shape[3]; e++) {
                    const char *at = (const char *)t->t.data + offset_of(&t->t, b, h, i, e) * es;
                    memset(mine + (at - base), 1, es);
                }
    int ok = 1;
    for (size_t i = 0; i < t->bytes; i++)
        ok = ok && (mine[i] || ((const unsigned char *)t->buf)[i] == 0xA5);
    free(mine);
    return ok;
}

/* ---- one case ------------------------------------------------------------------------------ */

typedef struct inplace_case {
    const char *name;
    tu_dims d; /* of the gathered sequence */
    sdpa_mpi_layout layout;
    int causal;
    sdpa_dtype out_dt; /* of out, dq, dk, dv (q, k, v, dout are f32) */
} inplace_case;

/* This rank's blocks of a case, filled from a seed of the case and the rank. */
typedef struct blocks {
    int64_t nq, nk;
    tu_tensor q, k, v, dout;
    sdpa_params p;
} blocks;

static blocks blocks_make(const inplace_case *c) {
    blocks x;
    const tu_dims d = c->d;
    tu_rng r = {0x1ace + (uint64_t)rank * 7919 + (uint64_t)d.Lq * 31 + (uint64_t)c->causal};
    x.nq = local_len(c->layout, rank, d.Lq);
    x.nk = local_len(c->layout, rank, d.Lk);
    x.q = tu_alloc(SDPA_F32, d.B, d.Hq, x.nq, d.Dk, TU_BHLD, 0, 0);
    x.k = tu_alloc(SDPA_F32, d.B, d.Hkv, x.nk, d.Dk, TU_BHLD, 0, 0);
    x.v = tu_alloc(SDPA_F32, d.B, d.Hkv, x.nk, d.Dv, TU_BHLD, 0, 0);
    x.dout = tu_alloc(SDPA_F32, d.B, d.Hq, x.nq, d.Dv, TU_BHLD, 0, 0);
    tu_fill_randn(&x.q, &r, 1.0, 0.0);
    tu_fill_randn(&x.k, &r, 1.0, 0.0);
    tu_fill_randn(&x.v, &r, 1.0, 0.0);
    tu_fill_randn(&x.dout, &r, 1.0, 0.0);
    memset(&x.p, 0, sizeof x.p);
    x.p.causal = c->causal;
    return x;
}

static void blocks_free(blocks *x) {
    tu_free(&x->q);
    tu_free(&x->k);
    tu_free(&x->v);
    tu_free(&x->dout);
}

/* The default call into packed outputs, then the flagged one into views of style s: the same
 * bits, the same bytes around the views, scratch smaller by the accumulator. */
static void run_case(const inplace_case *c, style s) {
    const tu_dims d = c->d;
    blocks x = blocks_make(c);
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    const int f32 = c->out_dt == SDPA_F32;
    char name[160];
    snprintf(name, sizeof name, "%s, %s out (rank %d)", c->name, style_names[s], rank);

    /* forward */
    tu_tensor o0 = view_alloc(S_PACKED, c->out_dt, d.B, d.Hq, x.nq, d.Dv);
    tu_tensor l0 = tu_alloc(SDPA_F32, d.B, d.Hq, x.nq, 1, TU_BHLD, 0, 0);
    tu_tensor o1 = view_alloc(s, c->out_dt, d.B, d.Hq, x.nq, d.Dv);
    tu_tensor l1 = tu_alloc(SDPA_F32, d.B, d.Hq, x.nq, 1, TU_BHLD, 0, 0);
    sdpa_mpi_stats st0 = {0}, st1 = {0};
    sdpa_status st = sdpa_mpi_forward(ctx, MPI_COMM_WORLD, c->layout, &x.q.t, &x.k.t, &x.v.t, &x.p,
                                      &o0.t, &l0.t, &st0);
    CHECK_MSG(st == SDPA_OK, "%s: forward: %s", name, sdpa_ctx_last_error(ctx));
    st = sdpa_mpi_forward_opt(ctx, MPI_COMM_WORLD, c->layout, &x.q.t, &x.k.t, &x.v.t, &x.p, &o1.t,
                              &l1.t, &in_out, &st1);
    CHECK_MSG(st == SDPA_OK, "%s: forward in out: %s", name, sdpa_ctx_last_error(ctx));
    CHECK_MSG(same_bits(&o0.t, &o1.t), "%s: O differs in out", name);
    CHECK_MSG(memcmp(l0.buf, l1.buf, l0.bytes) == 0, "%s: LSE differs in out", name);
    CHECK_MSG(canary_around(&o1), "%s: the forward wrote outside out's elements", name);
    const int64_t o_acc = f32 ? d.B * d.Hq * x.nq * d.Dv * 4 : 0;
    CHECK_MSG(st0.scratch_bytes - st1.scratch_bytes == o_acc,
              "%s: forward scratch %lld in out, %lld without: want %lld less", name,
              (long long)st1.scratch_bytes, (long long)st0.scratch_bytes, (long long)o_acc);

    /* backward, on the default forward's out and lse */
    tu_tensor dq0 = view_alloc(S_PACKED, c->out_dt, d.B, d.Hq, x.nq, d.Dk);
    tu_tensor dk0 = view_alloc(S_PACKED, c->out_dt, d.B, d.Hkv, x.nk, d.Dk);
    tu_tensor dv0 = view_alloc(S_PACKED, c->out_dt, d.B, d.Hkv, x.nk, d.Dv);
    tu_tensor dq1 = view_alloc(s, c->out_dt, d.B, d.Hq, x.nq, d.Dk);
    tu_tensor dk1 = view_alloc(s, c->out_dt, d.B, d.Hkv, x.nk, d.Dk);
    tu_tensor dv1 = view_alloc(s, c->out_dt, d.B, d.Hkv, x.nk, d.Dv);
    st = sdpa_mpi_backward(ctx, MPI_COMM_WORLD, c->layout, &x.q.t, &x.k.t, &x.v.t, &o0.t, &l0.t,
                           &x.dout.t, &x.p, &dq0.t, &dk0.t, &dv0.t, &st0);
    CHECK_MSG(st == SDPA_OK, "%s: backward: %s", name, sdpa_ctx_last_error(ctx));
    st = sdpa_mpi_backward_opt(ctx, MPI_COMM_WORLD, c->layout, &x.q.t, &x.k.t, &x.v.t, &o0.t, &l0.t,
                               &x.dout.t, &x.p, &dq1.t, &dk1.t, &dv1.t, &in_out, &st1);
    CHECK_MSG(st == SDPA_OK, "%s: backward in dq: %s", name, sdpa_ctx_last_error(ctx));
    CHECK_MSG(same_bits(&dq0.t, &dq1.t) && same_bits(&dk0.t, &dk1.t) && same_bits(&dv0.t, &dv1.t),
              "%s: a gradient differs in dq", name);
    CHECK_MSG(canary_around(&dq1) && canary_around(&dk1) && canary_around(&dv1),
              "%s: the backward wrote outside a gradient's elements", name);
    const int64_t q_acc = f32 ? d.B * d.Hq * x.nq * d.Dk * 4 : 0;
    CHECK_MSG(st0.scratch_bytes - st1.scratch_bytes == q_acc,
              "%s: backward scratch %lld in dq, %lld without: want %lld less", name,
              (long long)st1.scratch_bytes, (long long)st0.scratch_bytes, (long long)q_acc);

    tu_tensor *all[] = {&o0, &l0, &o1, &l1, &dq0, &dk0, &dv0, &dq1, &dk1, &dv1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        tu_free(all[i]);
    sdpa_ctx_destroy(ctx);
    blocks_free(&x);
}

static inplace_case make(const char *name, sdpa_mpi_layout layout, int causal, int64_t len) {
    inplace_case c = {name, {1, 2, 2, len, len, 16, 16}, layout, causal, SDPA_F32};
    return c;
}

/* ---- the sweep ----------------------------------------------------------------------------- */

static void test_layouts_and_strides(void) {
    static const sdpa_mpi_layout layouts[3] = {SDPA_MPI_CONTIGUOUS, SDPA_MPI_STRIPED,
                                               SDPA_MPI_ZIGZAG};
    static const char *const names[2][3] = {
        {"contiguous", "striped", "zigzag"},
        {"contiguous causal", "striped causal", "zigzag causal"}};
    for (int causal = 0; causal < 2; causal++)
        for (int l = 0; l < 3; l++)
            for (int s = 0; s < S_COUNT; s++) {
                const inplace_case c = make(names[causal][l], layouts[l], causal, 67);
                run_case(&c, (style)s);
            }
}

static void test_shapes(void) {
    inplace_case c = make("GQA 4/2, Dk 24 != Dv 40, B=2", SDPA_MPI_ZIGZAG, 1, 45);
    c.d = (tu_dims){2, 4, 2, 45, 45, 24, 40};
    run_case(&c, S_BLHD_PADDED);
    run_case(&c, S_REVERSED);
    c.name = "Lq 83 > Lk 31, striped";
    c.d = (tu_dims){1, 2, 1, 83, 31, 16, 16};
    c.layout = SDPA_MPI_STRIPED;
    run_case(&c, S_SPACED);
    /* beyond the ring's chunk of 512 query rows on each rank */
    c = make("contiguous causal long", SDPA_MPI_CONTIGUOUS, 1, 1100 * (int64_t)n_ranks + 3);
    c.d.Hq = c.d.Hkv = 1;
    c.d.Dk = c.d.Dv = 8;
    run_case(&c, S_REVERSED);
    /* an f16 output: the flag changes nothing, the accumulator stays */
    c = make("f16 out", SDPA_MPI_ZIGZAG, 1, 50);
    c.out_dt = SDPA_F16;
    run_case(&c, S_PACKED);
    run_case(&c, S_SPACED);
}

/* ---- errors -------------------------------------------------------------------------------- */

/* The flagged forward and backward with out (dq) of style S_SPACED, shape[3] + wider on this
 * rank: both must give want on every rank, out and dq untouched. */
static void expect_untouched(const char *what, sdpa_ctx *ctx, const blocks *x, const tu_dims *d,
                             int64_t wider, const sdpa_mpi_options *opt, sdpa_status want) {
    tu_tensor o = view_alloc(S_SPACED, SDPA_F32, d->B, d->Hq, x->nq, d->Dv + wider);
    tu_tensor l = tu_alloc(SDPA_F32, d->B, d->Hq, x->nq, 1, TU_BHLD, 0, 0);
    tu_tensor good_o = tu_alloc(SDPA_F32, d->B, d->Hq, x->nq, d->Dv, TU_BHLD, 0, 0);
    tu_tensor dq = view_alloc(S_SPACED, SDPA_F32, d->B, d->Hq, x->nq, d->Dk + wider);
    tu_tensor dk = tu_alloc(SDPA_F32, d->B, d->Hkv, x->nk, d->Dk, TU_BHLD, 0, 0);
    tu_tensor dv = tu_alloc(SDPA_F32, d->B, d->Hkv, x->nk, d->Dv, TU_BHLD, 0, 0);
    tu_fill_canary(&l);
    sdpa_status st = sdpa_mpi_forward_opt(ctx, MPI_COMM_WORLD, SDPA_MPI_ZIGZAG, &x->q.t, &x->k.t,
                                          &x->v.t, &x->p, &o.t, &l.t, opt, NULL);
    CHECK_MSG(st == want, "%s: forward %s, want %s (%s)", what, sdpa_status_name(st),
              sdpa_status_name(want), sdpa_ctx_last_error(ctx));
    CHECK_MSG(tu_is_canary(&o) && tu_is_canary(&l), "%s: the forward wrote out or lse", what);
    memset(good_o.buf, 0, good_o.bytes);
    st = sdpa_mpi_backward_opt(ctx, MPI_COMM_WORLD, SDPA_MPI_ZIGZAG, &x->q.t, &x->k.t, &x->v.t,
                               &good_o.t, &l.t, &x->dout.t, &x->p, &dq.t, &dk.t, &dv.t, opt, NULL);
    CHECK_MSG(st == want, "%s: backward %s, want %s (%s)", what, sdpa_status_name(st),
              sdpa_status_name(want), sdpa_ctx_last_error(ctx));
    CHECK_MSG(tu_is_canary(&dq), "%s: the backward wrote dq", what);
    tu_free(&o);
    tu_free(&l);
    tu_free(&good_o);
    tu_free(&dq);
    tu_free(&dk);
    tu_free(&dv);
}

/* An allocator that refuses blocks of `limit` bytes or more while limit is not 0: the ring's
 * own checks (a few small blocks) pass, its scratch is refused. */
typedef struct big_fails {
    size_t limit;
    long outstanding;
} big_fails;

static void *big_alloc(size_t size, size_t align, void *user) {
    big_fails *f = user;
    void *p = NULL;
    if ((f->limit != 0 && size >= f->limit) ||
        posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, size ? size : 1) != 0)
        return NULL;
    f->outstanding++;
    return p;
}

static void big_free(void *p, void *user) {
    ((big_fails *)user)->outstanding--;
    free(p);
}

static void test_errors(void) {
    inplace_case c = make("errors", SDPA_MPI_ZIGZAG, 1, 24 * (int64_t)n_ranks + 2);
    c.d.Dk = c.d.Dv = 64; /* a chunk of partial O (2 x 24 rows x 64 x 4 bytes) passes 8 KiB */
    blocks x = blocks_make(&c);
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    const int last = n_ranks - 1;
    /* a bad argument on the last rank only: out.shape[3] (and dq.shape[3]) one too many */
    expect_untouched("bad out on one rank", ctx, &x, &c.d, rank == last, &in_out, SDPA_ERR_SHAPE);
    CHECK_STR_CONTAINS(sdpa_ctx_last_error(ctx), "shape[3]");
    /* a flag the library does not know, on rank 0 only */
    const sdpa_mpi_options unknown = {rank == 0 ? 0x80u | SDPA_MPI_ACCUMULATE_IN_OUTPUT
                                                : SDPA_MPI_ACCUMULATE_IN_OUTPUT};
    expect_untouched("unknown flag", ctx, &x, &c.d, 0, &unknown, SDPA_ERR_PARAM);
    CHECK_STR_CONTAINS(sdpa_ctx_last_error(ctx), "0x80");
    sdpa_ctx_destroy(ctx);

    /* the last rank has no memory for its scratch: everyone fails when the ranks agree after
     * allocating, before the ring starts, and nothing is written */
    big_fails bf = {0, 0};
    sdpa_ctx_params cp = {0};
    cp.n_threads = 1;
    cp.allocator = (sdpa_allocator){big_alloc, big_free, &bf};
    CHECK(sdpa_ctx_create(&cp, &ctx) == SDPA_OK);
    const long before = bf.outstanding;
    bf.limit = rank == last ? 8192 : 0;
    expect_untouched("no scratch on one rank", ctx, &x, &c.d, 0, &in_out, SDPA_ERR_NOMEM);
    CHECK_STR_CONTAINS(sdpa_ctx_last_error(ctx), "bytes of scratch");
    bf.limit = 0;
    CHECK_MSG(bf.outstanding == before, "%ld blocks left allocated", bf.outstanding - before);
    sdpa_ctx_destroy(ctx);
    blocks_free(&x);
}

int main(int argc, char **argv) {
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "test_ring_inplace: MPI_Init_thread failed\n");
        return 1;
    }
    MPI_Comm_size(MPI_COMM_WORLD, &n_ranks);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank != 0 && freopen("/dev/null", "w", stdout) == NULL)
        return 1;
    printf("test_ring_inplace: %d rank%s\n", n_ranks, n_ranks == 1 ? "" : "s");
    const int failed =
        CHECK_RUN(argc, argv, CASE(test_layouts_and_strides), CASE(test_shapes), CASE(test_errors));
    /* every rank learns whether any failed, so the exit status agrees */
    int any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return any;
}
