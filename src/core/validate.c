/*
 * validate.c — every argument of sdpa_forward and sdpa_weights is checked here, before
 * anything is written, and turned into an sdpa__problem (see internal.h).
 *
 * The checks run in a fixed order, so that one bad argument gives one predictable status:
 * NULL pointers; the dtypes of v, out and lse (weights); q and k (dtype, extents, Dk and B
 * agreement, Hq % Hkv); the extents and shapes of v, out and lse (weights); the mask (NULL,
 * dtype, extents, broadcasting); scalar parameters; address spans and alignment of every
 * tensor; and last aliasing (which needs the spans). Each failure names the argument and its
 * values in the context's message.
 */
#include "internal.h"

#include <math.h>
#include <stdint.h>

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

static int is_float_dtype(sdpa_dtype dt) {
    return dt == SDPA_F32 || dt == SDPA_F16 || dt == SDPA_BF16;
}

static sdpa_status check_float(sdpa_ctx *ctx, const char *name, const sdpa_tensor *t) {
    if (!is_float_dtype(t->dtype))
        return sdpa__fail(ctx, SDPA_ERR_DTYPE, "%s.dtype=%s (%d) is not f32, f16 or bf16", name,
                          sdpa_dtype_name(t->dtype), (int)t->dtype);
    return SDPA_OK;
}

static sdpa_status check_f32(sdpa_ctx *ctx, const char *name, const sdpa_tensor *t) {
    if (t->dtype != SDPA_F32)
        return sdpa__fail(ctx, SDPA_ERR_DTYPE, "%s.dtype=%s (%d) must be f32", name,
                          sdpa_dtype_name(t->dtype), (int)t->dtype);
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
    return SDPA_OK;
}

/* Checks the mask against (B, Hq, Lq, Lk) and stores it expanded in p->mask. */
static sdpa_status check_mask(sdpa_ctx *ctx, const sdpa_tensor *m, sdpa__problem *p) {
    sdpa_status st = check_present(ctx, "mask", m);
    if (st != SDPA_OK)
        return st;
    if (m->dtype != SDPA_BOOL && !is_float_dtype(m->dtype))
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

/* The checks common to both entry points: q and k, the parameters and the mask. */
static sdpa_status check_qk(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                            sdpa__problem *p) {
    sdpa_status st;
    if ((st = check_float(ctx, "q", q)) != SDPA_OK || (st = check_float(ctx, "k", k)) != SDPA_OK)
        return st;
    if ((st = check_dims(ctx, "q", q, 1)) != SDPA_OK ||
        (st = check_dims(ctx, "k", k, 1)) != SDPA_OK)
        return st;
    if ((st = check_eq(ctx, "k", k, 0, "q", 0, q->shape[0])) != SDPA_OK ||
        (st = check_eq(ctx, "k", k, 3, "q", 3, q->shape[3])) != SDPA_OK)
        return st;
    if (q->shape[1] % k->shape[1] != 0)
        return sdpa__fail(ctx, SDPA_ERR_HEADS,
                          "q.shape[1]=%lld (Hq) is not a multiple of k.shape[1]=%lld (Hkv)",
                          (long long)q->shape[1], (long long)k->shape[1]);
    p->B = q->shape[0];
    p->Hq = q->shape[1];
    p->Lq = q->shape[2];
    p->Dk = q->shape[3];
    p->Hkv = k->shape[1];
    p->Lk = k->shape[2];
    p->group = p->Hq / p->Hkv;
    p->q = *q;
    p->k = *k;
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
}

/* Spans of the inputs (q, k, optional v, optional mask, optional ALiBi slopes), in `in`. */
static sdpa_status input_spans(sdpa_ctx *ctx, const sdpa__problem *p, const sdpa_tensor *v,
                               const sdpa_tensor *mask, span *in, int *n_in) {
    sdpa_status st;
    int n = 0;
    if ((st = check_span(ctx, "q", &p->q, &in[n++])) != SDPA_OK ||
        (st = check_span(ctx, "k", &p->k, &in[n++])) != SDPA_OK)
        return st;
    if (v != NULL && (st = check_span(ctx, "v", v, &in[n++])) != SDPA_OK)
        return st;
    /* the caller's mask, not the expanded view: same span, and the message shows their numbers */
    if (mask != NULL && (st = check_span(ctx, "mask", mask, &in[n++])) != SDPA_OK)
        return st;
    if (p->alibi != NULL) {
        in[n].lo = (uintptr_t)p->alibi;
        in[n].hi = in[n].lo + (uintptr_t)p->Hq * sizeof(float) - 1;
        n++;
    }
    *n_in = n;
    return SDPA_OK;
}

static const char *const input_names[5] = {"q", "k", "v", "mask", "params.alibi_slopes"};

/* An output must not overlap itself, any input, or an earlier output. */
static sdpa_status check_output(sdpa_ctx *ctx, const char *name, const sdpa_tensor *t,
                                const span *in, const char *const *in_names, int n_in, span *out) {
    sdpa_status st;
    if ((st = check_span(ctx, name, t, out)) != SDPA_OK ||
        (st = check_no_self_overlap(ctx, name, t)) != SDPA_OK)
        return st;
    for (int n = 0; n < n_in; n++)
        if (overlaps(*out, in[n]))
            return sdpa__fail(ctx, SDPA_ERR_ALIAS, "%s (bytes %p..%p) overlaps %s (bytes %p..%p)",
                              name, (void *)out->lo, (void *)out->hi, in_names[n], (void *)in[n].lo,
                              (void *)in[n].hi);
    return SDPA_OK;
}

sdpa_status sdpa__check_forward(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                                const sdpa_tensor *v, const sdpa_params *params,
                                const sdpa_tensor *out, const sdpa_tensor *lse, sdpa__problem *p) {
    static const sdpa_params defaults = {0};
    sdpa_status st;
    *p = (sdpa__problem){0};
    if ((st = check_present(ctx, "q", q)) != SDPA_OK ||
        (st = check_present(ctx, "k", k)) != SDPA_OK ||
        (st = check_present(ctx, "v", v)) != SDPA_OK ||
        (st = check_present(ctx, "out", out)) != SDPA_OK ||
        (lse != NULL && (st = check_present(ctx, "lse", lse)) != SDPA_OK))
        return st;
    if (params == NULL)
        params = &defaults;
    if ((st = check_float(ctx, "v", v)) != SDPA_OK ||
        (st = check_float(ctx, "out", out)) != SDPA_OK ||
        (lse != NULL && (st = check_f32(ctx, "lse", lse)) != SDPA_OK))
        return st;
    if ((st = check_qk(ctx, q, k, p)) != SDPA_OK)
        return st;
    if ((st = check_dims(ctx, "v", v, 1)) != SDPA_OK ||
        (st = check_dims(ctx, "out", out, 1)) != SDPA_OK ||
        (lse != NULL && (st = check_dims(ctx, "lse", lse, 0)) != SDPA_OK))
        return st;
    if ((st = check_eq(ctx, "v", v, 0, "k", 0, k->shape[0])) != SDPA_OK ||
        (st = check_eq(ctx, "v", v, 1, "k", 1, k->shape[1])) != SDPA_OK ||
        (st = check_eq(ctx, "v", v, 2, "k", 2, k->shape[2])) != SDPA_OK ||
        (st = check_eq(ctx, "out", out, 0, "q", 0, q->shape[0])) != SDPA_OK ||
        (st = check_eq(ctx, "out", out, 1, "q", 1, q->shape[1])) != SDPA_OK ||
        (st = check_eq(ctx, "out", out, 2, "q", 2, q->shape[2])) != SDPA_OK ||
        (st = check_eq(ctx, "out", out, 3, "v", 3, v->shape[3])) != SDPA_OK)
        return st;
    if (lse != NULL) {
        if ((st = check_eq(ctx, "lse", lse, 0, "q", 0, q->shape[0])) != SDPA_OK ||
            (st = check_eq(ctx, "lse", lse, 1, "q", 1, q->shape[1])) != SDPA_OK ||
            (st = check_eq(ctx, "lse", lse, 2, "q", 2, q->shape[2])) != SDPA_OK)
            return st;
        if (lse->shape[3] != 1)
            return sdpa__fail(ctx, SDPA_ERR_SHAPE, "lse.shape[3]=%lld must be 1",
                              (long long)lse->shape[3]);
    }
    p->Dv = v->shape[3];
    p->v = *v;
    if (params->mask != NULL && (st = check_mask(ctx, params->mask, p)) != SDPA_OK)
        return st;
    if ((st = check_params(ctx, params, p->Hq)) != SDPA_OK)
        return st;
    resolve_params(params, p);

    span in[6], o, l; /* q, k, v, mask, slopes, and out when lse is checked */
    const char *names[6];
    int n_in = 0;
    if ((st = input_spans(ctx, p, v, params->mask, in, &n_in)) != SDPA_OK)
        return st;
    for (int n = 0, m = 0; n < 5; n++) {
        if ((n == 3 && !p->has_mask) || (n == 4 && p->alibi == NULL))
            continue;
        names[m++] = input_names[n];
    }
    if ((st = check_output(ctx, "out", out, in, names, n_in, &o)) != SDPA_OK)
        return st;
    if (lse != NULL) {
        in[n_in] = o;
        names[n_in] = "out";
        if ((st = check_output(ctx, "lse", lse, in, names, n_in + 1, &l)) != SDPA_OK)
            return st;
    }
    return SDPA_OK;
}

sdpa_status sdpa__check_weights(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                                const sdpa_params *params, const sdpa_tensor *weights,
                                sdpa__problem *p) {
    static const sdpa_params defaults = {0};
    sdpa_status st;
    *p = (sdpa__problem){0};
    if ((st = check_present(ctx, "q", q)) != SDPA_OK ||
        (st = check_present(ctx, "k", k)) != SDPA_OK ||
        (st = check_present(ctx, "weights", weights)) != SDPA_OK)
        return st;
    if (params == NULL)
        params = &defaults;
    if ((st = check_f32(ctx, "weights", weights)) != SDPA_OK)
        return st;
    if ((st = check_qk(ctx, q, k, p)) != SDPA_OK)
        return st;
    if ((st = check_dims(ctx, "weights", weights, 0)) != SDPA_OK)
        return st;
    if ((st = check_eq(ctx, "weights", weights, 0, "q", 0, q->shape[0])) != SDPA_OK ||
        (st = check_eq(ctx, "weights", weights, 1, "q", 1, q->shape[1])) != SDPA_OK ||
        (st = check_eq(ctx, "weights", weights, 2, "q", 2, q->shape[2])) != SDPA_OK ||
        (st = check_eq(ctx, "weights", weights, 3, "k", 2, k->shape[2])) != SDPA_OK)
        return st;
    if (params->mask != NULL && (st = check_mask(ctx, params->mask, p)) != SDPA_OK)
        return st;
    if ((st = check_params(ctx, params, p->Hq)) != SDPA_OK)
        return st;
    resolve_params(params, p);

    span in[5], w;
    const char *names[5] = {"q", "k", "mask", "params.alibi_slopes", NULL};
    int n_in = 0;
    if ((st = input_spans(ctx, p, NULL, params->mask, in, &n_in)) != SDPA_OK)
        return st;
    if (!p->has_mask)
        names[2] = names[3];
    return check_output(ctx, "weights", weights, in, names, n_in, &w);
}
