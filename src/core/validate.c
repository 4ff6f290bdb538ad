/*
 * validate.c — every argument of every entry point is checked here, before anything is
 * written, and turned into an sdpa__problem (see problem.h). The entry points describe their
 * tensors as tables of roles (validate.h); one driver, sdpa__validate, checks any table in the
 * fixed order stated there, and each failure names the argument and its values in the
 * context's message.
 */
#include "validate.h"

#include "services.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The byte range [lo, hi] (inclusive) a tensor can touch. */
typedef struct span {
    uintptr_t lo, hi;
} span;

static sdpa_status check_present(sdpa_ctx *ctx, const char *name, const sdpa_tensor *t) {
    if (t == NULL)
        return sdpa__fail(ctx, SDPA_ERR_NULL, "%s is NULL", name);
    if (t->data == NULL)
        return sdpa__fail(ctx, SDPA_ERR_NULL, "%s.data is NULL", name);
    return SDPA_OK;
}

/* Every extent in [1, SDPA_MAX_EXTENT]; the last also <= SDPA_MAX_HEAD_DIM if head_dim. */
static sdpa_status check_dims(sdpa_ctx *ctx, const char *name, const sdpa_tensor *t, int head_dim) {
    for (int i = 0; i < 4; i++) {
        const int64_t n = t->shape[i];
        if (n < 1)
            return sdpa__fail(ctx, SDPA_ERR_DIM, "%s.shape[%d]=%lld must be >= 1", name, i,
                              (long long)n);
        if (n > SDPA_MAX_EXTENT)
            return sdpa__fail(ctx, SDPA_ERR_DIM, "%s.shape[%d]=%lld exceeds SDPA_MAX_EXTENT=%lld",
                              name, i, (long long)n, (long long)SDPA_MAX_EXTENT);
    }
    if (head_dim && t->shape[3] > SDPA_MAX_HEAD_DIM)
        return sdpa__fail(ctx, SDPA_ERR_DIM, "%s.shape[3]=%lld exceeds SDPA_MAX_HEAD_DIM=%lld",
                          name, (long long)t->shape[3], (long long)SDPA_MAX_HEAD_DIM);
    return SDPA_OK;
}

/* a.shape[ai] must equal want (which comes from b.shape[bi]). */
static sdpa_status check_eq(sdpa_ctx *ctx, const char *a, const sdpa_tensor *ta, int ai,
                            const char *b, int bi, int64_t want) {
    if (ta->shape[ai] != want)
        return sdpa__fail(ctx, SDPA_ERR_SHAPE, "%s.shape[%d]=%lld but %s.shape[%d]=%lld", a, ai,
                          (long long)ta->shape[ai], b, bi, (long long)want);
    return SDPA_OK;
}

/* Computes the byte range of t, checking every product and sum for overflow. */
static sdpa_status check_span(sdpa_ctx *ctx, const char *name, const sdpa_tensor *t, span *s) {
    int64_t neg = 0, pos = 0;
    for (int i = 0; i < 4; i++) {
        if (t->shape[i] == 1)
            continue; /* the stride of a single-element extent is never used */
        int64_t ext;
        if (__builtin_mul_overflow(t->shape[i] - 1, t->stride[i], &ext) ||
            __builtin_add_overflow(ext < 0 ? neg : pos, ext, ext < 0 ? &neg : &pos))
            return sdpa__fail(ctx, SDPA_ERR_OVERFLOW,
                              "%s: the span of dimensions 0..%d overflows int64 (extent %lld x "
                              "stride %lld)",
                              name, i, (long long)t->shape[i], (long long)t->stride[i]);
    }
    const int64_t es = (int64_t)sdpa_dtype_size(t->dtype);
    int64_t elems, bytes, neg_bytes, pos_bytes;
    if (__builtin_sub_overflow(pos, neg, &elems) || __builtin_add_overflow(elems, 1, &elems) ||
        __builtin_mul_overflow(elems, es, &bytes) || (uint64_t)bytes > (uint64_t)SIZE_MAX ||
        __builtin_mul_overflow(neg, es, &neg_bytes) || __builtin_mul_overflow(pos, es, &pos_bytes))
        return sdpa__fail(ctx, SDPA_ERR_OVERFLOW,
                          "%s: the address span of shape (%lld, %lld, %lld, %lld) with strides "
                          "(%lld, %lld, %lld, %lld) overflows int64 bytes",
                          name, (long long)t->shape[0], (long long)t->shape[1],
                          (long long)t->shape[2], (long long)t->shape[3], (long long)t->stride[0],
                          (long long)t->stride[1], (long long)t->stride[2],
                          (long long)t->stride[3]);
    const uintptr_t base = (uintptr_t)t->data;
    const uintptr_t below = (uintptr_t)(uint64_t)(-neg_bytes);
    const uintptr_t above = (uintptr_t)(uint64_t)pos_bytes + (uintptr_t)es - 1;
    if (base < below || UINTPTR_MAX - base < above)
        return sdpa__fail(ctx, SDPA_ERR_OVERFLOW,
                          "%s: shape (%lld, %lld, %lld, %lld) with strides (%lld, %lld, %lld, "
                          "%lld) reaches %lld bytes below and %lld above data=%p, outside the "
                          "address space",
                          name, (long long)t->shape[0], (long long)t->shape[1],
                          (long long)t->shape[2], (long long)t->shape[3], (long long)t->stride[0],
                          (long long)t->stride[1], (long long)t->stride[2], (long long)t->stride[3],
                          (long long)-neg_bytes, (long long)pos_bytes, t->data);
    if (base % (uintptr_t)es != 0)
        return sdpa__fail(ctx, SDPA_ERR_PARAM,
                          "%s.data=%p is not aligned to its %lld-byte %s "
                          "elements",
                          name, t->data, (long long)es, sdpa_dtype_name(t->dtype));
    s->lo = base - below;
    s->hi = base + above;
    return SDPA_OK;
}

/* An output must not write one address twice: no stride 0 over an extent > 1, and, sorted by
 * |stride|, each stride must step past everything the smaller ones reach. This is sufficient
 * (not necessary) for distinct elements to have distinct addresses. */
static sdpa_status check_no_self_overlap(sdpa_ctx *ctx, const char *name, const sdpa_tensor *t) {
    int64_t st[4], ex[4];
    int n = 0;
    for (int i = 0; i < 4; i++) {
        if (t->shape[i] == 1)
            continue;
        if (t->stride[i] == 0)
            return sdpa__fail(ctx, SDPA_ERR_ALIAS,
                              "%s.stride[%d]=0 with %s.shape[%d]=%lld: output elements would "
                              "share memory",
                              name, i, name, i, (long long)t->shape[i]);
        /* insertion sort by |stride|; spans were checked, so no overflow below */
        int64_t a = t->stride[i] < 0 ? -t->stride[i] : t->stride[i];
        int k = n++;
        while (k > 0 && st[k - 1] > a) {
            st[k] = st[k - 1];
            ex[k] = ex[k - 1];
            k--;
        }
        st[k] = a;
        ex[k] = t->shape[i];
    }
    int64_t reach = 0;
    for (int k = 0; k < n; k++) {
        if (st[k] <= reach)
            return sdpa__fail(ctx, SDPA_ERR_ALIAS,
                              "%s: strides (%lld, %lld, %lld, %lld) are not provably free of "
                              "overlap (sorted by size, each stride must exceed the span of "
                              "the smaller ones)",
                              name, (long long)t->stride[0], (long long)t->stride[1],
                              (long long)t->stride[2], (long long)t->stride[3]);
        reach += (ex[k] - 1) * st[k];
    }
    return SDPA_OK;
}

static int overlaps(span a, span b) {
    return a.lo <= b.hi && b.lo <= a.hi;
}

/* Whether dt (any value a caller may put in the field) is in the set of SDPA__DT bits. */
static int dtype_in(unsigned set, sdpa_dtype dt) {
    return (unsigned)dt < 32 && (set & SDPA__DT(dt)) != 0;
}

/* The role's dtype must be one its table allows: "must be f32" for a single choice, "is not
 * f32, f16 or bf16" for several. */
static sdpa_status check_dtype(sdpa_ctx *ctx, const sdpa__role *r, const sdpa_tensor *t) {
    if (dtype_in(r->dtypes, t->dtype))
        return SDPA_OK;
    static const sdpa_dtype order[] = {SDPA_F32, SDPA_F16, SDPA_BF16, SDPA_BOOL};
    char allowed[48] = "";
    int n = 0, total = 0;
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        total += (r->dtypes & SDPA__DT(order[i])) != 0;
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        if (!(r->dtypes & SDPA__DT(order[i])))
            continue;
        const size_t len = strlen(allowed);
        snprintf(allowed + len, sizeof allowed - len, "%s%s",
                 n == 0 ? "" : (n == total - 1 ? " or " : ", "), sdpa_dtype_name(order[i]));
        n++;
    }
    return sdpa__fail(ctx, SDPA_ERR_DTYPE, "%s.dtype=%s (%d) %s %s", r->name,
                      sdpa_dtype_name(t->dtype), (int)t->dtype, total == 1 ? "must be" : "is not",
                      allowed);
}

static sdpa_status check_params(sdpa_ctx *ctx, const sdpa_params *pr, int64_t hq) {
    if (pr->align != SDPA_ALIGN_TOP_LEFT && pr->align != SDPA_ALIGN_BOTTOM_RIGHT)
        return sdpa__fail(ctx, SDPA_ERR_PARAM,
                          "params.align=%d is not SDPA_ALIGN_TOP_LEFT (0) or "
                          "SDPA_ALIGN_BOTTOM_RIGHT (1)",
                          (int)pr->align);
    if (!isfinite(pr->scale))
        return sdpa__fail(ctx, SDPA_ERR_PARAM, "params.scale=%g is not finite", (double)pr->scale);
    if (!isfinite(pr->softcap) || pr->softcap < 0)
        return sdpa__fail(ctx, SDPA_ERR_PARAM,
                          "params.softcap=%g must be 0 (off) or positive and finite",
                          (double)pr->softcap);
    if (pr->use_window && pr->window_left < -1)
        return sdpa__fail(ctx, SDPA_ERR_PARAM,
                          "params.window_left=%lld must be -1 (unbounded) or >= 0",
                          (long long)pr->window_left);
    if (pr->use_window && pr->window_right < -1)
        return sdpa__fail(ctx, SDPA_ERR_PARAM,
                          "params.window_right=%lld must be -1 (unbounded) or >= 0",
                          (long long)pr->window_right);
    if (!(pr->dropout_p >= 0.0f && pr->dropout_p < 1.0f))
        return sdpa__fail(ctx, SDPA_ERR_PARAM,
                          "params.dropout_p=%g must be 0 (off) or in (0, 1): the chance that a "
                          "weight is dropped",
                          (double)pr->dropout_p);
    if (pr->alibi_slopes != NULL && (uintptr_t)pr->alibi_slopes % sizeof(float) != 0)
        return sdpa__fail(ctx, SDPA_ERR_PARAM,
                          "params.alibi_slopes=%p is not aligned to 4-byte floats",
                          (const void *)pr->alibi_slopes);
    if (pr->alibi_slopes != NULL) {
        for (int64_t h = 0; h < hq; h++)
            if (!isfinite(pr->alibi_slopes[h]))
                return sdpa__fail(ctx, SDPA_ERR_PARAM, "params.alibi_slopes[%lld]=%g is not finite",
                                  (long long)h, (double)pr->alibi_slopes[h]);
    }
    if (pr->sinks != NULL && (uintptr_t)pr->sinks % sizeof(float) != 0)
        return sdpa__fail(ctx, SDPA_ERR_PARAM, "params.sinks=%p is not aligned to 4-byte floats",
                          (const void *)pr->sinks);
    if (pr->sinks != NULL) {
        for (int64_t h = 0; h < hq; h++)
            if (isnan(pr->sinks[h]) || pr->sinks[h] == INFINITY)
                return sdpa__fail(ctx, SDPA_ERR_PARAM,
                                  "params.sinks[%lld]=%g must be finite, or -inf for no sink",
                                  (long long)h, (double)pr->sinks[h]);
    }
    return SDPA_OK;
}

/* Checks the mask against (B, Hq, Lq, Lk) and stores it expanded in p->mask. */
static sdpa_status check_mask(sdpa_ctx *ctx, const sdpa_tensor *m, sdpa__problem *p) {
    sdpa_status st = check_present(ctx, "mask", m);
    if (st != SDPA_OK)
        return st;
    if (!dtype_in(SDPA__DT_FLOAT | SDPA__DT(SDPA_BOOL), m->dtype))
        return sdpa__fail(ctx, SDPA_ERR_DTYPE, "mask.dtype=%s (%d) is not bool, f32, f16 or bf16",
                          sdpa_dtype_name(m->dtype), (int)m->dtype);
    if ((st = check_dims(ctx, "mask", m, 0)) != SDPA_OK)
        return st;
    const int64_t want[4] = {p->B, p->Hq, p->Lq, p->Lk};
    static const char *const dim_names[4] = {"B", "Hq", "Lq", "Lk"};
    p->mask = *m;
    for (int i = 0; i < 4; i++) {
        if (m->shape[i] != want[i] && m->shape[i] != 1)
            return sdpa__fail(ctx, SDPA_ERR_BROADCAST,
                              "mask.shape[%d]=%lld is neither 1 nor %s=%lld (mask shape "
                              "(%lld, %lld, %lld, %lld), target (%lld, %lld, %lld, %lld))",
                              i, (long long)m->shape[i], dim_names[i], (long long)want[i],
                              (long long)m->shape[0], (long long)m->shape[1],
                              (long long)m->shape[2], (long long)m->shape[3], (long long)want[0],
                              (long long)want[1], (long long)want[2], (long long)want[3]);
        if (m->shape[i] == 1) {
            p->mask.shape[i] = want[i];
            p->mask.stride[i] = 0;
        }
    }
    p->has_mask = 1;
    return SDPA_OK;
}

/* Fills the scalar parts of p from params (already checked). */
static void resolve_params(const sdpa_params *pr, sdpa__problem *p) {
    p->scale = pr->scale == 0.0f ? 1.0 / sqrt((double)p->Dk) : (double)pr->scale;
    p->softcap = (double)pr->softcap;
    p->off = pr->align == SDPA_ALIGN_BOTTOM_RIGHT ? p->Lk - p->Lq : 0;
    p->window_left = pr->use_window ? pr->window_left : -1;
    p->window_right = pr->use_window ? pr->window_right : -1;
    /* |j - (i + off)| < Lq + Lk for every pair, so a wider bound hides nothing: make it open,
     * which also keeps i + off +- window far from int64 overflow in every implementation */
    if (p->window_left > p->Lq + p->Lk)
        p->window_left = -1;
    if (p->window_right > p->Lq + p->Lk)
        p->window_right = -1;
    if (pr->causal)
        p->window_right = 0;
    p->alibi = pr->alibi_slopes;
    p->sinks = pr->sinks;
    p->bottom_right = pr->align == SDPA_ALIGN_BOTTOM_RIGHT;
    p->dropout_p = (double)pr->dropout_p;
    p->dropout_seed = pr->dropout_seed;
    p->dropout_offset = pr->dropout_offset;
}

/* The span `out` of output `name` must not meet any of the spans in[n_in]. */
static sdpa_status check_apart(sdpa_ctx *ctx, const char *name, const span *out, const span *in,
                               const char *const *in_names, int n_in) {
    for (int n = 0; n < n_in; n++)
        if (overlaps(*out, in[n]))
            return sdpa__fail(ctx, SDPA_ERR_ALIAS, "%s (bytes %p..%p) overlaps %s (bytes %p..%p)",
                              name, (void *)out->lo, (void *)out->hi, in_names[n], (void *)in[n].lo,
                              (void *)in[n].hi);
    return SDPA_OK;
}

/* An output must not overlap itself, any input, or an earlier output. */
static sdpa_status check_output(sdpa_ctx *ctx, const char *name, const sdpa_tensor *t,
                                const span *in, const char *const *in_names, int n_in, span *out) {
    sdpa_status st;
    if ((st = check_span(ctx, name, t, out)) != SDPA_OK ||
        (st = check_no_self_overlap(ctx, name, t)) != SDPA_OK)
        return st;
    return check_apart(ctx, name, out, in, in_names, n_in);
}

/* Each extent of role n against its shape expression; Hq % Hkv right after k's. */
static sdpa_status check_shapes(sdpa_ctx *ctx, const sdpa__signature *sig,
                                const sdpa_tensor *const *t) {
    for (int n = 0; n < sig->n_roles; n++) {
        const sdpa__role *r = &sig->roles[n];
        if (t[n] == NULL)
            continue;
        for (int i = 0; i < 4; i++) {
            const sdpa__dim e = r->shape[i];
            sdpa_status st = SDPA_OK;
            if (e.kind == SDPA__DIM_ONE && t[n]->shape[i] != 1)
                st = sdpa__fail(ctx, SDPA_ERR_SHAPE, "%s.shape[%d]=%lld must be 1", r->name, i,
                                (long long)t[n]->shape[i]);
            else if (e.kind == SDPA__DIM_SAME)
                st = check_eq(ctx, r->name, t[n], i, sig->roles[e.role].name, e.dim,
                              t[e.role]->shape[e.dim]);
            if (st != SDPA_OK)
                return st;
        }
        if (n == SDPA__ROLE_K && t[0]->shape[1] % t[1]->shape[1] != 0)
            return sdpa__fail(ctx, SDPA_ERR_HEADS,
                              "q.shape[1]=%lld (Hq) is not a multiple of k.shape[1]=%lld (Hkv)",
                              (long long)t[0]->shape[1], (long long)t[1]->shape[1]);
    }
    return SDPA_OK;
}

sdpa_status sdpa__validate(sdpa_ctx *ctx, const sdpa__signature *sig, const sdpa_tensor *const *t,
                           const sdpa_params *params, int64_t max_pages, sdpa__problem *p) {
    static const sdpa_params defaults = {0};
    const int nr = sig->n_roles;
    sdpa_status st;
    *p = (sdpa__problem){0};
    for (int n = 0; n < nr; n++)
        if ((t[n] != NULL || !sig->roles[n].optional) &&
            (st = check_present(ctx, sig->roles[n].name, t[n])) != SDPA_OK)
            return st;
    if (params == NULL)
        params = &defaults;
    for (int n = 0; n < nr; n++)
        if (t[n] != NULL && (st = check_dtype(ctx, &sig->roles[n], t[n])) != SDPA_OK)
            return st;
    for (int n = 0; n < nr; n++)
        if (t[n] != NULL &&
            (st = check_dims(ctx, sig->roles[n].name, t[n], sig->roles[n].head_dim)) != SDPA_OK)
            return st;
    if ((st = check_shapes(ctx, sig, t)) != SDPA_OK)
        return st;

    const sdpa_tensor *q = t[SDPA__ROLE_Q], *k = t[SDPA__ROLE_K];
    p->B = q->shape[0];
    p->Hq = q->shape[1];
    p->Lq = q->shape[2];
    p->Dk = q->shape[3];
    p->Hkv = k->shape[1];
    p->Lk = k->shape[2];
    if (max_pages > 0) { /* k and v are pools of pages: the keys of a sequence are its pages' */
        if (max_pages > SDPA_MAX_EXTENT / k->shape[2])
            return sdpa__fail(ctx, SDPA_ERR_DIM,
                              "cache.max_pages=%lld x page size k.shape[2]=%lld keys exceeds "
                              "SDPA_MAX_EXTENT=%lld",
                              (long long)max_pages, (long long)k->shape[2],
                              (long long)SDPA_MAX_EXTENT);
        p->page_size = k->shape[2];
        p->max_pages = max_pages;
        p->Lk = max_pages * k->shape[2];
    }
    p->group = p->Hq / p->Hkv;
    p->q = *q;
    p->k = *k;
    if (sig->has_v) {
        p->Dv = t[SDPA__ROLE_V]->shape[3];
        p->v = *t[SDPA__ROLE_V];
    }
    if (params->mask != NULL && (st = check_mask(ctx, params->mask, p)) != SDPA_OK)
        return st;
    if ((st = check_params(ctx, params, p->Hq)) != SDPA_OK)
        return st;
    resolve_params(params, p);

    /* Spans: the inputs in table order, then the mask (the caller's view, not the expanded
     * one: same span, and a message shows their numbers) and the ALiBi slopes. Each output is
     * then compared with all of them and with the outputs before it. */
    span sp[SDPA__MAX_ROLES + 3];
    const char *names[SDPA__MAX_ROLES + 3];
    int n_sp = 0;
    for (int n = 0; n < nr; n++) {
        if (t[n] == NULL || sig->roles[n].output)
            continue;
        if ((st = check_span(ctx, sig->roles[n].name, t[n], &sp[n_sp])) != SDPA_OK)
            return st;
        names[n_sp++] = sig->roles[n].name;
    }
    if (params->mask != NULL) {
        if ((st = check_span(ctx, "mask", params->mask, &sp[n_sp])) != SDPA_OK)
            return st;
        names[n_sp++] = "mask";
    }
    if (p->alibi != NULL) {
        sp[n_sp].lo = (uintptr_t)p->alibi;
        sp[n_sp].hi = sp[n_sp].lo + (uintptr_t)p->Hq * sizeof(float) - 1;
        names[n_sp++] = "params.alibi_slopes";
    }
    if (p->sinks != NULL) {
        sp[n_sp].lo = (uintptr_t)p->sinks;
        sp[n_sp].hi = sp[n_sp].lo + (uintptr_t)p->Hq * sizeof(float) - 1;
        names[n_sp++] = "params.sinks";
    }
    for (int n = 0; n < nr; n++) {
        if (t[n] == NULL || !sig->roles[n].output)
            continue;
        if ((st = check_output(ctx, sig->roles[n].name, t[n], sp, names, n_sp, &sp[n_sp])) !=
            SDPA_OK)
            return st;
        names[n_sp++] = sig->roles[n].name;
    }
    return SDPA_OK;
}

#define FREE_                                                                                      \
    { SDPA__DIM_FREE, 0, 0 }
#define ONE_                                                                                       \
    { SDPA__DIM_ONE, 0, 0 }
#define SAME_(role, dim)                                                                           \
    { SDPA__DIM_SAME, role, dim }
#define ROLE_Q_                                                                                    \
    {                                                                                              \
        "q", 0, 0, 1, SDPA__DT_FLOAT, {                                                            \
            FREE_, FREE_, FREE_, FREE_                                                             \
        }                                                                                          \
    }
#define ROLE_K_                                                                                    \
    {                                                                                              \
        "k", 0, 0, 1, SDPA__DT_FLOAT, {                                                            \
            SAME_(0, 0), FREE_, FREE_, SAME_(0, 3)                                                 \
        }                                                                                          \
    }

const sdpa__signature sdpa__sig_forward = {
    5,
    1,
    {ROLE_Q_,
     ROLE_K_,
     {"v", 0, 0, 1, SDPA__DT_FLOAT, {SAME_(1, 0), SAME_(1, 1), SAME_(1, 2), FREE_}},
     {"out", 1, 0, 1, SDPA__DT_FLOAT, {SAME_(0, 0), SAME_(0, 1), SAME_(0, 2), SAME_(2, 3)}},
     {"lse", 1, 1, 0, SDPA__DT(SDPA_F32), {SAME_(0, 0), SAME_(0, 1), SAME_(0, 2), ONE_}}}};

const sdpa__signature sdpa__sig_weights = {
    3,
    0,
    {ROLE_Q_,
     ROLE_K_,
     {"weights",
      1,
      0,
      0,
      SDPA__DT(SDPA_F32),
      {SAME_(0, 0), SAME_(0, 1), SAME_(0, 2), SAME_(1, 2)}}}};

/* The backward's: q, k, v, then the forward's out and lse and the incoming dout (inputs),
 * then dq, dk, dv shaped like q, k, v (outputs). */
const sdpa__signature sdpa__sig_backward = {
    9,
    1,
    {ROLE_Q_,
     ROLE_K_,
     {"v", 0, 0, 1, SDPA__DT_FLOAT, {SAME_(1, 0), SAME_(1, 1), SAME_(1, 2), FREE_}},
     {"out", 0, 0, 1, SDPA__DT_FLOAT, {SAME_(0, 0), SAME_(0, 1), SAME_(0, 2), SAME_(2, 3)}},
     {"lse", 0, 0, 0, SDPA__DT(SDPA_F32), {SAME_(0, 0), SAME_(0, 1), SAME_(0, 2), ONE_}},
     {"dout", 0, 0, 1, SDPA__DT_FLOAT, {SAME_(0, 0), SAME_(0, 1), SAME_(0, 2), SAME_(2, 3)}},
     {"dq", 1, 0, 1, SDPA__DT_FLOAT, {SAME_(0, 0), SAME_(0, 1), SAME_(0, 2), SAME_(0, 3)}},
     {"dk", 1, 0, 1, SDPA__DT_FLOAT, {SAME_(1, 0), SAME_(1, 1), SAME_(1, 2), SAME_(1, 3)}},
     {"dv", 1, 0, 1, SDPA__DT_FLOAT, {SAME_(2, 0), SAME_(2, 1), SAME_(2, 2), SAME_(2, 3)}}}};

sdpa_status sdpa__check_backward(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                                 const sdpa_tensor *v, const sdpa_tensor *out,
                                 const sdpa_tensor *lse, const sdpa_tensor *dout,
                                 const sdpa_params *params, const sdpa_tensor *dq,
                                 const sdpa_tensor *dk, const sdpa_tensor *dv, sdpa__problem *p) {
    const sdpa_tensor *const t[9] = {q, k, v, out, lse, dout, dq, dk, dv};
    return sdpa__validate(ctx, &sdpa__sig_backward, t, params, 0, p);
}

sdpa_status sdpa__check_forward(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                                const sdpa_tensor *v, const sdpa_params *params,
                                const sdpa_tensor *out, const sdpa_tensor *lse, sdpa__problem *p) {
    const sdpa_tensor *const t[5] = {q, k, v, out, lse};
    return sdpa__validate(ctx, &sdpa__sig_forward, t, params, 0, p);
}

sdpa_status sdpa__check_weights(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                                const sdpa_params *params, const sdpa_tensor *weights,
                                sdpa__problem *p) {
    const sdpa_tensor *const t[3] = {q, k, weights};
    return sdpa__validate(ctx, &sdpa__sig_weights, t, params, 0, p);
}

/* ---- sdpa_forward_kv ------------------------------------------------------------------------
 * The forward's roles, with k and v pools of pages (n_pages, Hkv, page_size, D) when the
 * cache is paged; then the lengths and the block table, each entry a read will go through. */

const sdpa__signature sdpa__sig_forward_paged = {
    5,
    1,
    {ROLE_Q_,
     {"k", 0, 0, 1, SDPA__DT_FLOAT, {FREE_, FREE_, FREE_, SAME_(0, 3)}},
     {"v", 0, 0, 1, SDPA__DT_FLOAT, {SAME_(1, 0), SAME_(1, 1), SAME_(1, 2), FREE_}},
     {"out", 1, 0, 1, SDPA__DT_FLOAT, {SAME_(0, 0), SAME_(0, 1), SAME_(0, 2), SAME_(2, 3)}},
     {"lse", 1, 1, 0, SDPA__DT(SDPA_F32), {SAME_(0, 0), SAME_(0, 1), SAME_(0, 2), ONE_}}}};

/* An int32 array of n entries: aligned, and apart from the outputs. */
static sdpa_status check_index_array(sdpa_ctx *ctx, const char *name, const int32_t *a, int64_t n,
                                     const sdpa_tensor *out, const sdpa_tensor *lse) {
    if ((uintptr_t)a % sizeof(int32_t) != 0)
        return sdpa__fail(ctx, SDPA_ERR_PARAM, "%s=%p is not aligned to 4-byte integers", name,
                          (const void *)a);
    const span in = {(uintptr_t)a, (uintptr_t)a + (uintptr_t)n * sizeof(int32_t) - 1};
    const char *const names[1] = {name};
    span o;
    sdpa_status st;
    /* the outputs' spans were taken by sdpa__validate: taking them again cannot fail */
    if ((st = check_span(ctx, "out", out, &o)) != SDPA_OK ||
        (st = check_apart(ctx, "out", &o, &in, names, 1)) != SDPA_OK)
        return st;
    if (lse != NULL && ((st = check_span(ctx, "lse", lse, &o)) != SDPA_OK ||
                        (st = check_apart(ctx, "lse", &o, &in, names, 1)) != SDPA_OK))
        return st;
    return SDPA_OK;
}

sdpa_status sdpa__check_forward_kv(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_kv_cache *cache,
                                   const sdpa_params *params, const sdpa_tensor *out,
                                   const sdpa_tensor *lse, sdpa__problem *p) {
    if (cache == NULL)
        return sdpa__fail(ctx, SDPA_ERR_NULL, "cache is NULL");
    const int paged = cache->block_table != NULL;
    if (paged && cache->max_pages < 1)
        return sdpa__fail(ctx, SDPA_ERR_PARAM,
                          "cache.max_pages=%lld must be >= 1 with a block table",
                          (long long)cache->max_pages);
    const sdpa_tensor *const t[5] = {q, cache->k, cache->v, out, lse};
    sdpa_status st = sdpa__validate(ctx, paged ? &sdpa__sig_forward_paged : &sdpa__sig_forward, t,
                                    params, paged ? cache->max_pages : 0, p);
    if (st != SDPA_OK)
        return st;
    if (p->dropout_p > 0.0)
        return sdpa__fail(ctx, SDPA_ERR_PARAM,
                          "params.dropout_p=%g: sdpa_forward_kv has no dropout (it serves "
                          "inference); use sdpa_forward",
                          p->dropout_p);
    const int64_t B = p->B, n_pages = paged ? cache->k->shape[0] : 0;
    if (paged && (uint64_t)B > (uint64_t)(SDPA_MAX_EXTENT / cache->max_pages))
        return sdpa__fail(ctx, SDPA_ERR_OVERFLOW,
                          "cache.block_table of B=%lld x max_pages=%lld entries is too large",
                          (long long)B, (long long)cache->max_pages);
    if (cache->seqlens_q != NULL &&
        (st = check_index_array(ctx, "cache.seqlens_q", cache->seqlens_q, B, out, lse)) != SDPA_OK)
        return st;
    if (cache->seqlens_k != NULL &&
        (st = check_index_array(ctx, "cache.seqlens_k", cache->seqlens_k, B, out, lse)) != SDPA_OK)
        return st;
    if (paged && (st = check_index_array(ctx, "cache.block_table", cache->block_table,
                                         B * cache->max_pages, out, lse)) != SDPA_OK)
        return st;
    for (int64_t b = 0; b < B; b++) {
        if (cache->seqlens_q != NULL && (cache->seqlens_q[b] < 0 || cache->seqlens_q[b] > p->Lq))
            return sdpa__fail(ctx, SDPA_ERR_INDEX,
                              "cache.seqlens_q[%lld]=%ld is outside [0, Lq=%lld]", (long long)b,
                              (long)cache->seqlens_q[b], (long long)p->Lq);
        if (cache->seqlens_k != NULL && (cache->seqlens_k[b] < 0 || cache->seqlens_k[b] > p->Lk))
            return sdpa__fail(ctx, SDPA_ERR_INDEX,
                              "cache.seqlens_k[%lld]=%ld is outside [0, %lld], the %s",
                              (long long)b, (long)cache->seqlens_k[b], (long long)p->Lk,
                              paged ? "pages' capacity max_pages x page size" : "k.shape[2]");
        if (!paged)
            continue;
        const int64_t lk = cache->seqlens_k != NULL ? cache->seqlens_k[b] : p->Lk;
        const int64_t used = (lk + p->page_size - 1) / p->page_size;
        for (int64_t e = 0; e < used; e++) {
            const int32_t page = cache->block_table[b * cache->max_pages + e];
            if (page < 0 || page >= n_pages)
                return sdpa__fail(ctx, SDPA_ERR_INDEX,
                                  "cache.block_table[%lld][%lld]=%ld is outside [0, n_pages=%lld) "
                                  "(sequence %lld has %lld keys: pages 0..%lld are read)",
                                  (long long)b, (long long)e, (long)page, (long long)n_pages,
                                  (long long)b, (long long)lk, (long long)(used - 1));
        }
    }
    p->seqlens_q = cache->seqlens_q;
    p->seqlens_k = cache->seqlens_k;
    p->block_table = cache->block_table;
    return SDPA_OK;
}

/* ---- sdpa_merge ----------------------------------------------------------------------------
 * Its tensors come in arrays of the caller's length, so they are not a table of roles: they
 * are visited as the sequence outs[0..n), lses[0..n), out, lse, in the order sdpa__validate
 * follows (presence, dtype, extents, shapes, spans and alignment, aliasing). out sets the
 * shape (B, H, L, D) the others are compared with. */

typedef struct merge_arg {
    const sdpa_tensor *t; /* NULL only for an absent lse */
    char name[40];
    int is_lse;
} merge_arg;

/* Argument k of the sequence above. */
static merge_arg merge_arg_at(int64_t n, const sdpa_tensor *outs, const sdpa_tensor *lses,
                              const sdpa_tensor *out, const sdpa_tensor *lse, int64_t k) {
    merge_arg a;
    if (k < n) {
        a.t = &outs[k];
        a.is_lse = 0;
        snprintf(a.name, sizeof a.name, "outs[%lld]", (long long)k);
    } else if (k < 2 * n) {
        a.t = &lses[k - n];
        a.is_lse = 1;
        snprintf(a.name, sizeof a.name, "lses[%lld]", (long long)(k - n));
    } else {
        a.t = k == 2 * n ? out : lse;
        a.is_lse = k != 2 * n;
        snprintf(a.name, sizeof a.name, "%s", a.is_lse ? "lse" : "out");
    }
    return a;
}

/* a's extents against out's: B, H, L equal, the last equal to D (or 1 for an LSE). */
static sdpa_status check_merge_shape(sdpa_ctx *ctx, const merge_arg *a, const sdpa_tensor *out) {
    sdpa_status st;
    for (int i = 0; i < 3; i++)
        if ((st = check_eq(ctx, a->name, a->t, i, "out", i, out->shape[i])) != SDPA_OK)
            return st;
    if (a->is_lse && a->t->shape[3] != 1)
        return sdpa__fail(ctx, SDPA_ERR_SHAPE, "%s.shape[3]=%lld must be 1", a->name,
                          (long long)a->t->shape[3]);
    return a->is_lse ? SDPA_OK : check_eq(ctx, a->name, a->t, 3, "out", 3, out->shape[3]);
}

sdpa_status sdpa__check_merge(sdpa_ctx *ctx, int64_t n_parts, const sdpa_tensor *outs,
                              const sdpa_tensor *lses, const sdpa_tensor *out,
                              const sdpa_tensor *lse) {
    if (n_parts < 1)
        return sdpa__fail(ctx, SDPA_ERR_PARAM, "n_parts=%lld must be >= 1", (long long)n_parts);
    if ((uint64_t)n_parts > SIZE_MAX / sizeof(sdpa_tensor))
        return sdpa__fail(ctx, SDPA_ERR_OVERFLOW,
                          "n_parts=%lld: an array of that many tensors overflows size_t",
                          (long long)n_parts);
    if (outs == NULL)
        return sdpa__fail(ctx, SDPA_ERR_NULL, "outs is NULL");
    if (lses == NULL)
        return sdpa__fail(ctx, SDPA_ERR_NULL, "lses is NULL");
    /* the inputs are arguments [0, 2n), out is 2n and lse 2n + 1 */
    const int64_t n_in = 2 * n_parts, n_args = n_in + 2;
    sdpa_status st;
    for (int64_t k = 0; k < n_args; k++) {
        const merge_arg a = merge_arg_at(n_parts, outs, lses, out, lse, k);
        if ((a.t != NULL || k != n_in + 1) && (st = check_present(ctx, a.name, a.t)) != SDPA_OK)
            return st;
    }
    for (int64_t k = 0; k < n_args; k++) {
        const merge_arg a = merge_arg_at(n_parts, outs, lses, out, lse, k);
        sdpa__role r;
        memset(&r, 0, sizeof r);
        r.name = a.name;
        r.dtypes = a.is_lse ? SDPA__DT(SDPA_F32) : SDPA__DT_FLOAT;
        if (a.t != NULL && (st = check_dtype(ctx, &r, a.t)) != SDPA_OK)
            return st;
    }
    for (int64_t k = 0; k < n_args; k++) {
        const merge_arg a = merge_arg_at(n_parts, outs, lses, out, lse, k);
        if (a.t != NULL && (st = check_dims(ctx, a.name, a.t, !a.is_lse)) != SDPA_OK)
            return st;
    }
    for (int64_t k = 0; k < n_args; k++) {
        const merge_arg a = merge_arg_at(n_parts, outs, lses, out, lse, k);
        if (a.t != NULL && k != n_in && (st = check_merge_shape(ctx, &a, out)) != SDPA_OK)
            return st;
    }
    span in;
    for (int64_t k = 0; k < n_in; k++) {
        const merge_arg a = merge_arg_at(n_parts, outs, lses, out, lse, k);
        if ((st = check_span(ctx, a.name, a.t, &in)) != SDPA_OK)
            return st;
    }
    /* each output apart from itself, every input (their spans were checked above, so taking
     * them again cannot fail) and, for lse, out */
    span o[2];
    for (int64_t k = n_in; k < n_args; k++) {
        const merge_arg a = merge_arg_at(n_parts, outs, lses, out, lse, k);
        if (a.t == NULL)
            continue;
        if ((st = check_output(ctx, a.name, a.t, NULL, NULL, 0, &o[k - n_in])) != SDPA_OK)
            return st;
        for (int64_t j = 0; j < k; j++) {
            const merge_arg b = merge_arg_at(n_parts, outs, lses, out, lse, j);
            const char *const b_name = b.name;
            if (j < n_in && (st = check_span(ctx, b.name, b.t, &in)) != SDPA_OK)
                return st;
            if ((st = check_apart(ctx, a.name, &o[k - n_in], j < n_in ? &in : &o[0], &b_name, 1)) !=
                SDPA_OK)
                return st;
        }
    }
    return SDPA_OK;
}
