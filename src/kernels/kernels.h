/*
 * kernels.h — the table of implementations the context dispatches to.
 *
 * An implementation (sdpa__impl) computes validated problems (see core/internal.h). Each
 * declares the instruction-set level it needs; dispatch (src/dispatch/dispatch.c) picks, once
 * per context, the best registered implementation whose level the CPU, the OS, the context's
 * max_isa and SDPA_MAX_ISA all allow. The reference (src/ref/) is the first entry and needs
 * nothing, so there is always one. Faster paths register themselves in dispatch.c's list;
 * an implementation that cannot handle some problem says so through its `supports` hook and
 * the next one down the list is used.
 */
#ifndef SDPA_KERNELS_H
#define SDPA_KERNELS_H

#include "../core/internal.h"

/*
 * Micro-kernels of the tiled ("flash") forward, one table per ISA (src/kernels/<isa>/).
 * The driver (src/attn/flash.c) works on a tile of query rows against a tile of keys with
 * the scores kept TRANSPOSED, s[j * lds + r] for key j and query row r, so that the online
 * softmax runs down columns: every SIMD lane is one query row, and max, exp and sum need no
 * horizontal reductions. Query rows are padded to a multiple of `lanes`; keys are not padded.
 * All matrices are f32 with strides in elements (K and V strides may be 0 or negative: they
 * can point straight into the caller's tensors).
 */
typedef struct sdpa__ukernels {
    const char *name;
    sdpa_isa isa;
    int lanes; /* query rows per vector; nr arguments below are multiples of it */
    /* qt[d*ldq + r] = rows[r][d] for r < nr, d < dk, and 0 for nr <= r < round_up(nr, lanes):
     * the query rows of a task, transposed so that rows run along the vector lanes */
    void (*pack_q)(int64_t nr, int64_t dk, const float *const *rows, float *qt, int64_t ldq);
    /* s[j*lds + r] = scale * sum_d k[j*ldk + d] * qt[d*ldq + r]   for j < nk, r < nr
     * (the scale is applied to the finished dot product, as the reference does) */
    void (*qk)(int64_t nk, int64_t nr, int64_t dk, const float *k, int64_t ldk, const float *qt,
               int64_t ldq, float scale, float *s, int64_t lds);
    /* Optional (NULL: not offered), for a decode step's few query rows: the scores of nr <= 4
     * rows given row-major (q_rows[r][d]), as qk computes them, into lanes [0, nr) of one
     * vector of lanes per key; lanes [nr, lanes) are set to 0. Where qk would spend a whole
     * vector of FMAs per key and feature on 4 useful lanes, this runs along the features. */
    void (*qk_few)(int64_t nk, int64_t nr, int64_t dk, const float *k, int64_t ldk,
                   const float *const *q_rows, float scale, float *s, int64_t lds);
    /* The online-softmax step for nk keys, for every row r < nr:
     *   m' = max(m[r], max_j s[j][r]);  u = (m' == -inf ? 0 : m')
     *   alpha[r] = exp(m[r] - u);  s[j][r] = (s == -inf ? -0.0f : exp(s - u))
     *   l[r] = l[r] * alpha[r] + sum_j s[j][r];  m[r] = m'
     * -0.0 marks hidden keys (exp never returns it), so that a careful P.V can skip them.
     * @return nonzero if any score was -inf (some key is hidden from some row). */
    int (*softmax)(int64_t nk, int64_t nr, float *s, int64_t lds, float *m, float *l, float *alpha);
    /* o[r*ldo + c] = alpha[r] * o[r*ldo + c] + sum_j p[j*ldp + r] * v[j*ldv + c]
     * for r < nr (not padded), c < dv. */
    void (*pv)(int64_t nk, int64_t nr, int64_t dv, const float *p, int64_t ldp, const float *alpha,
               const float *v, int64_t ldv, float *o, int64_t ldo);
} sdpa__ukernels;

extern const sdpa__ukernels sdpa__uk_generic;
/* The most query rows qk_few takes. */
#define SDPA__FEW_ROWS 4
/* The portable P V, which skips hidden keys: also the careful P V for V tiles with NaN/Inf. */
void sdpa__pv_generic(int64_t nk, int64_t nr, int64_t dv, const float *p, int64_t ldp,
                      const float *alpha, const float *v, int64_t ldv, float *o, int64_t ldo);
/* The portable pack_q, shared by tables that have no faster one. */
void sdpa__pack_q_generic(int64_t nr, int64_t dk, const float *const *rows, float *qt, int64_t ldq);
#if defined(SDPA_HAVE_X86)
extern const sdpa__ukernels sdpa__uk_avx2;
extern const sdpa__ukernels sdpa__uk_avx512;
#endif

typedef struct sdpa__impl sdpa__impl;
struct sdpa__impl {
    const char *name;         /* shown by sdpa_ctx_describe() */
    sdpa_isa isa;             /* level it requires */
    const sdpa__ukernels *uk; /* the micro-kernels it drives, or NULL */
    /* Optional: returns nonzero if this implementation handles p. NULL = handles everything. */
    int (*supports)(const sdpa__problem *p);
    /* out: (B, Hq, Lq, Dv); lse: NULL or (B, Hq, Lq, 1) F32. May fail only with NOMEM. */
    sdpa_status (*forward)(const sdpa__impl *self, sdpa_ctx *ctx, const sdpa__problem *p,
                           sdpa_tensor *out, sdpa_tensor *lse);
    /* w: (B, Hq, Lq, Lk) F32. May fail only with NOMEM. NULL: not offered (the next
     * implementation down the list that offers it is used). */
    sdpa_status (*weights)(const sdpa__impl *self, sdpa_ctx *ctx, const sdpa__problem *p,
                           sdpa_tensor *w);
};

/* The reference, in src/ref/: double accumulation, the whole contract. */
extern const sdpa__impl sdpa__impl_reference;

/* The tiled forward driver (src/attn/flash.c), run with self->uk. */
sdpa_status sdpa__flash_forward(const sdpa__impl *self, sdpa_ctx *ctx, const sdpa__problem *p,
                                sdpa_tensor *out, sdpa_tensor *lse);

typedef enum sdpa__op { SDPA__OP_FORWARD, SDPA__OP_WEIGHTS } sdpa__op;

/* Chooses the implementation of `op` for a context at level `isa` and problem p: the best
 * registered one that offers op and supports p. Never NULL (the reference offers all). */
const sdpa__impl *sdpa__select(sdpa_isa isa, sdpa__op op, const sdpa__problem *p);

/* The list in preference order (best last), for sdpa_ctx_describe(). */
const sdpa__impl *const *sdpa__impls(int *count);

#endif /* SDPA_KERNELS_H */
