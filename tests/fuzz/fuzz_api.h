/*
 * fuzz_api.h — what the parts of the API fuzz target share: the case it draws from the input
 * (shapes, tensors with their layouts, parameters, injected values, the arguments made invalid
 * on purpose) and the functions of each part:
 *   fuzz_api.c         the target: draws a case, calls the library, checks, reports;
 *   fuzz_api_draw.c    the input's bytes turned into a case (the mapping the corpus relies on);
 *   fuzz_api_tensor.c  tensors: strides from a layout, exact-size buffers, canaries and the
 *                      check that nothing was written between elements;
 *   fuzz_api_check.c   the oracle: statuses, untouched inputs, the rule against the golden,
 *                      determinism, the attention weights.
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

/* The input, read from both ends (as zstd's fuzz_data_producer does): parameters from the
 * tail, data from the head. */
typedef struct fz_src {
    const uint8_t *head; /* next data byte */
    const uint8_t *tail; /* one past the next parameter byte */
} fz_src;

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
    FZ_BAD_COMMON, /* q or k: both calls */
    FZ_BAD_PARAMS, /* the mask or the scalar parameters: both calls, unless params is NULL */
    FZ_BAD_FWD,    /* v, out or lse: sdpa_forward only */
    FZ_BAD_W,      /* the weights tensor: sdpa_weights only */
    FZ_BAD_COUNT
} fz_bad;

/* The tensors of a case by index, in the order q, k, v, mask, out, lse, w. */
enum { FZ_Q, FZ_K, FZ_V, FZ_MASK, FZ_OUT, FZ_LSE, FZ_W, FZ_N_TENSORS };

typedef struct fz_case {
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    fz_tensor q, k, v, mask, out, lse, w;
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
    int skip_weights;      /* a change that may be legal for sdpa_weights with memory it lacks */
    const char *why[8];    /* what made the arguments invalid, for the report */
    int n_why;
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

/* ---- fuzz_api_tensor.c ---- */

/* Allocates f's buffer for shape sh and dtype dt under f->ly, exactly as large as the view
 * spans. Notes the tensor as bad for `which` calls when the layout makes it invalid; `pick`
 * chooses the dimension a huge stride goes to. */
void fz_alloc_tensor(fz_case *c, fz_tensor *f, sdpa_dtype dt, const int64_t sh[4], int output,
                     fz_bad which, unsigned pick);
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

/* Checks an OK forward result against the golden and the baseline; returns the golden LSE
 * (B*Hq*Lq doubles, caller frees) for the weights check. */
double *fz_check_forward_result(fz_case *c, sdpa_ctx *ctx);
/* Calls sdpa_forward again on ctx with fresh canaries; the outputs must equal `ref_*`. */
void fz_check_same_bytes(fz_case *c, sdpa_ctx *ctx, const unsigned char *ref_out,
                         const unsigned char *ref_lse, const char *what);
/* Calls sdpa_weights on the case and checks its status and rows (g_lse may be NULL). */
void fz_check_weights(fz_case *c, sdpa_ctx *ctx, const double *g_lse);

#endif
