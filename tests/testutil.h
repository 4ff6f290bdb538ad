/*
 * testutil.h — what the tests share: owned tensors with random contents, an independent naive
 * implementation of attention (the "same-precision baseline" of testing.md, materialising
 * S and P), the golden (the library's reference, src/ref/, called directly so it stays the
 * oracle when faster paths are dispatched), and the tolerance rule of testing.md.
 */
#ifndef SDPA_TESTUTIL_H
#define SDPA_TESTUTIL_H

#include "sdpa.h"

#include <stddef.h>
#include <stdint.h>

/* ---- random numbers (splitmix64: small, seedable, the same everywhere) ---------------- */
typedef struct tu_rng {
    uint64_t s;
} tu_rng;

uint64_t tu_next(tu_rng *r);
double tu_uniform(tu_rng *r); /* [0, 1) */
double tu_randn(tu_rng *r);   /* standard normal */

/* ---- owned tensors ---------------------------------------------------------------------- */
typedef enum tu_layout { TU_BHLD, TU_BLHD } tu_layout;

/* A tensor view plus the buffer it owns. `pad` extra elements after each row of D
 * (row stride D + pad), `offset` elements before the first (odd base offsets). */
typedef struct tu_tensor {
    sdpa_tensor t;
    void *buf;
    size_t bytes;
} tu_tensor;

tu_tensor tu_alloc(sdpa_dtype dt, int64_t b, int64_t h, int64_t l, int64_t d, tu_layout layout,
                   int64_t pad, int64_t offset);
void tu_free(tu_tensor *t);

/* Element access as double (BOOL reads 0/1); set rounds to the dtype (BOOL: x != 0). */
double tu_get(const sdpa_tensor *t, int64_t b, int64_t h, int64_t l, int64_t d);
void tu_set(sdpa_tensor *t, int64_t b, int64_t h, int64_t l, int64_t d, double x);

/* Fills every element: randn * scale + shift. */
void tu_fill_randn(tu_tensor *t, tu_rng *r, double scale, double shift);
/* Fills every byte with a canary pattern / checks that it is still there. */
void tu_fill_canary(tu_tensor *t);
int tu_is_canary(const tu_tensor *t);
/* Every element of t written (not `fill` in every one of its bytes) and every byte of the
 * buffer around them still `fill` (tu_fill_canary's is 0xA5). */
int tu_written_exactly(const tu_tensor *t, unsigned char fill);

/* Copies every element of src into dst, which has src's shape (any strides and dtypes: a
 * broadcast view is materialised, a reversed view reversed, values rounded to dst's dtype). */
void tu_copy(sdpa_tensor *dst, const sdpa_tensor *src);

/* ---- one problem's tensors -------------------------------------------------------------- */

/* The extents of a problem: q (B, Hq, Lq, Dk), k (B, Hkv, Lk, Dk), v (B, Hkv, Lk, Dv). */
typedef struct tu_dims {
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
} tu_dims;

/* The arguments of one sdpa_forward call, owned: q, k, v as tu_dims says, out o
 * (B, Hq, Lq, Dv) and lse (B, Hq, Lq, 1), all F32 and contiguous (B, H, L, D), and params p
 * (zero: the defaults). */
typedef struct tu_problem {
    tu_tensor q, k, v, o, lse;
    sdpa_params p;
} tu_problem;

/* Allocates a problem; with r, fills q, k and v (in that order) with standard normal values,
 * else leaves every tensor zero. */
tu_problem tu_problem_new(tu_dims d, tu_rng *r);
void tu_problem_free(tu_problem *pb);
/* sdpa_forward(ctx, q, k, v, &p, o, lse) on the problem's tensors. */
sdpa_status tu_problem_forward(sdpa_ctx *ctx, tu_problem *pb);

/* ---- computing attention three ways ----------------------------------------------------- */

/* The independent naive implementation: S = softcap(scale Q K^T) + alibi + mask materialised
 * per head, visibility from the window rule, softmax, P V. With lp_dtype = -1 every operation
 * is in double; with an sdpa_dtype, sums are accumulated in float and S, P and O are rounded
 * to that dtype (the same-precision baseline of testing.md). Writes out (B, Hq, Lq, Dv) and
 * lse (B, Hq, Lq) as doubles. */
void tu_naive_forward(const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                      const sdpa_params *params, int lp_dtype, double *out, double *lse);

/* The same for the weights alone (B, Hq, Lq, Lk): p_ij, 0 where hidden, NaN where a NaN row
 * sees. */
void tu_naive_weights(const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_params *params,
                      int lp_dtype, double *weights);

/* The golden: the library's reference implementation, called directly (not through the
 * dispatcher). out and lse are F32 tensors the caller allocated (lse may be NULL).
 * @return the status of validation or of the reference. */
sdpa_status tu_golden_forward(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                              const sdpa_tensor *v, const sdpa_params *params, sdpa_tensor *out,
                              sdpa_tensor *lse);

/* The golden weights: the reference's sdpa_weights (in double), called directly; weights is
 * an F32 tensor (B, Hq, Lq, Lk) the caller allocated. */
sdpa_status tu_golden_weights(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                              const sdpa_params *params, sdpa_tensor *weights);

/* The golden gradients: the library's reference backward (src/ref/, in double; it recomputes
 * from q, k and v, and validates out and lse as sdpa_backward does) into dq, dk and dv.
 * @return the status of validation or of the reference. */
sdpa_status tu_golden_backward(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                               const sdpa_tensor *v, const sdpa_tensor *out, const sdpa_tensor *lse,
                               const sdpa_tensor *dout, const sdpa_params *params, sdpa_tensor *dq,
                               sdpa_tensor *dk, sdpa_tensor *dv);

/* ---- the tolerance rule of testing.md ----------------------------------------------------- */

/* Compares n values of `test` (stored in dtype, read as double) with `golden`, given the
 * same-precision baseline `lp`: err(x) = max |x - golden| over finite golden values;
 * floor = 2 max |round_dt(golden + 0.3) - 0.3 - golden|, but at least one ulp of the dtype at
 * max |golden| + 0.3 (what it estimates; a handful of values can make it ~0); passes iff
 * err(test) <= k * err(lp) + floor, non-finite values sit at the same positions and NMSE
 * (if nmse_gate > 0) is at most nmse_gate. Prints one line with the figures.
 * @return 1 on pass. */
int tu_rule(const char *what, const double *test, const double *lp, const double *golden, size_t n,
            sdpa_dtype dt, double k, double nmse_gate);

/* |x - g| within an f32 ulp of g (both computed in double, x rounded once to f32) for n values,
 * non-finite values equal; prints how many differ and one of them. @return 1 when none does. */
int tu_within_ulp(const char *what, const double *x, const double *g, size_t n);

/* Reads a whole (B, H, L, D) tensor into a contiguous double array (caller frees). */
double *tu_to_doubles(const sdpa_tensor *t);

/* The oracles' rounding: x rounded to the precision of lp_dtype (F32, F16, BF16; -1 keeps
 * double), and an accumulator's next value (f32 for every storage precision, as half-precision
 * math accumulates in f32; double for -1). */
double tu_round(int lp_dtype, double x);
double tu_acc_round(int lp_dtype, double x);
/* The mask value at (b, h, i, j) of a (B, Hq, Lq, Lk) mask, broadcasting extents of 1. */
double tu_mask_at(const sdpa_tensor *m, int64_t b, int64_t h, int64_t i, int64_t j);

/* malloc(n), at least one byte, or the test program exits (status 2) saying so. */
void *tu_xmalloc(size_t n);

/* Creates a context or aborts the test program (tests only). */
sdpa_ctx *tu_ctx(int n_threads, sdpa_isa max_isa);

/* An allocator for sdpa_ctx_params that fails every request while `fail` is set (after the
 * context has been made, say), and any request above `limit` bytes unless it is 0, noting the
 * largest request and whether it refused one; it counts the blocks outstanding, to check that
 * a failed call leaks nothing. */
typedef struct tu_failing_alloc {
    int fail;
    long outstanding;
    size_t limit, largest;
    int refused;
} tu_failing_alloc;

/* The hooks over fa: {alloc, free, fa}. */
sdpa_allocator tu_failing_allocator(tu_failing_alloc *fa);

/* ---- the registered implementations -------------------------------------------------------- */

struct sdpa__impl; /* src/dispatch/impl.h */

/* A fast implementation the build registered (src/dispatch/dispatch.c), and whether this CPU
 * runs it: tests loop over these instead of naming the tables, so a new table is tested
 * where it is registered. */
typedef struct tu_impl {
    const struct sdpa__impl *impl;
    const char *name;  /* "flash-avx2" */
    sdpa_isa level;    /* the max_isa that selects it: tu_ctx(n, level) runs it when `runs` */
    int runs;          /* a context capped at `level` dispatches to it on this CPU */
    char missing[128]; /* when it does not: the CPU features it lacks */
    /* What it does itself. A context capped at its level hands the rest to the table below it,
     * which the tests visit under that table's own name: */
    int weights, backward; /* it has an sdpa_weights (sdpa_backward) of its own */
    int own_uk;            /* its micro-kernels are no earlier entry's (flash-amx drives
                              flash-avx512's) */
} tu_impl;

enum { TU_MAX_IMPLS = 16 };

/* Fills out[] with the registered implementations but the reference, in preference order
 * (best last). @return their number. */
int tu_impls(tu_impl out[TU_MAX_IMPLS]);

/* Whether t computes this forward itself: not where it takes only some problems (flash-amx:
 * bf16 Q, K and V) and this is not one of them. Arguments sdpa_forward would refuse: 1 (the
 * call reports them). */
int tu_impl_takes(const tu_impl *t, const sdpa_tensor *q, const sdpa_tensor *k,
                  const sdpa_tensor *v, const sdpa_params *params, const sdpa_tensor *out);
/* The same for sdpa_forward_kv over a cache descriptor. */
int tu_impl_takes_kv(const tu_impl *t, const sdpa_tensor *q, const sdpa_kv_cache *cache,
                     const sdpa_params *params, const sdpa_tensor *out);

/* Prints one line per implementation: "runs", or "skipped: the CPU lacks ...". */
void tu_report_impls(void);

/* ---- scratch directories (the tests of the command's files) -------------------------------- */

/* Makes a new directory $TMPDIR/PREFIXxxxxxx (/tmp when TMPDIR is unset) and writes its path
 * to dir. @return 0, or -1 with errno from mkdtemp. */
int tu_scratch_dir(char *dir, size_t cap, const char *prefix);

/* The entries of dir other than . and .., only those whose name contains `part` unless it is
 * NULL. @return their number, or -1 if dir cannot be read. */
int tu_count_entries(const char *dir, const char *part);

/* Removes every entry of dir (files and empty directories), then dir. @return 0, or -1. */
int tu_remove_dir(const char *dir);

#endif /* SDPA_TESTUTIL_H */
