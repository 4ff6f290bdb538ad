/*
 * ring.c — ring attention over MPI (sdpa_mpi_forward, sdpa_mpi_backward) run, timed and checked.
 *
 *     mpirun -np P build/examples/ring [--L N] [--H N] [--hkv N] [--D N]
 *            [--layout contiguous|striped|zigzag] [--causal] [--threads N] [--reps N]
 *            [--backward] [--in-output] [--compare] [--compare-threads N] [--help]
 *
 * A sequence of L positions (H query heads over Hkv key/value heads of D features, f32, batch
 * 1) is dealt to the P ranks by the layout of sdpa_mpi.h. Each rank fills its blocks of Q, K
 * and V from a generator keyed by the global position, so the gathered sequence is the same
 * for every P and layout. The forward (and with --backward the backward) runs reps times after
 * one warm-up; rank 0 gathers every rank's figures and prints, per rank, the median time, the
 * GFLOP/s of its share (4 Lq Lk D per head, only the visible pairs when causal; the backward
 * counted as 2.5 forwards), the bytes it sent and received, the ring's scratch and the peak
 * RSS; per step of each rank's median rep, the compute and wait seconds and the block pairs.
 * Then the same K/V block sizes go around the ring with no compute (P - 1 shifts): beside the
 * time the ring's steps waited, it gives the fraction of communication hidden behind compute
 * (1 - wait / alone, clamped to [0, 1]).
 *
 * With --in-output the calls take SDPA_MPI_ACCUMULATE_IN_OUTPUT: the running O (and dQ) is
 * kept in the rank's own out (dq) rather than in an accumulator of the ring's scratch, which
 * the scratch and RSS columns show.
 *
 * With --compare, rank 0 also times sdpa_forward (and sdpa_backward) of one process on the
 * whole sequence with --compare-threads threads while the other ranks sleep, prints the ratio
 * of the ring's time to it, and checks the ring's output, gathered in global order, against
 * it: the run fails when the largest difference passes 1e-4 (gradients: 1e-4 of their
 * largest magnitude).
 *
 * CPUs: mpirun binds each rank to one core by default, and a rank's threads share its
 * binding. The report lists each rank's CPUs and says when a rank has more threads than CPUs
 * (start with --bind-to none, or --map-by slot:PE=N). For --compare, rank 0 widens its
 * binding to the ranks' CPUs together (Linux), so that the one process runs on the cores the
 * ring ran on.
 *
 * Exit status: 0 on success, 1 when a call fails (every rank prints the library's status and
 * message; sdpa_mpi_* return the same status on every rank) or the check fails, 2 for bad
 * options (on every rank).
 */
#include "machine.h"

#include <sdpa_mpi.h>

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The global positions rank r holds under layout (sdpa_mpi.h), in the order of its local
 * rows, into pos (unless NULL). @return their number. */
static int64_t positions(sdpa_mpi_layout layout, int p, int r, int64_t L, int64_t *pos) {
    int64_t n = 0;
    if (layout == SDPA_MPI_CONTIGUOUS) {
        for (int64_t i = r * L / p; i < (r + 1) * L / p; i++, n++)
            if (pos != NULL)
                pos[n] = i;
    } else if (layout == SDPA_MPI_STRIPED) {
        for (int64_t i = r; i < L; i += p, n++)
            if (pos != NULL)
                pos[n] = i;
    } else {
        const int64_t chunks[2] = {r, 2 * (int64_t)p - 1 - r};
        for (int c = 0; c < 2; c++)
            for (int64_t i = chunks[c] * L / (2 * p); i < (chunks[c] + 1) * L / (2 * p); i++, n++)
                if (pos != NULL)
                    pos[n] = i;
    }
    return n;
}

typedef struct options {
    int64_t L, H, Hkv, D;
    sdpa_mpi_layout layout;
    int causal, threads, reps, backward, compare, compare_threads;
    int in_output; /* SDPA_MPI_ACCUMULATE_IN_OUTPUT */
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: mpirun -np P ring [--L N] [--H N] [--hkv N] [--D N]\n"
            "                         [--layout contiguous|striped|zigzag] [--causal]\n"
            "                         [--threads N] [--reps N] [--backward] [--in-output]\n"
            "                         [--compare] [--compare-threads N] [--help]\n"
            "  --L N                gathered sequence length; each rank needs a position (8192)\n"
            "  --H N, --hkv N       query heads (16), key/value heads (H)\n"
            "  --D N                head dimension (64)\n"
            "  --layout NAME        how positions are dealt to ranks (zigzag)\n"
            "  --causal             causal attention (top-left)\n"
            "  --threads N          threads of each rank's context, 0 = all cores (1)\n"
            "  --reps N             timed repetitions after one warm-up (3)\n"
            "  --backward           also time sdpa_mpi_backward\n"
            "  --in-output          keep the running O (dQ) in out (dq), not in scratch\n"
            "  --compare            rank 0 also runs one process on the whole sequence\n"
            "  --compare-threads N  its threads (P)\n");
}

/* Reads argv[i + 1] as an integer in [lo, hi]; 0 if it is missing or not one. */
static int int_arg(int argc, char **argv, int i, int64_t lo, int64_t hi, int64_t *out) {
    if (i + 1 >= argc)
        return 0;
    char *end;
    const long long x = strtoll(argv[i + 1], &end, 10);
    if (end == argv[i + 1] || *end != '\0' || x < lo || x > hi)
        return 0;
    *out = (int64_t)x;
    return 1;
}

/* @return 0 to run, 1 for --help, 2 for a bad option (with a message on rank 0's stderr). */
static int parse(int argc, char **argv, int p, int rank, options *o) {
    int64_t hkv = 0, ct = 0, threads = 1, reps = 3;
    *o = (options){8192, 16, 0, 64, SDPA_MPI_ZIGZAG, 0, 1, 3, 0, 0, 0, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int ok = 1;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
            return 1;
        else if (strcmp(a, "--causal") == 0)
            o->causal = 1;
        else if (strcmp(a, "--backward") == 0)
            o->backward = 1;
        else if (strcmp(a, "--compare") == 0)
            o->compare = 1;
        else if (strcmp(a, "--in-output") == 0)
            o->in_output = 1;
        else if (strcmp(a, "--layout") == 0) {
            const char *v = i + 1 < argc ? argv[++i] : "";
            if (strcmp(v, "contiguous") == 0)
                o->layout = SDPA_MPI_CONTIGUOUS;
            else if (strcmp(v, "striped") == 0)
                o->layout = SDPA_MPI_STRIPED;
            else if (strcmp(v, "zigzag") == 0)
                o->layout = SDPA_MPI_ZIGZAG;
            else
                ok = 0;
        } else if (strcmp(a, "--L") == 0)
            ok = int_arg(argc, argv, i++, 1, SDPA_MAX_EXTENT, &o->L);
        else if (strcmp(a, "--H") == 0)
            ok = int_arg(argc, argv, i++, 1, 1 << 16, &o->H);
        else if (strcmp(a, "--hkv") == 0)
            ok = int_arg(argc, argv, i++, 1, 1 << 16, &hkv);
        else if (strcmp(a, "--D") == 0)
            ok = int_arg(argc, argv, i++, 1, SDPA_MAX_HEAD_DIM, &o->D);
        else if (strcmp(a, "--threads") == 0)
            ok = int_arg(argc, argv, i++, 0, SDPA_MAX_THREADS, &threads);
        else if (strcmp(a, "--reps") == 0)
            ok = int_arg(argc, argv, i++, 1, 10000, &reps);
        else if (strcmp(a, "--compare-threads") == 0)
            ok = int_arg(argc, argv, i++, 0, SDPA_MAX_THREADS, &ct);
        else
            ok = 0;
        if (!ok) {
            if (rank == 0) {
                fprintf(stderr, "ring: bad option or value at '%s'\n", a);
                usage(stderr);
            }
            return 2;
        }
    }
    o->Hkv = hkv > 0 ? hkv : o->H;
    o->threads = (int)threads;
    o->reps = (int)reps;
    o->compare_threads = ct > 0 ? (int)ct : p;
    const char *why = NULL;
    int empty = -1; /* a rank the layout leaves without positions (zigzag: L < 2P may) */
    for (int s = 0; s < p && o->L >= p && empty < 0; s++)
        if (positions(o->layout, p, s, o->L, NULL) == 0)
            empty = s;
    /* every tensor of the gathered sequence, and each rank's, is indexed with int64_t and
     * allocated with size_t; --compare gathers with MPI counts, which are int */
    const int64_t heads = o->H > o->Hkv ? o->H : o->Hkv;
    if (o->L < p)
        why = "--L must be at least the number of ranks";
    else if (empty >= 0)
        why = "this layout leaves a rank without positions: take a larger --L";
    else if (heads > INT64_MAX / 16 / o->L / o->D ||
             (uint64_t)(heads * o->L * o->D) > SIZE_MAX / 16)
        why = "H x L x D is too large";
    else if (o->compare && heads * o->L * o->D > INT_MAX)
        why = "--compare gathers H x L x D floats with MPI counts: at most 2^31 - 1";
    if (why != NULL) {
        if (rank == 0) {
            fprintf(stderr, "ring: %s\n", why);
            usage(stderr);
        }
        return 2;
    }
    return 0;
}

/* ---- the sequence ---------------------------------------------------------------------- */

/* Element (tensor, h, position, d) of the gathered sequence, in [-1, 1): a hash of its global
 * index, so any rank can make any part of it. tensor: 0 Q, 1 K, 2 V, 3 dO. */
static float value_at(const options *o, int tensor, int64_t h, int64_t pos, int64_t d) {
    uint64_t x =
        (((uint64_t)tensor * (uint64_t)o->H + (uint64_t)h) * (uint64_t)o->L + (uint64_t)pos) *
            (uint64_t)o->D +
        (uint64_t)d;
    x += 0x9E3779B97F4A7C15u; /* splitmix64 */
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9u;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBu;
    x ^= x >> 31;
    return (float)((int64_t)(x >> 40) - (1 << 23)) / (float)(1 << 23);
}

/* t (1, heads, n, D): the rows of positions pos[0..n) of one tensor of the sequence. */
static void fill(const options *o, int tensor, int64_t heads, int64_t n, const int64_t *pos,
                 float *t) {
    for (int64_t h = 0; h < heads; h++)
        for (int64_t i = 0; i < n; i++)
            for (int64_t d = 0; d < o->D; d++)
                t[(h * n + i) * o->D + d] = value_at(o, tensor, h, pos[i], d);
}

/* Forward FLOPs of the queries at pos[0..n): 2 (Dk + Dv) per head and visible pair. */
static double flops_of(const options *o, int64_t n, const int64_t *pos) {
    double pairs = 0.0;
    for (int64_t i = 0; i < n; i++)
        pairs += o->causal ? (double)(pos[i] + 1) : (double)o->L;
    return 4.0 * (double)o->H * (double)o->D * pairs;
}

/* ---- measurements ---------------------------------------------------------------------- */

/* The index of the median of t[0..n) (the upper one for even n). */
static int median_index(const double *t, int n) {
    for (int i = 0; i < n; i++) {
        int below = 0;
        for (int j = 0; j < n; j++)
            below += t[j] < t[i] || (t[j] == t[i] && j < i);
        if (below == n / 2)
            return i;
    }
    return 0;
}

/* One pure ring shift of blocks of the ring's sizes: at step t rank r sends the bytes of
 * block r - t to r + 1 and receives those of block r - t - 1 from r - 1, P - 1 steps, no
 * compute. bytes[s] are block s's; buf two buffers of the largest. @return seconds. */
static double shift_ring(int p, int r, const int64_t *bytes, char *buf[2]) {
    enum { PIECE = 1 << 30 };
    const double t0 = MPI_Wtime();
    for (int t = 0; t < p - 1; t++) {
        const int s = (r - t + p) % p, prev = (s - 1 + p) % p;
        for (int64_t at = 0; at < bytes[s] || at < bytes[prev]; at += PIECE) {
            const int64_t ns = bytes[s] - at, nr = bytes[prev] - at;
            MPI_Request rq[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
            if (nr > 0)
                MPI_Irecv(buf[(t + 1) % 2] + at, (int)(nr < PIECE ? nr : PIECE), MPI_BYTE,
                          (r + p - 1) % p, 0, MPI_COMM_WORLD, &rq[0]);
            if (ns > 0)
                MPI_Isend(buf[t % 2] + at, (int)(ns < PIECE ? ns : PIECE), MPI_BYTE, (r + 1) % p, 0,
                          MPI_COMM_WORLD, &rq[1]);
            MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
        }
    }
    return MPI_Wtime() - t0;
}

/* Waits for req without spinning, so that an idle rank leaves its core to rank 0's threads. */
static void wait_quietly(MPI_Request *req) {
    const struct timespec nap = {0, 1000000};
    int done = 0;
    while (MPI_Test(req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done)
        nanosleep(&nap, NULL);
}

/* Gathers t (1, heads, n_r, D) of every rank into full (1, heads, L, D) on rank 0, each row at
 * its global position. tmp holds heads x L x D floats on rank 0. */
static void gather_rows(const options *o, int p, int rank, int64_t heads, const float *t, int64_t n,
                        float *full, float *tmp, int64_t *pos) {
    int *counts = calloc((size_t)p, sizeof *counts), *displs = calloc((size_t)p, sizeof *displs);
    for (int s = 0, at = 0; s < p; s++) {
        counts[s] = (int)(heads * positions(o->layout, p, s, o->L, NULL) * o->D);
        displs[s] = at;
        at += counts[s];
    }
    MPI_Gatherv(t, (int)(heads * n * o->D), MPI_FLOAT, tmp, counts, displs, MPI_FLOAT, 0,
                MPI_COMM_WORLD);
    if (rank == 0)
        for (int s = 0; s < p; s++) {
            const int64_t ns = positions(o->layout, p, s, o->L, pos);
            const float *src = tmp + displs[s];
            for (int64_t h = 0; h < heads; h++)
                for (int64_t i = 0; i < ns; i++)
                    memcpy(full + (h * o->L + pos[i]) * o->D, src + (h * ns + i) * o->D,
                           (size_t)o->D * sizeof(float));
        }
    free(counts);
    free(displs);
}

/* @return max |a - b| over n values (NaN if either has a NaN where the other has not). */
static double max_diff(const float *a, const float *b, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double x = fabs((double)a[i] - (double)b[i]);
        m = x > m || isnan(x) ? x : m;
    }
    return m;
}

static double max_abs(const float *a, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++)
        m = fabs((double)a[i]) > m ? fabs((double)a[i]) : m;
    return m;
}

/* ---- the program ----------------------------------------------------------------------- */

/* What each rank reports to rank 0, as doubles (MPI_Gather): for the forward (at R_FWD) and
 * the backward (at R_BWD) D_COUNT figures of the median rep, then the rank's own figures. */
enum {
    D_SECONDS,  /* the call */
    D_SENT,     /* bytes sent, received */
    D_RECEIVED, /* */
    D_SCRATCH,  /* the ring's scratch (stats.scratch_bytes) */
    D_COMPUTE,  /* compute seconds, summed over the steps */
    D_WAIT,     /* wait seconds, likewise */
    D_COUNT
};
enum {
    R_FWD = 0,
    R_BWD = D_COUNT,
    R_N = 2 * D_COUNT, /* positions held */
    R_FLOPS,           /* forward FLOPs of its queries */
    R_COMM,            /* median seconds of the pure ring shift */
    R_RSS,             /* VmHWM bytes, before --compare */
    R_THREADS,         /* threads of its context */
    R_CPUS,            /* CPUs it may run on (0: unknown) */
    R_COUNT
};

/* Each rank's tensors, (1, heads, n, D) f32. */
typedef struct local {
    int64_t n, *pos;
    float *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv;
} local;

static void free_local(local *x) {
    free(x->pos);
    free(x->q);
    free(x->k);
    free(x->v);
    free(x->o);
    free(x->lse);
    free(x->dout);
    free(x->dq);
    free(x->dk);
    free(x->dv);
}

static float *floats(int64_t n) {
    return malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
}

/* Allocates x's tensors (gradients with backward) for n positions. @return 1 if all were. */
static int alloc_local(local *x, const options *o, int64_t n, int backward) {
    const int64_t nq = o->H * n * o->D, nk = o->Hkv * n * o->D;
    memset(x, 0, sizeof *x);
    x->n = n;
    x->pos = malloc((size_t)(n > 0 ? n : 1) * sizeof *x->pos);
    x->q = floats(nq);
    x->k = floats(nk);
    x->v = floats(nk);
    x->o = floats(nq);
    x->lse = floats(o->H * n);
    int ok = x->pos && x->q && x->k && x->v && x->o && x->lse;
    if (backward) {
        x->dout = floats(nq);
        x->dq = floats(nq);
        x->dk = floats(nk);
        x->dv = floats(nk);
        ok = ok && x->dout && x->dq && x->dk && x->dv;
    }
    return ok;
}

/* Runs the forward, or the backward, of x once untimed and then reps times. The steps of rep
 * i go to steps[i P ..], its stats to stats[i], its seconds to secs[i]. */
static sdpa_status time_ring(sdpa_ctx *ctx, const options *o, int p, local *x, int backward,
                             sdpa_mpi_step *steps, sdpa_mpi_stats *stats, double *secs) {
    const sdpa_tensor q = sdpa_tensor_bhld(x->q, SDPA_F32, 1, o->H, x->n, o->D);
    const sdpa_tensor k = sdpa_tensor_bhld(x->k, SDPA_F32, 1, o->Hkv, x->n, o->D);
    const sdpa_tensor v = sdpa_tensor_bhld(x->v, SDPA_F32, 1, o->Hkv, x->n, o->D);
    sdpa_tensor out = sdpa_tensor_bhld(x->o, SDPA_F32, 1, o->H, x->n, o->D);
    sdpa_tensor lse = sdpa_tensor_bhld(x->lse, SDPA_F32, 1, o->H, x->n, 1);
    sdpa_params params = {0};
    params.causal = o->causal;
    const sdpa_mpi_options opt = {o->in_output ? SDPA_MPI_ACCUMULATE_IN_OUTPUT : 0u};
    for (int i = -1; i < o->reps; i++) {
        sdpa_mpi_stats st0 = {0}, *st = i < 0 ? &st0 : &stats[i];
        st->steps = i < 0 ? NULL : steps + (int64_t)i * p;
        st->max_steps = i < 0 ? 0 : p;
        sdpa_status status;
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        if (!backward) {
            status = sdpa_mpi_forward_opt(ctx, MPI_COMM_WORLD, o->layout, &q, &k, &v, &params, &out,
                                          &lse, &opt, st);
        } else {
            const sdpa_tensor dout = sdpa_tensor_bhld(x->dout, SDPA_F32, 1, o->H, x->n, o->D);
            sdpa_tensor dq = sdpa_tensor_bhld(x->dq, SDPA_F32, 1, o->H, x->n, o->D);
            sdpa_tensor dk = sdpa_tensor_bhld(x->dk, SDPA_F32, 1, o->Hkv, x->n, o->D);
            sdpa_tensor dv = sdpa_tensor_bhld(x->dv, SDPA_F32, 1, o->Hkv, x->n, o->D);
            status = sdpa_mpi_backward_opt(ctx, MPI_COMM_WORLD, o->layout, &q, &k, &v, &out, &lse,
                                           &dout, &params, &dq, &dk, &dv, &opt, st);
        }
        const double t = MPI_Wtime() - t0;
        if (status != SDPA_OK)
            return status;
        if (i >= 0)
            secs[i] = t;
    }
    return SDPA_OK;
}

/* Fills fig[0..D_COUNT) from the median of the reps; copies its steps to med (unless NULL):
 * compute, wait and pairs of each. */
static void summarise(const options *o, int p, const sdpa_mpi_step *steps,
                      const sdpa_mpi_stats *stats, const double *secs, double *fig, double *med) {
    const int m = median_index(secs, o->reps);
    fig[D_SECONDS] = secs[m];
    fig[D_SENT] = (double)stats[m].bytes_sent;
    fig[D_RECEIVED] = (double)stats[m].bytes_received;
    fig[D_SCRATCH] = (double)stats[m].scratch_bytes;
    fig[D_COMPUTE] = fig[D_WAIT] = 0.0;
    for (int t = 0; t < p && t < stats[m].n_steps; t++) {
        const sdpa_mpi_step *s = &steps[(int64_t)m * p + t];
        fig[D_COMPUTE] += s->compute_seconds;
        fig[D_WAIT] += s->wait_seconds;
        if (med != NULL) {
            med[3 * t] = s->compute_seconds;
            med[3 * t + 1] = s->wait_seconds;
            med[3 * t + 2] = (double)s->pairs;
        }
    }
}

/* Rank 0's report of the ring: all holds every rank's R_COUNT figures, steps their median
 * forward's steps (compute, wait, pairs), masks their CPUs. */
static void print_ranks(const options *o, int p, const double *all, const double *steps,
                        const uint64_t *masks) {
    const double MiB = 1024.0 * 1024.0;
    double ring = 0.0, flops = 0.0;
    printf("\nforward, per rank (median of %d reps; MiB = 2^20 bytes; RSS before --compare)\n",
           o->reps);
    printf("%4s %9s %10s %9s %9s %9s %11s %9s  %s\n", "rank", "positions", "time_ms", "GFLOP/s",
           "sent_MiB", "recv_MiB", "scratch_MiB", "RSS_MiB", "cpus");
    for (int s = 0; s < p; s++) {
        const double *f = all + (int64_t)s * R_COUNT, *fw = f + R_FWD;
        char cpus[64];
        cpu_list(masks + (int64_t)s * CPU_WORDS, cpus, sizeof cpus);
        printf("%4d %9.0f %10.2f %9.2f %9.2f %9.2f %11.2f %9.1f  %s\n", s, f[R_N],
               fw[D_SECONDS] * 1e3, f[R_FLOPS] / fw[D_SECONDS] * 1e-9, fw[D_SENT] / MiB,
               fw[D_RECEIVED] / MiB, fw[D_SCRATCH] / MiB, f[R_RSS] / MiB, cpus);
        ring = fw[D_SECONDS] > ring ? fw[D_SECONDS] : ring;
        flops += f[R_FLOPS];
    }
    printf("ring: %.2f ms (the slowest rank's median), %.2f GFLOP/s in all\n", ring * 1e3,
           flops / ring * 1e-9);
    for (int s = 0; s < p; s++) {
        const double *f = all + (int64_t)s * R_COUNT;
        if (f[R_CPUS] > 0 && f[R_THREADS] > f[R_CPUS])
            printf("note: rank %d runs %.0f threads on %.0f CPU(s): mpirun binds each rank to a "
                   "core unless started with --bind-to none (or --map-by slot:PE=N)\n",
                   s, f[R_THREADS], f[R_CPUS]);
    }

    printf("\nforward, per step of each rank's median rep (block = the rank whose K/V it "
           "holds)\n");
    printf("%4s %4s %5s %11s %9s %6s\n", "rank", "step", "block", "compute_ms", "wait_ms", "pairs");
    for (int s = 0; s < p; s++)
        for (int t = 0; t < p; t++) {
            const double *x = steps + ((int64_t)s * p + t) * 3;
            printf("%4d %4d %5d %11.3f %9.3f %6.0f\n", s, t, (s - t + p) % p, x[0] * 1e3,
                   x[1] * 1e3, x[2]);
        }

    printf("\noverlap: the steps' wait against the same K/V bytes shifted round the ring alone\n"
           "(hidden = 1 - wait / alone, clamped to [0, 1]; wait also holds load imbalance;\n"
           " other = the call outside its steps: checks, allocation, the final agreement\n"
           " where a rank waits for the slowest, writing the outputs)\n");
    printf("%4s %12s %12s %10s %14s %8s\n", "rank", "compute_ms", "wait_ms", "other_ms",
           "comm_alone_ms", "hidden");
    for (int s = 0; s < p; s++) {
        const double *f = all + (int64_t)s * R_COUNT, *fw = f + R_FWD;
        char hidden[32] = "n/a";
        if (p > 1 && f[R_COMM] > 0.0) {
            double h = 1.0 - fw[D_WAIT] / f[R_COMM];
            h = h < 0.0 ? 0.0 : h > 1.0 ? 1.0 : h;
            snprintf(hidden, sizeof hidden, "%.3f", h);
        }
        printf("%4d %12.3f %12.3f %10.3f %14.3f %8s\n", s, fw[D_COMPUTE] * 1e3, fw[D_WAIT] * 1e3,
               (fw[D_SECONDS] - fw[D_COMPUTE] - fw[D_WAIT]) * 1e3, f[R_COMM] * 1e3, hidden);
    }
    if (!o->backward)
        return;
    ring = 0.0;
    printf("\nbackward, per rank (median of %d reps; GFLOP/s counts 2.5 forwards)\n", o->reps);
    printf("%4s %10s %9s %9s %9s %11s %12s %9s %10s\n", "rank", "time_ms", "GFLOP/s", "sent_MiB",
           "recv_MiB", "scratch_MiB", "compute_ms", "wait_ms", "other_ms");
    for (int s = 0; s < p; s++) {
        const double *f = all + (int64_t)s * R_COUNT, *bw = f + R_BWD;
        printf("%4d %10.2f %9.2f %9.2f %9.2f %11.2f %12.3f %9.3f %10.3f\n", s, bw[D_SECONDS] * 1e3,
               2.5 * f[R_FLOPS] / bw[D_SECONDS] * 1e-9, bw[D_SENT] / MiB, bw[D_RECEIVED] / MiB,
               bw[D_SCRATCH] / MiB, bw[D_COMPUTE] * 1e3, bw[D_WAIT] * 1e3,
               (bw[D_SECONDS] - bw[D_COMPUTE] - bw[D_WAIT]) * 1e3);
        ring = bw[D_SECONDS] > ring ? bw[D_SECONDS] : ring;
    }
    printf("ring: %.2f ms (the slowest rank's median), %.2f GFLOP/s in all\n", ring * 1e3,
           2.5 * flops / ring * 1e-9);
}

static double median_of(double *t, int n) {
    return t[median_index(t, n)];
}

/* Rank 0: one process on the whole sequence, timed and compared with the ring's gathered
 * results (o_ring, and with backward the gradients g_ring[3]). @return the exit status. */
static int compare(const options *o, const double *all, const uint64_t *masks, int p,
                   const float *o_ring, float *const g_ring[3]) {
    const int64_t L = o->L, nq = o->H * L * o->D, nk = o->Hkv * L * o->D;
    local x;
    double *secs = malloc((size_t)o->reps * sizeof *secs);
    sdpa_ctx *ctx = NULL;
    sdpa_ctx_params cp = {0};
    cp.n_threads = o->compare_threads;
    /* mpirun binds each rank to its own core by default: the one process gets the CPUs of
     * all the ranks together, the hardware the ring ran on */
    uint64_t mine[CPU_WORDS], every[CPU_WORDS] = {0};
    for (int s = 0; s < p; s++)
        for (int w = 0; w < CPU_WORDS; w++)
            every[w] |= masks[(int64_t)s * CPU_WORDS + w];
    char was[64], now[64];
    const int had = cpus_allowed(mine), all_cpus = cpu_list(every, now, sizeof now);
    const int widened = had > 0 && all_cpus > had && cpus_widen(every);
    cpu_list(mine, was, sizeof was);
    if (!alloc_local(&x, o, L, o->backward) || secs == NULL) {
        fprintf(stderr, "ring: rank 0: no memory for --compare\n");
        free_local(&x);
        free(secs);
        return 1;
    }
    sdpa_status st = sdpa_ctx_create(&cp, &ctx);
    const char *what = "sdpa_ctx_create";
    for (int64_t i = 0; i < L; i++)
        x.pos[i] = i;
    fill(o, 0, o->H, L, x.pos, x.q);
    fill(o, 1, o->Hkv, L, x.pos, x.k);
    fill(o, 2, o->Hkv, L, x.pos, x.v);
    if (o->backward)
        fill(o, 3, o->H, L, x.pos, x.dout);
    const sdpa_tensor q = sdpa_tensor_bhld(x.q, SDPA_F32, 1, o->H, L, o->D);
    const sdpa_tensor k = sdpa_tensor_bhld(x.k, SDPA_F32, 1, o->Hkv, L, o->D);
    const sdpa_tensor v = sdpa_tensor_bhld(x.v, SDPA_F32, 1, o->Hkv, L, o->D);
    sdpa_tensor out = sdpa_tensor_bhld(x.o, SDPA_F32, 1, o->H, L, o->D);
    sdpa_tensor lse = sdpa_tensor_bhld(x.lse, SDPA_F32, 1, o->H, L, 1);
    sdpa_params params = {0};
    params.causal = o->causal;
    double fwd = 0.0, bwd = 0.0;
    for (int i = -1; i < o->reps && st == SDPA_OK; i++) {
        const double t0 = MPI_Wtime();
        what = "sdpa_forward";
        st = sdpa_forward(ctx, &q, &k, &v, &params, &out, &lse);
        if (i >= 0)
            secs[i] = MPI_Wtime() - t0;
    }
    if (st == SDPA_OK)
        fwd = median_of(secs, o->reps);
    if (o->backward) {
        const sdpa_tensor dout = sdpa_tensor_bhld(x.dout, SDPA_F32, 1, o->H, L, o->D);
        sdpa_tensor dq = sdpa_tensor_bhld(x.dq, SDPA_F32, 1, o->H, L, o->D);
        sdpa_tensor dk = sdpa_tensor_bhld(x.dk, SDPA_F32, 1, o->Hkv, L, o->D);
        sdpa_tensor dv = sdpa_tensor_bhld(x.dv, SDPA_F32, 1, o->Hkv, L, o->D);
        for (int i = -1; i < o->reps && st == SDPA_OK; i++) {
            const double t0 = MPI_Wtime();
            what = "sdpa_backward";
            st = sdpa_backward(ctx, &q, &k, &v, &out, &lse, &dout, &params, &dq, &dk, &dv);
            if (i >= 0)
                secs[i] = MPI_Wtime() - t0;
        }
        if (st == SDPA_OK)
            bwd = median_of(secs, o->reps);
    }
    int code = 0;
    if (st != SDPA_OK) {
        fprintf(stderr, "ring: rank 0: %s: %s (%s)\n", what, sdpa_status_name(st),
                sdpa_ctx_last_error(ctx));
        code = 1;
    } else {
        double ring = 0.0, ring_b = 0.0, flops = 0.0;
        for (int s = 0; s < p; s++) {
            const double *f = all + (int64_t)s * R_COUNT;
            ring = f[R_FWD + D_SECONDS] > ring ? f[R_FWD + D_SECONDS] : ring;
            ring_b = f[R_BWD + D_SECONDS] > ring_b ? f[R_BWD + D_SECONDS] : ring_b;
            flops += f[R_FLOPS];
        }
        const int cpus = widened ? all_cpus : had;
        printf("\ncompare: one process on the whole sequence (rank 0, %d threads on CPUs %s, %s)\n",
               sdpa_ctx_n_threads(ctx), widened ? now : was, sdpa_ctx_kernel(ctx));
        if (widened)
            printf("  (rank 0 was bound to CPUs %s: widened to the ranks' CPUs together)\n", was);
        if (cpus > 0 && sdpa_ctx_n_threads(ctx) > cpus)
            printf("note: %d threads on %d CPU(s)\n", sdpa_ctx_n_threads(ctx), cpus);
        printf("  sdpa_forward:  %10.2f ms  %9.2f GFLOP/s   ring / single = %.3f\n", fwd * 1e3,
               flops / fwd * 1e-9, ring / fwd);
        if (o->backward)
            printf("  sdpa_backward: %10.2f ms  %9.2f GFLOP/s   ring / single = %.3f\n", bwd * 1e3,
                   2.5 * flops / bwd * 1e-9, ring_b / bwd);
        const double d = max_diff(o_ring, x.o, nq);
        const int bad = !(d <= 1e-4);
        printf("  check O:  max |ring - single| = %.3g (largest |O| %.3g, limit 1e-4): %s\n", d,
               max_abs(x.o, nq), bad ? "FAILED" : "ok");
        code = bad;
        if (o->backward) {
            const char *names[3] = {"dQ", "dK", "dV"};
            const float *ref[3] = {x.dq, x.dk, x.dv};
            const int64_t sizes[3] = {nq, nk, nk};
            for (int g = 0; g < 3; g++) {
                const double e = max_diff(g_ring[g], ref[g], sizes[g]);
                const double big = max_abs(ref[g], sizes[g]);
                const int worse = !(e <= 1e-4 * big);
                printf("  check %s: max |ring - single| = %.3g (largest |%s| %.3g, limit 1e-4 of "
                       "it): %s\n",
                       names[g], e, names[g], big, worse ? "FAILED" : "ok");
                code |= worse;
            }
        }
    }
    sdpa_ctx_destroy(ctx);
    free_local(&x);
    free(secs);
    return code;
}

/* --compare: the ring's results in global order on rank 0, then one process there while the
 * other ranks sleep. @return rank 0's verdict, on every rank (the exit status). */
static int gather_and_compare(const options *o, int p, int rank, const local *x, const double *all,
                              const uint64_t *masks) {
    const int64_t heads = o->H > o->Hkv ? o->H : o->Hkv;
    float *got[4] = {NULL, NULL, NULL, NULL}, *tmp = NULL;
    int64_t *pos = NULL;
    int have = 1, code = 1;
    if (rank == 0) {
        tmp = floats(heads * o->L * o->D);
        pos = malloc((size_t)o->L * sizeof *pos);
        for (int g = 0; g < 1 + 3 * o->backward; g++)
            have = have && (got[g] = floats(heads * o->L * o->D)) != NULL;
        have = have && tmp != NULL && pos != NULL;
    }
    MPI_Bcast(&have, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (have) {
        gather_rows(o, p, rank, o->H, x->o, x->n, got[0], tmp, pos);
        if (o->backward) {
            gather_rows(o, p, rank, o->H, x->dq, x->n, got[1], tmp, pos);
            gather_rows(o, p, rank, o->Hkv, x->dk, x->n, got[2], tmp, pos);
            gather_rows(o, p, rank, o->Hkv, x->dv, x->n, got[3], tmp, pos);
        }
        free(tmp);
        tmp = NULL;
        if (rank == 0)
            code = compare(o, all, masks, p, got[0], got + 1);
        /* nonblocking on every rank (an Ibcast matches only Ibcasts), and quiet */
        MPI_Request rq;
        MPI_Ibcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD, &rq);
        wait_quietly(&rq);
    } else if (rank == 0) {
        fprintf(stderr, "ring: rank 0: no memory for --compare\n");
    }
    free(tmp);
    free(pos);
    for (int g = 0; g < 4; g++)
        free(got[g]);
    return code;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int p, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    options o;
    const int parsed = parse(argc, argv, p, rank, &o);
    if (parsed != 0) {
        if (parsed == 1 && rank == 0)
            usage(stdout);
        MPI_Finalize();
        return parsed == 1 ? 0 : 2;
    }

    /* this rank's blocks, the buffers of the measurements, its context */
    local x;
    const int64_t n = positions(o.layout, p, rank, o.L, NULL);
    int ok = alloc_local(&x, &o, n, o.backward);
    sdpa_mpi_step *steps = malloc((size_t)o.reps * (size_t)p * sizeof *steps);
    sdpa_mpi_stats *stats = malloc((size_t)o.reps * sizeof *stats);
    double *secs = malloc((size_t)o.reps * sizeof *secs);
    double *med = calloc((size_t)p * 3, sizeof *med);
    int64_t *bytes = malloc((size_t)p * sizeof *bytes), max_bytes = 0;
    for (int s = 0; s < p && bytes != NULL; s++) {
        bytes[s] = 2 * o.Hkv * positions(o.layout, p, s, o.L, NULL) * o.D * (int64_t)sizeof(float);
        max_bytes = bytes[s] > max_bytes ? bytes[s] : max_bytes;
    }
    char *shift[2] = {malloc((size_t)max_bytes + 1), malloc((size_t)max_bytes + 1)};
    ok = ok && steps && stats && secs && med && bytes && shift[0] && shift[1];
    sdpa_ctx *ctx = NULL;
    sdpa_ctx_params cp = {0};
    cp.n_threads = o.threads;
    sdpa_status st = ok ? sdpa_ctx_create(&cp, &ctx) : SDPA_ERR_NOMEM;
    if (st != SDPA_OK)
        fprintf(stderr, "ring: rank %d: setup: %s\n", rank, sdpa_status_name(st));
    int all_ok = 0;
    ok = st == SDPA_OK;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    int code = all_ok ? 0 : 1;

    double fig[R_COUNT] = {0};
    if (code == 0) {
        positions(o.layout, p, rank, o.L, x.pos);
        fill(&o, 0, o.H, n, x.pos, x.q);
        fill(&o, 1, o.Hkv, n, x.pos, x.k);
        fill(&o, 2, o.Hkv, n, x.pos, x.v);
        if (o.backward)
            fill(&o, 3, o.H, n, x.pos, x.dout);
        fig[R_N] = (double)n;
        fig[R_FLOPS] = flops_of(&o, n, x.pos);
        for (int pass = 0; pass < 1 + o.backward && code == 0; pass++) {
            st = time_ring(ctx, &o, p, &x, pass, steps, stats, secs);
            if (st != SDPA_OK) {
                fprintf(stderr, "ring: rank %d: %s: %s (%s)\n", rank,
                        pass ? "sdpa_mpi_backward" : "sdpa_mpi_forward", sdpa_status_name(st),
                        sdpa_ctx_last_error(ctx));
                code = 1;
            } else {
                summarise(&o, p, steps, stats, secs, fig + (pass ? R_BWD : R_FWD),
                          pass ? NULL : med);
            }
        }
    }
    if (code == 0) {
        /* communication alone: the ring's K/V bytes, no compute */
        memset(shift[0], 1, (size_t)max_bytes);
        memset(shift[1], 2, (size_t)max_bytes);
        for (int i = -1; i < o.reps; i++) {
            MPI_Barrier(MPI_COMM_WORLD);
            const double t = shift_ring(p, rank, bytes, shift);
            if (i >= 0)
                secs[i] = t;
        }
        fig[R_COMM] = median_of(secs, o.reps);
        fig[R_RSS] = peak_rss();
        fig[R_THREADS] = sdpa_ctx_n_threads(ctx);
        uint64_t mask[CPU_WORDS];
        fig[R_CPUS] = cpus_allowed(mask);
        uint64_t *masks = rank == 0 ? malloc((size_t)p * CPU_WORDS * sizeof *masks) : NULL;
        MPI_Gather(mask, CPU_WORDS, MPI_UINT64_T, masks, CPU_WORDS, MPI_UINT64_T, 0,
                   MPI_COMM_WORLD);

        double *all = rank == 0 ? malloc((size_t)p * R_COUNT * sizeof *all) : NULL;
        double *all_steps = rank == 0 ? malloc((size_t)p * (size_t)p * 3 * sizeof *all) : NULL;
        MPI_Gather(fig, R_COUNT, MPI_DOUBLE, all, R_COUNT, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        MPI_Gather(med, 3 * p, MPI_DOUBLE, all_steps, 3 * p, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            char cpu[256];
            cpu_model(cpu, sizeof cpu);
            printf("ring: %s | P %d | threads/rank %d (%s) | L %lld H %lld Hkv %lld D %lld f32 | "
                   "layout %s | causal %s | result in %s | sdpa %s\n",
                   cpu, p, sdpa_ctx_n_threads(ctx), sdpa_ctx_kernel(ctx), (long long)o.L,
                   (long long)o.H, (long long)o.Hkv, (long long)o.D, sdpa_mpi_layout_name(o.layout),
                   o.causal ? "yes" : "no", o.in_output ? "output" : "scratch", sdpa_version());
            print_ranks(&o, p, all, all_steps, masks);
            fflush(stdout);
        }

        if (o.compare)
            code = gather_and_compare(&o, p, rank, &x, all, masks);
        free(all);
        free(all_steps);
        free(masks);
    }

    sdpa_ctx_destroy(ctx);
    free_local(&x);
    free(steps);
    free(stats);
    free(secs);
    free(med);
    free(bytes);
    free(shift[0]);
    free(shift[1]);
    MPI_Finalize();
    return code;
}
