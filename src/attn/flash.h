/*
 * flash.h — the tiled drivers ("flash attention" on the CPU), forward and backward, run with
 * the micro-kernels of the implementation that calls them (self->uk).
 */
#ifndef SDPA_FLASH_H
#define SDPA_FLASH_H

#include "../dispatch/impl.h"

/* out: (B, Hq, Lq, Dv); lse: NULL or (B, Hq, Lq, 1) F32. May fail only with NOMEM. */
sdpa_status sdpa__flash_forward(const sdpa__impl *self, sdpa_ctx *ctx, const sdpa__problem *p,
                                sdpa_tensor *out, sdpa_tensor *lse);

/* Whether the tiled forward takes mx's entries for p (mx may be NULL): Q, K and V all mx's
 * element type, K and V with unit feature stride, Dk and Dv within mx's steps and size. */
int sdpa__flash_mx_fits(const sdpa__mx_kernels *mx, const sdpa__problem *p);

/* The attention weights (B, Hq, Lq, Lk) F32 of sdpa_weights, every element written once.
 * May fail only with NOMEM, before writing. */
sdpa_status sdpa__flash_weights(const sdpa__impl *self, sdpa_ctx *ctx, const sdpa__problem *p,
                                sdpa_tensor *weights);

/* The gradients (flash_backward.c): from dout (B, Hq, Lq, Dv) and the forward's out
 * (B, Hq, Lq, Dv) and lse (B, Hq, Lq, 1) F32, writes dq (B, Hq, Lq, Dk), dk (B, Hkv, Lk, Dk) and
 * dv (B, Hkv, Lk, Dv), every element once. May fail only with NOMEM, before writing. */
sdpa_status sdpa__flash_backward(const sdpa__impl *self, sdpa_ctx *ctx, const sdpa__problem *p,
                                 const sdpa_tensor *out, const sdpa_tensor *lse,
                                 const sdpa_tensor *dout, sdpa_tensor *dq, sdpa_tensor *dk,
                                 sdpa_tensor *dv);

/* What sdpa__flash_backward chooses for itself, set by the tests to reach every schedule:
 * dq_budget, the most bytes of dQ partials held at once (sdpa__flash_backward: 32 MiB; a small
 * one makes the one-pass schedule run its pairs in several waves, or gives two kinds of task),
 * and `adapt`, whether the schedule follows the workers (sdpa__flash_backward: yes): the
 * one-pass schedule's waves must keep them busy at least 5/7 of the time; where the budget's
 * would not, waves of the fewest pairs with a task for every worker, smaller than the
 * budget's or larger (to at most 1 GiB, or dq_budget if larger), else two kinds of task;
 * without it the budget alone chooses;
 * key_group, the key blocks a task takes together (1 to 4; 0: chosen from the problem);
 * chunks, the chunks of key blocks per (b, kv head) pair (0: chosen from the problem alone;
 * 1 to 8, or the key blocks if fewer: forced). The gradients depend on the problem and the
 * chunks only: never on dq_budget, adapt, key_group or the thread count, which choose between
 * schedules that sum in the same order. `wide`: whether the one-pass schedule's tasks keep
 * their rows of Q and dO widened (0: chosen from the problem and the workers, > 0: in the
 * one-pass schedule wherever Q or dO is widened, whatever the steps and WIDE_MAX_BYTES, < 0:
 * never); the gradients are the same bits either way. */
typedef struct sdpa__bwd_tuning {
    size_t dq_budget;
    int key_group;
    int wide;
    int chunks;
    int adapt;
} sdpa__bwd_tuning;

sdpa_status sdpa__flash_backward_tuned(const sdpa__impl *self, sdpa_ctx *ctx,
                                       const sdpa__problem *p, const sdpa_tensor *out,
                                       const sdpa_tensor *lse, const sdpa_tensor *dout,
                                       sdpa_tensor *dq, sdpa_tensor *dk, sdpa_tensor *dv,
                                       const sdpa__bwd_tuning *tuning);

#endif /* SDPA_FLASH_H */
