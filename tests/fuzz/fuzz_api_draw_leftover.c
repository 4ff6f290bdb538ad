/*
 * fuzz_api_draw_leftover.c — the API fuzz target's draws that take only the bytes the
 * forward's draw (fuzz_api_draw.c) left over: the backward's arguments (dout, dq, dk, dv, the
 * dropout, an argument made invalid on purpose) and how sdpa_forward_kv is called (a page
 * size, the lengths, sinks, an invalid length or entry). An input used up draws the defaults
 * (f32 contiguous gradients, no dropout, no KV call), so every input committed before these
 * draws existed keeps its meaning for sdpa_forward and sdpa_weights.
 *
 * Like fuzz_api_draw.c, this is part of the mapping the committed corpus was found through:
 * the order in which bytes are taken is part of it.
 */
#include "fuzz_api.h"
#include "fuzz_api_draw.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---- the backward (issue 11) ------------------------------------------------------------- */

/* A gradient tensor's dtype: f32/f16/bf16, one time in 64 one no tensor may have. */
static sdpa_dtype draw_grad_dtype(fz_src *s, fz_case *c, const char *why) {
    static const int bad[4] = {SDPA_BOOL, 4, 7, -1};
    const unsigned x = take(s);
    if (x % 64 == 63) {
        fz_note_bad_status(c, FZ_BAD_BWD, why, SDPA_ERR_DTYPE, ".dtype=");
        return (sdpa_dtype)bad[(x >> 6) % 4];
    }
    return (sdpa_dtype)(x % 3);
}

/* draw_layout's, but what would make the tensor invalid (a huge stride, misaligned data; for
 * an output also a stride 0 and overlapping rows) is kept one time in 4 only, so that four
 * tensors more leave most backward calls valid. */
static fz_layout draw_grad_layout(fz_src *s, int output) {
    fz_layout ly = fz_draw_layout(s);
    const int invalid = ly.huge || ly.misalign || (output && (ly.zero || ly.overlap));
    if (invalid && take(s) % 4 != 3) {
        ly.huge = ly.misalign = 0;
        if (output)
            ly.zero = 0, ly.overlap = 0;
    }
    return ly;
}

/* Dropout (sdpa.h, Dropout) for the backward: a drop probability, a seed and an offset; one
 * time in 64 a dropout_p outside [0, 1), which sdpa_backward must refuse. A valid one is used
 * only where the inputs hold no huge value (the injections of kind 3 and 4): with 1 / (1 - p)
 * up to 1000, out (and what the backward reads from it) would pass f16's range. */
static void draw_dropout(fz_case *c, fz_src *s, int calm) {
    const unsigned pb = take(s);
    const uint32_t lo = take16(s);
    const uint32_t sd = lo | (uint32_t)take16(s) << 16;
    uint64_t offset = take16(s);
    if (pb >> 6 & 1u)
        offset = UINT64_MAX - offset; /* offsets near 2^64 wrap in the key */
    const uint64_t seed = (pb >> 7) ? (uint64_t)sd * 0x9E3779B97F4A7C15u : sd;
    float p;
    if (pb % 64 == 63) {
        static const float bad[6] = {1.0f, -0.25f, NAN, 2.0f, INFINITY, -INFINITY};
        p = bad[take(s) % 6];
        if (!c->params_null)
            fz_note_bad_status(c, FZ_BAD_BWD, "dropout_p outside [0, 1)", SDPA_ERR_PARAM,
                               "params.dropout_p=");
    } else if (pb % 64 == 62) {
        /* valid oddities: a drop chance that rounds to 0 in 2^-32 steps, one far below it,
         * nearly all dropped, and -0 (off) */
        static const float odd[4] = {0x1p-34f, 1e-30f, 0.999f, -0.0f};
        p = odd[take(s) % 4];
    } else {
        p = (float)(1 + pb % 62) / 64.0f;
    }
    const int valid = p >= 0.0f && p < 1.0f;
    if (c->params_null || (valid && !calm))
        return;
    c->drop_p = p;
    c->drop_seed = seed;
    c->drop_offset = offset;
    c->drop_set = 1;
    c->dropout = valid && p > 0.0f;
}

/* The backward's arguments made invalid on purpose (rare): a dout of the wrong shape, an lse
 * of the wrong dtype or shape, an output over an input or another output, a NULL. Each alone
 * has one status and a message naming the argument. */
static void draw_backward_oddity(fz_case *c, fz_src *s) {
    const unsigned x = take(s) % 5, y = take(s);
    if (x == 0) {
        /* dout (B, Hq, Lq, Dk) where Dk != Dv: the classic slip; else an extent + 1 */
        const int d = (int)(y % 4);
        const int64_t was = c->dout.t.shape[d];
        const int64_t now = d == 3 && c->Dk != c->Dv ? c->Dk : was + 1;
        c->dout.t.shape[d] = now;
        c->dout.perturbd = d;
        c->dout.perturbv = now;
        fz_note_bad_status(c, FZ_BAD_BWD, "dout of the wrong shape", SDPA_ERR_SHAPE, "dout.shape[");
    } else if (x == 1) {
        c->lse_odd = 1 + (int)(y % 2);
        fz_note_bad_status(c, FZ_BAD_BWD, "lse (backward) not f32", SDPA_ERR_DTYPE, "lse.dtype=");
    } else if (x == 2) {
        c->lse_odd = 3 + (int)(y % 2);
        fz_note_bad_status(c, FZ_BAD_BWD, "lse (backward) of the wrong shape", SDPA_ERR_SHAPE,
                           c->lse_odd == 3 ? "lse.shape[3]" : "lse.shape[2]");
    } else if (x == 3) {
        /* dq over q, k, v, out, lse or dout; dk over dq; dv over dk */
        fz_tensor *lse = c->lse.used ? &c->lse : &c->blse;
        fz_tensor *const victims[8] = {&c->q, &c->k, &c->v, &c->out, lse, &c->dout, &c->dq, &c->dk};
        const unsigned w = y % 8;
        fz_tensor *victim = victims[w], *f = w == 6 ? &c->dk : w == 7 ? &c->dv : &c->dq;
        f->t.data = victim->t.data;
        f->alias = 1;
        const size_t es = sdpa_dtype_size(f->t.dtype);
        /* misaligned for f's dtype, it is refused for that first (SDPA_ERR_PARAM) */
        const int aligned = es != 0 && (uintptr_t)f->t.data % es == 0;
        fz_note_bad_status(c, FZ_BAD_BWD, "a gradient over an input or another gradient",
                           aligned ? SDPA_ERR_ALIAS : SDPA_OK, f->name);
    } else {
        static const char *const what[4] = {"dout is NULL", "dq.data is NULL", "dk is NULL",
                                            "dv.data is NULL"};
        fz_tensor *const t[4] = {&c->dout, &c->dq, &c->dk, &c->dv};
        const unsigned w = y % 4;
        if (w % 2 == 0)
            t[w]->null_tensor = 1;
        else
            t[w]->t.data = NULL;
        fz_note_bad_status(c, FZ_BAD_BWD, what[w], SDPA_ERR_NULL, what[w]);
    }
}

/* The backward's arguments, drawn after everything else, so that an input found before keeps
 * its meaning for sdpa_forward and sdpa_weights except where it had bytes left over (a valid
 * dropout changes the forward too): an input used up (take gives 0) draws f32 dout and
 * gradients in contiguous (B, H, L, D) layouts, no dropout and nothing invalid. The values of
 * dout come from the head of the input, then from the PRNG, like q's, k's and v's. */
void fz_draw_backward(fz_case *c, fz_src *s, tu_rng *rng) {
    const size_t before = (size_t)(s->tail - s->head);
    const int64_t sho[4] = {c->B, c->Hq, c->Lq, c->Dv}, shq[4] = {c->B, c->Hq, c->Lq, c->Dk};
    const int64_t shk[4] = {c->B, c->Hkv, c->Lk, c->Dk}, shv[4] = {c->B, c->Hkv, c->Lk, c->Dv};
    const int64_t shl[4] = {c->B, c->Hq, c->Lq, 1};
    fz_tensor *const t[4] = {&c->dout, &c->dq, &c->dk, &c->dv};
    const int64_t *const sh[4] = {sho, shq, shk, shv};
    static const char *const bad_dt[4] = {"dout dtype invalid", "dq dtype invalid",
                                          "dk dtype invalid", "dv dtype invalid"};
    const unsigned bk = take(s);
    for (int n = 0; n < 4; n++) {
        const sdpa_dtype dt = draw_grad_dtype(s, c, bad_dt[n]);
        t[n]->ly = draw_grad_layout(s, n > 0);
        t[n]->used = 1;
        fz_alloc_tensor(c, t[n], dt, sh[n], n > 0, FZ_BAD_BWD, FZ_BAD_BWD, take(s));
    }
    if (!c->lse.used) {
        c->blse.used = 1;
        fz_alloc_tensor(c, &c->blse, SDPA_F32, shl, 1, FZ_BAD_BWD, FZ_BAD_BWD, 0);
        fz_fill_canary(&c->blse); /* defined bytes until a forward writes it */
    }

    /* dout's values: its gaps NaN, as the inputs' */
    const unsigned mg = take(s);
    memset(c->dout.buf, 0xFF, c->dout.bytes);
    if (fz_fillable(&c->dout))
        fz_fill_float(&c->dout, s, rng, ldexp(1.0, (int)(mg % 5) - 2));

    /* dropout one time in 4, in the calm cases only (see draw_dropout) */
    if ((bk & 3u) == 3) {
        int calm = !c->huge_qk && !c->huge_v;
        for (int n = 0; n < c->n_inj; n++)
            calm &= c->inj[n].kind < 3 || c->inj[n].tensor == 3;
        draw_dropout(c, s, calm);
    }

    /* NaN or +-Inf in dout (1 time in 8) */
    if ((bk >> 2 & 7u) == 7 && fz_fillable(&c->dout)) {
        static const double val[3] = {NAN, INFINITY, -INFINITY};
        const double x = val[take(s) % 3];
        int64_t flat = (int64_t)take16(s);
        for (int i = 3; i >= 0; i--) {
            c->dout_inj[i] = flat % c->dout.t.shape[i];
            flat /= c->dout.t.shape[i];
        }
        tu_set(&c->dout.t, c->dout_inj[0], c->dout_inj[1], c->dout_inj[2], c->dout_inj[3], x);
        c->dout_nonfinite = 1;
    }

    if (take(s) % 16 == 15)
        draw_backward_oddity(c, s);
    c->bwd_bytes = before - (size_t)(s->tail - s->head);
}

/* ---- the KV cache (issue 13) ------------------------------------------------------------- */

/* How sdpa_forward_kv is called on the case (fuzz_api_kv.c), drawn after everything else, so
 * that an input found before keeps its meaning; one that is used up (take gives 0) makes no
 * KV call. Three times in four otherwise: a page size (0: the plain layout; 1, 2, 5, 16, 64,
 * 256), the pool's order, spare pages and extra block-table entries, the lengths (seqlens_k in
 * [0, Lk], seqlens_q in [0, Lq], each full one time in 4; NULL one time in 4), one time in 4
 * sinks (-8..8, -inf one time in 256; only with params), and one time in 16 a length or an
 * entry made invalid, or an entry no length reads made out of range (which is valid). */
void fz_draw_kv(fz_case *c, fz_src *s) {
    const size_t before = (size_t)(s->tail - s->head);
    const unsigned x = take(s);
    if (x % 4 != 0 && c->B <= 3 && c->Hq <= 16) {
        static const int64_t pages[8] = {0, 0, 1, 2, 5, 16, 64, 256};
        c->kv = 1;
        c->kv_page = pages[x >> 2 & 7u];
        c->kv_blhd = x >> 5 & 1u;
        c->kv_no_sk = (x >> 6) == 3;
        const unsigned y = take(s);
        c->kv_spare = (int)(y & 3u);
        c->kv_more = y >> 2 & 1u;
        c->kv_no_sq = (y >> 3 & 3u) == 3;
        for (int64_t b = 0; b < c->B; b++) {
            const unsigned u = take(s), w = take(s);
            c->kv_sk[b] = (int32_t)(u >= 192 ? c->Lk : (int64_t)u % (c->Lk + 1));
            c->kv_sq[b] = (int32_t)(w >= 192 ? c->Lq : (int64_t)w % (c->Lq + 1));
        }
        const unsigned z = take(s);
        if (z % 4 == 3 && !c->params_null) {
            c->kv_sinks = 1;
            for (int64_t h = 0; h < c->Hq; h++) {
                const unsigned w = take(s);
                c->kv_sink[h] = w == 255 ? -INFINITY : ((float)w - 128.0f) / 16.0f;
            }
        }
        const unsigned bad = take(s);
        if (bad % 16 == 15) {
            c->kv_bad = 1 + (int)((bad >> 4) % 7);
            c->kv_bad_at = take(s);
        }
        c->kv_seed = take16(s);
    }
    c->kv_bytes = before - (size_t)(s->tail - s->head);
}
