/*
 * sdpa_mpi.h — context-parallel ("ring") attention over MPI: libsdpa_mpi.
 *
 * A sequence too long for one process is cut along its length over the P ranks of an MPI
 * communicator. Each rank holds a block of the queries, keys and values (and, for the
 * backward, of the output, its LSE and the output's gradient). The key/value blocks travel
 * around the ring of ranks, rank r sending to r + 1 and receiving from r - 1, while each rank
 * computes its queries against the block it holds and merges the partial results by their
 * log-sum-exp (sdpa_merge's rule). After P steps every rank holds the exact attention of its
 * queries over the whole sequence. The backward sends the key/value gradients around the same
 * ring behind their blocks, and home at the end. (Ring attention: Liu, Zaharia and Abbeel,
 * 2023; the striped layout: Brandon et al., 2023.)
 *
 * Build: CMake builds libsdpa_mpi (static, it links libsdpa's static library) when it finds
 * MPI (-DSDPA_MPI=AUTO, the default; ON requires it, OFF skips it). The core library never
 * depends on it. Programs are started with mpirun; see examples/mpi/ring.c.
 *
 * Semantics are those of sdpa_forward and sdpa_backward (sdpa.h) applied to the gathered
 * sequence: every position-based feature -- causal in both alignments, the window, ALiBi --
 * uses global positions; softcap, scale, GQA, Dk != Dv and the dtypes (f32, f16, bf16 in any
 * mix the core accepts, any strides) work as there. Not offered here, SDPA_ERR_UNSUPPORTED:
 * a mask tensor, dropout and attention sinks.
 *
 * Determinism: for a given number of ranks and layout, results are bitwise identical on every
 * run and for any thread count of each rank's context. The partial results merge in a fixed
 * order (the ring's), and key/value gradients add up in a fixed order too. Results differ in
 * the last bits from one process's sdpa_forward on the gathered sequence (a different order of
 * the same sums), within the accuracy rule of the core.
 *
 * Errors: every rank returns the same status. Before any data moves, the ranks exchange a
 * summary of their arguments (one MPI_Allgather): an argument that fails the core's checks on
 * one rank makes every rank return that status (its message names the rank), and shapes,
 * dtypes or parameters that differ between ranks give SDPA_ERR_MISMATCH on every rank, with a
 * message naming both ranks and the values. A failing MPI call gives SDPA_ERR_MPI with MPI's
 * message. The calls work on a duplicate of comm with MPI_ERRORS_RETURN, so the caller's
 * communicator and its error handler are left as they were, and no message of the ring meets
 * the caller's. Outputs are written only once every rank has succeeded; an error leaves them
 * untouched on every rank (except after a failing MPI call, which MPI may not report on every
 * rank alike; and see SDPA_MPI_ACCUMULATE_IN_OUTPUT, which gives up this guarantee for out or
 * dq in exchange for memory).
 *
 * Threads: the calls are collective over comm, and hold ctx for their whole duration (another
 * call on it returns SDPA_ERR_BUSY). MPI must be initialised; any thread level will do, as
 * only the calling thread makes MPI calls.
 */
#ifndef SDPA_MPI_H
#define SDPA_MPI_H

#include "sdpa.h"

#include <mpi.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How the positions of a sequence of length L are dealt to the P ranks. Queries and keys are
 * dealt alike, each by its own length (Lq and Lk of the gathered sequence are the sums of the
 * ranks' local lengths). Every rank holds at least one position of each.
 *   SDPA_MPI_CONTIGUOUS  rank r holds a run of consecutive positions, after rank r - 1's; the
 *                        runs may differ in length.
 *   SDPA_MPI_STRIPED     rank r holds positions r, r + P, r + 2P, ... (ceil((L - r) / P)
 *                        of them): causal work is balanced.
 *   SDPA_MPI_ZIGZAG      the sequence is cut in 2P chunks, chunk c holding positions
 *                        [floor(c L / 2P), floor((c + 1) L / 2P)); rank r holds chunks r and
 *                        2P - 1 - r, in that order: causal work is balanced.
 * A rank whose local length differs from its layout's gets SDPA_ERR_SHAPE (on every rank). */
typedef enum sdpa_mpi_layout {
    SDPA_MPI_CONTIGUOUS = 0,
    SDPA_MPI_STRIPED = 1,
    SDPA_MPI_ZIGZAG = 2
} sdpa_mpi_layout;

/* What one step of the ring cost this rank. */
typedef struct sdpa_mpi_step {
    double compute_seconds; /* attention on the block held, merges and sums included */
    double wait_seconds;    /* blocked in MPI after computing, until the step's messages arrived */
    int64_t bytes_sent, bytes_received;
    int64_t pairs; /* block pairs computed: 0 where the causal rule or the window hides all */
} sdpa_mpi_step;

/* Optional measurements of a call, for benchmarks (NULL = none taken). */
typedef struct sdpa_mpi_stats {
    sdpa_mpi_step *steps; /* in: an array of max_steps entries, or NULL */
    int max_steps;        /* in */
    int n_steps;          /* out: the steps taken (P, the number of ranks); the first
                             min(n_steps, max_steps) entries of steps are filled */
    double total_seconds; /* out: the whole call on this rank, the argument check included */
    int64_t bytes_sent, bytes_received; /* out: the call's messages, this rank */
    int64_t scratch_bytes;              /* out: memory the ring allocated on this rank */
} sdpa_mpi_stats;

/* Flags of sdpa_mpi_options.flags, ORed; 0 = none. */
typedef enum sdpa_mpi_flag {
    /* Keep the running result in the caller's output instead of an f32 accumulator of the
     * same size in scratch: the forward's O in out when out is F32 (saving B Hq nq_r Dv x 4
     * bytes), the backward's dQ in dq when dq is F32 (saving B Hq nq_r Dk x 4 bytes); any
     * strides the call accepts will do. For an F16 or BF16 out (dq) the flag changes nothing:
     * the accumulator is allocated as without it. The results are bitwise those of the call
     * without the flag (the same operations in the same order). The forward's running LSE
     * stays in scratch, in double as without the flag (B Hq nq_r x 8 bytes; keeping it in an
     * F32 lse would round it between merges and change the bits), and lse is written at the
     * end as without the flag.
     * What the caller gives up: the guarantee that out (dq) is untouched when the call fails.
     * Argument errors, on any rank, and a rank short of scratch memory are still found before
     * anything is written, and then out (dq) is untouched on every rank. But once the ring has
     * started, out (dq) holds a partial sum: an MPI failure mid-ring, or an error in a step's
     * computation, returns the error (the latter on every rank) and may leave out (dq)
     * partially written on any rank. lse, dk and dv are still written only on success. The
     * flag may differ between ranks. */
    SDPA_MPI_ACCUMULATE_IN_OUTPUT = 1 << 0
} sdpa_mpi_flag;

/* Options of sdpa_mpi_forward_opt and sdpa_mpi_backward_opt. A zero-initialised struct, or a
 * NULL pointer, means the defaults: the behaviour of sdpa_mpi_forward and sdpa_mpi_backward.
 * Fields added later keep zero as the default. */
typedef struct sdpa_mpi_options {
    unsigned flags; /* sdpa_mpi_flag values ORed; an unknown bit gives SDPA_ERR_PARAM */
} sdpa_mpi_options;

/* The attention of this rank's queries over the whole sequence, collectively over comm.
 *   q:    (B, Hq, nq_r, Dk) this rank's queries, dealt by layout
 *   k, v: (B, Hkv, nk_r, Dk) and (B, Hkv, nk_r, Dv) this rank's keys and values
 *   out:  (B, Hq, nq_r, Dv) written: this rank's rows of the result
 *   lse:  NULL or (B, Hq, nq_r, 1) F32, written
 * B, Hq, Hkv, Dk, Dv, the dtypes, layout and every field of params must agree on all ranks
 * (alibi_slopes by value).
 * @return SDPA_OK on every rank, or the same error on every rank (see Errors above). */
SDPA_API sdpa_status sdpa_mpi_forward(sdpa_ctx *ctx, MPI_Comm comm, sdpa_mpi_layout layout,
                                      const sdpa_tensor *q, const sdpa_tensor *k,
                                      const sdpa_tensor *v, const sdpa_params *params,
                                      sdpa_tensor *out, sdpa_tensor *lse, sdpa_mpi_stats *stats);

/* sdpa_mpi_forward with options (NULL = the defaults; see sdpa_mpi_flag). */
SDPA_API sdpa_status sdpa_mpi_forward_opt(sdpa_ctx *ctx, MPI_Comm comm, sdpa_mpi_layout layout,
                                          const sdpa_tensor *q, const sdpa_tensor *k,
                                          const sdpa_tensor *v, const sdpa_params *params,
                                          sdpa_tensor *out, sdpa_tensor *lse,
                                          const sdpa_mpi_options *options, sdpa_mpi_stats *stats);

/* The gradients of this rank's blocks, collectively over comm, for out and lse as
 * sdpa_mpi_forward wrote them with the same comm, layout and params.
 *   dout: (B, Hq, nq_r, Dv) the gradient of this rank's output rows
 *   dq:   (B, Hq, nq_r, Dk), dk: (B, Hkv, nk_r, Dk), dv: (B, Hkv, nk_r, Dv) written
 * Each key/value block's gradient sums the contributions of the ranks in ring order.
 * @return as sdpa_mpi_forward. */
SDPA_API sdpa_status sdpa_mpi_backward(sdpa_ctx *ctx, MPI_Comm comm, sdpa_mpi_layout layout,
                                       const sdpa_tensor *q, const sdpa_tensor *k,
                                       const sdpa_tensor *v, const sdpa_tensor *out,
                                       const sdpa_tensor *lse, const sdpa_tensor *dout,
                                       const sdpa_params *params, sdpa_tensor *dq, sdpa_tensor *dk,
                                       sdpa_tensor *dv, sdpa_mpi_stats *stats);

/* sdpa_mpi_backward with options (NULL = the defaults; see sdpa_mpi_flag). */
SDPA_API sdpa_status sdpa_mpi_backward_opt(sdpa_ctx *ctx, MPI_Comm comm, sdpa_mpi_layout layout,
                                           const sdpa_tensor *q, const sdpa_tensor *k,
                                           const sdpa_tensor *v, const sdpa_tensor *out,
                                           const sdpa_tensor *lse, const sdpa_tensor *dout,
                                           const sdpa_params *params, sdpa_tensor *dq,
                                           sdpa_tensor *dk, sdpa_tensor *dv,
                                           const sdpa_mpi_options *options, sdpa_mpi_stats *stats);

/* @return the layout's name ("contiguous", "striped", "zigzag") or "unknown". */
SDPA_API const char *sdpa_mpi_layout_name(sdpa_mpi_layout layout);

#ifdef __cplusplus
}
#endif

#endif /* SDPA_MPI_H */
