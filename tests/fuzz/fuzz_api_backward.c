/*
 * fuzz_api_backward.c — the API fuzz target's oracle for sdpa_backward (issue 11): the call on
 * the drawn case (q, k, v, params and the forward's out and lse, with the dout, dq, dk, dv and
 * dropout of fz_draw_backward; with dropout, out and lse come from a forward with that
 * dropout, itself checked against the golden as the forward is), its status (for an argument
 * made invalid alone, the very status and a message naming it), dq, dk and dv untouched on
 * error, inputs (out, lse and dout included) never written, and on success:
 *   - rows that see no key have dq = 0 and keys that no row sees dk = dv = 0, exactly (sdpa.h;
 *     every case);
 *   - where the inputs hold huge finite values (huge_qk, huge_v: a q.k near or beyond f32's
 *     range, a V column near FLT_MAX), nothing more about the values: the gradients of such
 *     problems are ill-conditioned in f32 (dS = P (dP - Delta) cancels at 1e38 scale), and
 *     where they overflow is a property of the implementation, not of the contract;
 *   - where Q, K, V, the mask or dout hold NaN or Inf: non-finite values exactly where the
 *     golden has them (sdpa.h: a NaN row's NaN reaches its dq and the dk, dv of the keys it
 *     sees, a hidden key's never reaches anything);
 *   - else testing.md's rule against the golden, the reference backward (src/ref/, called
 *     directly on the problem sdpa__check_backward builds, so it stays the oracle when a
 *     faster backward is dispatched), with k = 3 (f16, bf16) or 8 (f32) times the error of a
 *     same-precision naive backward (fz_naive_run), the dtype's rounding floor, and a
 *     first-order bound of what f32 arithmetic may add to each element (see bounds below);
 *     no NMSE gate, as for the forward's out; the baseline is computed only for a gradient
 *     whose error is above the floor. A golden beyond the gradient dtype's range may be the
 *     infinity of its sign (rounding makes it so). The golden is itself held to this file's
 *     naive backward in double, which is written from sdpa.h, not from src/ref/;
 *   - a second call and a call with another thread count give the same bytes.
 */
#include "fuzz_api.h"

#include "core/half.h"
#include "core/philox.h"
#include "core/validate.h"
#include "ref/ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the naive backward ------------------------------------------------------------------ */

/* The additive mask value of (b, h, i, j); 0 for a bool mask or none. */
static double bias_at(const fz_case *c, int64_t b, int64_t h, int64_t i, int64_t j) {
    const sdpa_tensor *m = c->params.mask;
    if (m == NULL || m->dtype == SDPA_BOOL)
        return 0.0;
    return tu_mask_at(m, b, h, i, j);
}

/* The rounding unit of a dtype's values. */
static double unit_of(sdpa_dtype dt) {
    return dt == SDPA_F32 ? 0x1p-24 : dt == SDPA_F16 ? 0x1p-11 : 0x1p-8;
}

/* Scratch of one run: one query row and the gradients of one (b, kv head). */
typedef struct naive_rows {
    double *s, *P, *pt, *z, *g, *t, *oa, *dq, *nq;
    double *dk, *dv, *nk, *nv;
    unsigned char *vis;
} naive_rows;

/*
 * The forward and backward of one query row i of (b, h), as sdpa.h states them:
 *     x_j = scale q.k_j,  s_j = softcap(x_j) + alibi + mask,  P = softmax(s),  P~ = z P,
 *     O = P~ V,  dP~_j = dO.v_j,  dP = z dP~,  Delta = dO.O,  dS = P (dP - Delta),
 *     dX = dS softcap'(x),  dq = scale dX K,  dk_j += scale dX_j q,  dv_j += P~_j dO.
 * With lp >= 0, every value named above is rounded to lp and every sum accumulated in f32:
 * the same-precision baseline, PyTorch's autograd through a materialised softmax in that
 * dtype. With lp = -1, all in double, and with it, bounds of what an f32 implementation may
 * get wrong, to first order in u = 2^-24, worst case (not statistical) growth:
 *   score            ds (fz_score_noise: (Dk + 4) u S)
 *   P, relative      eP = 2 ds + (Lk + 24) u  (its score and the forward's LSE; exp and the
 *                    normalisation a few u, the sum of the LSE (Lk + 8) u)
 *   O[d]             (eP + uo) Oa[d], Oa[d] = sum_j P~_j |v_j[d]|, uo the rounding unit of
 *                    out's dtype: a kernel may read out, rounded, for Delta
 *   Delta            (eP + uo + (Dv + 2) u) sum_d |dO[d]| Oa[d]
 *   dP_j             (Dv + 3) u z_j sum_d |dO[d]| |v_j[d]|
 *   dS_j             P_j (eP (|dP_j| + |Delta|) + e(dP_j) + e(Delta)) + 2 u |dS_j|
 *   dX_j             e(dS_j) g_j + |dS_j| e(g_j) + u |dX_j|, g = softcap' = 1 - t^2,
 *                    e(g) = min(1, 2 |t| g ds / c) + 4 u (the score's error through tanh,
 *                    and 1 - t^2's cancellation near |t| = 1); without softcap e(dS_j)
 *   dq[d]            |scale| sum_j (e(dX_j) + (Lk + 2) u |dX_j|) |k_j[d]|
 *   dk_j[d]          |scale| sum_rows (e(dX_j) + (G Lq + 2) u |dX_j|) |q[d]|
 *   dv_j[d]          sum_rows P~_j (eP + (G Lq + 2) u) |dO[d]|
 * each doubled at the end for what first order leaves out. The gradients' own rounding to
 * their dtype is the rule's floor, not part of these.
 */
static void naive_row(const fz_case *c, int lp, int grads, double ds, const double *Q,
                      const double *K, const double *V, const double *DO, int64_t b, int64_t h,
                      int64_t i, naive_rows *w, fz_naive *out) {
    const sdpa_params *p = &c->params;
    const int64_t Lk = c->Lk, Dk = c->Dk, Dv = c->Dv, G = c->Hq / c->Hkv, hk = h / G;
    const double scale = p->scale != 0.0f ? (double)p->scale : 1.0 / sqrt((double)Dk);
    const double cap = (double)p->softcap;
    const int64_t off = p->align == SDPA_ALIGN_BOTTOM_RIGHT ? c->Lk - c->Lq : 0;
    const double u = 0x1p-24;
    const double eP = 2.0 * ds + (double)(Lk + 24) * u, uo = unit_of(c->out.t.dtype);
    const double rows_u = (double)(G * c->Lq + 2) * u;
    const double *q = Q + ((b * c->Hq + h) * c->Lq + i) * Dk;
    const double *dO = grads ? DO + ((b * c->Hq + h) * c->Lq + i) * Dv : NULL;
    double *o = out->o + ((b * c->Hq + h) * c->Lq + i) * Dv;
    const double pd = c->dropout ? (double)c->drop_p : 0.0;
    const double zf = tu_round(lp < 0 ? -1 : SDPA_F32, 1.0 / (1.0 - pd));

    // the scores, their maximum; a NaN or +inf score makes the row NaN
    double m = -INFINITY;
    int any = 0, nan_row = 0;
    for (int64_t j = 0; j < Lk; j++) {
        const double *kj = K + ((b * c->Hkv + hk) * Lk + j) * Dk;
        w->vis[j] = (unsigned char)fz_visible(c, b, h, i, j);
        w->s[j] = -INFINITY;
        if (!w->vis[j])
            continue;
        double dot = 0.0;
        for (int64_t d = 0; d < Dk; d++)
            dot = tu_acc_round(lp, dot + q[d] * kj[d]);
        const double x = tu_round(lp, dot * scale);
        double s = x;
        w->g[j] = 1.0;
        w->t[j] = 0.0;
        if (cap > 0.0) {
            const double t = tu_round(lp, tanh(x / cap));
            const double ch = cosh(x / cap);
            s = tu_round(lp, cap * t);
            w->t[j] = t;
            w->g[j] = lp < 0 ? 1.0 / (ch * ch) : tu_round(lp, 1.0 - tu_round(lp, t * t));
        }
        if (p->alibi_slopes != NULL)
            s = tu_round(lp, s - (double)p->alibi_slopes[h] * fabs((double)(j - (i + off))));
        s = tu_round(lp, s + bias_at(c, b, h, i, j));
        if (s == -INFINITY) {
            w->vis[j] = 0;
            continue;
        }
        w->s[j] = s;
        any = 1;
        if (isnan(s) || s == INFINITY)
            nan_row = 1;
        else if (s > m)
            m = s;
    }

    // P, P~ and O; a row with no key: O = 0, dq = 0, nothing for dk and dv
    double sum = 0.0;
    for (int64_t j = 0; j < Lk && any && !nan_row; j++)
        if (w->vis[j])
            sum = tu_acc_round(lp, sum + tu_acc_round(lp, exp(w->s[j] - m)));
    for (int64_t j = 0; j < Lk; j++) {
        w->P[j] = w->pt[j] = w->z[j] = 0.0;
        if (!w->vis[j])
            continue;
        w->P[j] = nan_row ? NAN : tu_round(lp, exp(w->s[j] - m) / sum);
        w->z[j] = 1.0;
        if (c->dropout)
            w->z[j] = sdpa__dropout_keep(c->drop_seed, c->drop_offset, b, h, i, j, pd) ? zf : 0.0;
        w->pt[j] = c->dropout ? tu_round(lp, w->z[j] * w->P[j]) : w->P[j];
    }
    for (int64_t d = 0; d < Dv; d++) {
        double a = 0.0, aa = 0.0;
        for (int64_t j = 0; j < Lk; j++) {
            if (!w->vis[j])
                continue;
            const double vjd = V[((b * c->Hkv + hk) * Lk + j) * Dv + d];
            a = tu_acc_round(lp, a + w->pt[j] * vjd);
            aa += w->pt[j] * fabs(vjd);
        }
        o[d] = tu_round(lp, a);
        w->oa[d] = aa;
    }
    if (!grads)
        return;

    // the backward of the row
    double delta = 0.0, delta_a = 0.0;
    for (int64_t d = 0; d < Dv; d++) {
        delta = tu_acc_round(lp, delta + dO[d] * o[d]);
        delta_a += fabs(dO[d]) * w->oa[d];
    }
    delta = tu_round(lp, delta);
    const double e_delta = (eP + uo + (double)(Dv + 2) * u) * delta_a;
    for (int64_t d = 0; d < Dk; d++)
        w->dq[d] = w->nq[d] = 0.0;
    for (int64_t j = 0; j < Lk && any; j++) {
        if (!w->vis[j])
            continue;
        const double *kj = K + ((b * c->Hkv + hk) * Lk + j) * Dk;
        const double *vj = V + ((b * c->Hkv + hk) * Lk + j) * Dv;
        double dpt = 0.0, a = 0.0;
        for (int64_t d = 0; d < Dv; d++) {
            dpt = tu_acc_round(lp, dpt + dO[d] * vj[d]);
            a += fabs(dO[d]) * fabs(vj[d]);
        }
        dpt = tu_round(lp, dpt);
        const double dp = c->dropout ? tu_round(lp, w->z[j] * dpt) : dpt;
        const double dS = tu_round(lp, w->P[j] * tu_round(lp, dp - delta));
        const double dX = cap > 0.0 ? tu_round(lp, dS * w->g[j]) : dS;
        double *dk_j = w->dk + j * Dk, *dv_j = w->dv + j * Dv;
        for (int64_t d = 0; d < Dk; d++) {
            w->dq[d] = tu_acc_round(lp, w->dq[d] + dX * kj[d]);
            dk_j[d] = tu_acc_round(lp, dk_j[d] + dX * q[d]);
        }
        for (int64_t d = 0; d < Dv; d++)
            dv_j[d] = tu_acc_round(lp, dv_j[d] + w->pt[j] * dO[d]);
        if (lp >= 0)
            continue;
        // the bounds (see above)
        const double e_dp = (double)(Dv + 3) * u * w->z[j] * a;
        const double e_dS =
            w->P[j] * (eP * (fabs(dp) + fabs(delta)) + e_dp + e_delta) + 2.0 * u * fabs(dS);
        double e_dX = e_dS;
        if (cap > 0.0) {
            const double e_g =
                (w->g[j] > 0.0 ? fmin(1.0, 2.0 * fabs(w->t[j]) * w->g[j] * (ds / cap)) : 0.0) +
                4.0 * u;
            e_dX = e_dS * w->g[j] + fabs(dS) * e_g + u * fabs(dX);
        }
        double *nk_j = w->nk + j * Dk, *nv_j = w->nv + j * Dv;
        for (int64_t d = 0; d < Dk; d++) {
            w->nq[d] += fabs(scale) * (e_dX + (double)(Lk + 2) * u * fabs(dX)) * fabs(kj[d]);
            nk_j[d] += fabs(scale) * (e_dX + rows_u * fabs(dX)) * fabs(q[d]);
        }
        for (int64_t d = 0; d < Dv; d++)
            nv_j[d] += w->pt[j] * (eP + rows_u) * fabs(dO[d]);
    }
    for (int64_t d = 0; d < Dk; d++) {
        const int64_t at = ((b * c->Hq + h) * c->Lq + i) * Dk + d;
        out->dq[at] = nan_row ? NAN : tu_round(lp, scale * w->dq[d]);
        if (lp < 0)
            out->nq[at] = 2.0 * w->nq[d];
    }
}

void fz_naive_run(const fz_case *c, int lp, int grads, fz_naive *out) {
    const int64_t B = c->B, Hq = c->Hq, Hkv = c->Hkv, Lq = c->Lq, Lk = c->Lk, Dk = c->Dk,
                  Dv = c->Dv, G = Hq / Hkv;
    const double scale = c->params.scale != 0.0f ? (double)c->params.scale : 1.0 / sqrt((double)Dk);
    const double ds = lp < 0 && grads ? fz_score_noise(c) : 0.0; /* for the bounds */
    memset(out, 0, sizeof *out);
    double *Q = tu_to_doubles(&c->q.t), *K = tu_to_doubles(&c->k.t), *V = tu_to_doubles(&c->v.t);
    double *DO = grads ? tu_to_doubles(&c->dout.t) : NULL;
    out->o = malloc((size_t)(B * Hq * Lq * Dv) * sizeof(double));
    if (grads) {
        out->dq = malloc((size_t)(B * Hq * Lq * Dk) * sizeof(double));
        out->dk = malloc((size_t)(B * Hkv * Lk * Dk) * sizeof(double));
        out->dv = malloc((size_t)(B * Hkv * Lk * Dv) * sizeof(double));
        if (lp < 0) {
            out->nq = malloc((size_t)(B * Hq * Lq * Dk) * sizeof(double));
            out->nk = malloc((size_t)(B * Hkv * Lk * Dk) * sizeof(double));
            out->nv = malloc((size_t)(B * Hkv * Lk * Dv) * sizeof(double));
        }
    }
    naive_rows w;
    double **rows[9] = {&w.s, &w.P, &w.pt, &w.z, &w.g, &w.t, &w.oa, &w.dq, &w.nq};
    const int64_t len[9] = {Lk, Lk, Lk, Lk, Lk, Lk, Dv, Dk, Dk};
    for (int n = 0; n < 9; n++)
        *rows[n] = malloc((size_t)len[n] * sizeof(double));
    w.dk = calloc((size_t)(Lk * Dk), sizeof(double));
    w.dv = calloc((size_t)(Lk * Dv), sizeof(double));
    w.nk = calloc((size_t)(Lk * Dk), sizeof(double));
    w.nv = calloc((size_t)(Lk * Dv), sizeof(double));
    w.vis = malloc((size_t)Lk);
    for (int64_t b = 0; b < B; b++)
        for (int64_t hk = 0; hk < Hkv; hk++) {
            memset(w.dk, 0, (size_t)(Lk * Dk) * sizeof(double));
            memset(w.dv, 0, (size_t)(Lk * Dv) * sizeof(double));
            memset(w.nk, 0, (size_t)(Lk * Dk) * sizeof(double));
            memset(w.nv, 0, (size_t)(Lk * Dv) * sizeof(double));
            /* the query heads of the group in order, their rows in order: a NaN row's NaN
             * reaches the keys it sees (naive_row adds NaN there) */
            for (int64_t h = hk * G; h < (hk + 1) * G; h++)
                for (int64_t i = 0; i < Lq; i++)
                    naive_row(c, lp, grads, ds, Q, K, V, DO, b, h, i, &w, out);
            if (!grads)
                continue;
            for (int64_t j = 0; j < Lk; j++) {
                const int64_t r = (b * Hkv + hk) * Lk + j;
                for (int64_t d = 0; d < Dk; d++) {
                    out->dk[r * Dk + d] = tu_round(lp, scale * w.dk[j * Dk + d]);
                    if (lp < 0)
                        out->nk[r * Dk + d] = 2.0 * w.nk[j * Dk + d];
                }
                for (int64_t d = 0; d < Dv; d++) {
                    out->dv[r * Dv + d] = tu_round(lp, w.dv[j * Dv + d]);
                    if (lp < 0)
                        out->nv[r * Dv + d] = 2.0 * w.nv[j * Dv + d];
                }
            }
        }
    for (int n = 0; n < 9; n++)
        free(*rows[n]);
    free(w.dk);
    free(w.dv);
    free(w.nk);
    free(w.nv);
    free(w.vis);
    free(Q);
    free(K);
    free(V);
    free(DO);
}

void fz_naive_free(fz_naive *n) {
    double *all[7] = {n->o, n->dq, n->dk, n->dv, n->nq, n->nk, n->nv};
    for (int i = 0; i < 7; i++)
        free(all[i]);
    memset(n, 0, sizeof *n);
}

/* ---- the checks of an OK result ---------------------------------------------------------- */

/* The three gradients of a case, by index 0 dq, 1 dk, 2 dv. */
static fz_tensor *grad(fz_case *c, int n) {
    return n == 0 ? &c->dq : n == 1 ? &c->dk : &c->dv;
}

static size_t grad_count(const fz_case *c, int n) {
    return (size_t)(n == 0   ? c->B * c->Hq * c->Lq * c->Dk
                    : n == 1 ? c->B * c->Hkv * c->Lk * c->Dk
                             : c->B * c->Hkv * c->Lk * c->Dv);
}

/* Row (b, h, i) sees some key by the window, causal and mask rules. */
static int row_sees(const fz_case *c, int64_t b, int64_t h, int64_t i) {
    for (int64_t j = 0; j < c->Lk; j++)
        if (fz_visible(c, b, h, i, j))
            return 1;
    return 0;
}

/* sdpa.h: a row that sees no key gets dq = 0; a key that no row sees gets dk = dv = 0. These
 * hold for any values, huge and non-finite ones included. */
static void check_structural_zeros(fz_case *c, double *const t[3]) {
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->Lq; i++) {
                if (row_sees(c, b, h, i))
                    continue;
                for (int64_t d = 0; d < c->Dk; d++)
                    if (t[0][((b * c->Hq + h) * c->Lq + i) * c->Dk + d] != 0.0)
                        fz_violation("row (%lld, %lld, %lld) sees no key but dq[%lld] = %g",
                                     (long long)b, (long long)h, (long long)i, (long long)d,
                                     t[0][((b * c->Hq + h) * c->Lq + i) * c->Dk + d]);
            }
    const int64_t G = c->Hq / c->Hkv;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t hk = 0; hk < c->Hkv; hk++)
            for (int64_t j = 0; j < c->Lk; j++) {
                int seen = 0;
                for (int64_t h = hk * G; h < (hk + 1) * G && !seen; h++)
                    for (int64_t i = 0; i < c->Lq && !seen; i++)
                        seen = fz_visible(c, b, h, i, j);
                if (seen)
                    continue;
                const int64_t r = (b * c->Hkv + hk) * c->Lk + j;
                for (int64_t d = 0; d < c->Dk; d++)
                    if (t[1][r * c->Dk + d] != 0.0)
                        fz_violation("key (%lld, %lld, %lld) is seen by no row but dk[%lld] = %g",
                                     (long long)b, (long long)hk, (long long)j, (long long)d,
                                     t[1][r * c->Dk + d]);
                for (int64_t d = 0; d < c->Dv; d++)
                    if (t[2][r * c->Dv + d] != 0.0)
                        fz_violation("key (%lld, %lld, %lld) is seen by no row but dv[%lld] = %g",
                                     (long long)b, (long long)hk, (long long)j, (long long)d,
                                     t[2][r * c->Dv + d]);
            }
}

/* A golden beyond the largest finite value of dt (less a margin for the computation's own
 * error): the test may hold the infinity of its sign there, as rounding to dt makes it (the
 * gradients are not bounded by the inputs' range the way out is: an f16 dq passes 65504 with
 * ordinary inputs). Checks that it is not NaN, then marks it 2 in skip: out of the
 * comparison. */
static void beyond_range(const char *what, sdpa_dtype dt, const double *t, const double *g,
                         size_t n, unsigned char *skip) {
    const double top = (dt == SDPA_F16    ? 65504.0
                        : dt == SDPA_BF16 ? 0x1.fep127
                                          : 0x1.fffffep127) *
                       (1 - 0x1p-8);
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(g[i]) || fabs(g[i]) < top)
            continue;
        if (isnan(t[i]) || (isinf(t[i]) && (t[i] > 0) != (g[i] > 0)))
            fz_violation("%s[%zu] = %g where the golden is %g, beyond %s's range", what, i, t[i],
                         g[i], sdpa_dtype_name(dt));
        skip[i] = 2;
    }
}

/* testing.md's rule for one gradient, err(test) <= k err(lp) + floor, read as rule_ok
 * (fuzz_api_check.c) reads it for out, with the f32 noise per element: err(test) is the
 * largest |test - golden| - noise. Elements marked 1 in skip (ill rows) are held to the
 * positions of non-finite values only, 2 (beyond the range) not at all. lp may be NULL: then
 * the result is -1 where the baseline is needed, i.e. where err(test) is above the floor (the
 * baseline is computed only then, which saves most of its cost). */
static int grad_rule_ok(const char *what, const double *t, const double *lp, const double *g,
                        const double *noise, const unsigned char *skip, size_t n, sdpa_dtype dt,
                        double k) {
    double err_test = 0.0, err_lp = 0.0, floor_ = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        if (skip[i] == 2)
            continue;
        if (!isfinite(g[i]) || !isfinite(t[i])) {
            if (!((isnan(g[i]) && isnan(t[i])) || g[i] == t[i])) {
                fprintf(stderr, "fuzz_api: %s[%zu] = %g but the golden has %g\n", what, i, t[i],
                        g[i]);
                return 0;
            }
            continue;
        }
        if (skip[i])
            continue;
        const double e = fabs(t[i] - g[i]) - noise[i];
        if (e > err_test) {
            err_test = e;
            worst = i;
        }
        if (lp != NULL && isfinite(lp[i]))
            err_lp = fmax(err_lp, fabs(lp[i] - g[i]));
        floor_ = fmax(floor_, fz_ulp(dt, fabs(g[i]) + 0.3));
    }
    if (err_test <= k * err_lp + floor_)
        return 1;
    if (lp == NULL)
        return -1;
    fprintf(stderr,
            "fuzz_api: %s (%s): err %.3e (beyond the f32 noise) > %g x lp %.3e + floor %.3e; "
            "worst at [%zu]: test %.9g lp %.9g golden %.9g noise %.3e\n",
            what, sdpa_dtype_name(dt), err_test, k, err_lp, floor_, worst, t[worst], lp[worst],
            g[worst], noise[worst]);
    return 0;
}

/* The golden (rounded to f32) against the oracle's naive backward in double: they differ by
 * the golden's rounding and double's own noise (the f32 bounds scaled by 2^-29), unless one
 * of them is wrong. */
static void check_golden(const char *what, const double *g, const double *dbl, const double *noise,
                         const unsigned char *ill, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (ill[i] || !isfinite(dbl[i]))
            continue;
        const double tol = fz_ulp(SDPA_F32, fabs(dbl[i])) + 4.0 * noise[i] * 0x1p-29;
        if (!(fabs(g[i] - dbl[i]) <= tol))
            fz_violation("the golden %s[%zu] = %.9g but the oracle's double backward gives %.9g "
                         "(tolerance %.3e): src/ref/ or fuzz_api_backward.c is wrong",
                         what, i, g[i], dbl[i], tol);
    }
}

/* Per element of dq, dk and dv, whether it comes from a row ill-conditioned in f32 by its
 * mask (fz_ill_rows): dq of such a row, dk and dv of every key it sees. */
static void ill_elements(const fz_case *c, unsigned char *ill[3]) {
    unsigned char *rows = fz_ill_rows(c);
    const int64_t G = c->Hq / c->Hkv;
    for (int n = 0; n < 3; n++)
        ill[n] = calloc(grad_count(c, n), 1);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->Lq; i++) {
                if (!rows[(b * c->Hq + h) * c->Lq + i])
                    continue;
                memset(ill[0] + ((b * c->Hq + h) * c->Lq + i) * c->Dk, 1, (size_t)c->Dk);
                for (int64_t j = 0; j < c->Lk; j++) {
                    if (!fz_visible(c, b, h, i, j))
                        continue;
                    const int64_t r = (b * c->Hkv + h / G) * c->Lk + j;
                    memset(ill[1] + r * c->Dk, 1, (size_t)c->Dk);
                    memset(ill[2] + r * c->Dv, 1, (size_t)c->Dv);
                }
            }
    free(rows);
}

/* An OK backward's dq, dk and dv (the forward's out and lse were passed). */
static void check_values(fz_case *c, sdpa_ctx *ctx, const sdpa_tensor *lse) {
    static const char *const names[3] = {"dq", "dk", "dv"};
    double *t[3];
    for (int n = 0; n < 3; n++)
        t[n] = tu_to_doubles(&grad(c, n)->t);
    check_structural_zeros(c, t);
    if (c->huge_qk || c->huge_v) {
        /* huge finite inputs: the digits and the places of overflow are the implementation's
         * (see the top of this file); the structural zeros above are all that is checked */
        for (int n = 0; n < 3; n++)
            free(t[n]);
        return;
    }

    /* the golden: the reference backward on the problem the validator builds, into f32 */
    tu_tensor gt[3] = {tu_alloc(SDPA_F32, c->B, c->Hq, c->Lq, c->Dk, TU_BHLD, 0, 0),
                       tu_alloc(SDPA_F32, c->B, c->Hkv, c->Lk, c->Dk, TU_BHLD, 0, 0),
                       tu_alloc(SDPA_F32, c->B, c->Hkv, c->Lk, c->Dv, TU_BHLD, 0, 0)};
    sdpa__problem p;
    sdpa_params bp;
    sdpa_status st =
        sdpa__check_backward(ctx, &c->q.t, &c->k.t, &c->v.t, &c->out.t, lse, &c->dout.t,
                             fz_bwd_params(c, &bp), &gt[0].t, &gt[1].t, &gt[2].t, &p);
    if (st == SDPA_OK)
        st = sdpa__ref_backward(ctx, &p, &c->dout.t, &gt[0].t, &gt[1].t, &gt[2].t);
    if (st != SDPA_OK)
        fz_violation("the golden backward refused what sdpa_backward accepted: %s: %s",
                     sdpa_status_name(st), sdpa_ctx_last_error(ctx));
    double *g[3];
    for (int n = 0; n < 3; n++) {
        g[n] = tu_to_doubles(&gt[n].t);
        tu_free(&gt[n]);
    }

    if (c->nonfinite || c->dout_nonfinite) {
        /* NaN or Inf in the inputs: non-finite values where the golden has them */
        for (int n = 0; n < 3; n++) {
            unsigned char *skip = calloc(grad_count(c, n), 1);
            beyond_range(names[n], grad(c, n)->t.dtype, t[n], g[n], grad_count(c, n), skip);
            for (size_t i = 0; i < grad_count(c, n); i++)
                if (skip[i])
                    t[n][i] = g[n][i] = 0.0;
            fz_check_positions(names[n], t[n], g[n], grad_count(c, n));
            free(skip);
        }
    } else {
        fz_naive dbl, lp[3];
        fz_naive_run(c, -1, 1, &dbl);
        unsigned char *ill[3];
        ill_elements(c, ill);
        const double *const dbl_g[3] = {dbl.dq, dbl.dk, dbl.dv};
        const double *const noise[3] = {dbl.nq, dbl.nk, dbl.nv};
        for (int n = 0; n < 3; n++)
            check_golden(names[n], g[n], dbl_g[n], noise[n], ill[n], grad_count(c, n));
        /* the same-precision baseline of a dtype, computed once, when a gradient of that
         * dtype needs it: gradient n reads lp[src[n]] */
        int src[3];
        for (int n = 0; n < 3; n++) {
            src[n] = n;
            for (int m = n - 1; m >= 0; m--)
                if (grad(c, m)->t.dtype == grad(c, n)->t.dtype)
                    src[n] = m;
            lp[n].dq = NULL;
        }
        for (int n = 0; n < 3; n++) {
            const sdpa_dtype dt = grad(c, n)->t.dtype;
            const double k = dt == SDPA_F32 ? 8.0 : 3.0;
            beyond_range(names[n], dt, t[n], g[n], grad_count(c, n), ill[n]);
            int ok =
                grad_rule_ok(names[n], t[n], NULL, g[n], noise[n], ill[n], grad_count(c, n), dt, k);
            if (ok < 0) {
                fz_naive *l = &lp[src[n]];
                if (l->dq == NULL)
                    fz_naive_run(c, (int)dt, 1, l);
                ok = grad_rule_ok(names[n], t[n],
                                  n == 0   ? l->dq
                                  : n == 1 ? l->dk
                                           : l->dv,
                                  g[n], noise[n], ill[n], grad_count(c, n), dt, k);
            }
            if (!ok)
                fz_violation("%s fails the tolerance rule against the golden (figures above)",
                             names[n]);
        }
        for (int n = 0; n < 3; n++) {
            if (src[n] == n && lp[n].dq != NULL)
                fz_naive_free(&lp[n]);
            free(ill[n]);
        }
        fz_naive_free(&dbl);
    }
    for (int n = 0; n < 3; n++) {
        free(t[n]);
        free(g[n]);
    }
}

/* ---- the call ---------------------------------------------------------------------------- */

static sdpa_status call_backward(fz_case *c, sdpa_ctx *ctx, const sdpa_tensor *lse) {
    sdpa_params bp;
    for (int n = 0; n < 3; n++)
        fz_fill_canary(grad(c, n));
    return sdpa_backward(ctx, fz_arg(&c->q), fz_arg(&c->k), fz_arg(&c->v), fz_arg(&c->out), lse,
                         fz_arg(&c->dout), fz_bwd_params(c, &bp), fz_arg_out(&c->dq),
                         fz_arg_out(&c->dk), fz_arg_out(&c->dv));
}

/* The backward's inputs beyond q, k, v, the mask and the slopes (fz_snapshot's): out, the lse
 * it reads, dout. */
typedef struct bwd_inputs {
    const fz_tensor *t[3];
    unsigned char *copy[3];
} bwd_inputs;

static void check_inputs(const bwd_inputs *in, const char *call) {
    for (int n = 0; n < 3; n++)
        if (memcmp(in->t[n]->buf, in->copy[n], in->t[n]->bytes) != 0)
            fz_violation("%s wrote into input %s", call, in->t[n]->name);
}

/* The status: documented, refused iff invalid, and, for an argument made invalid on its own,
 * the status and a message naming it. */
static void check_backward_status(const fz_case *c, sdpa_status st, sdpa_ctx *ctx, int bad) {
    fz_check_status(c, st, ctx, "sdpa_backward", bad, !bad);
    static const fz_bad kinds[4] = {FZ_BAD_COMMON, FZ_BAD_PARAMS, FZ_BAD_FWD, FZ_BAD_BWD};
    int total = 0, one = -1;
    for (int n = 0; n < 4; n++) {
        const int cnt = kinds[n] == FZ_BAD_PARAMS && c->params_null ? 0 : c->n_bad[kinds[n]];
        total += cnt;
        if (cnt == 1)
            one = (int)kinds[n];
    }
    if (total != 1 || one < 0 || c->want[one] == SDPA_OK)
        return;
    if (st != c->want[one])
        fz_violation("sdpa_backward returned %s for its one invalid argument, not %s",
                     sdpa_status_name(st), sdpa_status_name(c->want[one]));
    if (c->want_msg[one] != NULL && strstr(sdpa_ctx_last_error(ctx), c->want_msg[one]) == NULL)
        fz_violation("sdpa_backward's message \"%s\" lacks \"%s\"", sdpa_ctx_last_error(ctx),
                     c->want_msg[one]);
}

void fz_check_backward(fz_case *c, sdpa_ctx *ctx, sdpa_ctx *ctx2, int fwd_ok) {
    const int bad = c->bad[FZ_BAD_COMMON] || (c->bad[FZ_BAD_PARAMS] && !c->params_null) ||
                    c->bad[FZ_BAD_FWD] || c->bad[FZ_BAD_BWD];
    const int64_t work = c->B * c->Hq * c->Lq * c->Lk * (c->Dk + c->Dv + 4);
    /* A valid backward above the budget is not run. Nor is one whose out or lse points into
     * another tensor (the forward refused that, FZ_BAD_OUT; the view may reach past the
     * buffer it points into, which a backward that reads out would then overrun: the
     * generator's fault, not the library's). */
    if (!bad && (work > FZ_MAX_BWD_WORK || c->out.alias || c->lse.alias))
        return;
    fz_tensor *lse = c->lse.used ? &c->lse : &c->blse;
    if (!bad && fwd_ok && (c->dropout || !c->lse.used)) {
        /* out and lse for the backward to read: the forward ran without lse, or without the
         * backward's dropout, which changes out. One with them; with dropout, its out (and
         * lse) checked as the forward's are, against the golden with that dropout. */
        sdpa_params bp;
        const sdpa_params *bpr = fz_bwd_params(c, &bp);
        const sdpa_status st =
            sdpa_forward(ctx, &c->q.t, &c->k.t, &c->v.t, bpr, &c->out.t, &lse->t);
        if (st != SDPA_OK)
            fz_violation("sdpa_forward with the backward's %s failed with %s: %s",
                         c->dropout ? "dropout" : "lse", sdpa_status_name(st),
                         sdpa_ctx_last_error(ctx));
        if (c->dropout)
            free(fz_check_forward_result(c, ctx, bpr));
    }
    /* the lse passed: the right one, or a view of it with the wrong dtype or shape */
    sdpa_tensor lse_view = lse->t;
    if (c->lse_odd == 1 || c->lse_odd == 2)
        lse_view.dtype = c->lse_odd == 1 ? SDPA_F16 : SDPA_BF16;
    else if (c->lse_odd == 3)
        lse_view.shape[3] = 2;
    else if (c->lse_odd == 4)
        lse_view.shape[2] += 1;

    bwd_inputs in = {{&c->out, lse, &c->dout}, {NULL, NULL, NULL}};
    for (int n = 0; n < 3; n++) {
        in.copy[n] = malloc(in.t[n]->bytes);
        memcpy(in.copy[n], in.t[n]->buf, in.t[n]->bytes);
    }
    const sdpa_status st = call_backward(c, c->ctx_null ? NULL : ctx, &lse_view);
    check_backward_status(c, st, ctx, bad);
    check_inputs(&in, "sdpa_backward");
    if (st != SDPA_OK) {
        for (int n = 0; n < 3; n++)
            if (!fz_is_canary(grad(c, n)))
                fz_violation("sdpa_backward failed with %s but wrote into %s", sdpa_status_name(st),
                             grad(c, n)->name);
    } else {
        unsigned char *ref[3];
        for (int n = 0; n < 3; n++) {
            fz_check_gaps(grad(c, n), "sdpa_backward");
            ref[n] = malloc(grad(c, n)->bytes);
            memcpy(ref[n], grad(c, n)->buf, grad(c, n)->bytes);
        }
        /* the values only where out and lse hold the forward's results (it may have refused
         * out or lse as outputs, FZ_BAD_OUT, which the backward reads legally) */
        if (fwd_ok)
            check_values(c, ctx, &lse_view);
        sdpa_ctx *const again[2] = {ctx, ctx2};
        static const char *const what[2] = {"a second call", "another thread count"};
        for (int r = 0; r < 2; r++) {
            const sdpa_status st2 = call_backward(c, again[r], &lse_view);
            if (st2 != SDPA_OK)
                fz_violation("sdpa_backward (%s) failed with %s: %s", what[r],
                             sdpa_status_name(st2), sdpa_ctx_last_error(again[r]));
            for (int n = 0; n < 3; n++)
                if (memcmp(grad(c, n)->buf, ref[n], grad(c, n)->bytes) != 0)
                    fz_violation("%s differs on %s", grad(c, n)->name, what[r]);
        }
        check_inputs(&in, "sdpa_backward (again)");
        for (int n = 0; n < 3; n++)
            free(ref[n]);
    }
    for (int n = 0; n < 3; n++)
        free(in.copy[n]);
}
