/*
 * fuzz_api.h — what the parts of the API fuzz target share: the case it draws from the input
 * (shapes, tensors with their layouts, parameters, injected values, the arguments made invalid
 * on purpose) and the functions of each part:
 *   fuzz_api.c          the target: draws a case, calls the library, checks, reports;
 *   fuzz_api_draw.c     the input's bytes turned into a case (the mapping the corpus relies on);
 *   fuzz_api_draw_leftover.c
 *                       the backward's and the KV call's draws, from the bytes left over
 *                       (what the two files of draws share: fuzz_api_draw.h);
 *   fuzz_api_tensor.c   tensors: strides from a layout, exact-size buffers, canaries and the
 *                       check that nothing was written between elements;
 *   fuzz_api_check.c    the oracle: statuses, untouched inputs, the rule against the golden,
 *                       determinism, the attention weights;
 *   fuzz_api_backward.c the backward's oracle: sdpa_backward's statuses, untouched outputs and
 *                       inputs, dq, dk, dv against the reference backward, the same bytes again;
 *   fuzz_api_kv.c       sdpa_forward_kv on the case's tensors as a ragged or paged KV cache.
 * A change to the draw changes what every file of tests/fuzz/corpus/api means.
 */
#ifndef SDPA_FUZZ_API_H
#define SDPA_FUZZ_API_H

#include "sdpa.h"
#include "testutil.h"

#include <stddef.h>
#include <stdint.h>

/* B*Hq*Lq*Lk*(Dk+Dv+4) above this is shrunk: the golden and the naive baseline are O(that)
 * in double with per-element loads (the 4 stands for a score's own costs: exp, mask, window),
 * and the fuzzer must stay above ~1000 executions/s. 129 x 129 tiles with Dk = Dv = 1 fit. */
#define FZ_MAX_WORK ((int64_t)100000)

/* The backward is run (when its arguments are valid) only while B*Hq*Lq*Lk*(Dk+Dv+4) is at
 * most this: each valid backward costs three calls, the golden (the reference backward, in
 * double), the oracle's own double backward with its error bounds and, where a gradient is
 * not within the floor, a same-precision baseline per dtype, all O(that) and under ASan.
 * 40000 keeps two thirds (the committed corpus) to four fifths (a fresh run's) of the valid
 * cases at about two thirds of the forward-only executions/s; 65 x 65 (two of the tiled
 * backward's blocks of 64 each way) with Dk = Dv = 2 fits. Above it, invalid arguments are still
 * passed (they are refused before any work). */
#define FZ_MAX_BWD_WORK ((int64_t)40000)

/* How a tensor's strides are made from its shape. */
typedef struct fz_layout {
    int base;      /* 0: (B, H, L, D) order; 1: (B, L, H, D); 2: D before L (transposed rows) */
    int64_t pad;   /* elements after each row: a view into a wider array */
    unsigned neg;  /* bit i: stride[i] negated (dimension i walked backwards) */
    unsigned zero; /* bit i: stride[i] = 0 (a broadcast view; refused for outputs) */
    int huge;      /* 1..5: a stride whose address span overflows (always refused) */
    int misalign;  /* data one byte past an element boundary */
    int overlap;   /* outputs: stride[2] = D - 1, so rows share memory */
} fz_layout;

typedef struct fz_tensor {
    const char *name;
    sdpa_tensor t;
    unsigned char *buf; /* exactly the bytes the view spans (+1 when misaligned) */
    size_t bytes;
    fz_layout ly;
    int used;         /* passed to the call */
    int is_input;     /* q, k, v or the mask */
    int null_tensor;  /* passed as a NULL pointer */
    int alias;        /* t.data points into another tensor's buffer */
    int64_t perturbd; /* -1, or the dimension whose extent was changed after allocation */
    int64_t perturbv; /* what it was changed to */
} fz_tensor;

typedef struct fz_injection {
    int tensor; /* 0 q, 1 k, 2 v, 3 mask */
    int kind;   /* 0 NaN, 1 +Inf, 2 -Inf, 3 +huge, 4 -huge */
    int64_t at[4];
} fz_injection;

/* Which calls an invalid argument must make fail. */
typedef enum fz_bad {
    FZ_BAD_COMMON, /* q or k: every call */
    FZ_BAD_PARAMS, /* the mask or the scalar parameters: every call, unless params is NULL */
    FZ_BAD_FWD,    /* v, out or lse: sdpa_forward, and sdpa_backward, which reads them */
    FZ_BAD_W,      /* the weights tensor: sdpa_weights only */
    FZ_BAD_OUT,    /* out or lse as an output (a stride 0, overlapping rows, aliasing):
                    * sdpa_forward only; sdpa_backward reads them, which is legal */
    FZ_BAD_BWD,    /* dout, dq, dk, dv or the lse passed to the backward: sdpa_backward only */
    FZ_BAD_COUNT
} fz_bad;

/* The tensors of a case by index, in the order q, k, v, mask, out, lse, w; then the
 * backward's: dout, dq, dk, dv, and the lse it reads when the forward's has none (blse). */
enum { FZ_Q, FZ_K, FZ_V, FZ_MASK, FZ_OUT, FZ_LSE, FZ_W, FZ_N_TENSORS };
enum { FZ_DOUT = FZ_N_TENSORS, FZ_DQ, FZ_DK, FZ_DV, FZ_BLSE, FZ_N_ALL };

typedef struct fz_case {
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    fz_tensor q, k, v, mask, out, lse, w;
    fz_tensor dout, dq, dk, dv; /* the backward's (fz_draw_backward) */
    fz_tensor blse;             /* the backward's lse when lse is not used: f32, contiguous */
    sdpa_params params;
    int params_null, ctx_null;
    float *slopes_buf;
    size_t slopes_bytes;
    int isa, t1, t2;
    int n_inj;
    fz_injection inj[4];
    int nonfinite;         /* NaN/Inf in Q, K, V or NaN/+Inf in an additive mask */
    int huge_qk;           /* huge finite values in Q or K */
    int huge_v;            /* a column of V near FLT_MAX: the accumulator overflows, O does not */
    int score_inf;         /* a Q row and a K row whose q.k is beyond f32 (draw_score_overflow) */
    int64_t inf_q[3];      /* that Q row: (b, h, i) */
    int64_t inf_k[3];      /* that K row: (b, hk, j) */
    double inf_qv, inf_kv; /* the value of every element of each */
    int bad[FZ_BAD_COUNT]; /* invalid arguments the generator put in, by the calls they fail */
    /* how many, and for the last of each kind the status and a part of the message it must
     * give when it is the only one (0 / NULL: not checked) */
    int n_bad[FZ_BAD_COUNT];
    sdpa_status want[FZ_BAD_COUNT];
    const char *want_msg[FZ_BAD_COUNT];
    int skip_weights;   /* a change that may be legal for sdpa_weights with memory it lacks */
    const char *why[8]; /* what made the arguments invalid, for the report */
    int n_why;
    /* the backward's (fz_draw_backward) */
    /* Dropout goes into the backward's params only (and those of the forward that gives it
     * out and lse), never into the case's: sdpa_forward and sdpa_weights on an input found
     * before keep their meaning (a forward with dropout runs on the reference). */
    float drop_p;
    uint64_t drop_seed, drop_offset;
    int drop_set;        /* drop_* go into the backward's params (not when params is NULL) */
    int dropout;         /* and drop_p is a valid probability > 0: weights are dropped */
    int dout_nonfinite;  /* NaN or Inf injected into dout */
    int64_t dout_inj[4]; /* where */
    int lse_odd;         /* the lse passed to the backward: 1 f16, 2 bf16, 3 shape[3] = 2,
                          * 4 shape[2] = Lq + 1 (a view of the right one) */
    size_t bwd_bytes;    /* input bytes the backward's draw took */
    /* the KV-cache call (issue 13; fz_draw_kv, drawn last, and fuzz_api_kv.c): sdpa_forward_kv
     * on the case's q, out and lse, with its k and v as a plain cache of ragged lengths or
     * scattered into a pool of pages, where sdpa_forward accepted the case */
    int kv;
    int64_t kv_page;            /* 0: the plain layout (no block table); else the page size */
    int kv_blhd;                /* the pool in (n_pages, page, Hkv, D) order */
    int kv_spare, kv_more;      /* spare pages in the pool; extra block-table entries */
    int kv_no_sk, kv_no_sq;     /* seqlens_k / seqlens_q passed as NULL */
    int32_t kv_sk[4], kv_sq[4]; /* the lengths (B <= 3) */
    int kv_sinks;               /* params.sinks = kv_sink */
    float kv_sink[16];          /* Hq <= 13 */
    int kv_bad;                 /* 0, or the length or entry made invalid (fuzz_api_kv.c) */
    unsigned kv_bad_at;
    uint32_t kv_seed; /* the pool's order and the unused entries' values */
    size_t kv_bytes;  /* input bytes the KV draw took */
} fz_case;

/* ---- fuzz_api.c ---- */

/* Reports a broken invariant with the case being run, and aborts for libFuzzer. */
void fz_violation(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2), noreturn))
#endif
    ;

/* ---- fuzz_api_draw.c ---- */

/* Draws the whole case from the input; best_isa caps the drawn ISA cap (a higher one would be
 * lowered silently and only duplicate a context). */
void fz_draw_case(fz_case *c, const uint8_t *data, size_t size, int best_isa);
void fz_free_case(fz_case *c);
/* Records an invalid argument: the calls named by `which` must fail. */
void fz_note_bad(fz_case *c, fz_bad which, const char *why);
/* The same, with the status (and a part of the message) the calls must give when it is the
 * only invalid argument they see. */
void fz_note_bad_status(fz_case *c, fz_bad which, const char *why, sdpa_status st, const char *msg);

/* ---- fuzz_api_tensor.c ---- */

/* Allocates f's buffer for shape sh and dtype dt under f->ly, exactly as large as the view
 * spans. Notes the tensor as bad for `which` calls when the layout makes it invalid, and for
 * `as_output` calls when only an output may not have it (a stride 0, overlapping rows);
 * `pick` chooses the dimension a huge stride goes to. */
void fz_alloc_tensor(fz_case *c, fz_tensor *f, sdpa_dtype dt, const int64_t sh[4], int output,
                     fz_bad which, fz_bad as_output, unsigned pick);
/* Whether f's elements can be written: a known dtype, memory behind the view, and aligned. */
int fz_fillable(const fz_tensor *f);
void fz_fill_canary(fz_tensor *f);
int fz_is_canary(const fz_tensor *f);
/* After a successful call: f's bytes outside its elements still hold the canary (ASan cannot
 * see a write into a row's padding). */
void fz_check_gaps(const fz_tensor *f, const char *call);

/* ---- fuzz_api_check.c ---- */

/* Is key j visible to query i of (b, h) by the window, causal and mask rules alone? */
int fz_visible(const fz_case *c, int64_t b, int64_t h, int64_t i, int64_t j);
/* Pointers as the calls receive them (NULL where the case says so). */
const sdpa_tensor *fz_arg(const fz_tensor *f);
sdpa_tensor *fz_arg_out(fz_tensor *f);
/* The status is documented, a failure leaves a message, and must_fail / must_pass hold. */
void fz_check_status(const fz_case *c, sdpa_status st, sdpa_ctx *ctx, const char *call,
                     int must_fail, int must_pass);

/* Copies of the inputs' bytes, to see that no call writes into them. */
typedef struct fz_snapshot {
    unsigned char *copy[5];
} fz_snapshot;
void fz_take_snapshot(const fz_case *c, fz_snapshot *s);
void fz_check_snapshot(const fz_case *c, const fz_snapshot *s, const char *call);
void fz_free_snapshot(fz_snapshot *s);

/* Checks an OK forward result on params pr (the case's, or the backward's with dropout)
 * against the golden and the baseline; returns the golden LSE (B*Hq*Lq doubles, caller
 * frees) for the weights check. */
double *fz_check_forward_result(fz_case *c, sdpa_ctx *ctx, const sdpa_params *pr);
/* Calls sdpa_forward again on ctx with fresh canaries; the outputs must equal `ref_*`. */
void fz_check_same_bytes(fz_case *c, sdpa_ctx *ctx, const unsigned char *ref_out,
                         const unsigned char *ref_lse, const char *what);
/* Calls sdpa_weights on the case and checks its status and rows (g_lse may be NULL). */
void fz_check_weights(fz_case *c, sdpa_ctx *ctx, const double *g_lse);

/* Shared with the backward's oracle. */
/* Non-finite values exactly where the golden has them (NaN and Inf not told apart). */
void fz_check_positions(const char *what, const double *test, const double *golden, size_t n);
/* The spacing of dtype dt's values at magnitude x (x > 0). */
double fz_ulp(sdpa_dtype dt, double x);
/* A first-order bound of the error of an f32 score (see f32_noise in fuzz_api_check.c). */
double fz_score_noise(const fz_case *c);
/* B*Hq*Lq flags: rows ill-conditioned in f32 by their mask (see fuzz_api_check.c). */
unsigned char *fz_ill_rows(const fz_case *c);
/* The params the calls receive (NULL when the case says so). */
const sdpa_params *fz_params(const fz_case *c);
/* The params sdpa_backward receives: the case's with its dropout, in *tmp (NULL when the
 * case says so). */
const sdpa_params *fz_bwd_params(const fz_case *c, sdpa_params *tmp);
/* Dropout's largest factor 1 / (1 - p), 1 without dropout. */
double fz_zmax(const fz_case *c);

/* The rule of docs/testing.md as the forward's check reads it (rule_ok in fuzz_api_check.c),
 * and its bounds of f32 noise for O and LSE, for the KV call's check. */
int fz_rule_ok(const char *what, const double *test, const double *lp, const double *golden,
               size_t n, sdpa_dtype dt, double k, double noise, const unsigned char *ill,
               size_t row_len);
void fz_f32_noise(const fz_case *c, double *out, double *lse);
/* The dtype of the case's same-precision baseline (testing.md): out's, except where a matrix
 * unit may run (an AMX cap) on bf16 Q, K and V: it rounds the weights to bf16, so the baseline
 * is the inputs' precision, bf16. And the rule's k for that baseline. */
int fz_lp_dtype(const fz_case *c);
double fz_rule_k(int lp_dtype);

/* ---- fuzz_api_kv.c ---- */

/* sdpa_forward_kv on the case (c->kv, after sdpa_forward accepted it): the plain cache or the
 * pool of pages built from k and v, the lengths and block table drawn, sometimes one made
 * invalid (its status and message, outputs untouched); on success, each sequence against the
 * golden of its own slices by the rule, rows past its queries 0 with LSE -inf or the sink,
 * and the same bytes from another thread count. */
void fz_check_kv(fz_case *c, sdpa_ctx *ctx, sdpa_ctx *ctx2);

/* ---- fuzz_api_backward.c ---- */

/* What the oracle's own computation of the case gives, element by element, contiguous
 * (B, H, L, D): out (B, Hq, Lq, Dv); with gradients, dq, dk, dv; in the double pass, also
 * a first-order bound of an f32 implementation's error for each gradient element. */
typedef struct fz_naive {
    double *o, *dq, *dk, *dv;
    double *nq, *nk, *nv; /* the bounds (double pass only) */
} fz_naive;
/* The case's forward (and, when grads, backward) with the backward's dropout (the case's
 * drop_* when c->dropout), the naive way: in double with
 * lp_dtype = -1 (then with the bounds), else in f32 sums with the values rounded to lp_dtype
 * (testing.md's same-precision baseline). Only for cases whose values are finite. */
void fz_naive_run(const fz_case *c, int lp_dtype, int grads, fz_naive *out);
void fz_naive_free(fz_naive *n);
/* Everything about sdpa_backward on the case: its status, dq, dk and dv untouched on error,
 * inputs (out, lse and dout included) never written, and on success the values against the
 * golden and the same bytes again. fwd_ok: sdpa_forward accepted the case, so out and lse
 * hold its results. */
void fz_check_backward(fz_case *c, sdpa_ctx *ctx, sdpa_ctx *ctx2, int fwd_ok);

#endif
