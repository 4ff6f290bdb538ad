/*
 * explain.h — the walk-through behind `sdpa explain` and `sdpa demo`: one small attention
 * problem, its arithmetic written out in double precision, and the library's answer to
 * compare with. explain_input.c draws the inputs from a seed (as PyTorch would) or loads the
 * user's .npy files; explain_calc.c does the arithmetic and calls the library; explain.c
 * narrates every step (typeset by explain_print.c) and demo.c prints the short version.
 */
#ifndef SDPA_CLI_EXPLAIN_H
#define SDPA_CLI_EXPLAIN_H

#include "explain_print.h"

#include "sdpa.h"

enum { EXPLAIN_MAX_L = 16, EXPLAIN_MAX_D = 16 }; /* the largest extents shown */

/* Everything one walk-through needs. The inputs are float32, as the library takes them; every
 * intermediate is double, so the step-by-step numbers are the exact values of the maths and
 * the final comparison measures the library alone. */
typedef struct explain {
    /* where the inputs come from */
    int generated; /* 1: from the seed; 0: the user's files */
    int n_model;   /* generated: d_model */
    unsigned long long seed;
    const char *qname, *kname, *vname;
    int causal;
    /* the narration's state (explain.c) */
    xp_out out;
    int step;

    int lq, lk, dk, dv;
    float x[EXPLAIN_MAX_L * EXPLAIN_MAX_D];
    float q[EXPLAIN_MAX_L * EXPLAIN_MAX_D], k[EXPLAIN_MAX_L * EXPLAIN_MAX_D],
        v[EXPLAIN_MAX_L * EXPLAIN_MAX_D];

    double scores[EXPLAIN_MAX_L * EXPLAIN_MAX_L]; /* q_i . k_j */
    double scaled[EXPLAIN_MAX_L * EXPLAIN_MAX_L]; /* scores / sqrt(d_k); -inf where masked */
    double w[EXPLAIN_MAX_L * EXPLAIN_MAX_L];      /* softmax of each row of scaled */
    double o[EXPLAIN_MAX_L * EXPLAIN_MAX_D];      /* w V */

    /* the backward (--backward), for the loss L = sum of every entry of out: dO = 1 */
    int backward;
    double dp[EXPLAIN_MAX_L * EXPLAIN_MAX_L];  /* dP = dO V^T */
    double delta[EXPLAIN_MAX_L];               /* Delta_i = dO_i . o_i */
    double ds[EXPLAIN_MAX_L * EXPLAIN_MAX_L];  /* dS = P o (dP - Delta), 0 where masked */
    double dq[EXPLAIN_MAX_L * EXPLAIN_MAX_D];  /* dS K / sqrt(d_k) */
    double dkk[EXPLAIN_MAX_L * EXPLAIN_MAX_D]; /* dS^T Q / sqrt(d_k) */
    double dvv[EXPLAIN_MAX_L * EXPLAIN_MAX_D]; /* P^T dO */
} explain;

/* ---- the inputs (explain_input.c) ------------------------------------------------------ */

/* The notebook's inputs: X = randn(n, d_model) after torch.manual_seed(seed), then W_Q, W_K,
 * W_V = randn(d_model, d_model) from the same generator, and Q = X W_Q, K = X W_K, V = X W_V
 * (each product accumulated in double and rounded once to float32). n and d_model are 1 to
 * EXPLAIN_MAX_L and EXPLAIN_MAX_D. Sets e->generated, seed, n_model and the extents. */
void explain_generate(explain *e, unsigned long long seed, int n, int d_model);

/* Loads the user's queries, keys and values (e->qname, kname, vname): rank 2, float32 or
 * float16, at most EXPLAIN_MAX_L x EXPLAIN_MAX_D, finite, with agreeing extents.
 * @return CLI_OK and sets the inputs and extents, or CLI_RUNTIME with the problem printed on
 *         stderr. */
int explain_load(explain *e);

/* ---- the arithmetic (explain_calc.c) --------------------------------------------------- */

/* PyTorch's is_causal (top-left): with e->causal, query i sees keys 0..i. */
int explain_visible(const explain *e, int i, int j);

/* Fills scores, scaled, w and o from the inputs. */
void explain_compute(explain *e);

/* Fills dp, delta, ds, dq, dk and dvv from the forward's numbers (after explain_compute), for
 * L = sum of out. */
void explain_backward(explain *e);

/* L = sum of out, recomputed in double from scratch with q[i * d_k + f] moved by h (the
 * finite-difference check of one entry of dQ). */
double explain_loss_moved_q(const explain *e, int i, int f, double h);

/* Unbiased sample variance (torch.var's default) of n >= 2 numbers. */
double explain_sample_var(const double *x, int n);
double explain_sample_var_f(const float *x, int n);

/* The row the worked examples use: the one whose weights are most spread out (the smallest
 * largest weight), since a one-hot row teaches little about mixing. */
int explain_most_spread_row(const explain *e);

/* The library on the same inputs (with the causal mask when e->causal): sdpa_weights into
 * weights (lq x lk) and sdpa_forward into out (lq x dv) and, unless NULL, lse (lq).
 * @return SDPA_OK, or the status of the call that failed (sdpa_ctx_last_error says why). */
sdpa_status explain_library(explain *e, sdpa_ctx *ctx, float *weights, float *out, float *lse);

/* sdpa_backward on the same inputs, with out and lse from sdpa_forward and dO = 1, into dq
 * (lq x dk), dk (lk x dk), dv (lk x dv). @return SDPA_OK or the failing call's status. */
sdpa_status explain_library_backward(explain *e, sdpa_ctx *ctx, float *dq, float *dk, float *dv);

#endif /* SDPA_CLI_EXPLAIN_H */
