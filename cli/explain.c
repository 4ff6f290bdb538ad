/*
 * explain.c — `sdpa explain`: scaled dot-product attention taught one step at a time, on real
 * numbers, the way the seeds' notebook walks through it (../shared/seeds/): the inputs, the
 * scores Q K^T, the scaling and why, the causal mask, the row-wise softmax, the weighted sum
 * of the values, and a check against the library's fused result; then the seeds' "why scale"
 * demonstration. With --n 4 --d 8 --seed 42 (the defaults) the inputs are the very numbers
 * PyTorch draws after torch.manual_seed(42) (torch_rng.c), so the printout can be read side by
 * side with the notebook.
 *
 * This file is the narration: the options, and each step's prose, tables and worked sums.
 * The inputs come from explain_input.c; every step is computed by explain_calc.c, plainly
 * and in double precision, because showing it is the point; the library is called only at
 * the end, as the thing being checked. The layout code (80-column tables and word-wrapped
 * prose, colour only on a terminal) is in explain_print.c.
 */
#include "args.h"
#include "cli.h"
#include "explain.h"

#include "sdpa.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: sdpa explain [--n N] [--d D] [--seed S] [--causal] [--backward] [--no-color]\n"
    "       sdpa explain --q Q.npy --k K.npy --v V.npy [--causal] [--backward] [--no-color]\n"
    "\n"
    "Walks through scaled dot-product attention, softmax(Q K^T / sqrt(d_k)) V, one\n"
    "step at a time on real numbers: the inputs, the scores Q K^T (one entry worked\n"
    "out), the scaling by 1/sqrt(d_k) and why (the variance argument, on these very\n"
    "numbers), the causal mask (with --causal), the row-wise softmax (one row worked\n"
    "out), the weighted sum of the values, and a check against the library's fused\n"
    "sdpa_forward. It ends with the \"why scale\" demonstration: the softmax of\n"
    "[2, 1, 0.5], of [200, 100, 50], and of [200, 100, 50] scaled down.\n"
    "\n"
    "options:\n"
    "  --n N        number of tokens, 1 to 16 (default 4)\n"
    "  --d D        model dimension, d_model = d_k = d_v, 1 to 16 (default 8)\n"
    "  --seed S     random seed, as torch.manual_seed(S) (default 42). The inputs are\n"
    "               X = randn(N, D), then W_Q, W_K, W_V = randn(D, D), and\n"
    "               Q = X W_Q, K = X W_K, V = X W_V, as a PyTorch notebook would\n"
    "  --q FILE     your own queries instead: a .npy array (Lq, d_k), float32/float16\n"
    "  --k FILE     your own keys, (Lk, d_k)\n"
    "  --v FILE     your own values, (Lk, d_v); --q, --k and --v go together, and\n"
    "               each extent is at most 16 (use 'sdpa run' for larger arrays)\n"
    "  --causal     token i may attend only to tokens j <= i (a decoder's mask)\n"
    "  --backward   then the gradients, for the loss L = out.sum(): dV, dP, Delta, the\n"
    "               softmax's derivative dS, dQ and dK, one entry of each worked out,\n"
    "               checked by a finite difference and against sdpa_backward\n"
    "  --no-color   no colour, even on a terminal (so does a non-empty NO_COLOR);\n"
    "               output into a pipe or a file never has colour\n"
    "  -h, --help   this text\n"
    "\n"
    "examples:\n"
    "  sdpa explain                     the classic example: 4 tokens, d = 8, seed 42\n"
    "  sdpa explain --causal            the same, with the causal mask\n"
    "  sdpa explain --backward          ... and its gradients, step by step\n"
    "  sdpa explain --n 6 --d 16 --seed 7\n"
    "  sdpa explain --q q.npy --k k.npy --v v.npy\n"
    "  sdpa explain | less              (plain text: no colour in a pipe)\n"
    "\n"
    "exit codes: 0 ok, 1 runtime error (a file, a failed check), 2 usage error.\n";

/* ---------------------------------------------------------------------------------------- */
/* Options                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static int parse_seed(const char *s, unsigned long long *out) {
    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *end;
    const unsigned long long val = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return -1;
    *out = val;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* The steps                                                                                 */
/* ---------------------------------------------------------------------------------------- */

static void step_inputs(explain *e) {
    xp_heading(&e->out, ++e->step, "The inputs");
    if (e->generated) {
        const int n = e->lq, d = e->n_model;
        char code[64];
        xp_para(&e->out, 0, 0,
                "We start from %d token%s that have already been embedded: each is a vector "
                "of d_model = %d numbers, one row of X. (PyTorch: torch.manual_seed(%llu); "
                "%s.)",
                n, n == 1 ? "" : "s", d, e->seed,
                xp_glue(code, sizeof code, "X = torch.randn(%d, %d)", n, d));
        xp_matrix(&e->out, "X", e->x, n, d, "x");
        xp_para(&e->out, 0, 0,
                "Each token plays three roles, and three learned matrices give it one vector per "
                "role "
                "(random here: W_Q, W_K, W_V = %s, drawn in that order):",
                xp_glue(code, sizeof code, "torch.randn(%d, %d)", d, d));
        xp_para(&e->out, 2, 14,
                "Q = X W_Q     the query: what am I looking for?\n"
                "K = X W_K     the key: what do I offer, to be found by?\n"
                "V = X W_V     the value: what do I hand over if chosen?");
        xp_para(&e->out, 0, 0,
                "Row i of Q, K and V belongs to token i. Here d_k = d_v = d_model = %d.", d);
    } else {
        xp_para(&e->out, 0, 0,
                "Your arrays: %d quer%s from %s, %d key%s from %s and %d value%s from %s. Row i "
                "of Q is query i, row j of K and of V belong to key j. d_k = %d (the length "
                "of a query or key), d_v = %d (the length of a value).",
                e->lq, e->lq == 1 ? "y" : "ies", e->qname, e->lk, e->lk == 1 ? "" : "s", e->kname,
                e->lk, e->lk == 1 ? "" : "s", e->vname, e->dk, e->dv);
    }
    xp_matrix(&e->out, "Q", e->q, e->lq, e->dk, "q");
    xp_matrix(&e->out, "K", e->k, e->lk, e->dk, "k");
    xp_matrix(&e->out, "V", e->v, e->lk, e->dv, "v");
}

static void step_scores(explain *e) {
    xp_heading(&e->out, ++e->step, "Scores: every query meets every key, Q K^T");
    xp_para(&e->out, 0, 0,
            "Entry [i, j] is the dot product q_i . k_j = the sum over the d_k = %d "
            "feature%s of q_i[f] * k_j[f]: how well token i's query matches token j's key. A "
            "large score is a good match. The result has one row per query and one column "
            "per key, %d x %d: every query against every key, the N^2 part of attention.",
            e->dk, e->dk == 1 ? "" : "s", e->lq, e->lk);
    xp_grid(&e->out, "scores = Q K^T", e->scores, e->lq, e->lk, XP_AUTO, "q", "k", 0, NULL);

    const int i = 0, j = e->lk > 1 ? 1 : 0;
    xp_fmt style_q = xp_style_f(e->q, e->lq * e->dk), style_k = xp_style_f(e->k, e->lk * e->dk);
    char label[64];
    snprintf(label, sizeof label, "scores[%d, %d] = q%d . k%d = ", i, j, i, j);
    xp_sum sum;
    xp_sum_begin(&sum, label);
    for (int t = 0; t < e->dk; t++)
        xp_sum_product(&sum, (double)e->q[i * e->dk + t], style_q, (double)e->k[j * e->dk + t],
                       style_k);
    xp_sum_end(&sum, e->scores[i * e->lk + j], xp_style(e->scores, e->lq * e->lk));
    xp_para(&e->out, 0, 0, "For example, worked out feature by feature:");
    xp_sum_print(&e->out, &sum);
    xp_para(&e->out, 0, 0, "(The factors are shown rounded; the sum uses every digit.)");
}

static void step_scale(explain *e) {
    const int dk = e->dk, count = e->lq * e->lk;
    const double root = sqrt((double)dk);
    xp_heading(&e->out, ++e->step, "Scaling: divide by sqrt(d_k)");
    if (dk == 1) {
        xp_para(&e->out, 0, 0,
                "Each score is a sum of d_k products, and sums grow with their length: with "
                "entries of variance 1 a score has variance d_k, so we divide every score by "
                "sqrt(d_k) to bring it back to about 1. Here d_k = 1 and sqrt(1) = 1: the "
                "scaling changes nothing (it matters for long vectors; try --d 16).");
    } else {
        xp_para(&e->out, 0, 0,
                "Why: each score is a sum of d_k = %d products, and sums grow with their "
                "length. If the entries of q and k were independent with mean 0 and "
                "variance 1, each product would have variance 1 and the score variance "
                "d_k = %d. Large scores push the softmax into saturation: one weight near 1, "
                "the others near 0, and the gradients vanish (the demonstration at the end "
                "shows it). Dividing by sqrt(d_k) = %.2f divides the variance by d_k = %d, "
                "whatever d_k is: scaled scores have variance about 1.",
                dk, dk, root, dk);
    }
    if (count >= 2 && dk > 1) {
        const double vs = explain_sample_var(e->scores, count);
        const double vq = explain_sample_var_f(e->q, e->lq * dk),
                     vk = explain_sample_var_f(e->k, e->lk * dk);
        const double pred = dk * vq * vk;
        const int not_one = vq < 0.5 || vq > 2.0 || vk < 0.5 || vk > 2.0;
        char predicted[128], after[96];
        xp_glue(predicted, sizeof predicted, "d_k x var(q) x var(k) = %d x %.3g x %.3g = %.4g", dk,
                vq, vk, pred);
        xp_glue(after, sizeof after, "%.4g / %d = %.4g", vs, dk, vs / dk);
        xp_para(&e->out, 0, 0,
                "On these very numbers: the %d raw scores have sample variance %.4g. The "
                "entries of Q and K have variances %.3g and %.3g here%s%s, so the argument "
                "predicts %s; %d scores are a small sample, so expect rough agreement only. "
                "After scaling the variance is %s: the factor d_k is gone, and what is left "
                "comes from the size of q and k themselves%s.",
                count, vs, vq, vk, not_one ? ", not 1" : "",
                e->generated ? " (each entry is itself a sum of d_model products of X and W)" : "",
                predicted, count, after,
                e->generated ? " (in a trained transformer, normalisation layers keep them "
                               "near 1)"
                             : "");
        if (vs / dk > 4.0)
            xp_para(&e->out, 0, 0,
                    "With a variance of %.3g the scaled scores still lie several units apart, "
                    "so the weights below come out close to one-hot.",
                    vs / dk);
    }
    /* The scaled scores before any mask: the mask step shows them again, with -inf. */
    double unmasked[EXPLAIN_MAX_L * EXPLAIN_MAX_L];
    for (int t = 0; t < count; t++)
        unmasked[t] = e->scores[t] / root;
    xp_grid(&e->out, "scaled = scores / sqrt(d_k)", unmasked, e->lq, e->lk, XP_AUTO, "q", "k", 0,
            NULL);
}

static void step_mask(explain *e) {
    int hidden = 0;
    for (int i = 0; i < e->lq; i++)
        for (int j = 0; j < e->lk; j++)
            hidden += !explain_visible(e, i, j);
    xp_heading(&e->out, ++e->step, "The causal mask: no peeking at the future");
    xp_para(&e->out, 0, 0,
            "A token must not see the future. In a decoder, token i is produced before "
            "tokens i+1, i+2, ... exist, so query i may look only at keys j <= i. Every "
            "entry above the diagonal (j > i) becomes -inf; since exp(-inf) = 0, those keys "
            "will get weight exactly 0 and the visible keys share all of it. (Some code "
            "writes -1e9 instead of -inf: the same effect in practice.)%s",
            e->lq != e->lk ? " With a different number of queries and keys, query i lines "
                             "up with key i (top-left alignment, like PyTorch's is_causal)."
                           : "");
    const int last = e->lq - 1, seen = (last < e->lk - 1 ? last : e->lk - 1);
    if (hidden == 0)
        xp_para(&e->out, 0, 0,
                "Here there is only one key, and every query may see it: nothing is masked.");
    else if (last == 0)
        xp_para(&e->out, 0, 0, "Here %d of the %d entries %s masked: row 0 sees only k0.", hidden,
                e->lq * e->lk, hidden == 1 ? "is" : "are");
    else
        xp_para(&e->out, 0, 0,
                "Here %d of the %d entries %s masked: row 0 sees only k0, row %d sees k0 to "
                "k%d.",
                hidden, e->lq * e->lk, hidden == 1 ? "is" : "are", last, seen);
    xp_grid(&e->out, "masked scaled scores", e->scaled, e->lq, e->lk, XP_AUTO, "q", "k", 0, NULL);
}

static void step_softmax(explain *e, int r) {
    const int lk = e->lk;
    xp_heading(&e->out, ++e->step, "Softmax, row by row: scores become weights");
    xp_para(&e->out, 0, 0,
            "Each row becomes a probability distribution over the keys:\n"
            "  weights[i, j] = exp(s_ij - m_i) / sum_j exp(s_ij - m_i),\n"
            "where s is the %sscaled score and m_i the largest score of row i. Subtracting "
            "m_i changes nothing (it cancels in the division) but keeps exp() from "
            "overflowing. Entry [i, j] is the share of token i's attention that goes to "
            "token j: every weight is >= 0 and each row sums to 1.",
            e->causal ? "masked " : "");

    /* One row in full: the scores, the shift, the exponentials, the division. */
    const double *s = e->scaled + r * lk;
    double m = -INFINITY, sum = 0.0, ex[EXPLAIN_MAX_L], shifted[EXPLAIN_MAX_L];
    for (int j = 0; j < lk; j++)
        m = s[j] > m ? s[j] : m;
    for (int j = 0; j < lk; j++) {
        shifted[j] = s[j] - m;
        ex[j] = exp(shifted[j]);
        sum += ex[j];
    }
    xp_para(&e->out, 0, 0, "Row %d worked out (its largest score is m_%d = %s):", r, r,
            xp_cell(m, xp_style(s, lk)));
    const double *rows[4] = {s, shifted, ex, e->w + r * lk};
    const char *labels[4] = {"s", "s - m", "exp", "weight"};
    const xp_fmt fmts[4] = {XP_AUTO, XP_AUTO, XP_EXP, XP_FIXED3};
    xp_row_table(&e->out, rows, labels, fmts, 4, lk);

    xp_sum total;
    char label[32];
    snprintf(label, sizeof label, "sum of exp = ");
    xp_sum_begin(&total, label);
    for (int j = 0; j < lk; j++)
        if (explain_visible(e, r, j))
            xp_sum_term(&total, ex[j], XP_EXP);
    const int top = xp_argmax(e->w + r * lk, lk);
    char example[96];
    if (total.terms > 1) /* "1.0000 = 1.0000" would say nothing */
        xp_sum_end(&total, sum, XP_FIXED4);
    xp_sum_print(&e->out, &total);
    xp_para(&e->out, 0, 0, "and each weight is its exp divided by that sum, e.g. %s.",
            xp_glue(example, sizeof example, "weights[%d, %d] = %s / %.4f = %.3f", r, top,
                    xp_cell(ex[top], XP_EXP), sum, e->w[r * lk + top]));

    double sums[EXPLAIN_MAX_L];
    for (int i = 0; i < e->lq; i++) {
        sums[i] = 0.0;
        for (int j = 0; j < lk; j++)
            sums[i] += e->w[i * lk + j];
    }
    xp_para(&e->out, 0, 0, "All the weights%s, and each row's sum%s:",
            e->out.color ? ", the largest of each row highlighted" : "",
            e->causal ? " (a masked key's weight is exactly 0 and prints as 0; 0.000 is a "
                        "weight that merely rounds to zero)"
                      : "");
    xp_grid(&e->out, e->causal ? "weights = softmax(masked scaled)" : "weights = softmax(scaled)",
            e->w, e->lq, lk, XP_FIXED3, "q", "k", 1, sums);
}

static void step_output(explain *e, int r) {
    const int lk = e->lk, dv = e->dv;
    xp_heading(&e->out, ++e->step, "The output: a weighted sum of the values");
    xp_para(&e->out, 0, 0,
            "Token i's output is a blend of the value vectors, mixed in the proportions of "
            "its weights: out[i] = sum_j weights[i, j] * v_j. Entry [i, f] is feature f of "
            "that blend. Because each row of weights sums to 1, out[i] is a weighted "
            "average of the values: a row that puts nearly all its weight on one key "
            "nearly copies that key's value.");
    const double *wr = e->w + r * lk;
    /* Masked keys drop out. With many keys, so do the weights that print as 0.000: sixteen
     * terms of which ten read "0.000 x v5" would hide the few that matter. */
    int shown[EXPLAIN_MAX_L], n_shown = 0, n_tiny = 0;
    for (int j = 0; j < lk; j++) {
        if (!explain_visible(e, r, j))
            continue;
        if (lk > 8 && wr[j] < 0.0005)
            n_tiny++;
        else
            shown[n_shown++] = j;
    }
    xp_sum comb;
    char label[64];
    snprintf(label, sizeof label, "out[%d] = ", r);
    xp_sum_begin(&comb, label);
    for (int t = 0; t < n_shown; t++)
        xp_sum_weighted(&comb, wr[shown[t]], "v", shown[t]);
    xp_sum_end(&comb, 0.0, XP_NONE);
    xp_para(&e->out, 0, 0, "Row %d, the row worked out in the softmax step:", r);
    xp_sum_print(&e->out, &comb);

    const xp_fmt vstyle = xp_style_f(e->v, lk * dv);
    snprintf(label, sizeof label, "out[%d, 0] = ", r);
    xp_sum feat;
    xp_sum_begin(&feat, label);
    for (int t = 0; t < n_shown; t++)
        xp_sum_product(&feat, wr[shown[t]], XP_FIXED3, (double)e->v[shown[t] * dv], vstyle);
    xp_sum_end(&feat, e->o[r * dv], xp_style(e->o, e->lq * dv));
    xp_para(&e->out, 0, 0, "Its first feature, number by number:");
    xp_sum_print(&e->out, &feat);
    if (n_tiny)
        xp_para(&e->out, 0, 0,
                "(Left out above: the %d key%s whose weight rounds to 0.000; they count in "
                "the result, but too little to show.)",
                n_tiny, n_tiny == 1 ? "" : "s");
    const int top = xp_argmax(wr, lk);
    if (wr[top] > 0.9 && lk > 1 && top == r)
        xp_para(&e->out, 0, 0,
                "With %.3f of its weight on key %d, out[%d] is almost exactly v%d: token %d "
                "mostly keeps its own value.",
                wr[top], top, r, top, r);
    else if (wr[top] > 0.9 && lk > 1)
        xp_para(&e->out, 0, 0,
                "With %.3f of its weight on key %d, out[%d] is almost exactly v%d: token %d "
                "has, in effect, looked up token %d and copied its value.",
                wr[top], top, r, top, r, top);
    xp_grid(&e->out, "out = weights V", e->o, e->lq, dv, XP_AUTO, "o", NULL, 0, NULL);
}

/* Compares the step-by-step result with the library's. Returns CLI_OK if they agree. */
static int step_check(explain *e) {
    static float lw[EXPLAIN_MAX_L * EXPLAIN_MAX_L], lo[EXPLAIN_MAX_L * EXPLAIN_MAX_D];
    xp_heading(&e->out, ++e->step, "The check: the library's fused kernel");
    sdpa_ctx *ctx;
    sdpa_status st = sdpa_ctx_create(NULL, &ctx);
    if (st != SDPA_OK) {
        fprintf(stderr, "sdpa explain: cannot create a context: %s\n", sdpa_status_str(st));
        return CLI_RUNTIME;
    }
    if (explain_library(e, ctx, lw, lo, NULL) != SDPA_OK) {
        fprintf(stderr, "sdpa explain: %s\n", sdpa_ctx_last_error(ctx));
        sdpa_ctx_destroy(ctx);
        return CLI_RUNTIME;
    }
    const char *isa = sdpa_isa_name(sdpa_ctx_isa(ctx));
    sdpa_ctx_destroy(ctx);

    double dw = 0.0, dout = 0.0, big = 1.0;
    for (int t = 0; t < e->lq * e->lk; t++) {
        const double d = fabs((double)lw[t] - e->w[t]);
        dw = d > dw || isnan(d) ? d : dw;
    }
    for (int t = 0; t < e->lq * e->dv; t++) {
        const double d = fabs((double)lo[t] - e->o[t]);
        dout = d > dout || isnan(d) ? d : dout;
        big = fabs(e->o[t]) > big ? fabs(e->o[t]) : big;
    }
    xp_para(
        &e->out, 0, 0,
        "The library computes the same thing without ever storing the weights: "
        "sdpa_forward runs over tiles of keys with an online softmax, in float32, with "
        "the kernels chosen for this CPU (%s). sdpa_weights returns the weights for inspection. "
        "Same inputs, compared with the step-by-step numbers above (computed in double):",
        isa);
    xp_para(&e->out, 2, 4,
            "weights: max |sdpa_weights - step by step| = %.2e\n"
            "output:  max |sdpa_forward - step by step| = %.2e",
            dw, dout);
    /* float32 keeps about 7 significant digits; a few roundings per entry stay far below
     * 1e-5 of the largest output. */
    const int ok = dw <= 1e-5 && dout <= 1e-5 * big;
    /* A score that float32 cannot hold is +-inf in the library, by its rule (sdpa.h, "Scores
     * beyond f32"), while the steps above, in double, kept it: a difference of rule, to be
     * explained, not reported as a bug. */
    double beyond = 0.0; /* the largest |q.k| beyond f32 (scaling only makes it smaller) */
    for (int t = 0; t < e->lq * e->lk; t++) {
        const double a = fabs(e->scores[t]);
        beyond = a >= 0x1.ffffffp127 && a > beyond ? a : beyond;
    }
    if (!ok && beyond > 0.0) {
        xp_para(&e->out, 0, 0,
                "They differ, and by rule: a score here reaches %.3g, beyond the largest "
                "float32 (3.4e+38). The library works in float32, where such a score is "
                "+inf or -inf (include/sdpa.h, \"Scores beyond f32\"): +inf makes its row "
                "NaN, -inf hides its key. The steps above kept it, in double. Scale the "
                "inputs down to compare the two.",
                beyond);
        return CLI_OK;
    }
    if (ok)
        xp_para(&e->out, 0, 0,
                "They agree to float32 rounding: the fused kernel computes exactly "
                "softmax(Q\x01K^T\x01/\x01sqrt(d_k))\x01V."); /* \x01: never split */
    else
        xp_para(&e->out, 0, 0,
                "They DO NOT agree: this is a bug in the library, please report it with "
                "the command line above.");
    return ok ? CLI_OK : CLI_RUNTIME;
}

/* ---- the backward (--backward) ---- */

static void step_grad_v(explain *e) {
    xp_heading(&e->out, ++e->step, "The backward: a loss, and dV");
    xp_para(&e->out, 0, 0,
            "Training needs the gradient of a loss with respect to Q, K and V. Take the "
            "simplest loss, L = the sum of every entry of out (out.sum() in PyTorch): moving "
            "any output entry by 1 moves L by 1, so dL/dout, written dO, is 1 everywhere. "
            "The chain rule then runs the steps above backwards.");
    xp_para(&e->out, 0, 0,
            "First the values. Row i of out is sum_j weights[i, j] v_j, so moving v_j by 1 "
            "moves out_i by weights[i, j]: dV_j = sum_i weights[i, j] dO_i, that is "
            "dV = weights^T dO. With dO = 1, each row of dV is the column sum of the weights "
            "for that key, repeated over its %d feature%s: how much attention key j "
            "received in total.",
            e->dv, e->dv == 1 ? "" : "s");
    xp_grid(&e->out, "dV = weights^T dO", e->dvv, e->lk, e->dv, XP_AUTO, "v", NULL, 0, NULL);
}

static void step_grad_s(explain *e, int r) {
    const int lk = e->lk;
    xp_heading(&e->out, ++e->step, "Through the softmax: dS = P o (dP - Delta)");
    xp_para(&e->out, 0, 0,
            "How does L change when a weight moves? out_i gains v_j per unit of "
            "weights[i, j], so dP[i, j] = dO_i . v_j; with dO = 1 that is the sum of v_j's "
            "features, the same for every row:");
    xp_grid(&e->out, "dP = dO V^T", e->dp, e->lq, lk, XP_AUTO, "q", "k", 0, NULL);
    xp_para(&e->out, 0, 0,
            "But the weights of a row are not free: they are a softmax, and they sum to 1. "
            "Raising one score takes weight from every other key of the row, so the "
            "softmax's derivative subtracts the row's weighted average of dP, "
            "Delta_i = sum_j P[i, j] dP[i, j], which equals dO_i . out_i:\n"
            "    dS[i, j] = P[i, j] (dP[i, j] - Delta_i)\n"
            "where P is the weights. A masked key has P = 0 and gets nothing.");
    char label[64], worked[160];
    const int j = xp_argmax(e->w + r * lk, lk);
    snprintf(label, sizeof label, "Delta_%d = ", r);
    xp_sum sum;
    xp_sum_begin(&sum, label);
    for (int t = 0; t < lk; t++)
        if (explain_visible(e, r, t))
            xp_sum_product(&sum, e->w[r * lk + t], XP_FIXED3, e->dp[r * lk + t],
                           xp_style(e->dp, e->lq * lk));
    xp_sum_end(&sum, e->delta[r], xp_style(e->delta, e->lq));
    xp_para(&e->out, 0, 0, "Row %d, the row worked out before:", r);
    xp_sum_print(&e->out, &sum);
    xp_para(&e->out, 0, 0, "and its largest weight's entry: %s.",
            xp_glue(worked, sizeof worked, "dS[%d, %d] = %s x (%s - %s%s%s) = %s", r, j,
                    xp_cell(e->w[r * lk + j], XP_FIXED3),
                    xp_cell(e->dp[r * lk + j], xp_style(e->dp, e->lq * lk)),
                    e->delta[r] < 0 ? "(" : "", xp_cell(e->delta[r], xp_style(e->delta, e->lq)),
                    e->delta[r] < 0 ? ")" : "",
                    xp_cell(e->ds[r * lk + j], xp_style(e->ds, e->lq * lk))));
    xp_grid(&e->out, "dS = P o (dP - Delta)", e->ds, e->lq, lk, XP_AUTO, "q", "k", 0, NULL);
}

static void step_grad_qk(explain *e, int r) {
    const int lk = e->lk, dk = e->dk;
    xp_heading(&e->out, ++e->step, "Back through the scores: dQ and dK");
    xp_para(&e->out, 0, 0,
            "A scaled score is q_i . k_j / sqrt(d_k), so moving q_i moves it by k_j / "
            "sqrt(d_k) and moving k_j by q_i / sqrt(d_k):\n"
            "    dQ = dS K / sqrt(d_k)        dK = dS^T Q / sqrt(d_k)\n"
            "Each query collects the keys it looked at, weighted by how the loss wants its "
            "scores to move; each key collects the queries that looked at it.");
    char label[64];
    snprintf(label, sizeof label, "(dS K)[%d, 0] = ", r);
    const double root = sqrt((double)dk);
    xp_sum sum;
    xp_sum_begin(&sum, label);
    for (int j = 0; j < lk; j++)
        if (explain_visible(e, r, j))
            xp_sum_product(&sum, e->ds[r * lk + j], xp_style(e->ds, e->lq * lk),
                           (double)e->k[j * dk], xp_style_f(e->k, lk * dk));
    xp_sum_end(&sum, e->dq[r * dk] * root, XP_FIXED4);
    char tail[128];
    xp_para(&e->out, 0, 0, "One entry, row %d's first feature:", r);
    xp_sum_print(&e->out, &sum);
    xp_para(&e->out, 2, 4, "%s",
            xp_glue(tail, sizeof tail, "dQ[%d, 0] = %.4f / %.4f = %.4f", r, e->dq[r * dk] * root,
                    root, e->dq[r * dk]));
    xp_grid(&e->out, "dQ = dS K / sqrt(d_k)", e->dq, e->lq, dk, XP_AUTO, "q", NULL, 0, NULL);
    xp_grid(&e->out, "dK = dS^T Q / sqrt(d_k)", e->dkk, lk, dk, XP_AUTO, "k", NULL, 0, NULL);
}

static int step_grad_check(explain *e, int r) {
    static float ldq[EXPLAIN_MAX_L * EXPLAIN_MAX_D], ldk[EXPLAIN_MAX_L * EXPLAIN_MAX_D],
        ldv[EXPLAIN_MAX_L * EXPLAIN_MAX_D];
    xp_heading(&e->out, ++e->step, "The check: a finite difference, and the library's backward");
    const double h = 1e-6;
    const double fd =
        (explain_loss_moved_q(e, r, 0, h) - explain_loss_moved_q(e, r, 0, -h)) / (2 * h);
    xp_para(&e->out, 0, 0,
            "Is dQ[%d, 0] right? Move q_%d[0] by h = +-1e-6, recompute the loss from scratch "
            "both times, and divide the change by 2h:",
            r, r);
    xp_para(&e->out, 2, 4,
            "(L(q + h) - L(q - h)) / 2h = %.8f\n"
            "dQ[%d, 0] from the chain rule = %.8f",
            fd, r, e->dq[r * e->dk]);
    sdpa_ctx *ctx;
    sdpa_status st = sdpa_ctx_create(NULL, &ctx);
    if (st != SDPA_OK) {
        fprintf(stderr, "sdpa explain: cannot create a context: %s\n", sdpa_status_str(st));
        return CLI_RUNTIME;
    }
    if (explain_library_backward(e, ctx, ldq, ldk, ldv) != SDPA_OK) {
        fprintf(stderr, "sdpa explain: %s\n", sdpa_ctx_last_error(ctx));
        sdpa_ctx_destroy(ctx);
        return CLI_RUNTIME;
    }
    sdpa_ctx_destroy(ctx);
    const double *mine[3] = {e->dq, e->dkk, e->dvv};
    const float *lib[3] = {ldq, ldk, ldv};
    const int n[3] = {e->lq * e->dk, e->lk * e->dk, e->lk * e->dv};
    double diff[3] = {0, 0, 0}, big = 1.0;
    for (int g = 0; g < 3; g++)
        for (int t = 0; t < n[g]; t++) {
            const double d = fabs((double)lib[g][t] - mine[g][t]);
            diff[g] = d > diff[g] || isnan(d) ? d : diff[g];
            big = fabs(mine[g][t]) > big ? fabs(mine[g][t]) : big;
        }
    xp_para(&e->out, 0, 0,
            "sdpa_backward computes the same three gradients tile by tile in float32, "
            "recomputing the weights from Q, K and the forward's log-sum-exp instead of "
            "storing them (FlashAttention-2's way). Compared with the step-by-step numbers:");
    xp_para(&e->out, 2, 4,
            "dQ: max |sdpa_backward - step by step| = %.2e\n"
            "dK: max |sdpa_backward - step by step| = %.2e\n"
            "dV: max |sdpa_backward - step by step| = %.2e",
            diff[0], diff[1], diff[2]);
    /* the finite difference's own error is about h^2 plus the loss's rounding over h */
    const int fd_ok = fabs(fd - e->dq[r * e->dk]) <= 1e-6 * (1.0 + fabs(e->dq[r * e->dk]));
    const int ok = fd_ok && diff[0] <= 1e-5 * big && diff[1] <= 1e-5 * big && diff[2] <= 1e-5 * big;
    xp_para(&e->out, 0, 0, "%s",
            ok ? "All three agree: the gradients are those of the forward above."
               : "They DO NOT agree: this is a bug, please report it with the command line "
                 "above.");
    return ok ? CLI_OK : CLI_RUNTIME;
}

/* The seeds' demonstration, through sdpa_weights: a single query [1] against three keys of
 * dimension 1 makes the scores equal to the keys times the scale we choose. */
static int why_scale(explain *e) {
    xp_heading(&e->out, 0, "Why scale? The softmax of small and of large scores");
    sdpa_ctx *ctx;
    if (sdpa_ctx_create(NULL, &ctx) != SDPA_OK) {
        fprintf(stderr, "sdpa explain: cannot create a context\n");
        return CLI_RUNTIME;
    }
    static float one[1] = {1.0f};
    static float small[3] = {2.0f, 1.0f, 0.5f}, huge[3] = {200.0f, 100.0f, 50.0f};
    float res[3][3];
    const float *keys[3] = {small, huge, huge};
    const float scales[3] = {1.0f, 1.0f, 0.01f};
    for (int c = 0; c < 3; c++) {
        sdpa_tensor tq = sdpa_tensor_bhld(one, SDPA_F32, 1, 1, 1, 1);
        sdpa_tensor tk = sdpa_tensor_bhld((void *)keys[c], SDPA_F32, 1, 1, 3, 1);
        sdpa_tensor tw = sdpa_tensor_bhld(res[c], SDPA_F32, 1, 1, 1, 3);
        sdpa_params p = {0};
        p.scale = scales[c];
        if (sdpa_weights(ctx, &tq, &tk, &p, &tw) != SDPA_OK) {
            fprintf(stderr, "sdpa explain: %s\n", sdpa_ctx_last_error(ctx));
            sdpa_ctx_destroy(ctx);
            return CLI_RUNTIME;
        }
    }
    sdpa_ctx_destroy(ctx);
    xp_para(&e->out, 0, 0,
            "Three rows of scores with the same order, through sdpa_weights (a query [1] "
            "against keys that are the scores). PyTorch's F.softmax prints the same: "
            "[0.6285, 0.2312, 0.1402] and [1.0, 3.78e-44, 0.0].");
    const char *names[3] = {"softmax([2, 1, 0.5])", "softmax([200, 100, 50])",
                            "softmax([200, 100, 50] / 100)"};
    const char *notes[3] = {"a soft mix", "one-hot", "soft again"};
    char vals[3][64];
    for (int c = 0; c < 3; c++)
        snprintf(vals[c], sizeof vals[c], "[%s, %s, %s]", xp_cell(res[c][0], XP_PROB),
                 xp_cell(res[c][1], XP_PROB), xp_cell(res[c][2], XP_PROB));
    /* Aligned in columns: names, values, notes. */
    int wn = 0, wv = 0;
    for (int c = 0; c < 3; c++) {
        wn = (int)strlen(names[c]) > wn ? (int)strlen(names[c]) : wn;
        wv = (int)strlen(vals[c]) > wv ? (int)strlen(vals[c]) : wv;
    }
    for (int c = 0; c < 3; c++)
        printf("  %-*s = %-*s  %s\n", wn, names[c], wv, vals[c], notes[c]);
    putchar('\n');
    xp_para(&e->out, 0, 0,
            "Same order, very different distributions. Large scores make the softmax "
            "all-or-nothing: the winner takes everything (exp(-100) = 3.7e-44 is at the "
            "very edge of what float32 can hold, exp(-150) underflows to 0), the model "
            "looks at one token only, and the losers get no gradient to learn from. "
            "Scaling the same scores down, here by 100, in attention by sqrt(d_k), brings "
            "back a soft mix, and gradients can flow.");
    return CLI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Entry point                                                                               */
/* ---------------------------------------------------------------------------------------- */

int cli_explain(int argc, char **argv) {
    static explain e; /* ~7 KB of matrices: static keeps the stack small */
    memset(&e, 0, sizeof e);
    int n = 4, d = 8, no_color = 0, have_n = 0, have_d = 0, have_seed = 0;
    e.seed = 42;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) {
            fputs(usage, stdout);
            return CLI_OK;
        }
        if (strcmp(a, "--causal") == 0) {
            e.causal = 1;
            continue;
        }
        if (strcmp(a, "--backward") == 0) {
            e.backward = 1;
            continue;
        }
        if (strcmp(a, "--no-color") == 0 || strcmp(a, "--no-colour") == 0) {
            no_color = 1;
            continue;
        }
        const int takes = strcmp(a, "--n") == 0 || strcmp(a, "--d") == 0 ||
                          strcmp(a, "--seed") == 0 || strcmp(a, "--q") == 0 ||
                          strcmp(a, "--k") == 0 || strcmp(a, "--v") == 0;
        if (!takes)
            return cli_usage_error("explain", "unknown option '%s'", a);
        if (i + 1 >= argc)
            return cli_usage_error("explain", "%s needs a value", a);
        const char *val = argv[++i];
        if (strcmp(a, "--n") == 0) {
            int64_t x;
            if (cli_parse_int(val, 1, EXPLAIN_MAX_L, &x) != 0)
                return cli_usage_error("explain",
                                       "--n wants a number of tokens from 1 to 16, "
                                       "not '%s'",
                                       val);
            n = (int)x;
            have_n = 1;
        } else if (strcmp(a, "--d") == 0) {
            int64_t x;
            if (cli_parse_int(val, 1, EXPLAIN_MAX_D, &x) != 0)
                return cli_usage_error("explain", "--d wants a dimension from 1 to 16, not '%s'",
                                       val);
            d = (int)x;
            have_d = 1;
        } else if (strcmp(a, "--seed") == 0) {
            if (parse_seed(val, &e.seed) != 0)
                return cli_usage_error("explain", "--seed wants a whole number >= 0, not '%s'",
                                       val);
            have_seed = 1;
        } else if (strcmp(a, "--q") == 0) {
            e.qname = val;
        } else if (strcmp(a, "--k") == 0) {
            e.kname = val;
        } else {
            e.vname = val;
        }
    }
    const int files = (e.qname != NULL) + (e.kname != NULL) + (e.vname != NULL);
    if (files > 0 && files < 3)
        return cli_usage_error("explain", "--q, --k and --v go together: %s is missing",
                               !e.qname   ? "--q"
                               : !e.kname ? "--k"
                                          : "--v");
    if (files == 3 && (have_n || have_d || have_seed))
        return cli_usage_error("explain", "--n, --d and --seed make random inputs; they do not "
                                          "mix with --q/--k/--v");

    if (files == 0) {
        explain_generate(&e, e.seed, n, d);
    } else {
        const int rc = explain_load(&e);
        if (rc != CLI_OK)
            return rc;
    }
    xp_out_init(&e.out, no_color);
    explain_compute(&e);
    if (e.backward)
        explain_backward(&e);

    xp_title(&e.out, "Scaled dot-product attention, step by step");
    xp_para(&e.out, 4, 4, "Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V");
    if (e.generated)
        xp_para(&e.out, 0, 0,
                "%d token%s, d_model = %d, seed %llu%s: the numbers PyTorch draws after "
                "torch.manual_seed(%llu), so you can follow along in a notebook. Every "
                "number below is computed here, step by step, in double precision; the "
                "last step checks them against the library.",
                e.lq, e.lq == 1 ? "" : "s", e.n_model, e.seed, e.causal ? ", causal" : "", e.seed);
    else
        xp_para(&e.out, 0, 0,
                "Your own arrays%s. Every number below is computed here, step by step, in "
                "double precision; the last step checks them against the library.",
                e.causal ? ", causal" : "");

    const int r = explain_most_spread_row(&e);
    step_inputs(&e);
    step_scores(&e);
    step_scale(&e);
    if (e.causal)
        step_mask(&e);
    step_softmax(&e, r);
    step_output(&e, r);
    int rc = step_check(&e);
    if (rc == CLI_OK && e.backward) {
        step_grad_v(&e);
        step_grad_s(&e, r);
        step_grad_qk(&e, r);
        rc = step_grad_check(&e, r);
    }
    if (rc == CLI_OK || rc == CLI_RUNTIME) {
        const int rc2 = why_scale(&e);
        rc = rc != CLI_OK ? rc : rc2;
    }
    xp_para(&e.out, 0, 0,
            "That is all of it:\n\n    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V\n\nTry "
            "--causal, --n 8 --d 16, another --seed, or your own arrays with --q/--k/--v.");
    fflush(stdout);
    return rc;
}
