/*
 * torch_rng.h — PyTorch's CPU random normal numbers, reproduced, so that `sdpa demo` and
 * `sdpa explain` show the very numbers of the seeds' walk-through (torch.manual_seed(42);
 * torch.randn(4, 8) ...). The generator is MT19937 (Matsumoto & Nishimura, 1998) seeded as
 * std::mt19937 is; floats come from the low 24 bits of each 32-bit draw; normals from the
 * Box-Muller transform, applied the way PyTorch's CPU kernel applies it (blocks of 16 for
 * tensors of 16 or more elements, one pair at a time in double below that). Written from the
 * algorithms' descriptions; values agree with PyTorch 2.x to float rounding.
 */
#ifndef SDPA_TORCH_RNG_H
#define SDPA_TORCH_RNG_H

#include <stdint.h>

typedef struct torch_rng {
    uint32_t mt[624];
    int index;
    int has_cached; /* a second Box-Muller value kept for the next small tensor */
    double cached;
} torch_rng;

void torch_rng_seed(torch_rng *r, uint64_t seed);
uint32_t torch_rng_u32(torch_rng *r);
/* Fills out[0..n) like torch.randn(n) after the same seed and the same earlier draws. */
void torch_rng_randn(torch_rng *r, float *out, int64_t n);

#endif
