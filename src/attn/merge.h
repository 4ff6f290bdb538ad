/*
 * merge.h — combining partial attention results computed over disjoint sets of keys into the
 * result over their union (sdpa_merge; split-KV decode merges its chunks with the same row
 * function). A part is a pair (O_p, LSE_p): its normalised output and the log of its softmax
 * denominator. With M = max_p LSE_p and w_p = exp(LSE_p - M), the union's result is
 *     O = sum_p w_p O_p / sum_p w_p,   LSE = M + log sum_p w_p.
 */
#ifndef SDPA_MERGE_H
#define SDPA_MERGE_H

#include "sdpa.h"

#include <stdint.h>

/*
 * Merges one row: n partial rows of d f32 values, part p at o + p * ldo with log-sum-exp
 * lse[p] (in double, so that a caller that has them unrounded, as split-KV decode does, keeps
 * them so), into dst (d doubles, to be rounded once to the output's dtype by the caller).
 * Sums are taken in double, parts in index order. A part whose lse is -inf (no key, or all
 * masked) contributes nothing and its row is never read; if every part is -inf, dst = 0 and
 * the result is -inf. A NaN or +inf lse makes the whole row NaN (its rows are not read). A
 * NaN in a row whose lse is finite makes that column NaN.
 * @return the merged log-sum-exp, in double.
 */
double sdpa__merge_row(int64_t n, int64_t d, const float *o, int64_t ldo, const double *lse,
                       double *dst);

/* sdpa_merge on validated arguments (sdpa__check_merge): outs[p] (B, H, L, D) and lses[p]
 * (B, H, L, 1) F32 for p < n_parts; out (B, H, L, D) and lse (NULL or (B, H, L, 1) F32) are
 * written. Rows are shared among the context's threads in a split that depends only on the
 * shapes. May fail only with NOMEM, before writing. */
sdpa_status sdpa__merge(sdpa_ctx *ctx, int64_t n_parts, const sdpa_tensor *outs,
                        const sdpa_tensor *lses, sdpa_tensor *out, sdpa_tensor *lse);

#endif /* SDPA_MERGE_H */
