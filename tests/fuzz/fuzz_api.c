/*
 * fuzz_api.c — libFuzzer target: sdpa_forward and sdpa_weights on fuzzed arguments, checked
 * differentially against the reference (src/ref/, called directly through tu_golden_forward)
 * and the same-precision naive baseline (tu_naive_forward), with the tolerance rule of
 * docs/testing.md.
 *
 * The input is read from both ends (as zstd's fuzz_data_producer does): parameters from the
 * tail (shapes, dtypes, strides, mask, window, softcap, ALiBi, scale bits, threads, ISA cap,
 * special values, aliasing), data from the head (tensor values; a PRNG seeded from the tail
 * takes over when the head runs out). Every buffer is malloc'ed at exactly the size its
 * extents and strides span, so ASan sees any access outside a tensor; the gaps inside it
 * (padded rows) hold NaN for inputs, so a read there shows in the result, and a canary for
 * outputs, so a write there is seen.
 *
 * Invariants (a violation prints what was violated and the whole case to stderr, then
 * aborts, which libFuzzer reports):
 *   - the status is SDPA_OK or an error sdpa.h documents; an invalid argument is refused and
 *     a valid call is not;
 *   - on error the outputs are byte-identical to their canary and the context has a message;
 *   - inputs are never written;
 *   - on OK: out and lse pass the rule against the golden (see rule_ok for how its floor is
 *     read on cases of a few elements; or, when the inputs hold NaN, Inf or huge values in
 *     Q/K, which make the problem ill-conditioned, hold non-finite values exactly where the
 *     golden does); rows the golden finds fully masked are exactly 0 with LSE -inf; nothing
 *     outside the elements is written; a second call, and a call with another thread count
 *     (same ISA), give identical bytes;
 *   - sdpa_weights on the same arguments: rows in [0, 1] summing to 1 within 1e-5, exactly 0
 *     where a key is hidden, all 0 where the golden LSE is -inf.
 *
 * Build and run: tests/fuzz/run_api_fuzz.sh. The committed corpus (tests/fuzz/corpus/api) is
 * replayed by tests/fuzz/replay.c as the CTest test fuzz_replay_api.
 */
#include "sdpa.h"
#include "testutil.h"

#include "core/half.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* B*Hq*Lq*Lk*(Dk+Dv+4) above this is shrunk: the golden and the naive baseline are O(that)
 * in double with per-element loads (the 4 stands for a score's own costs: exp, mask, window),
 * and the fuzzer must stay above ~1000 executions/s. 129 x 129 tiles with Dk = Dv = 1 fit. */
#define MAX_WORK ((int64_t)100000)

/* ---- the input, read from both ends ------------------------------------------------------ */

typedef struct src {
    const uint8_t *head; /* next data byte */
    const uint8_t *tail; /* one past the next parameter byte */
} src;

/* A parameter byte; 0 once the input is used up (so a short input means small defaults). */
static unsigned take(src *s) {
    return s->tail > s->head ? *--s->tail : 0u;
}

static unsigned take16(src *s) {
    const unsigned lo = take(s);
    return lo | take(s) << 8;
}

/* A data byte, or -1 once the parameters and the data have met. */
static int data_byte(src *s) {
    return s->head < s->tail ? *s->head++ : -1;
}

/* ---- the case ---------------------------------------------------------------------------- */

/* How a tensor's strides are made from its shape. */
typedef struct layout {
    int base;      /* 0: (B, H, L, D) order; 1: (B, L, H, D); 2: D before L (transposed rows) */
    int64_t pad;   /* elements after each row: a view into a wider array */
    unsigned neg;  /* bit i: stride[i] negated (dimension i walked backwards) */
    unsigned zero; /* bit i: stride[i] = 0 (a broadcast view; refused for outputs) */
    int huge;      /* 1..5: a stride whose address span overflows (always refused) */
    int misalign;  /* data one byte past an element boundary */
    int overlap;   /* outputs: stride[2] = D - 1, so rows share memory */
} layout;

typedef struct ftensor {
    const char *name;
    sdpa_tensor t;
    unsigned char *buf; /* exactly the bytes the view spans (+1 when misaligned) */
    size_t bytes;
    layout ly;
    int used;         /* passed to the call */
    int is_input;     /* q, k, v or the mask */
    int null_tensor;  /* passed as a NULL pointer */
    int alias;        /* t.data points into another tensor's buffer */
    int64_t perturbd; /* -1, or the dimension whose extent was changed after allocation */
    int64_t perturbv; /* what it was changed to */
} ftensor;

typedef struct injection {
    int tensor; /* 0 q, 1 k, 2 v, 3 mask */
    int kind;   /* 0 NaN, 1 +Inf, 2 -Inf, 3 +huge, 4 -huge */
    int64_t at[4];
} injection;

typedef struct fcase {
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    ftensor q, k, v, mask, out, lse, w;
    sdpa_params params;
    int params_null, ctx_null;
    float *slopes_buf;
    size_t slopes_bytes;
    int isa, t1, t2;
    int n_inj;
    injection inj[4];
    int nonfinite; /* NaN/Inf in Q, K, V or NaN/+Inf in an additive mask */
    int huge_qk;   /* huge finite values in Q or K */
    /* Invalid arguments the generator put in: the call that sees them must fail. */
    int bad_common;     /* q or k: both calls */
    int bad_params;     /* the mask or the scalar parameters: both calls, unless params is NULL */
    int bad_fwd;        /* v, out or lse: sdpa_forward only */
    int bad_w;          /* the weights tensor: sdpa_weights only */
    int skip_weights;   /* a change that may be legal for sdpa_weights with memory it lacks */
    const char *why[8]; /* what made the arguments invalid, for the report */
    int n_why;
} fcase;

static const fcase *current; /* the case being run, printed with a violation */

static void note_bad(fcase *c, int *flag, const char *why) {
    *flag = 1;
    if (c->n_why < 8)
        c->why[c->n_why++] = why;
}

static int fillable(const ftensor *f);

static void print_tensor(const ftensor *f) {
    const sdpa_tensor *t = &f->t;
    fprintf(stderr, "  %-5s", f->name);
    if (!f->used) {
        fprintf(stderr, " (not passed)\n");
        return;
    }
    if (f->null_tensor) {
        fprintf(stderr, " NULL\n");
        return;
    }
    fprintf(stderr,
            " %s(%d) shape (%lld, %lld, %lld, %lld) stride (%lld, %lld, %lld, %lld) data %s "
            "buf+%lld of %zu bytes; layout base %d pad %lld neg %x zero %x huge %d misalign %d "
            "overlap %d alias %d",
            sdpa_dtype_name(t->dtype), (int)t->dtype, (long long)t->shape[0],
            (long long)t->shape[1], (long long)t->shape[2], (long long)t->shape[3],
            (long long)t->stride[0], (long long)t->stride[1], (long long)t->stride[2],
            (long long)t->stride[3], t->data == NULL ? "NULL" : "at",
            t->data == NULL || f->alias ? -1LL : (long long)((unsigned char *)t->data - f->buf),
            f->bytes, f->ly.base, (long long)f->ly.pad, f->ly.neg, f->ly.zero, f->ly.huge,
            f->ly.misalign, f->ly.overlap, f->alias);
    if (f->perturbd >= 0)
        fprintf(stderr, " perturbed shape[%lld]=%lld", (long long)f->perturbd,
                (long long)f->perturbv);
    fputc('\n', stderr);
    /* the values of small inputs, so that a report can be reproduced by hand */
    const int64_t n = t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3];
    if (f->is_input && fillable(f) && f->perturbd < 0 && n <= 16) {
        fprintf(stderr, "        values:");
        for (int64_t e = 0; e < n; e++)
            fprintf(stderr, " %g",
                    tu_get(t, e / (t->shape[1] * t->shape[2] * t->shape[3]),
                           e / (t->shape[2] * t->shape[3]) % t->shape[1],
                           e / t->shape[3] % t->shape[2], e % t->shape[3]));
        fputc('\n', stderr);
    }
}

static void print_case(const fcase *c) {
    static const char *const inj_tensor[4] = {"q", "k", "v", "mask"};
    static const char *const inj_kind[5] = {"NaN", "+Inf", "-Inf", "+huge", "-huge"};
    const sdpa_params *p = &c->params;
    fprintf(stderr,
            "case: B=%lld Hq=%lld Hkv=%lld Lq=%lld Lk=%lld Dk=%lld Dv=%lld isa-cap=%s "
            "threads=%d/%d ctx%s params%s\n",
            (long long)c->B, (long long)c->Hq, (long long)c->Hkv, (long long)c->Lq,
            (long long)c->Lk, (long long)c->Dk, (long long)c->Dv, sdpa_isa_name((sdpa_isa)c->isa),
            c->t1, c->t2, c->ctx_null ? " NULL" : "", c->params_null ? " NULL" : "");
    fprintf(stderr,
            "  params: scale=%a (%g) causal=%d align=%d use_window=%d window=(%lld, %lld) "
            "softcap=%a (%g) alibi=%s mask=%s\n",
            (double)p->scale, (double)p->scale, p->causal, (int)p->align, p->use_window,
            (long long)p->window_left, (long long)p->window_right, (double)p->softcap,
            (double)p->softcap, p->alibi_slopes ? "yes" : "no", p->mask ? "yes" : "no");
    if (p->alibi_slopes != NULL && ((uintptr_t)p->alibi_slopes & 3u) == 0) {
        fprintf(stderr, "  slopes:");
        for (int64_t h = 0; h < c->Hq; h++)
            fprintf(stderr, " %a", (double)p->alibi_slopes[h]);
        fputc('\n', stderr);
    }
    const ftensor *const all[7] = {&c->q, &c->k, &c->v, &c->mask, &c->out, &c->lse, &c->w};
    for (int i = 0; i < 7; i++)
        print_tensor(all[i]);
    for (int i = 0; i < c->n_inj; i++)
        fprintf(stderr, "  injected %s at %s(%lld, %lld, %lld, %lld)\n", inj_kind[c->inj[i].kind],
                inj_tensor[c->inj[i].tensor], (long long)c->inj[i].at[0],
                (long long)c->inj[i].at[1], (long long)c->inj[i].at[2], (long long)c->inj[i].at[3]);
    fprintf(stderr,
            "  invalid on purpose: common %d params %d forward %d weights %d:", c->bad_common,
            c->bad_params, c->bad_fwd, c->bad_w);
    for (int i = 0; i < c->n_why; i++)
        fprintf(stderr, " %s;", c->why[i]);
    fputc('\n', stderr);
}

/* Reports a broken invariant with the case that broke it, and aborts for libFuzzer. */
static void violation(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2), noreturn))
#endif
    ;

static void violation(const char *fmt, ...) {
    fflush(stdout); /* tu_rule's figures, printed just before */
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz_api: VIOLATION: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    if (current != NULL)
        print_case(current);
    fflush(stderr);
    abort();
}

/* ---- contexts: one per (ISA cap, thread count), created once and reused ------------------- */

static sdpa_ctx *contexts[SDPA_ISA_AVX512 + 1][5];

static sdpa_ctx *get_ctx(int isa, int threads) {
    if (contexts[isa][threads] == NULL)
        contexts[isa][threads] = tu_ctx(threads, (sdpa_isa)isa);
    return contexts[isa][threads];
}

/* The best of generic/avx2/avx512 this CPU has: a higher cap would be lowered silently and
 * only duplicate a context. */
static int best_isa(void) {
    static int best = 0;
    if (best == 0)
        best = (int)sdpa_ctx_isa(get_ctx(SDPA_ISA_AVX512, 1));
    return best;
}

/* ---- drawing the case -------------------------------------------------------------------- */

static int64_t draw_len(src *s) {
    static const int64_t edges[] = {15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129};
    const unsigned x = take(s);
    if (x < 224)
        return 1 + (int64_t)(x % 70);
    return edges[x % (sizeof edges / sizeof edges[0])];
}

/* 1..40 mostly; sometimes 48..80, which reaches the AVX-512 P V's 4-vector column tail
 * (Dv 49..63) and head dimensions past 64. */
static int64_t draw_dim(src *s) {
    const unsigned x = take(s);
    return x < 236 ? 1 + (int64_t)(x % 40) : 48 + (int64_t)(x % 33);
}

/* f32/f16/bf16 mostly; one time in 32 a dtype no tensor may have. */
static sdpa_dtype draw_dtype(src *s, int *invalid) {
    static const int bad[4] = {SDPA_BOOL, 4, 7, -1};
    const unsigned x = take(s);
    if (x % 32 == 31) {
        *invalid = 1;
        return (sdpa_dtype)bad[(x >> 5) % 4];
    }
    return (sdpa_dtype)(x % 3);
}

static layout draw_layout(src *s) {
    layout ly = {0};
    const unsigned a = take(s);
    ly.base = (a & 3) == 3 ? 2 : (a & 3) == 2 ? 1 : 0;
    if ((a >> 2 & 3) == 3)
        ly.pad = 1 + (int64_t)(take(s) % 7);
    const unsigned mod = a >> 4;
    if (mod == 10 || mod == 11)
        ly.neg = take(s) & 15u;
    else if (mod == 12)
        ly.zero = (take(s) & 15u) ? (take(s) & 15u) : 3u;
    else if (mod == 13)
        ly.huge = 1 + (int)(take(s) % 5);
    else if (mod == 14)
        ly.misalign = 1;
    else if (mod == 15)
        ly.overlap = 1;
    return ly;
}

/* Strides of a view of shape sh under layout ly (huge patterns applied by the caller). */
static void make_strides(const layout *ly, const int64_t sh[4], int64_t st[4]) {
    const int64_t H = sh[1], L = sh[2], D = sh[3];
    if (ly->base == 0) {
        const int64_t row = D + ly->pad;
        st[0] = H * L * row, st[1] = L * row, st[2] = row, st[3] = 1;
    } else if (ly->base == 1) {
        const int64_t row = D + ly->pad;
        st[0] = L * H * row, st[1] = row, st[2] = H * row, st[3] = 1;
    } else {
        const int64_t col = L + ly->pad;
        st[0] = H * D * col, st[1] = D * col, st[2] = 1, st[3] = col;
    }
    for (int i = 0; i < 4; i++) {
        if (ly->zero >> i & 1u)
            st[i] = 0;
        if (ly->neg >> i & 1u)
            st[i] = -st[i];
    }
    if (ly->overlap) {
        st[2] = D - 1;
        st[3] = 1;
    }
}

/* Allocates f's buffer for shape sh and dtype dt under f->ly, exactly as large as the view
 * spans. Sets *bad (with the reason) when the layout makes the tensor invalid. */
static void alloc_tensor(fcase *c, ftensor *f, sdpa_dtype dt, const int64_t sh[4], int output,
                         int *bad, unsigned pick) {
    const layout *ly = &f->ly;
    sdpa_tensor *t = &f->t;
    t->dtype = dt;
    memcpy(t->shape, sh, sizeof t->shape);
    make_strides(ly, sh, t->stride);
    const size_t es = sdpa_dtype_size(dt) ? sdpa_dtype_size(dt) : 4;
    if (output && ly->zero) {
        for (int i = 0; i < 4; i++)
            if ((ly->zero >> i & 1u) && sh[i] > 1)
                note_bad(c, bad, "output stride 0 over an extent > 1");
    }
    if (output && ly->overlap && sh[2] > 1)
        note_bad(c, bad, "output rows overlap");
    if (ly->huge) {
        /* the first dimension from `pick` on with an extent that makes the span overflow */
        const int64_t need = ly->huge == 4 ? 3 : 2;
        for (int n = 0; n < 4; n++) {
            const int i = (int)((pick + (unsigned)n) % 4);
            if (sh[i] < need)
                continue;
            /* INT64_MAX, -INT64_MAX, INT64_MIN: the span overflows int64 elements; 2^62 over
             * 3 or more: 2^63; -2^60: fits int64 bytes but reaches 2^60 elements (2^60 to
             * 2^62 bytes) below data, under address 0 on any 64-bit system */
            static const int64_t huge[6] = {0,         INT64_MAX,        -INT64_MAX,
                                            INT64_MIN, (int64_t)1 << 62, -((int64_t)1 << 60)};
            t->stride[i] = huge[ly->huge];
            note_bad(c, bad, "a stride whose span overflows");
            f->bytes = es;
            f->buf = malloc(f->bytes);
            t->data = f->buf;
            return;
        }
        f->ly.huge = 0; /* no extent large enough: an ordinary view */
    }
    int64_t lo = 0, hi = 0;
    for (int i = 0; i < 4; i++) {
        const int64_t e = (sh[i] - 1) * t->stride[i];
        if (e < 0)
            lo += e;
        else
            hi += e;
    }
    const size_t mis = ly->misalign ? 1 : 0;
    if (mis && sdpa_dtype_size(dt) >= 2)
        note_bad(c, bad, "data not aligned to its element size");
    f->bytes = (size_t)(hi - lo + 1) * es + mis;
    f->buf = malloc(f->bytes);
    if (f->buf == NULL)
        violation("out of memory for %zu bytes (the generator's fault)", f->bytes);
    t->data = f->buf + mis + (size_t)(-lo) * es;
}

/* Marks, in map, the bytes of f's buffer that hold elements of its view. */
static void element_map(const ftensor *f, unsigned char *map) {
    const sdpa_tensor *t = &f->t;
    const int64_t es = (int64_t)sdpa_dtype_size(t->dtype);
    const int64_t base = (int64_t)((const unsigned char *)t->data - f->buf);
    memset(map, 0, f->bytes);
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t h = 0; h < t->shape[1]; h++)
            for (int64_t l = 0; l < t->shape[2]; l++)
                for (int64_t d = 0; d < t->shape[3]; d++) {
                    const int64_t o = base + es * (b * t->stride[0] + h * t->stride[1] +
                                                   l * t->stride[2] + d * t->stride[3]);
                    memset(map + o, 1, (size_t)es);
                }
}

/* The value of a float input element: from the head of the input while it lasts (multiples
 * of 1/32, exact in every dtype), then from the PRNG. */
static double draw_value(src *s, tu_rng *r, double mag) {
    const int b = data_byte(s);
    if (b >= 0)
        return ((double)b - 128.0) / 32.0 * mag;
    return tu_randn(r) * mag;
}

static int byte_or_rng(src *s, tu_rng *r) {
    const int b = data_byte(s);
    return b >= 0 ? b : (int)(tu_next(r) & 255u);
}

/* Whether f's elements can be written: a known dtype, memory behind the view, and aligned
 * (the views that are none of these are refused by the library before it reads them). */
static int fillable(const ftensor *f) {
    const size_t es = sdpa_dtype_size(f->t.dtype);
    return f->used && es != 0 && !f->ly.huge && !(f->ly.misalign && es >= 2);
}

/* Fills every element of a float input (the gaps were set to NaN bytes before). */
static void fill_float(ftensor *f, src *s, tu_rng *r, double mag) {
    sdpa_tensor *t = &f->t;
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t h = 0; h < t->shape[1]; h++)
            for (int64_t l = 0; l < t->shape[2]; l++)
                for (int64_t d = 0; d < t->shape[3]; d++)
                    tu_set(t, b, h, l, d, draw_value(s, r, mag));
}

/* Mask values: -inf (bool: false) with probability about thr/256; additive values also
 * -1e9, 0 and small finite biases. */
static void fill_mask(ftensor *f, src *s, tu_rng *r, unsigned thr) {
    sdpa_tensor *t = &f->t;
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t h = 0; h < t->shape[1]; h++)
            for (int64_t l = 0; l < t->shape[2]; l++)
                for (int64_t d = 0; d < t->shape[3]; d++) {
                    const unsigned u = (unsigned)byte_or_rng(s, r);
                    const int64_t o =
                        b * t->stride[0] + h * t->stride[1] + l * t->stride[2] + d * t->stride[3];
                    if (t->dtype == SDPA_BOOL) {
                        /* any nonzero byte means "may attend", not only 1 */
                        ((unsigned char *)t->data)[o] = u < thr ? 0 : (unsigned char)(1 + u % 255);
                        continue;
                    }
                    double x;
                    if (u < thr)
                        x = -INFINITY;
                    else if (u % 16 == 0)
                        x = -1e9;
                    else if (u % 4 == 0)
                        x = 0.0;
                    else
                        x = ((double)(u % 64) - 32.0) / 8.0;
                    tu_set(t, b, h, l, d, x);
                }
}

static float bits_float(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static float draw_scale(src *s, fcase *c) {
    const unsigned kind = take(s) % 12;
    if (kind < 5)
        return 0.0f; /* the default, 1/sqrt(Dk) */
    if (kind < 8) {
        const float x = ldexpf(1.0f + (float)take(s) / 256.0f, (int)(take(s) % 10) - 7);
        return kind == 7 ? -x : x;
    }
    if (kind < 10) {
        /* a denormal: exponent bits 0, mantissa from the input, never 0 */
        uint32_t m = (take(s) | take(s) << 8 | (take(s) & 0x7fu) << 16);
        m = m ? m : 1u;
        return bits_float(m | (kind == 9 ? 0x80000000u : 0u));
    }
    static const float bad[4] = {NAN, INFINITY, -INFINITY, -NAN};
    note_bad(c, &c->bad_params, "scale not finite");
    return bad[take(s) % 4];
}

static float draw_softcap(src *s, fcase *c) {
    const unsigned kind = take(s) % 16;
    if (kind < 9)
        return 0.0f;
    if (kind < 13)
        return ldexpf(1.0f + (float)take(s) / 256.0f, (int)(take(s) % 8) - 2);
    if (kind == 13) {
        static const float odd[4] = {1e-40f, 1e-30f, 1e30f, -0.0f}; /* all valid */
        return odd[take(s) % 4];
    }
    static const float bad[4] = {-1.0f, NAN, INFINITY, -INFINITY};
    note_bad(c, &c->bad_params, "softcap negative or not finite");
    return bad[take(s) % 4];
}

static int64_t draw_window(src *s, fcase *c, int64_t L) {
    const unsigned x = take(s);
    if (x < 232) {
        const int64_t w = -2 + (int64_t)(x % (unsigned)(L + 5));
        if (w < -1 && c->params.use_window)
            note_bad(c, &c->bad_params, "window bound < -1");
        return w;
    }
    static const int64_t odd[4] = {INT64_MAX, (int64_t)1 << 62, INT64_MIN, -1000};
    const int64_t w = odd[x % 4];
    if (w < -1 && c->params.use_window)
        note_bad(c, &c->bad_params, "window bound < -1");
    return w;
}

/* Shrinks the problem until B*Hq*Lq*Lk*(Dk+Dv) <= MAX_WORK, keeping Lq and Lk (the tile edges
 * are what the fuzzer should reach) as long as possible. */
static void fit_budget(fcase *c, int heads_bad) {
#define WORK (c->B * c->Hq * c->Lq * c->Lk * (c->Dk + c->Dv + 4))
    if (WORK > MAX_WORK)
        c->B = 1;
    if (WORK > MAX_WORK && !heads_bad) {
        const int64_t g = c->Hq / c->Hkv;
        c->Hkv = 1;
        c->Hq = g;
    }
    if (WORK > MAX_WORK) {
        c->Dk = c->Dk > 8 ? 1 + c->Dk % 8 : c->Dk;
        c->Dv = c->Dv > 8 ? 1 + c->Dv % 8 : c->Dv;
    }
    while (WORK > MAX_WORK && c->Hq > 1 && !heads_bad) {
        c->Hq = c->Hq / 2 > 0 ? c->Hq / 2 : 1;
    }
    while (WORK > MAX_WORK) {
        if (c->Lq > c->Lk)
            c->Lq /= 2;
        else
            c->Lk /= 2;
    }
#undef WORK
}

/* Huge finite values for an element of dtype dt: the largest f16, a large bf16 (testing.md),
 * and the f16 maximum again for f32 (scores must stay in f32's range). In V, no more than the
 * output dtype holds: O is a convex combination of V's rows, and a value f16 cannot hold
 * would become Inf on output by the contract, not by a fault. All are exact in their dtype. */
static double huge_value(sdpa_dtype dt, int in_v, sdpa_dtype out) {
    if (dt != SDPA_BF16)
        return 65504.0;
    return in_v && out == SDPA_F16 ? 65280.0 : 133120.0; /* bf16 rounds 65504 up to 65536 */
}

/* ---- checks ------------------------------------------------------------------------------ */

static int documented(sdpa_status st) {
    switch (st) {
    case SDPA_OK:
    case SDPA_ERR_NULL:
    case SDPA_ERR_DTYPE:
    case SDPA_ERR_DIM:
    case SDPA_ERR_SHAPE:
    case SDPA_ERR_HEADS:
    case SDPA_ERR_BROADCAST:
    case SDPA_ERR_OVERFLOW:
    case SDPA_ERR_PARAM:
    case SDPA_ERR_ALIAS:
    case SDPA_ERR_NOMEM:
        return 1;
    default:
        return 0;
    }
}

static int is_canary(const ftensor *f) {
    for (size_t i = 0; i < f->bytes; i++)
        if (f->buf[i] != 0xA5)
            return 0;
    return 1;
}

static void fill_canary(ftensor *f) {
    if (f->buf != NULL)
        memset(f->buf, 0xA5, f->bytes);
}

/* After a successful call: the bytes of f's buffer outside its elements still hold the
 * canary (ASan cannot see a write into a row's padding). */
static void check_gaps(const ftensor *f, const char *call) {
    if (!f->used || f->alias)
        return;
    unsigned char *map = malloc(f->bytes);
    element_map(f, map);
    for (size_t i = 0; i < f->bytes; i++)
        if (!map[i] && f->buf[i] != 0xA5)
            violation("%s wrote byte %zu of %s's buffer, outside its elements", call, i, f->name);
    free(map);
}

static void check_status(const fcase *c, sdpa_status st, sdpa_ctx *ctx, const char *call,
                         int must_fail, int must_pass) {
    if (!documented(st))
        violation("%s returned %d (%s), not a documented status", call, (int)st,
                  sdpa_status_name(st));
    if (must_fail && st == SDPA_OK)
        violation("%s accepted invalid arguments", call);
    if (must_pass && st != SDPA_OK)
        violation("%s refused valid arguments: %s: %s", call, sdpa_status_name(st),
                  sdpa_ctx_last_error(ctx));
    if (st != SDPA_OK && !c->ctx_null && sdpa_ctx_last_error(ctx)[0] == '\0')
        violation("%s failed with %s but left no message", call, sdpa_status_name(st));
}

/* Non-finite values exactly where the golden has them (NaN and Inf not told apart: where
 * an Inf meets a weight that underflows in f32 but not in double, Inf becomes NaN). */
static void check_positions(const char *what, const double *test, const double *golden, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(test[i]) != !isfinite(golden[i]))
            violation("%s[%zu] = %g but the golden has %g", what, i, test[i], golden[i]);
}

/* The spacing of dtype dt's values at magnitude x (x > 0). */
static double ulp_of(sdpa_dtype dt, double x) {
    const int mant = dt == SDPA_F32 ? 23 : dt == SDPA_F16 ? 10 : 7;
    const int emin = dt == SDPA_F16 ? -14 : -126;
    int e;
    frexp(x, &e); /* x = f * 2^e, f in [0.5, 1) */
    return ldexp(1.0, (e - 1 < emin ? emin : e - 1) - mant);
}

/* testing.md's rule, err(test) <= k err(lp) + floor, non-finite values at the same places,
 * adapted to cases of a handful of elements (often one), where the rule's figures are samples
 * of rounding noise too small to be stable:
 *   - the floor is at the bound of its sample: 2 max |round_dt(g + 0.3) - 0.3 - g| is at most
 *     max ulp_dt(|g| + 0.3), and the sample can fall near 0;
 *   - it is at least `noise`, a first-order bound of what f32 arithmetic may add (see
 *     f32_noise): err(lp) can be luckily small (one row whose scores are exact, a baseline
 *     that takes exp in double) where flash's online softmax is a few ulps off.
 *   - rows marked `ill` (see ill_rows) are only held to the positions of non-finite values.
 * Neither hides a semantic fault (a wrong key, bias or weight moves O by far more).
 * On failure, tu_rule prints the figures of the rule as written. */
static int rule_ok(const char *what, const double *test, const double *lp, const double *golden,
                   size_t n, sdpa_dtype dt, double k, double noise, const unsigned char *ill,
                   size_t row_len) {
    double err_test = 0.0, err_lp = 0.0, floor_ = noise;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        const double g = golden[i];
        if (!isfinite(g) || !isfinite(test[i])) {
            if (!((isnan(g) && isnan(test[i])) || g == test[i])) {
                tu_rule(what, test, lp, golden, n, dt, k, 0.0);
                return 0;
            }
            continue;
        }
        if (ill[i / row_len])
            continue;
        if (fabs(test[i] - g) > err_test) {
            err_test = fabs(test[i] - g);
            worst = i;
        }
        if (isfinite(lp[i]))
            err_lp = fmax(err_lp, fabs(lp[i] - g));
        floor_ = fmax(floor_, ulp_of(dt, fabs(g) + 0.3));
    }
    if (err_test <= k * err_lp + floor_)
        return 1;
    tu_rule(what, test, lp, golden, n, dt, k, 0.0);
    fprintf(stderr,
            "fuzz_api: %s: err %.3e > %g x lp %.3e + floor %.3e; worst at [%zu]: test "
            "%.9g lp %.9g golden %.9g\n",
            what, err_test, k, err_lp, floor_, worst, test[worst], lp[worst], golden[worst]);
    return 0;
}

/* max |x| over the elements of t (finite inputs). */
static double max_abs(const sdpa_tensor *t) {
    double m = 0.0;
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t h = 0; h < t->shape[1]; h++)
            for (int64_t l = 0; l < t->shape[2]; l++)
                for (int64_t d = 0; d < t->shape[3]; d++)
                    m = fmax(m, fabs(tu_get(t, b, h, l, d)));
    return m;
}

/* First-order bounds of the rounding noise of an f32 computation of the case, for O (*out)
 * and LSE (*lse), with u = 2^-24 and the worst-case (not the statistical) growth:
 *   a score q.k * scale + bias, summed in any order: ds <= (Dk + 4) u S, with S a bound of
 *   the magnitudes summed (|scale| Dk max|q| max|k|, plus ALiBi's largest bias and the
 *   largest finite mask value above -1e8: rows that only see keys masked near -1e9 are
 *   ill-conditioned in f32 and left to the baseline);
 *   a weight p_j moves by up to 2 ds relatively, exp and the normalisation add a few u, and
 *   the sum over Lk keys (Lk + 8) u: dO <= max|v| (2 ds + (Lk + 8) u);
 *   LSE = m + log l: dLSE <= ds + (Lk + 8) u. */
static void f32_noise(const fcase *c, double *out, double *lse) {
    const sdpa_params *p = &c->params;
    const double u = 0x1p-24;
    const double scale = p->scale != 0.0f ? fabs((double)p->scale) : 1.0 / sqrt((double)c->Dk);
    double S = scale * (double)c->Dk * max_abs(&c->q.t) * max_abs(&c->k.t);
    if (p->alibi_slopes != NULL) {
        double m = 0.0;
        for (int64_t h = 0; h < c->Hq; h++)
            m = fmax(m, fabs((double)p->alibi_slopes[h]));
        S += m * (double)(c->Lq + c->Lk);
    }
    if (p->mask != NULL && p->mask->dtype != SDPA_BOOL) {
        const sdpa_tensor *t = p->mask;
        double m = 0.0;
        for (int64_t b = 0; b < t->shape[0]; b++)
            for (int64_t h = 0; h < t->shape[1]; h++)
                for (int64_t l = 0; l < t->shape[2]; l++)
                    for (int64_t d = 0; d < t->shape[3]; d++) {
                        const double x = fabs(tu_get(t, b, h, l, d));
                        if (x < 1e8)
                            m = fmax(m, x);
                    }
        S += m;
    }
    const double ds = (double)(c->Dk + 4) * u * S, acc = (double)(c->Lk + 8) * u;
    *out = max_abs(&c->v.t) * (2.0 * ds + acc);
    *lse = ds + acc;
}

static int visible(const fcase *c, int64_t b, int64_t h, int64_t i, int64_t j);

/* Rows ill-conditioned in f32 by construction: every key they see carries an additive mask
 * of -1e8 or below (-1e9 is a common "finite -inf"), or some key carries +1e8 or more (which
 * then dominates), so f32 scores x +- 1e9 keep nothing of x (ulp 64) while the golden's double
 * keeps it all. No f32 implementation can match the golden there, and the baseline in the
 * output dtype may not follow f32 either (in f16, -1e9 becomes -inf and the row looks fully
 * masked). Returns B*Hq*Lq flags (caller frees). */
static unsigned char *ill_rows(const fcase *c) {
    unsigned char *ill = calloc((size_t)(c->B * c->Hq * c->Lq), 1);
    const sdpa_tensor *m = c->params.mask;
    if (m == NULL || m->dtype == SDPA_BOOL)
        return ill;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->Lq; i++) {
                int seen = 0, all_low = 1, any_high = 0;
                for (int64_t j = 0; j < c->Lk; j++) {
                    if (!visible(c, b, h, i, j))
                        continue;
                    const double x = tu_get(m, m->shape[0] == 1 ? 0 : b, m->shape[1] == 1 ? 0 : h,
                                            m->shape[2] == 1 ? 0 : i, m->shape[3] == 1 ? 0 : j);
                    seen = 1;
                    all_low &= x <= -1e8;
                    any_high |= x >= 1e8;
                }
                ill[(b * c->Hq + h) * c->Lq + i] = (unsigned char)(seen && (all_low || any_high));
            }
    return ill;
}

/* Is key j visible to query i of (b, h) by the window, causal and mask rules alone? */
static int visible(const fcase *c, int64_t b, int64_t h, int64_t i, int64_t j) {
    const sdpa_params *p = &c->params;
    const int64_t off = p->align == SDPA_ALIGN_BOTTOM_RIGHT ? c->Lk - c->Lq : 0;
    const int64_t rel = j - (i + off);
    const int64_t wl = p->use_window ? p->window_left : -1;
    const int64_t wr = p->causal ? 0 : p->use_window ? p->window_right : -1;
    if ((wl >= 0 && rel < -wl) || (wr >= 0 && rel > wr))
        return 0;
    if (p->mask != NULL) {
        const sdpa_tensor *m = p->mask;
        const double mv = tu_get(m, m->shape[0] == 1 ? 0 : b, m->shape[1] == 1 ? 0 : h,
                                 m->shape[2] == 1 ? 0 : i, m->shape[3] == 1 ? 0 : j);
        if (m->dtype == SDPA_BOOL ? mv == 0.0 : mv == -INFINITY)
            return 0;
    }
    return 1;
}

/* ---- the run ----------------------------------------------------------------------------- */

typedef struct snapshot {
    unsigned char *copy[5];
} snapshot;

static const unsigned char *input_bytes(const fcase *c, int i, size_t *n) {
    const ftensor *const in[4] = {&c->q, &c->k, &c->v, &c->mask};
    if (i < 4) {
        *n = in[i]->bytes;
        return in[i]->buf;
    }
    *n = c->slopes_bytes;
    return (const unsigned char *)c->slopes_buf;
}

static void take_snapshot(const fcase *c, snapshot *s) {
    for (int i = 0; i < 5; i++) {
        size_t n;
        const unsigned char *p = input_bytes(c, i, &n);
        s->copy[i] = NULL;
        if (p != NULL) {
            s->copy[i] = malloc(n);
            memcpy(s->copy[i], p, n);
        }
    }
}

static void check_snapshot(const fcase *c, snapshot *s, const char *call) {
    static const char *const names[5] = {"q", "k", "v", "mask", "alibi_slopes"};
    for (int i = 0; i < 5; i++) {
        size_t n;
        const unsigned char *p = input_bytes(c, i, &n);
        if (p != NULL && memcmp(p, s->copy[i], n) != 0)
            violation("%s wrote into input %s", call, names[i]);
    }
}

static void free_snapshot(snapshot *s) {
    for (int i = 0; i < 5; i++)
        free(s->copy[i]);
}

/* Pointers as the calls receive them (NULL where the case says so). */
static const sdpa_tensor *arg(const ftensor *f) {
    return !f->used || f->null_tensor ? NULL : &f->t;
}

static sdpa_tensor *arg_out(ftensor *f) {
    return !f->used || f->null_tensor ? NULL : &f->t;
}

/* Checks an OK forward result against the golden and the baseline; returns the golden LSE
 * (B*Hq*Lq doubles, caller frees) for the weights check. */
static double *check_forward_result(fcase *c, sdpa_ctx *ctx) {
    const sdpa_params *pr = c->params_null ? NULL : &c->params;
    const int64_t rows = c->B * c->Hq * c->Lq;
    const size_t n_out = (size_t)(rows * c->Dv);
    tu_tensor gout = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, c->Dv, TU_BHLD, 0, 0);
    tu_tensor glse = tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, 1, TU_BHLD, 0, 0);
    const sdpa_status gst = tu_golden_forward(ctx, &c->q.t, &c->k.t, &c->v.t, pr, &gout.t, &glse.t);
    if (gst != SDPA_OK)
        violation("the golden refused what sdpa_forward accepted: %s: %s", sdpa_status_name(gst),
                  sdpa_ctx_last_error(ctx));
    double *g_o = tu_to_doubles(&gout.t), *g_l = tu_to_doubles(&glse.t);
    double *t_o = tu_to_doubles(&c->out.t);
    double *t_l = c->lse.used ? tu_to_doubles(&c->lse.t) : NULL;
    tu_free(&gout);
    tu_free(&glse);

    if (c->nonfinite || c->huge_qk) {
        /* ill-conditioned or non-finite: the positions of non-finite values are the contract
         * (no NaN where the golden is finite), the digits are not */
        check_positions("out", t_o, g_o, n_out);
        if (t_l != NULL)
            check_positions("lse", t_l, g_l, (size_t)rows);
    } else {
        double *lp_o = malloc(n_out * sizeof *lp_o), *lp_l = malloc((size_t)rows * sizeof *lp_l);
        tu_naive_forward(&c->q.t, &c->k.t, &c->v.t, pr, (int)c->out.t.dtype, lp_o, lp_l);
        const double k = c->out.t.dtype == SDPA_F32 ? 3.0 : 2.0;
        /* no NMSE gate: where the baseline itself is far off (peaky rows, -1e9 masks in f16)
         * the ratio already adapts, and NMSE would only flag the problem, not the library */
        double noise_o, noise_l;
        f32_noise(c, &noise_o, &noise_l);
        unsigned char *ill = ill_rows(c);
        if (!rule_ok("out", t_o, lp_o, g_o, n_out, c->out.t.dtype, k, noise_o, ill, (size_t)c->Dv))
            violation("out fails the tolerance rule against the golden (figures above)");
        if (t_l != NULL &&
            !rule_ok("lse", t_l, lp_l, g_l, (size_t)rows, SDPA_F32, k, noise_l, ill, 1))
            violation("lse fails the tolerance rule against the golden (figures above)");
        free(ill);
        free(lp_o);
        free(lp_l);
    }
    /* fully masked rows: exactly 0, LSE -inf */
    for (int64_t r = 0; r < rows; r++) {
        if (g_l[r] != -INFINITY)
            continue;
        for (int64_t d = 0; d < c->Dv; d++)
            if (t_o[r * c->Dv + d] != 0.0)
                violation("row %lld is fully masked but out[%lld] = %g", (long long)r, (long long)d,
                          t_o[r * c->Dv + d]);
        if (t_l != NULL && t_l[r] != -INFINITY)
            violation("row %lld is fully masked but lse = %g", (long long)r, t_l[r]);
    }
    free(g_o);
    free(t_o);
    free(t_l);
    return g_l;
}

/* Calls sdpa_forward again on ctx with fresh canaries; the outputs must equal `ref_*`. */
static void check_same_bytes(fcase *c, sdpa_ctx *ctx, const unsigned char *ref_out,
                             const unsigned char *ref_lse, const char *what) {
    fill_canary(&c->out);
    if (c->lse.used)
        fill_canary(&c->lse);
    const sdpa_status st =
        sdpa_forward(ctx, &c->q.t, &c->k.t, &c->v.t, c->params_null ? NULL : &c->params, &c->out.t,
                     c->lse.used ? &c->lse.t : NULL);
    if (st != SDPA_OK)
        violation("sdpa_forward (%s) failed with %s: %s", what, sdpa_status_name(st),
                  sdpa_ctx_last_error(ctx));
    if (memcmp(c->out.buf, ref_out, c->out.bytes) != 0)
        violation("out differs on %s", what);
    if (c->lse.used && memcmp(c->lse.buf, ref_lse, c->lse.bytes) != 0)
        violation("lse differs on %s", what);
}

static void check_weights(fcase *c, sdpa_ctx *ctx, const double *g_lse) {
    const sdpa_params *pr = c->params_null ? NULL : &c->params;
    fill_canary(&c->w);
    const sdpa_status st = sdpa_weights(c->ctx_null ? NULL : ctx, arg(&c->q), arg(&c->k), pr,
                                        c->w.null_tensor ? NULL : &c->w.t);
    const int bad = c->bad_common || (c->bad_params && !c->params_null) || c->bad_w;
    check_status(c, st, ctx, "sdpa_weights", bad, !bad);
    if (st != SDPA_OK) {
        if (!is_canary(&c->w))
            violation("sdpa_weights failed with %s but wrote into weights", sdpa_status_name(st));
        return;
    }
    check_gaps(&c->w, "sdpa_weights");
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->Lq; i++) {
                const double gl = g_lse ? g_lse[(b * c->Hq + h) * c->Lq + i] : 0.0;
                double sum = 0.0;
                int nan_row = 0;
                for (int64_t j = 0; j < c->Lk; j++) {
                    const double x = tu_get(&c->w.t, b, h, i, j);
                    const int vis = visible(c, b, h, i, j);
                    if (!vis && x != 0.0)
                        violation("weights(%lld, %lld, %lld, %lld) = %g for a hidden key",
                                  (long long)b, (long long)h, (long long)i, (long long)j, x);
                    if (isnan(gl) || (g_lse == NULL && isnan(x))) {
                        nan_row = 1;
                        continue;
                    }
                    if (!(x >= 0.0 && x <= 1.0))
                        violation("weights(%lld, %lld, %lld, %lld) = %g outside [0, 1]",
                                  (long long)b, (long long)h, (long long)i, (long long)j, x);
                    if (gl == -INFINITY && x != 0.0)
                        violation("weights(%lld, %lld, %lld, %lld) = %g in a fully masked row",
                                  (long long)b, (long long)h, (long long)i, (long long)j, x);
                    sum += x;
                }
                if (nan_row || gl == -INFINITY || (g_lse == NULL && sum == 0.0))
                    continue;
                if (fabs(sum - 1.0) > 1e-5)
                    violation("weights row (%lld, %lld, %lld) sums to %.9g", (long long)b,
                              (long long)h, (long long)i, sum);
            }
}

static void free_case(fcase *c) {
    ftensor *const all[7] = {&c->q, &c->k, &c->v, &c->mask, &c->out, &c->lse, &c->w};
    for (int i = 0; i < 7; i++)
        free(all[i]->buf);
    free(c->slopes_buf);
}

/* Changes one extent of one tensor after its allocation (rare): every such change breaks an
 * equality between tensors, so the call must fail, without touching the smaller memory. */
static void perturb(fcase *c, src *s) {
    static const int64_t odd[4] = {0, -1, (int64_t)1 << 31, 65537};
    ftensor *const all[5] = {&c->q, &c->k, &c->v, &c->out, &c->lse};
    ftensor *f = all[take(s) % (c->lse.used ? 5 : 4)];
    const int d = (int)(take(s) % 4);
    const unsigned how = take(s) % 6;
    const int64_t was = f->t.shape[d];
    const int64_t now = how == 0 ? was + 1 : how == 1 ? was - 1 : odd[how - 2];
    f->t.shape[d] = now;
    f->perturbd = d;
    f->perturbv = now;
    if (f == &c->k && d == 1) {
        /* Hkv +-1 may still divide Hq: legal for sdpa_weights, which would then read k past
         * its memory (the caller's fault). sdpa_forward compares it with v. */
        note_bad(c, &c->bad_fwd, "k.shape[1] changed");
        c->skip_weights = 1;
    } else if (f == &c->q || f == &c->k) {
        note_bad(c, &c->bad_common, "q or k extent changed");
    } else {
        note_bad(c, &c->bad_fwd, "v, out or lse extent changed");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    src s = {data, data + size};
    fcase cs;
    memset(&cs, 0, sizeof cs);
    fcase *c = &cs;
    c->q.name = "q", c->k.name = "k", c->v.name = "v", c->mask.name = "mask";
    c->out.name = "out", c->lse.name = "lse", c->w.name = "w";
    ftensor *const all[7] = {&c->q, &c->k, &c->v, &c->mask, &c->out, &c->lse, &c->w};
    for (int i = 0; i < 7; i++) {
        all[i]->perturbd = -1;
        all[i]->is_input = i < 4;
    }

    /* shapes */
    c->B = 1 + take(&s) % 3;
    const unsigned hb = take(&s);
    c->Hkv = 1 + hb % 3;
    c->Hq = c->Hkv * (1 + (hb >> 2) % 4);
    const int heads_bad = (hb >> 4) == 15 && c->Hkv > 1;
    if (heads_bad) {
        c->Hq += 1;
        note_bad(c, &c->bad_common, "Hq not a multiple of Hkv");
    }
    c->Lq = draw_len(&s);
    c->Lk = draw_len(&s);
    c->Dk = draw_dim(&s);
    c->Dv = draw_dim(&s);
    fit_budget(c, heads_bad);

    /* dtypes */
    int bad_dt = 0;
    const sdpa_dtype dq = draw_dtype(&s, &bad_dt), dk = draw_dtype(&s, &bad_dt);
    if (bad_dt)
        note_bad(c, &c->bad_common, "q or k dtype invalid");
    bad_dt = 0;
    const sdpa_dtype dv = draw_dtype(&s, &bad_dt), dout = draw_dtype(&s, &bad_dt);
    if (bad_dt)
        note_bad(c, &c->bad_fwd, "v or out dtype invalid");

    /* scalar parameters */
    const unsigned fl = take(&s);
    c->params.causal = fl & 1u;
    c->params.use_window = fl >> 1 & 1u;
    c->q.used = c->k.used = c->v.used = c->out.used = c->w.used = 1;
    c->lse.used = fl >> 2 & 1u;
    c->params.align = (sdpa_align)(fl >> 3 & 1u);
    if ((fl >> 4) == 15) {
        c->params.align = (sdpa_align)((fl & 1u) ? 2 : -1);
        note_bad(c, &c->bad_params, "align invalid");
    }
    c->params.scale = draw_scale(&s, c);
    c->params.softcap = draw_softcap(&s, c);
    c->params.window_left = draw_window(&s, c, c->Lk);
    c->params.window_right = draw_window(&s, c, c->Lk);

    /* threads and ISA */
    const unsigned th = take(&s);
    c->t1 = 1 + (int)(th % 4);
    c->t2 = 1 + (int)((th >> 2) % 4);
    if (c->t2 == c->t1)
        c->t2 = c->t1 % 4 + 1;
    c->isa = SDPA_ISA_GENERIC + (int)((th >> 4) % 3);
    if (c->isa > best_isa())
        c->isa = best_isa();

    /* tensors */
    const unsigned long long seed = (unsigned long long)take16(&s) << 16 | take16(&s);
    tu_rng rng = {seed};
    const int64_t shq[4] = {c->B, c->Hq, c->Lq, c->Dk}, shk[4] = {c->B, c->Hkv, c->Lk, c->Dk};
    const int64_t shv[4] = {c->B, c->Hkv, c->Lk, c->Dv}, sho[4] = {c->B, c->Hq, c->Lq, c->Dv};
    const int64_t shl[4] = {c->B, c->Hq, c->Lq, 1}, shw[4] = {c->B, c->Hq, c->Lq, c->Lk};
    c->q.ly = draw_layout(&s);
    c->k.ly = draw_layout(&s);
    c->v.ly = draw_layout(&s);
    c->out.ly = draw_layout(&s);
    alloc_tensor(c, &c->q, dq, shq, 0, &c->bad_common, take(&s));
    alloc_tensor(c, &c->k, dk, shk, 0, &c->bad_common, take(&s));
    alloc_tensor(c, &c->v, dv, shv, 0, &c->bad_fwd, take(&s));
    alloc_tensor(c, &c->out, dout, sho, 1, &c->bad_fwd, take(&s));
    if (c->lse.used) {
        c->lse.ly = draw_layout(&s);
        const unsigned x = take(&s);
        sdpa_dtype dl = SDPA_F32;
        if (x % 16 == 15) {
            dl = (sdpa_dtype)(x >> 4 & 1u ? SDPA_F16 : SDPA_BF16);
            note_bad(c, &c->bad_fwd, "lse dtype not f32");
        }
        alloc_tensor(c, &c->lse, dl, shl, 1, &c->bad_fwd, take(&s));
    }
    const unsigned wx = take(&s);
    if (wx % 16 == 15) {
        c->w.ly = draw_layout(&s);
    }
    alloc_tensor(c, &c->w, wx % 32 == 31 ? SDPA_F16 : SDPA_F32, shw, 1, &c->bad_w, take(&s));
    if (wx % 32 == 31)
        note_bad(c, &c->bad_w, "weights dtype not f32");

    /* the mask */
    const unsigned mk = take(&s);
    if (mk % 8 >= 3) {
        static const sdpa_dtype mdt[5] = {SDPA_BOOL, SDPA_F32, SDPA_F16, SDPA_BF16, SDPA_BOOL};
        sdpa_dtype dm = mdt[(mk % 8 - 3) % 5];
        if (mk >> 3 == 31) {
            dm = (sdpa_dtype)7;
            note_bad(c, &c->bad_params, "mask dtype invalid");
        }
        const unsigned bc = take(&s);
        int64_t shm[4];
        memcpy(shm, shw, sizeof shm);
        for (int i = 0; i < 4; i++)
            if (bc >> i & 1u)
                shm[i] = 1;
        if (bc >> 4 == 15) {
            const int i = (int)(take(&s) % 4);
            shm[i] = shw[i] + 1;
            note_bad(c, &c->bad_params, "mask extent neither 1 nor full");
        }
        c->mask.used = 1;
        c->mask.ly = draw_layout(&s);
        alloc_tensor(c, &c->mask, dm, shm, 0, &c->bad_params, take(&s));
        c->params.mask = &c->mask.t;
    }

    /* ALiBi */
    const unsigned al = take(&s);
    if (al % 4 == 3) {
        const int mis = al >> 2 == 63;
        c->slopes_bytes = (size_t)c->Hq * sizeof(float) + (size_t)mis;
        c->slopes_buf = malloc(c->slopes_bytes);
        float *sl = (float *)(void *)((unsigned char *)c->slopes_buf + mis);
        for (int64_t h = 0; h < c->Hq; h++) {
            const float x = ldexpf(1.0f, -(int)(1 + take(&s) % 8));
            if (mis)
                memcpy((unsigned char *)sl + h * 4, &x, sizeof x);
            else
                sl[h] = (al >> 2 & 3u) == 1 ? -x : x;
        }
        if (mis)
            note_bad(c, &c->bad_params, "alibi_slopes misaligned");
        if (!mis && (al >> 4 & 7u) == 7) {
            sl[take(&s) % (unsigned)c->Hq] = (al >> 7) ? NAN : INFINITY;
            note_bad(c, &c->bad_params, "alibi slope not finite");
        }
        c->params.alibi_slopes = sl;
    }

    /* values; the gaps of inputs hold NaN so that reading them shows */
    const unsigned mg = take(&s);
    for (int i = 0; i < 4; i++)
        if (all[i]->used)
            memset(all[i]->buf, all[i]->t.dtype == SDPA_BOOL ? 0x00 : 0xFF, all[i]->bytes);
    const int valid_values = fillable(&c->q) && fillable(&c->k) && fillable(&c->v);
    if (fillable(&c->q))
        fill_float(&c->q, &s, &rng, ldexp(1.0, (int)(mg % 5) - 2));
    if (fillable(&c->k))
        fill_float(&c->k, &s, &rng, ldexp(1.0, (int)(mg / 5 % 5) - 2));
    if (fillable(&c->v))
        fill_float(&c->v, &s, &rng, ldexp(1.0, (int)(mg / 25 % 5) - 2));
    if (c->mask.used && fillable(&c->mask)) {
        static const unsigned thr[8] = {0, 16, 48, 96, 160, 224, 252, 256};
        fill_mask(&c->mask, &s, &rng, thr[take(&s) % 8]);
    }

    /* special values */
    const unsigned sp = take(&s);
    if (sp % 4 == 3 && valid_values) {
        c->n_inj = 1 + (int)(sp >> 2) % 4;
        for (int n = 0; n < c->n_inj; n++) {
            injection *in = &c->inj[n];
            in->tensor = (int)(take(&s) % 4);
            in->kind = (int)(take(&s) % 5);
            ftensor *f = all[in->tensor];
            if (!f->used || !fillable(f) || (in->tensor == 3 && f->t.dtype == SDPA_BOOL)) {
                in->tensor = 2;
                f = &c->v;
            }
            int64_t flat = (int64_t)take16(&s);
            for (int i = 3; i >= 0; i--) {
                in->at[i] = flat % f->t.shape[i];
                flat /= f->t.shape[i];
            }
            static const double val[5] = {NAN, INFINITY, -INFINITY, 1.0, -1.0};
            double x = val[in->kind];
            if (in->kind >= 3)
                x *= in->tensor == 3 ? 1e9 : huge_value(f->t.dtype, in->tensor == 2, dout);
            tu_set(&f->t, in->at[0], in->at[1], in->at[2], in->at[3], x);
            if (in->tensor == 3)
                c->nonfinite |= in->kind <= 1; /* -inf and -1e9 are ordinary mask values */
            else if (in->kind <= 2)
                c->nonfinite = 1;
            else if (in->tensor <= 1)
                c->huge_qk = 1;
        }
    }

    /* NULLs, aliasing and wrong extents (rare) */
    const unsigned odd = take(&s);
    if (odd % 64 == 63) {
        switch (take(&s) % 12) {
        case 0:
            c->ctx_null = 1;
            note_bad(c, &c->bad_common, "ctx NULL");
            break;
        case 1:
            c->q.null_tensor = 1;
            note_bad(c, &c->bad_common, "q NULL");
            break;
        case 2:
            c->k.t.data = NULL;
            note_bad(c, &c->bad_common, "k.data NULL");
            break;
        case 3:
            c->v.null_tensor = 1;
            note_bad(c, &c->bad_fwd, "v NULL");
            break;
        case 4:
            c->out.t.data = NULL;
            note_bad(c, &c->bad_fwd, "out.data NULL");
            break;
        case 5:
            c->out.null_tensor = 1;
            note_bad(c, &c->bad_fwd, "out NULL");
            break;
        case 6:
            if (c->lse.used) {
                c->lse.t.data = NULL;
                note_bad(c, &c->bad_fwd, "lse.data NULL");
            }
            break;
        case 7:
            if (c->mask.used) {
                c->mask.t.data = NULL;
                note_bad(c, &c->bad_params, "mask.data NULL");
            }
            break;
        case 8:
            c->w.null_tensor = 1;
            note_bad(c, &c->bad_w, "weights NULL");
            break;
        case 9:
            c->params_null = 1; /* valid: the defaults */
            break;
        default:
            perturb(c, &s);
            break;
        }
    } else if (odd % 64 == 62) {
        /* an output pointing into an input or into the other output */
        const unsigned which = take(&s) % 6;
        ftensor *victim = which == 1 ? &c->k : which == 2 ? &c->v : &c->q;
        if (which == 3 && c->mask.used)
            victim = &c->mask;
        if (which == 4 && c->lse.used) {
            c->lse.t.data = c->out.t.data;
            c->lse.alias = 1;
            note_bad(c, &c->bad_fwd, "lse aliases out");
        } else if (which == 5) {
            c->w.t.data = (take(&s) & 1u) ? c->q.t.data : c->k.t.data;
            c->w.alias = 1;
            note_bad(c, &c->bad_w, "weights alias q or k");
        } else {
            c->out.t.data = victim->t.data;
            c->out.alias = 1;
            note_bad(c, &c->bad_fwd, "out aliases an input");
        }
    }

    if (c->params_null) {
        /* NULL params means the defaults: the case describes what the calls see */
        memset(&c->params, 0, sizeof c->params);
        c->mask.used = 0;
    }
    current = c;

    /* the call under test */
    sdpa_ctx *ctx = get_ctx(c->isa, c->t1);
    for (int i = 4; i < 7; i++)
        fill_canary(all[i]);
    snapshot snap;
    take_snapshot(c, &snap);
    const sdpa_params *pr = c->params_null ? NULL : &c->params;
    const sdpa_status st = sdpa_forward(c->ctx_null ? NULL : ctx, arg(&c->q), arg(&c->k),
                                        arg(&c->v), pr, arg_out(&c->out), arg_out(&c->lse));
    const int bad = c->bad_common || (c->bad_params && !c->params_null) || c->bad_fwd;
    check_status(c, st, ctx, "sdpa_forward", bad, !bad);
    check_snapshot(c, &snap, "sdpa_forward");
    double *g_lse = NULL;
    if (st != SDPA_OK) {
        if (!is_canary(&c->out) || (c->lse.used && !is_canary(&c->lse)))
            violation("sdpa_forward failed with %s but wrote into an output", sdpa_status_name(st));
    } else {
        check_gaps(&c->out, "sdpa_forward");
        check_gaps(&c->lse, "sdpa_forward");
        unsigned char *ref_out = malloc(c->out.bytes);
        unsigned char *ref_lse = c->lse.used ? malloc(c->lse.bytes) : NULL;
        memcpy(ref_out, c->out.buf, c->out.bytes);
        if (ref_lse != NULL)
            memcpy(ref_lse, c->lse.buf, c->lse.bytes);
        g_lse = check_forward_result(c, ctx);
        check_same_bytes(c, ctx, ref_out, ref_lse, "a second call");
        check_same_bytes(c, get_ctx(c->isa, c->t2), ref_out, ref_lse, "another thread count");
        check_snapshot(c, &snap, "sdpa_forward (again)");
        free(ref_out);
        free(ref_lse);
    }
    if (!c->skip_weights) {
        check_weights(c, ctx, g_lse);
        check_snapshot(c, &snap, "sdpa_weights");
    }
    free(g_lse);
    free_snapshot(&snap);
    free_case(c);
    current = NULL;
    return 0;
}
