/*
 * ring.c — sdpa_mpi_forward and sdpa_mpi_backward (sdpa_mpi.h): the ring.
 *
 * Rank r holds its queries for the whole call; key/value blocks circulate. At step t it holds
 * block s = r - t (mod P), packed contiguously in one of two buffers, while the next block
 * arrives in the other from rank r - 1 and the one held goes to rank r + 1. The step computes
 * r's queries against block s, one placed problem (core/placement.h) per pair of runs
 * (layout.h) and per chunk of CHUNK_ROWS query rows, calling MPI_Testall between chunks so
 * that the transfers progress while it computes.
 *
 * Forward: each chunk's partial (O, LSE) is merged into the running result of its rows
 * (merge.h's row function: the order is the ring's, fixed). Backward: each pair gives dQ of
 * its rows (added into r's dQ) and dK, dV of the block (added into the block's gradient,
 * which travels behind the block: received from r - 1 at the end of the previous step, it
 * takes r's contributions and goes to r + 1; after P steps it arrives home). Sums run in a
 * fixed order, so results depend on P and the layout only.
 *
 * The running result (forward: O in f32 beside the LSE in double; backward: dQ in f32) lives
 * in scratch, or with SDPA_MPI_ACCUMULATE_IN_OUTPUT in the caller's f32 out or dq: the same
 * values go through the same operations in the same order, so the bits are the same.
 *
 * Collective agreement (check.c): the ranks swap a summary of their arguments before anything
 * else, agree again after allocating, and once more before writing their outputs, so a
 * failure anywhere (short of MPI itself) becomes the same status on every rank and no output
 * is written (but for the running result kept in the caller's output).
 */
#include "ring.h"

#include "attn/merge.h"
#include "core/half.h"
#include "core/placement.h"
#include "core/problem.h"
#include "core/services.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum {
    CHUNK_ROWS = 512,      /* query rows per placed call */
    PIECE_BYTES = 1 << 30, /* the largest message (MPI counts are int) */
    TAG_K = 0,             /* + piece: a block's keys */
    TAG_V = 1 << 19,       /* + piece: a block's values */
    TAG_GRAD = 1 << 20,    /* + piece: a block's key/value gradient */
    MAX_PIECES = (1 << 20) - 1
};

/* ---- small helpers ---------------------------------------------------------------------- */

static int64_t elem_size(sdpa_dtype dt) {
    return dt == SDPA_F32 ? 4 : 2;
}

/* Rows [r0, r0 + n) of t along L: the same strides, a later start. */
static sdpa_tensor rows_of(const sdpa_tensor *t, int64_t r0, int64_t n) {
    sdpa_tensor v = *t;
    v.data = (char *)t->data + r0 * t->stride[2] * elem_size(t->dtype);
    v.shape[2] = n;
    return v;
}

/* A contiguous (d0, d1, d2, d3) tensor at data. */
static sdpa_tensor packed(void *data, sdpa_dtype dt, int64_t d0, int64_t d1, int64_t d2,
                          int64_t d3) {
    sdpa_tensor t = {data, dt, {d0, d1, d2, d3}, {d1 * d2 * d3, d2 * d3, d3, 1}};
    return t;
}

static void *take(ring *R, size_t bytes) {
    void *p = sdpa__alloc(R->ctx, bytes, 64);
    if (p != NULL)
        R->scratch += (int64_t)bytes;
    return p;
}

/* ---- messages -------------------------------------------------------------------------- */

static int64_t pieces(int64_t bytes) {
    return (bytes + PIECE_BYTES - 1) / PIECE_BYTES;
}

/* Posts the sends (to r + 1) or receives (from r - 1) of bytes at buf, in pieces. */
static sdpa_status post(ring *R, int send, void *buf, int64_t bytes, int tag) {
    const int peer = send ? (R->r + 1) % R->p : (R->r + R->p - 1) % R->p;
    for (int64_t at = 0, k = 0; at < bytes; at += PIECE_BYTES, k++) {
        const int n = (int)(bytes - at < PIECE_BYTES ? bytes - at : PIECE_BYTES);
        if (R->n_reqs == R->cap_reqs) /* allocate() counts every piece a step posts */
            return sdpa__fail(R->ctx, SDPA_ERR_INTERNAL, "ring: more than %d transfers in a step",
                              R->cap_reqs);
        MPI_Request *rq = &R->reqs[R->n_reqs++];
        const int rc =
            send ? MPI_Isend((char *)buf + at, n, MPI_BYTE, peer, tag + (int)k, R->comm, rq)
                 : MPI_Irecv((char *)buf + at, n, MPI_BYTE, peer, tag + (int)k, R->comm, rq);
        if (rc != MPI_SUCCESS)
            return sdpa__mpi_failed(R, rc, send ? "MPI_Isend" : "MPI_Irecv");
    }
    return SDPA_OK;
}

/* Lets the posted transfers progress while computing. */
static sdpa_status progress(ring *R) {
    int done = 0;
    if (R->n_reqs == 0)
        return SDPA_OK;
    const int rc = MPI_Testall(R->n_reqs, R->reqs, &done, MPI_STATUSES_IGNORE);
    return rc == MPI_SUCCESS ? SDPA_OK : sdpa__mpi_failed(R, rc, "MPI_Testall");
}

static sdpa_status wait_all(ring *R) {
    const int rc = MPI_Waitall(R->n_reqs, R->reqs, MPI_STATUSES_IGNORE);
    R->n_reqs = 0;
    return rc == MPI_SUCCESS ? SDPA_OK : sdpa__mpi_failed(R, rc, "MPI_Waitall");
}

/* ---- blocks ---------------------------------------------------------------------------- */

/* Bytes of block s packed: K (B, Hkv, nk_s, Dk) then V (B, Hkv, nk_s, Dv). */
static int64_t k_bytes(const ring *R, int s) {
    return R->B * R->Hkv * R->nk[s] * R->Dk * elem_size(R->kdt);
}

static int64_t kv_bytes(const ring *R, int s) {
    return k_bytes(R, s) + R->B * R->Hkv * R->nk[s] * R->Dv * elem_size(R->vdt);
}

/* Whether t's elements lie packed in (B, H, L, D) order, as a block travels: then it is sent
 * from where it is. */
static int is_packed(const sdpa_tensor *t) {
    int64_t want = 1;
    for (int d = 3; d >= 0; d--) {
        if (t->shape[d] > 1 && t->stride[d] != want)
            return 0;
        want *= t->shape[d];
    }
    return 1;
}

/* Bytes of block s's gradient: dK then dV, f32. */
static int64_t grad_bytes(const ring *R, int s) {
    return R->B * R->Hkv * R->nk[s] * (R->Dk + R->Dv) * 4;
}

/* Copies t (B, H, n, D) element by element, bits unchanged, into a contiguous block. */
static void pack(const sdpa_tensor *t, char *dst) {
    const int64_t es = elem_size(t->dtype), D = t->shape[3];
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t h = 0; h < t->shape[1]; h++)
            for (int64_t j = 0; j < t->shape[2]; j++) {
                const char *src = (const char *)t->data + sdpa__offset(t, b, h, j, 0) * es;
                if (t->stride[3] == 1)
                    memcpy(dst, src, (size_t)(D * es));
                else
                    for (int64_t d = 0; d < D; d++)
                        memcpy(dst + d * es, src + d * t->stride[3] * es, (size_t)es);
                dst += D * es;
            }
}

/* Views of the K and V of block s packed at buf (NULL: the rank's own block, in the caller's
 * tensors), rows of run kr. */
static void block_views(const ring *R, const args *a, int s, char *buf, const sdpa__run *kr,
                        sdpa_tensor *k, sdpa_tensor *v) {
    if (buf == NULL) {
        *k = rows_of(a->k, kr->at, kr->n);
        *v = rows_of(a->v, kr->at, kr->n);
        return;
    }
    const int64_t n = R->nk[s];
    sdpa_tensor kt = packed(buf, R->kdt, R->B, R->Hkv, n, R->Dk);
    sdpa_tensor vt =
        packed(buf + R->B * R->Hkv * n * R->Dk * elem_size(R->kdt), R->vdt, R->B, R->Hkv, n, R->Dv);
    *k = rows_of(&kt, kr->at, kr->n);
    *v = rows_of(&vt, kr->at, kr->n);
}

/* Writes the f32 tensor src into dst (same shape), rounding once to dst's dtype. */
static void store_all(const sdpa_tensor *src, sdpa_tensor *dst) {
    for (int64_t b = 0; b < dst->shape[0]; b++)
        for (int64_t h = 0; h < dst->shape[1]; h++)
            for (int64_t i = 0; i < dst->shape[2]; i++) {
                const float *x = (const float *)src->data + sdpa__offset(src, b, h, i, 0);
                if (dst->dtype == SDPA_F32 && dst->stride[3] == 1) {
                    memcpy((float *)dst->data + sdpa__offset(dst, b, h, i, 0), x,
                           (size_t)dst->shape[3] * sizeof(float));
                    continue;
                }
                for (int64_t d = 0; d < dst->shape[3]; d++)
                    sdpa__store(dst->data, dst->dtype, sdpa__offset(dst, b, h, i, d),
                                x[d * src->stride[3]]);
            }
}

/* a += b, elementwise over two f32 tensors of one shape (a any strides, b contiguous). */
static void add_into(const sdpa_tensor *a, const sdpa_tensor *b) {
    const float *y = (const float *)b->data;
    const int64_t sd = a->stride[3];
    for (int64_t b0 = 0; b0 < a->shape[0]; b0++)
        for (int64_t h = 0; h < a->shape[1]; h++)
            for (int64_t i = 0; i < a->shape[2]; i++) {
                float *x = (float *)a->data + sdpa__offset(a, b0, h, i, 0);
                for (int64_t d = 0; d < a->shape[3]; d++)
                    x[d * sd] += *y++;
            }
}

/* Sets every element of the f32 tensor t to +0. */
static void zero_all(const sdpa_tensor *t) {
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t h = 0; h < t->shape[1]; h++)
            for (int64_t i = 0; i < t->shape[2]; i++) {
                float *x = (float *)t->data + sdpa__offset(t, b, h, i, 0);
                if (t->stride[3] == 1)
                    memset(x, 0, (size_t)t->shape[3] * sizeof(float));
                else
                    for (int64_t d = 0; d < t->shape[3]; d++)
                        x[d * t->stride[3]] = 0.0f;
            }
}

/* ---- the steps ------------------------------------------------------------------------- */

/* What a step computes with: the block held and, per call, scratch for one chunk. */
typedef struct step_io {
    const args *a;
    int s;           /* the block held */
    char *kv;        /* its K and V, packed */
    float *part_o;   /* forward: CHUNK_ROWS rows of (B, Hq, ., Dv); backward: dQ rows */
    float *part_l;   /* forward: (B, Hq, CHUNK_ROWS) LSE */
    float *acc_o;    /* the scratch behind acc, or NULL when acc is the caller's output */
    sdpa_tensor acc; /* f32, forward: r's O (B, Hq, nq, Dv); backward: r's dQ (B, Hq, nq, Dk) */
    double *acc_l;   /* forward: r's LSE (B, Hq, nq) */
    double *row;     /* forward: 3 Dv doubles and floats for a merge */
    float *grad;     /* backward: block s's dK, dV accumulator (grad_bytes) */
    float *dkv;      /* backward: a call's dK, dV (the largest run) */
    int64_t pairs;
} step_io;

/* Merges a chunk's partial (rows [at, at + n) of r's queries) into the running result. */
static void merge_chunk(const ring *R, step_io *io, int64_t at, int64_t n) {
    const int64_t Dv = R->Dv, nq = R->nq[R->r], sd = io->acc.stride[3];
    float *two = (float *)(io->row + Dv);
    for (int64_t b = 0; b < R->B; b++)
        for (int64_t h = 0; h < R->Hq; h++)
            for (int64_t i = 0; i < n; i++) {
                const int64_t bh = b * R->Hq + h;
                float *acc = (float *)io->acc.data + sdpa__offset(&io->acc, b, h, at + i, 0);
                double lse[2] = {io->acc_l[bh * nq + at + i], (double)io->part_l[bh * n + i]};
                if (sd == 1)
                    memcpy(two, acc, (size_t)Dv * sizeof(float));
                else
                    for (int64_t d = 0; d < Dv; d++)
                        two[d] = acc[d * sd];
                memcpy(two + Dv, io->part_o + (bh * n + i) * Dv, (size_t)Dv * sizeof(float));
                io->acc_l[bh * nq + at + i] = sdpa__merge_row(2, Dv, two, Dv, lse, io->row);
                for (int64_t d = 0; d < Dv; d++)
                    acc[d * sd] = (float)io->row[d];
            }
}

/* One placed call: queries sub (rows of r's), keys kr (rows of block io->s). */
static sdpa_status compute_pair(ring *R, step_io *io, const sdpa__run *sub, const sdpa__run *kr,
                                const sdpa__placement *pl) {
    const args *a = io->a;
    sdpa_tensor q = rows_of(a->q, sub->at, sub->n), k, v;
    block_views(R, a, io->s, io->kv, kr, &k, &v);
    if (!a->backward) {
        sdpa_tensor o = packed(io->part_o, SDPA_F32, R->B, R->Hq, sub->n, R->Dv);
        sdpa_tensor l = packed(io->part_l, SDPA_F32, R->B, R->Hq, sub->n, 1);
        sdpa_status st = sdpa__forward_placed(R->ctx, &q, &k, &v, &R->lp, pl, &o, &l);
        if (st == SDPA_OK)
            merge_chunk(R, io, sub->at, sub->n);
        return st;
    }
    sdpa_tensor out = rows_of(a->out, sub->at, sub->n), lse = rows_of(a->lse, sub->at, sub->n);
    sdpa_tensor dout = rows_of(a->dout, sub->at, sub->n);
    sdpa_tensor dq = packed(io->part_o, SDPA_F32, R->B, R->Hq, sub->n, R->Dk);
    sdpa_tensor dk = packed(io->dkv, SDPA_F32, R->B, R->Hkv, kr->n, R->Dk);
    sdpa_tensor dv =
        packed(io->dkv + R->B * R->Hkv * kr->n * R->Dk, SDPA_F32, R->B, R->Hkv, kr->n, R->Dv);
    sdpa_status st =
        sdpa__backward_placed(R->ctx, &q, &k, &v, &out, &lse, &dout, &R->lp, pl, &dq, &dk, &dv);
    if (st != SDPA_OK)
        return st;
    const int64_t nk = R->nk[io->s];
    sdpa_tensor acc_q = io->acc;
    sdpa_tensor acc_k = packed(io->grad, SDPA_F32, R->B, R->Hkv, nk, R->Dk);
    sdpa_tensor acc_v =
        packed(io->grad + R->B * R->Hkv * nk * R->Dk, SDPA_F32, R->B, R->Hkv, nk, R->Dv);
    acc_q = rows_of(&acc_q, sub->at, sub->n);
    acc_k = rows_of(&acc_k, kr->at, kr->n);
    acc_v = rows_of(&acc_v, kr->at, kr->n);
    add_into(&acc_q, &dq);
    add_into(&acc_k, &dk);
    add_into(&acc_v, &dv);
    return SDPA_OK;
}

/* r's queries against block io->s: every run pair, chunk by chunk, letting MPI progress. */
static sdpa_status compute_step(ring *R, step_io *io) {
    sdpa__run kruns[2];
    const int n_kruns = sdpa__mpi_runs(R->layout, R->p, io->s, R->nk, kruns);
    for (int qi = 0; qi < R->n_qruns; qi++)
        for (int64_t c0 = 0; c0 < R->qruns[qi].n; c0 += CHUNK_ROWS) {
            const int64_t c1 = c0 + CHUNK_ROWS < R->qruns[qi].n ? c0 + CHUNK_ROWS : R->qruns[qi].n;
            const sdpa__run sub = sdpa__mpi_subrun(&R->qruns[qi], c0, c1);
            for (int ki = 0; ki < n_kruns; ki++) {
                sdpa__placement pl;
                if (!sdpa__mpi_place(&sub, &kruns[ki], &R->w, &pl))
                    continue;
                sdpa_status st = compute_pair(R, io, &sub, &kruns[ki], &pl);
                if (st != SDPA_OK)
                    return st;
                io->pairs++;
                if ((st = progress(R)) != SDPA_OK)
                    return st;
            }
        }
    return SDPA_OK;
}

/* ---- the ring -------------------------------------------------------------------------- */

static int64_t max_over_ranks(const ring *R, int64_t (*bytes)(const ring *, int)) {
    int64_t m = 0;
    for (int s = 0; s < R->p; s++)
        if (bytes(R, s) > m)
            m = bytes(R, s);
    return m;
}

static int64_t max_len(const int64_t *lens, int p) {
    int64_t m = 0;
    for (int s = 0; s < p; s++)
        m = lens[s] > m ? lens[s] : m;
    return m;
}

/* The scratch of a call: two key/value buffers, and the forward's merge state or the
 * backward's gradient accumulators. in_out: the running O (forward) or dQ (backward) is kept
 * in the caller's output (SDPA_MPI_ACCUMULATE_IN_OUTPUT, which the output's dtype allows). */
typedef struct scratch {
    char *kv[2];
    float *grad[2];
    step_io io;
    int in_out;
} scratch;

static sdpa_status allocate(ring *R, const args *a, scratch *sc) {
    const int64_t nq = R->nq[R->r], chunk = nq < CHUNK_ROWS ? nq : CHUNK_ROWS;
    const int64_t kv_max = max_over_ranks(R, kv_bytes);
    const int64_t bhq = R->B * R->Hq;
    memset(sc, 0, sizeof *sc);
    sc->io.a = a;
    /* the running result goes where SDPA_MPI_ACCUMULATE_IN_OUTPUT puts it, or into scratch */
    const sdpa_tensor *res = a->backward ? a->dq : a->out;
    const int64_t res_d = a->backward ? R->Dk : R->Dv;
    sc->in_out = (a->flags & SDPA_MPI_ACCUMULATE_IN_OUTPUT) && res->dtype == SDPA_F32;
    if (sc->in_out)
        sc->io.acc = *res;
    else if ((sc->io.acc_o = take(R, (size_t)(bhq * nq * res_d) * sizeof(float))) != NULL)
        sc->io.acc = packed(sc->io.acc_o, SDPA_F32, R->B, R->Hq, nq, res_d);
    int64_t n_pieces = 2 * pieces(kv_max) + 4;
    /* step 0 computes on the caller's K and V and sends them from there when they are
     * packed; buffers hold the blocks that arrive (kv[1] at step 0, then turn about), and
     * kv[0] the rank's own block at step 0 when it must be packed to be sent */
    const int own_packed = is_packed(a->k) && is_packed(a->v);
    const int need0 = R->p > 2 || (R->p == 2 && !own_packed);
    sc->kv[0] = need0 ? take(R, (size_t)kv_max) : NULL;
    sc->kv[1] = R->p > 1 ? take(R, (size_t)kv_max) : NULL;
    int ok = (!need0 || sc->kv[0] != NULL) && (R->p == 1 || sc->kv[1] != NULL) &&
             sc->io.acc.data != NULL;
    if (!a->backward) {
        sc->io.part_o = take(R, (size_t)(bhq * chunk * R->Dv) * sizeof(float));
        sc->io.part_l = take(R, (size_t)(bhq * chunk) * sizeof(float));
        sc->io.acc_l = take(R, (size_t)(bhq * nq) * sizeof(double));
        sc->io.row = take(R, (size_t)R->Dv * (sizeof(double) + 2 * sizeof(float)));
        ok = ok && sc->io.part_o && sc->io.part_l && sc->io.acc_l && sc->io.row;
    } else {
        const int64_t grad_max = max_over_ranks(R, grad_bytes);
        n_pieces += 2 * pieces(grad_max);
        sc->grad[0] = take(R, (size_t)grad_max);
        sc->grad[1] = R->p > 1 ? take(R, (size_t)grad_max) : sc->grad[0];
        sc->io.part_o = take(R, (size_t)(bhq * chunk * R->Dk) * sizeof(float));
        sc->io.dkv = take(R, (size_t)(R->B * R->Hkv * max_len(R->nk, R->p) * (R->Dk + R->Dv)) *
                                 sizeof(float));
        ok = ok && sc->grad[0] && sc->grad[1] && sc->io.part_o && sc->io.dkv;
    }
    R->cap_reqs = (int)n_pieces;
    R->reqs = n_pieces <= MAX_PIECES ? take(R, (size_t)n_pieces * sizeof(MPI_Request)) : NULL;
    if (!ok || R->reqs == NULL)
        return sdpa__fail(R->ctx, SDPA_ERR_NOMEM,
                          "ring: no memory for %lld bytes of scratch on rank %d",
                          (long long)R->scratch, R->r);
    return SDPA_OK;
}

static void release_scratch(ring *R, scratch *sc) {
    sdpa__free(R->ctx, sc->kv[0]);
    sdpa__free(R->ctx, sc->kv[1]);
    sdpa__free(R->ctx, sc->grad[0]);
    if (sc->grad[1] != sc->grad[0])
        sdpa__free(R->ctx, sc->grad[1]);
    sdpa__free(R->ctx, sc->io.part_o);
    sdpa__free(R->ctx, sc->io.part_l);
    sdpa__free(R->ctx, sc->io.acc_o);
    sdpa__free(R->ctx, sc->io.acc_l);
    sdpa__free(R->ctx, sc->io.row);
    sdpa__free(R->ctx, sc->io.dkv);
    sdpa__free(R->ctx, R->reqs);
}

/* Writes the results from the scratch into the caller's outputs (O or dQ already there when
 * accumulated in place). */
static void write_outputs(ring *R, const args *a, scratch *sc) {
    const int64_t nq = R->nq[R->r], nk = R->nk[R->r];
    if (!a->backward) {
        if (!sc->in_out)
            store_all(&sc->io.acc, (sdpa_tensor *)a->out);
        if (a->lse != NULL)
            for (int64_t b = 0; b < R->B; b++)
                for (int64_t h = 0; h < R->Hq; h++)
                    for (int64_t i = 0; i < nq; i++)
                        ((float *)a->lse->data)[sdpa__offset(a->lse, b, h, i, 0)] =
                            (float)sc->io.acc_l[(b * R->Hq + h) * nq + i];
        return;
    }
    float *home = sc->grad[R->p % 2]; /* r's own block's gradient, back from its trip */
    sdpa_tensor dk = packed(home, SDPA_F32, R->B, R->Hkv, nk, R->Dk);
    sdpa_tensor dv = packed(home + R->B * R->Hkv * nk * R->Dk, SDPA_F32, R->B, R->Hkv, nk, R->Dv);
    if (!sc->in_out)
        store_all(&sc->io.acc, (sdpa_tensor *)a->dq);
    store_all(&dk, (sdpa_tensor *)a->dk);
    store_all(&dv, (sdpa_tensor *)a->dv);
}

/* The P steps, then the agreement and the outputs. */
static sdpa_status run_ring(ring *R, const args *a, summary *all) {
    scratch sc;
    sdpa_status st = allocate(R, a, &sc);
    if ((st = sdpa__mpi_agree_status(R, st, all)) != SDPA_OK) {
        release_scratch(R, &sc);
        return st;
    }
    const int p = R->p, r = R->r;
    const int64_t nq = R->nq[r], bhq = R->B * R->Hq;
    /* from here on, with SDPA_MPI_ACCUMULATE_IN_OUTPUT, the caller's out (or dq) is written */
    zero_all(&sc.io.acc);
    if (!a->backward) {
        for (int64_t i = 0; i < bhq * nq; i++)
            sc.io.acc_l[i] = -INFINITY;
    } else {
        memset(sc.grad[0], 0, (size_t)grad_bytes(R, r));
    }
    sdpa_status compute_st = SDPA_OK;
    for (int t = 0; t < p; t++) {
        const int s = (r - t + p) % p, prev = (s - 1 + p) % p; /* held now, held next */
        double t0 = MPI_Wtime();
        sdpa_mpi_step step = {0};
        sc.io.s = s;
        sc.io.kv = t == 0 ? NULL : sc.kv[t % 2];
        sc.io.grad = sc.grad[t % 2];
        sc.io.pairs = 0;
        if (t < p - 1) {
            /* K and V of the block held go to r + 1 (from the caller's tensors at step 0 when
             * they are packed, else packed first); the next block comes from r - 1 */
            const char *send_k, *send_v;
            if (t == 0 && is_packed(a->k) && is_packed(a->v)) {
                send_k = a->k->data;
                send_v = a->v->data;
            } else {
                char *held = t == 0 ? sc.kv[0] : sc.io.kv;
                if (t == 0) {
                    pack(a->k, held);
                    pack(a->v, held + k_bytes(R, s));
                }
                send_k = held;
                send_v = held + k_bytes(R, s);
            }
            char *next = sc.kv[(t + 1) % 2];
            if ((st = post(R, 0, next, k_bytes(R, prev), TAG_K)) != SDPA_OK ||
                (st = post(R, 0, next + k_bytes(R, prev), kv_bytes(R, prev) - k_bytes(R, prev),
                           TAG_V)) != SDPA_OK ||
                (st = post(R, 1, (void *)send_k, k_bytes(R, s), TAG_K)) != SDPA_OK ||
                (st = post(R, 1, (void *)send_v, kv_bytes(R, s) - k_bytes(R, s), TAG_V)) != SDPA_OK)
                break;
            step.bytes_received += kv_bytes(R, prev);
            step.bytes_sent += kv_bytes(R, s);
        }
        if (a->backward && p > 1) {
            /* the block r - 1 holds now comes here next, with its gradient so far */
            if ((st = post(R, 0, sc.grad[(t + 1) % 2], grad_bytes(R, prev), TAG_GRAD)) != SDPA_OK)
                break;
            step.bytes_received += grad_bytes(R, prev);
        }
        if (compute_st == SDPA_OK) {
            compute_st = compute_step(R, &sc.io);
            if (compute_st == SDPA_ERR_MPI) {
                st = compute_st;
                break;
            }
        }
        if (a->backward && p > 1) {
            if ((st = post(R, 1, sc.io.grad, grad_bytes(R, s), TAG_GRAD)) != SDPA_OK)
                break;
            step.bytes_sent += grad_bytes(R, s);
        }
        const double t1 = MPI_Wtime();
        if ((st = wait_all(R)) != SDPA_OK)
            break;
        step.compute_seconds = t1 - t0;
        step.wait_seconds = MPI_Wtime() - t1;
        step.pairs = sc.io.pairs;
        if (R->stats != NULL) {
            if (R->stats->steps != NULL && t < R->stats->max_steps)
                R->stats->steps[t] = step;
            R->stats->n_steps = t + 1;
            R->stats->bytes_sent += step.bytes_sent;
            R->stats->bytes_received += step.bytes_received;
        }
    }
    if (st != SDPA_OK) {
        /* an MPI call failed: transfers may still be writing into the buffers, so they are
         * cancelled and the scratch is left allocated rather than freed under them */
        for (int i = 0; i < R->n_reqs; i++)
            if (R->reqs[i] != MPI_REQUEST_NULL)
                MPI_Cancel(&R->reqs[i]);
        return st;
    }
    st = sdpa__mpi_agree_status(R, compute_st, all);
    if (st == SDPA_OK)
        write_outputs(R, a, &sc);
    release_scratch(R, &sc);
    return st;
}

/* Either entry point: claim, duplicate the communicator, check, run, release. */
static sdpa_status ring_call(sdpa_ctx *ctx, MPI_Comm comm, sdpa_mpi_layout layout, const args *a,
                             sdpa_mpi_stats *stats) {
    if (ctx == NULL)
        return SDPA_ERR_NULL;
    if (sdpa__claim(ctx))
        return SDPA_ERR_BUSY;
    if (stats != NULL) {
        stats->n_steps = 0;
        stats->total_seconds = 0.0;
        stats->bytes_sent = stats->bytes_received = stats->scratch_bytes = 0;
    }
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    if (!initialised || finalised)
        return sdpa__release(ctx, sdpa__fail(ctx, SDPA_ERR_MPI,
                                             "MPI is %s: call MPI_Init before sdpa_mpi_*",
                                             finalised ? "finalised" : "not initialised"));
    if (comm == MPI_COMM_NULL)
        return sdpa__release(ctx, sdpa__fail(ctx, SDPA_ERR_NULL, "comm is MPI_COMM_NULL"));
    const double t0 = MPI_Wtime();
    ring R;
    memset(&R, 0, sizeof R);
    R.ctx = ctx;
    R.layout = layout;
    R.stats = stats;
    int rc = MPI_Comm_dup(comm, &R.comm);
    if (rc != MPI_SUCCESS)
        return sdpa__release(ctx, sdpa__mpi_failed(&R, rc, "MPI_Comm_dup"));
    MPI_Comm_set_errhandler(R.comm, MPI_ERRORS_RETURN);
    MPI_Comm_size(R.comm, &R.p);
    MPI_Comm_rank(R.comm, &R.r);
    /* the lengths and summaries of every rank; a rank short of memory says so first */
    R.nq = sdpa__alloc(ctx, 2 * (size_t)R.p * sizeof(int64_t), 64);
    summary *all = sdpa__alloc(ctx, (size_t)R.p * sizeof(summary), 64);
    int ok = R.nq != NULL && all != NULL, all_ok = 0;
    sdpa_status st = SDPA_OK;
    rc = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, R.comm);
    if (rc != MPI_SUCCESS)
        st = sdpa__mpi_failed(&R, rc, "MPI_Allreduce");
    else if (!all_ok)
        st = sdpa__fail(ctx, SDPA_ERR_NOMEM, "ring: a rank has no memory for %d summaries", R.p);
    if (st == SDPA_OK) {
        R.nk = R.nq + R.p;
        st = sdpa__mpi_check(&R, a, all);
    }
    if (st == SDPA_OK)
        st = run_ring(&R, a, all);
    if (stats != NULL) {
        stats->total_seconds = MPI_Wtime() - t0;
        stats->scratch_bytes = R.scratch;
    }
    sdpa__free(ctx, R.nq);
    sdpa__free(ctx, all);
    MPI_Comm_free(&R.comm);
    return sdpa__release(ctx, st);
}

sdpa_status sdpa_mpi_forward_opt(sdpa_ctx *ctx, MPI_Comm comm, sdpa_mpi_layout layout,
                                 const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                                 const sdpa_params *params, sdpa_tensor *out, sdpa_tensor *lse,
                                 const sdpa_mpi_options *options, sdpa_mpi_stats *stats) {
    const unsigned flags = options != NULL ? options->flags : 0u;
    const args a = {q, k, v, out, lse, NULL, NULL, NULL, NULL, params, 0, flags};
    return ring_call(ctx, comm, layout, &a, stats);
}

sdpa_status sdpa_mpi_forward(sdpa_ctx *ctx, MPI_Comm comm, sdpa_mpi_layout layout,
                             const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                             const sdpa_params *params, sdpa_tensor *out, sdpa_tensor *lse,
                             sdpa_mpi_stats *stats) {
    return sdpa_mpi_forward_opt(ctx, comm, layout, q, k, v, params, out, lse, NULL, stats);
}

sdpa_status sdpa_mpi_backward_opt(sdpa_ctx *ctx, MPI_Comm comm, sdpa_mpi_layout layout,
                                  const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                                  const sdpa_tensor *out, const sdpa_tensor *lse,
                                  const sdpa_tensor *dout, const sdpa_params *params,
                                  sdpa_tensor *dq, sdpa_tensor *dk, sdpa_tensor *dv,
                                  const sdpa_mpi_options *options, sdpa_mpi_stats *stats) {
    const unsigned flags = options != NULL ? options->flags : 0u;
    const args a = {q, k, v, out, lse, dout, dq, dk, dv, params, 1, flags};
    return ring_call(ctx, comm, layout, &a, stats);
}

sdpa_status sdpa_mpi_backward(sdpa_ctx *ctx, MPI_Comm comm, sdpa_mpi_layout layout,
                              const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                              const sdpa_tensor *out, const sdpa_tensor *lse,
                              const sdpa_tensor *dout, const sdpa_params *params, sdpa_tensor *dq,
                              sdpa_tensor *dk, sdpa_tensor *dv, sdpa_mpi_stats *stats) {
    return sdpa_mpi_backward_opt(ctx, comm, layout, q, k, v, out, lse, dout, params, dq, dk, dv,
                                 NULL, stats);
}

const char *sdpa_mpi_layout_name(sdpa_mpi_layout layout) {
    switch (layout) {
    case SDPA_MPI_CONTIGUOUS:
        return "contiguous";
    case SDPA_MPI_STRIPED:
        return "striped";
    case SDPA_MPI_ZIGZAG:
        return "zigzag";
    default:
        return "unknown";
    }
}
