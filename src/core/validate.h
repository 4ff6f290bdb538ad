/*
 * validate.h — the argument checks of every entry point, driven by a table of tensor roles.
 *
 * An entry point describes its tensors once, as roles: a name ("q", "dout"), input or
 * output, optional or required, the dtypes allowed, whether the last extent is a head
 * dimension, and a shape expression (each extent free, 1, or equal to an extent of an earlier
 * role). sdpa__validate runs the checks in one fixed order for every table — presence, dtype,
 * extents, shape relations (and Hq % Hkv after k), the mask, the scalar parameters, address
 * spans and alignment, then aliasing of each output against every input and earlier output —
 * so one bad argument gives one predictable status, and each failure names the argument and
 * its values. Nothing is written but the context's message and the problem.
 */
#ifndef SDPA_VALIDATE_H
#define SDPA_VALIDATE_H

#include "problem.h"

/* One extent of a role's shape. */
typedef enum sdpa__dim_kind {
    SDPA__DIM_FREE = 0, /* any extent in [1, SDPA_MAX_EXTENT] */
    SDPA__DIM_ONE,      /* exactly 1 */
    SDPA__DIM_SAME      /* equal to extent `dim` of role `role` (an earlier one) */
} sdpa__dim_kind;

typedef struct sdpa__dim {
    unsigned char kind, role, dim;
} sdpa__dim;

/* Bits of sdpa__role.dtypes. */
#define SDPA__DT(d) (1u << (d))
#define SDPA__DT_FLOAT (SDPA__DT(SDPA_F32) | SDPA__DT(SDPA_F16) | SDPA__DT(SDPA_BF16))

typedef struct sdpa__role {
    const char *name;
    unsigned char output;   /* written by the call */
    unsigned char optional; /* may be NULL */
    unsigned char head_dim; /* shape[3] is a head dimension (<= SDPA_MAX_HEAD_DIM) */
    unsigned dtypes;        /* SDPA__DT bits allowed */
    sdpa__dim shape[4];
} sdpa__role;

/* The roles the problem is built from: q (B, Hq, Lq, Dk) must be role 0, k (B, Hkv, Lk, Dk)
 * role 1 and, when present, v (B, Hkv, Lk, Dv) role 2. */
enum { SDPA__ROLE_Q = 0, SDPA__ROLE_K = 1, SDPA__ROLE_V = 2, SDPA__MAX_ROLES = 12 };

/* An entry point's signature: its roles in the order the checks visit them. */
typedef struct sdpa__signature {
    int n_roles;
    int has_v; /* role 2 is v */
    sdpa__role roles[SDPA__MAX_ROLES];
} sdpa__signature;

/* The signatures of the entry points. */
extern const sdpa__signature sdpa__sig_forward; /* q, k, v, out, lse (optional) */
extern const sdpa__signature sdpa__sig_weights; /* q, k, weights */
/* q, k, v, out, lse, dout, dq, dk, dv */
extern const sdpa__signature sdpa__sig_backward;

/* Validates the tensors t[n] (one per role of sig; NULL where a role is optional and absent)
 * and params (NULL = defaults), and fills *p. max_pages > 0: k and v are pools of pages
 * (sdpa_forward_kv), and Lk is max_pages times their page size. */
sdpa_status sdpa__validate(sdpa_ctx *ctx, const sdpa__signature *sig, const sdpa_tensor *const *t,
                           const sdpa_params *params, int64_t max_pages, sdpa__problem *p);

/* sdpa_forward_kv's arguments: the forward's, with the cache's k and v (pools of pages when
 * it has a block table), then its lengths and every block-table entry the lengths make read
 * (SDPA_ERR_INDEX). Fills the problem's cache fields. */
sdpa_status sdpa__check_forward_kv(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_kv_cache *cache,
                                   const sdpa_params *params, const sdpa_tensor *out,
                                   const sdpa_tensor *lse, sdpa__problem *p);

/* The forward's and the weights' argument lists, through sdpa__validate. */
sdpa_status sdpa__check_forward(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                                const sdpa_tensor *v, const sdpa_params *params,
                                const sdpa_tensor *out, const sdpa_tensor *lse, sdpa__problem *p);
sdpa_status sdpa__check_weights(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                                const sdpa_params *params, const sdpa_tensor *weights,
                                sdpa__problem *p);

sdpa_status sdpa__check_backward(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                                 const sdpa_tensor *v, const sdpa_tensor *out,
                                 const sdpa_tensor *lse, const sdpa_tensor *dout,
                                 const sdpa_params *params, const sdpa_tensor *dq,
                                 const sdpa_tensor *dk, const sdpa_tensor *dv, sdpa__problem *p);

/* sdpa_merge's arguments: n_parts >= 1; outs[p] (B, H, L, D) F32/F16/BF16 and lses[p]
 * (B, H, L, 1) F32 for every part, shaped like out (B, H, L, D) F32/F16/BF16; lse NULL or
 * (B, H, L, 1) F32; the spans, alignment and aliasing rules of the other entry points. Each
 * failure names the argument ("outs[2].shape[1]=4 but out.shape[1]=8"). */
sdpa_status sdpa__check_merge(sdpa_ctx *ctx, int64_t n_parts, const sdpa_tensor *outs,
                              const sdpa_tensor *lses, const sdpa_tensor *out,
                              const sdpa_tensor *lse);

#endif /* SDPA_VALIDATE_H */
