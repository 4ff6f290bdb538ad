/*
 * fuzz_api_draw.h — what the API fuzz target's two files of draws share: the input, read from
 * both ends, with its readers, and the draws fuzz_api_draw.c gives fuzz_api_draw_leftover.c
 * (a layout, a float tensor's values) and the other way round (the backward's and the KV
 * call's draws, which fz_draw_case makes last). Only those two files include it; the rest of
 * the target sees a drawn case through fuzz_api.h.
 */
#ifndef SDPA_FUZZ_API_DRAW_H
#define SDPA_FUZZ_API_DRAW_H

#include "fuzz_api.h"

#include <stdint.h>

/* The input, read from both ends (as zstd's fuzz_data_producer does): parameters from the
 * tail, data from the head. */
typedef struct fz_src {
    const uint8_t *head; /* next data byte */
    const uint8_t *tail; /* one past the next parameter byte */
} fz_src;

/* ---- the input, read from both ends ------------------------------------------------------ */

/* A parameter byte; 0 once the input is used up (so a short input means small defaults). */
static inline unsigned take(fz_src *s) {
    return s->tail > s->head ? *--s->tail : 0u;
}

static inline unsigned take16(fz_src *s) {
    const unsigned lo = take(s);
    return lo | take(s) << 8;
}

/* A data byte, or -1 once the parameters and the data have met. */
static inline int data_byte(fz_src *s) {
    return s->head < s->tail ? *s->head++ : -1;
}

/* ---- fuzz_api_draw.c ---- */

/* A tensor's layout: its order, padded rows, and rarely negative, zero or overflowing strides,
 * misaligned data or overlapping rows. */
fz_layout fz_draw_layout(fz_src *s);
/* Fills every element of a float input from the head of the input, then from r, in multiples
 * of mag (the gaps were set to NaN bytes before). */
void fz_fill_float(fz_tensor *f, fz_src *s, tu_rng *r, double mag);

/* ---- fuzz_api_draw_leftover.c ---- */

/* The backward's arguments: dout and its values, dq, dk, dv, sometimes dropout, a NaN or Inf
 * in dout, or an argument made invalid on purpose. */
void fz_draw_backward(fz_case *c, fz_src *s, tu_rng *rng);
/* How sdpa_forward_kv is called on the case (c->kv), or not at all. */
void fz_draw_kv(fz_case *c, fz_src *s);

#endif
