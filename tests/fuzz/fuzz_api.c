/*
 * fuzz_api.c — libFuzzer target: sdpa_forward, sdpa_weights and sdpa_backward on fuzzed
 * arguments, checked differentially against the reference (src/ref/, called directly through
 * tu_golden_forward and sdpa__ref_backward) and a same-precision naive baseline
 * (tu_naive_forward; fuzz_api_backward.c for the gradients), with the tolerance rule of
 * docs/testing.md.
 *
 * The input is read from both ends (as zstd's fuzz_data_producer does): parameters from the
 * tail (shapes, dtypes, strides, mask, window, softcap, ALiBi, scale bits, threads, ISA cap,
 * special values, aliasing), data from the head (tensor values; a PRNG seeded from the tail
 * takes over when the head runs out): fuzz_api_draw.c. Every buffer is malloc'ed at exactly
 * the size its extents and strides span, so ASan sees any access outside a tensor; the gaps
 * inside it (padded rows) hold NaN for inputs, so a read there shows in the result, and a
 * canary for outputs, so a write there is seen (fuzz_api_tensor.c).
 *
 * Invariants (fuzz_api_check.c; a violation prints what was violated and the whole case to
 * stderr, then aborts, which libFuzzer reports):
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
 *     where a key is hidden, all 0 where the golden LSE is -inf; where the golden LSE is NaN
 *     (a NaN or +inf score, e.g. a q.k beyond FLT_MAX), NaN or 0 with at least one NaN, as
 *     sdpa_forward's row is NaN there: the two calls follow one rule on scores;
 *   - sdpa_backward on the same arguments, with a drawn dout, dq, dk, dv and sometimes
 *     dropout (fuzz_api_backward.c): invalid arguments refused (alone: with their status and
 *     a message naming them), dq, dk, dv untouched on error, inputs (out, lse, dout too) never
 *     written; on OK, dq, dk and dv pass the rule against the reference backward with a
 *     first-order bound of f32 rounding per element, rows that see no key have dq = 0 and
 *     keys no row sees dk = dv = 0, and a second call and another thread count give the
 *     same bytes;
 *   - sdpa_forward_kv on the same q, out and lse, with k and v as a ragged plain cache or a
 *     pool of pages (fuzz_api_kv.c), where sdpa_forward accepted the case and the input has
 *     bytes left for it: invalid lengths and block-table entries refused with their status and
 *     message, outputs untouched; on OK each sequence by the rule against the golden of its
 *     own slices, rows past its queries 0, the same bytes on another thread count.
 *
 * Build and run: tests/fuzz/run_fuzz.sh api. The committed corpus (tests/fuzz/corpus/api) is
 * replayed by tests/fuzz/replay.c as the CTest test fuzz_replay_api.
 */
#include "fuzz_api.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---- the report of a violation ----------------------------------------------------------- */

static const fz_case *current; /* the case being run, printed with a violation */

static void print_tensor(const fz_tensor *f) {
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
    if (f->is_input && fz_fillable(f) && f->perturbd < 0 && n <= 16) {
        fprintf(stderr, "        values:");
        for (int64_t e = 0; e < n; e++)
            fprintf(stderr, " %g",
                    tu_get(t, e / (t->shape[1] * t->shape[2] * t->shape[3]),
                           e / (t->shape[2] * t->shape[3]) % t->shape[1],
                           e / t->shape[3] % t->shape[2], e % t->shape[3]));
        fputc('\n', stderr);
    }
}

static void print_case(const fz_case *c) {
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
    if (c->drop_set)
        fprintf(stderr, "  the backward's dropout: p=%a (%g) seed=%llu offset=%llu%s\n",
                (double)c->drop_p, (double)c->drop_p, (unsigned long long)c->drop_seed,
                (unsigned long long)c->drop_offset, c->dropout ? "" : " (not dropping)");
    if (p->alibi_slopes != NULL && ((uintptr_t)p->alibi_slopes & 3u) == 0) {
        fprintf(stderr, "  slopes:");
        for (int64_t h = 0; h < c->Hq; h++)
            fprintf(stderr, " %a", (double)p->alibi_slopes[h]);
        fputc('\n', stderr);
    }
    const fz_tensor *const all[FZ_N_ALL] = {&c->q, &c->k,    &c->v,  &c->mask, &c->out, &c->lse,
                                            &c->w, &c->dout, &c->dq, &c->dk,   &c->dv,  &c->blse};
    for (int i = 0; i < FZ_N_ALL; i++)
        print_tensor(all[i]);
    for (int i = 0; i < c->n_inj; i++)
        fprintf(stderr, "  injected %s at %s(%lld, %lld, %lld, %lld)\n", inj_kind[c->inj[i].kind],
                inj_tensor[c->inj[i].tensor], (long long)c->inj[i].at[0],
                (long long)c->inj[i].at[1], (long long)c->inj[i].at[2], (long long)c->inj[i].at[3]);
    if (c->score_inf)
        fprintf(stderr,
                "  score beyond f32: q(%lld, %lld, %lld, :) = %g x k(%lld, %lld, %lld, :) = %g\n",
                (long long)c->inf_q[0], (long long)c->inf_q[1], (long long)c->inf_q[2], c->inf_qv,
                (long long)c->inf_k[0], (long long)c->inf_k[1], (long long)c->inf_k[2], c->inf_kv);
    fprintf(stderr, "  the backward's draw took %zu bytes of the input\n", c->bwd_bytes);
    if (c->dout_nonfinite)
        fprintf(stderr, "  injected a non-finite value at dout(%lld, %lld, %lld, %lld)\n",
                (long long)c->dout_inj[0], (long long)c->dout_inj[1], (long long)c->dout_inj[2],
                (long long)c->dout_inj[3]);
    if (c->lse_odd)
        fprintf(stderr, "  the backward's lse: %s\n",
                c->lse_odd == 1   ? "viewed as f16"
                : c->lse_odd == 2 ? "viewed as bf16"
                : c->lse_odd == 3 ? "shape[3] = 2"
                                  : "shape[2] = Lq + 1");
    if (c->kv) {
        fprintf(stderr,
                "  sdpa_forward_kv: page %lld (0: plain)%s, %d spare pages, %d more entries, "
                "seed %u, seqlens_k%s",
                (long long)c->kv_page, c->kv_blhd ? " (n_pages, page, Hkv, D)" : "", c->kv_spare,
                c->kv_more, (unsigned)c->kv_seed, c->kv_no_sk ? " NULL" : "");
        for (int64_t b = 0; b < c->B && !c->kv_no_sk; b++)
            fprintf(stderr, " %ld", (long)c->kv_sk[b]);
        fprintf(stderr, ", seqlens_q%s", c->kv_no_sq ? " NULL" : "");
        for (int64_t b = 0; b < c->B && !c->kv_no_sq; b++)
            fprintf(stderr, " %ld", (long)c->kv_sq[b]);
        fprintf(stderr, ", invalid %d at %u, sinks", c->kv_bad, c->kv_bad_at);
        for (int64_t h = 0; h < c->Hq && c->kv_sinks; h++)
            fprintf(stderr, " %g", (double)c->kv_sink[h]);
        fprintf(stderr, "%s (%zu bytes of the input)\n", c->kv_sinks ? "" : " none", c->kv_bytes);
    }
    fprintf(stderr,
            "  invalid on purpose: common %d params %d forward %d weights %d out-as-output %d "
            "backward %d:",
            c->n_bad[FZ_BAD_COMMON], c->n_bad[FZ_BAD_PARAMS], c->n_bad[FZ_BAD_FWD],
            c->n_bad[FZ_BAD_W], c->n_bad[FZ_BAD_OUT], c->n_bad[FZ_BAD_BWD]);
    for (int i = 0; i < c->n_why; i++)
        fprintf(stderr, " %s;", c->why[i]);
    fputc('\n', stderr);
}

void fz_violation(const char *fmt, ...) {
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

static sdpa_ctx *contexts[SDPA_ISA_AMX + 1][5];

static sdpa_ctx *get_ctx(int isa, int threads) {
    if (contexts[isa][threads] == NULL)
        contexts[isa][threads] = tu_ctx(threads, (sdpa_isa)isa);
    return contexts[isa][threads];
}

/* The best of generic/avx2/avx512/amx this CPU has: a higher cap would be lowered silently
 * and only duplicate a context. */
static int best_isa(void) {
    static int best = 0;
    if (best == 0)
        best = (int)sdpa_ctx_isa(get_ctx(SDPA_ISA_AMX, 1));
    return best;
}

/* ---- the run ----------------------------------------------------------------------------- */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_case cs;
    fz_case *c = &cs;
    fz_draw_case(c, data, size, best_isa());
    current = c;

    /* the call under test */
    sdpa_ctx *ctx = get_ctx(c->isa, c->t1);
    fz_fill_canary(&c->out);
    fz_fill_canary(&c->lse);
    fz_fill_canary(&c->w);
    fz_snapshot snap;
    fz_take_snapshot(c, &snap);
    const sdpa_params *pr = c->params_null ? NULL : &c->params;
    const sdpa_status st =
        sdpa_forward(c->ctx_null ? NULL : ctx, fz_arg(&c->q), fz_arg(&c->k), fz_arg(&c->v), pr,
                     fz_arg_out(&c->out), fz_arg_out(&c->lse));
    const int bad = c->bad[FZ_BAD_COMMON] || (c->bad[FZ_BAD_PARAMS] && !c->params_null) ||
                    c->bad[FZ_BAD_FWD] || c->bad[FZ_BAD_OUT];
    fz_check_status(c, st, ctx, "sdpa_forward", bad, !bad);
    fz_check_snapshot(c, &snap, "sdpa_forward");
    double *g_lse = NULL;
    if (st != SDPA_OK) {
        if (!fz_is_canary(&c->out) || (c->lse.used && !fz_is_canary(&c->lse)))
            fz_violation("sdpa_forward failed with %s but wrote into an output",
                         sdpa_status_name(st));
    } else {
        fz_check_gaps(&c->out, "sdpa_forward");
        fz_check_gaps(&c->lse, "sdpa_forward");
        unsigned char *ref_out = malloc(c->out.bytes);
        unsigned char *ref_lse = c->lse.used ? malloc(c->lse.bytes) : NULL;
        memcpy(ref_out, c->out.buf, c->out.bytes);
        if (ref_lse != NULL)
            memcpy(ref_lse, c->lse.buf, c->lse.bytes);
        g_lse = fz_check_forward_result(c, ctx, fz_params(c));
        fz_check_same_bytes(c, ctx, ref_out, ref_lse, "a second call");
        fz_check_same_bytes(c, get_ctx(c->isa, c->t2), ref_out, ref_lse, "another thread count");
        fz_check_snapshot(c, &snap, "sdpa_forward (again)");
        free(ref_out);
        free(ref_lse);
    }
    if (!c->skip_weights) {
        fz_check_weights(c, ctx, g_lse);
        fz_check_snapshot(c, &snap, "sdpa_weights");
    }
    free(g_lse);
    fz_check_backward(c, ctx, get_ctx(c->isa, c->t2), st == SDPA_OK);
    fz_check_snapshot(c, &snap, "sdpa_backward");
    if (st == SDPA_OK && c->kv)
        fz_check_kv(c, ctx, get_ctx(c->isa, c->t2));
    fz_free_snapshot(&snap);
    fz_free_case(c);
    current = NULL;
    return 0;
}
