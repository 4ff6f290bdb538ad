/*
 * layout.c — the positions of the layouts and the placement of a pair of runs (layout.h).
 *
 * The placement: queries at qa + i S and keys at ka + j S (one step S for both, as every
 * layout deals queries and keys alike). Query i may see key j iff
 *     qa + i S + off - left <= ka + j S <= qa + i S + off + right.
 * With d = qa + off - ka that is  d - left <= S (j - i) <= d + right,  so in the runs' indices
 *     i + ceil((d - left) / S) <= j <= i + floor((d + right) / S),
 * a window rule again (with its own offset and widths), and ALiBi's global distance
 * |ka + j S - (qa + i S) - off| is |S (j - i) - d|.
 */
#include "layout.h"

/* floor(a / b) and ceil(a / b) for b > 0, whatever the sign of a. */
static int64_t floor_div(int64_t a, int64_t b) {
    const int64_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

static int64_t ceil_div(int64_t a, int64_t b) {
    const int64_t q = a / b;
    return (a % b != 0 && a > 0) ? q + 1 : q;
}

sdpa__window sdpa__mpi_window(const sdpa_params *params, int64_t lq, int64_t lk) {
    sdpa_params none = {0};
    const sdpa_params *pr = params != NULL ? params : &none;
    sdpa__window w;
    w.off = pr->align == SDPA_ALIGN_BOTTOM_RIGHT ? lk - lq : 0;
    w.left = pr->use_window ? pr->window_left : -1;
    w.right = pr->use_window ? pr->window_right : -1;
    if (w.left > lq + lk)
        w.left = -1;
    if (w.right > lq + lk)
        w.right = -1;
    if (pr->causal)
        w.right = 0;
    return w;
}

/* The first position of zig-zag chunk c of 2p. */
static int64_t chunk_start(int64_t c, int p, int64_t len) {
    return c * len / (2 * (int64_t)p);
}

int64_t sdpa__mpi_expected(sdpa_mpi_layout layout, int p, int r, int64_t len) {
    switch (layout) {
    case SDPA_MPI_STRIPED:
        return len > r ? (len - r + p - 1) / p : 0;
    case SDPA_MPI_ZIGZAG: {
        const int64_t a = r, z = 2 * (int64_t)p - 1 - r;
        return chunk_start(a + 1, p, len) - chunk_start(a, p, len) + chunk_start(z + 1, p, len) -
               chunk_start(z, p, len);
    }
    default:
        return -1;
    }
}

int sdpa__mpi_runs(sdpa_mpi_layout layout, int p, int r, const int64_t *lens, sdpa__run runs[2]) {
    int64_t len = 0;
    for (int s = 0; s < p; s++)
        len += lens[s];
    int count = 0;
    if (layout == SDPA_MPI_STRIPED) {
        runs[count++] = (sdpa__run){r, p, lens[r], 0};
    } else if (layout == SDPA_MPI_ZIGZAG) {
        const int64_t chunks[2] = {r, 2 * (int64_t)p - 1 - r};
        int64_t at = 0;
        for (int c = 0; c < 2; c++) {
            const int64_t a = chunk_start(chunks[c], p, len);
            const int64_t n = chunk_start(chunks[c] + 1, p, len) - a;
            if (n > 0)
                runs[count++] = (sdpa__run){a, 1, n, at};
            at += n;
        }
    } else {
        int64_t start = 0;
        for (int s = 0; s < r; s++)
            start += lens[s];
        runs[count++] = (sdpa__run){start, 1, lens[r], 0};
    }
    if (count > 0 && runs[0].n == 0)
        count = 0;
    return count;
}

sdpa__run sdpa__mpi_subrun(const sdpa__run *run, int64_t r0, int64_t r1) {
    return (sdpa__run){run->start + r0 * run->step, run->step, r1 - r0, run->at + r0};
}

int sdpa__mpi_place(const sdpa__run *qr, const sdpa__run *kr, const sdpa__window *w,
                    sdpa__placement *place) {
    const int64_t step = qr->step, d = qr->start + w->off - kr->start;
    /* the keys of query i are [i + a, i + b] in the runs' indices; an open side is one beyond
     * every key of the pair */
    const int64_t open = qr->n + kr->n;
    const int64_t a = w->left >= 0 ? ceil_div(d - w->left, step) : -open;
    const int64_t b = w->right >= 0 ? floor_div(d + w->right, step) : open;
    if (b < a || a > kr->n - 1 || qr->n - 1 + b < 0)
        return 0;
    if (w->left >= 0) {
        place->off = a;
        place->window_left = 0;
        place->window_right = w->right >= 0 ? b - a : -1;
    } else {
        place->off = w->right >= 0 ? b : 0;
        place->window_left = -1;
        place->window_right = w->right >= 0 ? 0 : -1;
    }
    place->alibi_step = step;
    place->alibi_shift = d - place->off;
    return 1;
}
