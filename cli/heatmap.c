/*
 * heatmap.c — see heatmap.h. The work is done in four steps: lay out the picture (grid of
 * panels, block factors, cell size) so that it fits in HEATMAP_MAX_SIDE pixels; reduce each
 * shown head to its drawn cells (block means); find the colour scale; draw into an RGB
 * buffer, which heatmap_png_write hands to libpng's simplified API.
 *
 * All text uses font.h at scale 2 (10 x 14 pixel capitals), large enough to read on a
 * laptop screen without zooming, and the same size in every picture so that pictures of
 * different shapes look alike.
 */
#include "heatmap.h"

#include "colormap.h"
#include "font.h"
#include "outputs.h"

#include <png.h>

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Magenta: a colour viridis never reaches, bright where viridis is dark and saturated where
 * it is pale, so a NaN stands out at any weight around it, also to colour-blind readers. */
const uint8_t heatmap_nan_rgb[3] = {255, 0, 255};

static const uint8_t white_rgb[3] = {255, 255, 255};
static const uint8_t black_rgb[3] = {0, 0, 0};
static const uint8_t ink_rgb[3] = {30, 30, 30};      /* title, tick labels */
static const uint8_t note_rgb[3] = {85, 85, 85};     /* secondary title lines */
static const uint8_t frame_rgb[3] = {110, 110, 110}; /* plot frames and ticks */

enum {
    S = 2,                      /* text scale */
    TEXT_H = FONT_ASCENT * S,   /* height of capitals and digits */
    LINE_H = 26,                /* one line of text, with its spacing */
    MARGIN = 24,                /* around the picture */
    TICK = 5,                   /* length of a tick mark */
    GAP = 5,                    /* between a tick mark and its label */
    PANEL_GAP = 28,             /* between the panels of a grid */
    YLABEL_W = FONT_H * S + 12, /* the rotated "query position i" and its gap */
    XLABEL_H = 10 + FONT_H * S, /* "key position j" under the grid */
    BAR_GAP = 36,               /* from the grid to the colour bar */
    BAR_W = 24,                 /* width of the colour bar */
    BAR_LABEL_CHARS = 10,       /* the widest colour bar label the layout plans for */
    MAX_CELL = 80,              /* pixels per cell at most: a 4 x 4 matrix is 320 pixels */
    TARGET_PLOT = 720,          /* preferred size of one panel, split between grid columns */
    MIN_TARGET = 160,           /* ... but no smaller than this per panel */
    MIN_PLOT = 96,              /* a strip (Lq = 1 or Lk = 1) is stretched to this */
    TITLE_LINES_MAX = 5,        /* title, subtitle, shape, averaging note, values below 0 */
    TITLE_WIDE = 1400,          /* a picture is widened for its title up to this */
};

static int min_int(int a, int b) {
    return a < b ? a : b;
}

static int max_int(int a, int b) {
    return a > b ? a : b;
}

typedef struct canvas {
    int w, h;
    uint8_t *px; /* w * h RGB triples, row by row */
} canvas;

/* ------------------------------------------------------------------------------------------ */
/* Drawing                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* Fills the rectangle [x, x + w) x [y, y + h), clipped to the canvas. */
static void fill_rect(canvas *c, int x, int y, int w, int h, const uint8_t rgb[3]) {
    const int x0 = x < 0 ? 0 : x, y0 = y < 0 ? 0 : y;
    const int x1 = x + w > c->w ? c->w : x + w, y1 = y + h > c->h ? c->h : y + h;
    for (int yy = y0; yy < y1; yy++) {
        uint8_t *p = c->px + ((size_t)yy * (size_t)c->w + (size_t)x0) * 3;
        for (int xx = x0; xx < x1; xx++, p += 3)
            p[0] = rgb[0], p[1] = rgb[1], p[2] = rgb[2];
    }
}

/* A one-pixel outline just outside [x, x + w) x [y, y + h). */
static void frame_rect(canvas *c, int x, int y, int w, int h, const uint8_t rgb[3]) {
    fill_rect(c, x - 1, y - 1, w + 2, 1, rgb);
    fill_rect(c, x - 1, y + h, w + 2, 1, rgb);
    fill_rect(c, x - 1, y, 1, h, rgb);
    fill_rect(c, x + w, y, 1, h, rgb);
}

static int text_width(const char *s, int scale) {
    const size_t n = strlen(s);
    return n == 0 ? 0 : (int)(n * FONT_ADVANCE - 1) * scale;
}

/* Draws s with the top-left corner of its first glyph at (x, y). */
static void draw_text(canvas *c, int x, int y, const char *s, int scale, const uint8_t rgb[3]) {
    for (; *s != '\0'; s++, x += FONT_ADVANCE * scale)
        for (int r = 0; r < FONT_H; r++) {
            const unsigned bits = font_glyph_row((unsigned char)*s, r);
            for (int col = 0; col < FONT_W; col++)
                if (bits & (1u << (FONT_W - 1 - col)))
                    fill_rect(c, x + col * scale, y + r * scale, scale, scale, rgb);
        }
}

/* Draws s turned a quarter anticlockwise, reading upwards, inside the box whose top-left
 * corner is (x, y) (FONT_H * scale wide, text_width tall): the label of a vertical axis. */
static void draw_text_up(canvas *c, int x, int y, const char *s, int scale, const uint8_t rgb[3]) {
    const int len = text_width(s, scale);
    for (int u = 0; *s != '\0'; s++, u += FONT_ADVANCE * scale)
        for (int r = 0; r < FONT_H; r++) {
            const unsigned bits = font_glyph_row((unsigned char)*s, r);
            for (int col = 0; col < FONT_W; col++)
                if (bits & (1u << (FONT_W - 1 - col)))
                    fill_rect(c, x + r * scale, y + len - u - (col + 1) * scale, scale, scale, rgb);
        }
}

/* Copies src into dst as text the font can draw: each UTF-8 sequence or control character
 * becomes one '?', and the text is cut with "..." to at most max_w pixels at scale S. */
static void printable_text(char *dst, size_t n, const char *src, int max_w) {
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)src; *p != '\0' && k + 1 < n; p++) {
        if (*p >= 0x80 && *p < 0xC0)
            continue; /* a continuation byte: its lead byte already gave '?' */
        dst[k++] = (*p < ' ' || *p > '~') ? '?' : (char)*p;
    }
    dst[k] = '\0';
    if (text_width(dst, S) <= max_w)
        return;
    const int keep = (max_w / S + 1) / FONT_ADVANCE - 3;
    if (keep <= 0) {
        dst[0] = '\0';
        return;
    }
    strcpy(dst + keep, "...");
}

/* ------------------------------------------------------------------------------------------ */
/* Scales and labels                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* The smallest of 1, 2 and 5 times a power of ten that is at least x: the spacing of tick
 * labels on an axis of positions. */
static int64_t nice_position_step(double x) {
    for (int64_t p = 1; p < INT64_MAX / 10; p *= 10) {
        if ((double)p >= x)
            return p;
        if (2.0 * (double)p >= x)
            return 2 * p;
        if (5.0 * (double)p >= x)
            return 5 * p;
    }
    return INT64_MAX / 10;
}

/* The step of the colour bar's ticks: the smallest of 1, 2, 2.5 and 5 times a power of ten
 * that puts at most 5 ticks on [lo, hi]. Since consecutive candidates differ by at most a
 * factor 2, the chosen step also gives at least 3. */
static double colour_bar_step(double lo, double hi) {
    const double range = hi - lo;
    static const double mant[4] = {1.0, 2.0, 2.5, 5.0};
    for (int e = (int)floor(log10(range)) - 2;; e++)
        for (int m = 0; m < 4; m++) {
            const double step = mant[m] * pow(10.0, e);
            if (floor(hi / step) - ceil(lo / step) + 1.0 <= 5.0)
                return step;
        }
}

/* Digits after the decimal point that multiples of step need (0.25 -> 2, 0.1 -> 1). */
static int step_decimals(double step) {
    for (int d = 0; d < 9; d++) {
        const double m = step * pow(10.0, d);
        if (fabs(m - nearbyint(m)) < 1e-6 * m)
            return d;
    }
    return 9;
}

/* A colour bar label: decimals as the step needs them on a scale of ordinary numbers,
 * %g for the whole bar when its numbers are very small or very large. */
static void format_scale_value(char *buf, size_t n, double v, double step, double hi) {
    const int decimals = step_decimals(step);
    if (decimals <= 4 && hi < 1e6)
        snprintf(buf, n, "%.*f", decimals, v == 0.0 ? 0.0 : v); /* never "-0.00" */
    else
        snprintf(buf, n, "%.3g", v == 0.0 ? 0.0 : v);
}

/* The number written in a large cell: two decimals for weights (and anything of their order
 * of magnitude), two significant digits for a picture of much smaller or larger numbers. */
static void format_cell_value(char *buf, size_t n, float v, const heatmap_geometry *g) {
    const int fixed = g->hi - g->lo >= 0.05 && g->hi < 100.0 && g->lo > -100.0;
    if (isnan(v))
        snprintf(buf, n, "NaN");
    else if (isinf(v))
        snprintf(buf, n, v > 0 ? "Inf" : "-Inf");
    else
        snprintf(buf, n, fixed ? "%.2f" : "%.2g", (double)v);
}

/* The scale (1 or 2) at which every cell's value fits in its cell, or 0 for none: numbers
 * are written only where all of them can be, never in some cells and not in others. */
static int value_scale(const float *cells, size_t n, int cw, int ch, const heatmap_geometry *g) {
    if (cw < 16 || ch < 14)
        return 0; /* (and the loop below stays short: large cells are few) */
    int widest = 0;
    char buf[64];
    for (size_t i = 0; i < n; i++) {
        format_cell_value(buf, sizeof buf, cells[i], g);
        widest = max_int(widest, text_width(buf, 1));
    }
    /* Scale 2 from about 60-pixel cells and scale 1 from about 30, with room around the
     * digits; smaller cells are read by their colour. */
    if (2 * widest + 14 <= cw && ch >= 28)
        return 2;
    if (widest + 8 <= cw && ch >= 14)
        return 1;
    return 0;
}

/* Text on a cell: black on the pale end of the map, white on the dark end. */
static const uint8_t *text_colour_on(const uint8_t bg[3]) {
    const double luma = 0.2126 * bg[0] + 0.7152 * bg[1] + 0.0722 * bg[2];
    return luma > 140.0 ? black_rgb : white_rgb;
}

/* ------------------------------------------------------------------------------------------ */
/* Layout                                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef struct layout {
    int ncols, nrows;       /* panels */
    int64_t fq, fk, dq, dk; /* block factors and drawn cells per axis */
    int cw, ch;             /* pixels per cell */
    int plot_w, plot_h;     /* dk * cw, dq * ch */
    int left_gutter;        /* row tick labels and ticks, left of each plot */
    int bottom_gutter;      /* column ticks and labels, under each plot */
    int panel_w, panel_h;   /* a plot with its gutters and its label */
    int grid_x, grid_y;     /* top-left of the first panel */
    int grid_w, grid_h;
    int bar_area_w; /* from the grid's right edge to the right margin */
} layout;

static int64_t ceil_div(int64_t a, int64_t b) {
    return a / b + (a % b != 0);
}

/* Plans the grid of npanels panels of Lq x Lk weights, leaving room for TITLE_LINES_MAX lines
 * of title (the caller sets grid_y once it knows how many there are). Every size is bounded
 * so that the picture fits in HEATMAP_MAX_SIDE: the block factors grow beyond
 * ceil(L / max_cells) when many panels share the width. */
static int plan_layout(layout *ly, int npanels, int64_t Lq, int64_t Lk, int max_cells, char *err,
                       size_t errlen) {
    memset(ly, 0, sizeof *ly);
    ly->ncols = (int)ceil(sqrt((double)npanels));
    ly->nrows = (npanels + ly->ncols - 1) / ly->ncols;
    char digits[32];
    snprintf(digits, sizeof digits, "%lld", (long long)(Lq - 1));
    ly->left_gutter = text_width(digits, S) + GAP + TICK;
    ly->bottom_gutter = TICK + GAP + TEXT_H;
    ly->panel_w = ly->left_gutter; /* plot sizes are added below */
    ly->panel_h = LINE_H + ly->bottom_gutter;
    ly->grid_x = MARGIN + YLABEL_W;
    ly->bar_area_w = BAR_GAP + BAR_W + TICK + GAP + (BAR_LABEL_CHARS * FONT_ADVANCE - 1) * S;

    /* What is left for the plots themselves, per panel. */
    const int fixed_w = ly->grid_x + ly->ncols * ly->panel_w + (ly->ncols - 1) * PANEL_GAP +
                        ly->bar_area_w + MARGIN;
    const int fixed_h = MARGIN + TITLE_LINES_MAX * LINE_H + 10 + ly->nrows * ly->panel_h +
                        (ly->nrows - 1) * PANEL_GAP + XLABEL_H + MARGIN;
    const int avail_w = (HEATMAP_MAX_SIDE - fixed_w) / ly->ncols;
    const int avail_h = (HEATMAP_MAX_SIDE - fixed_h) / ly->nrows;
    if (avail_w < 16 || avail_h < 16) {
        snprintf(err, errlen, "%d panels leave no room for the weights", npanels);
        return -1;
    }

    /* Block factors: at most max_cells cells per axis, fewer if the panels must be smaller.
     * One bound for both axes, so that a square matrix keeps square blocks and its diagonal
     * (where causal attention concentrates) stays at 45 degrees. */
    const int cap = min_int(max_cells, min_int(avail_w, avail_h));
    ly->fq = ceil_div(Lq, cap);
    ly->fk = ceil_div(Lk, cap);
    ly->dq = ceil_div(Lq, ly->fq);
    ly->dk = ceil_div(Lk, ly->fk);

    /* Square cells as large as the preferred panel size allows, then a strip (one row or a
     * few) stretched so that it is not a hairline. */
    const int target = max_int(TARGET_PLOT / ly->ncols, MIN_TARGET);
    const int tw = min_int(target, avail_w), th = min_int(target, avail_h);
    int c = (int)(tw / ly->dk < th / ly->dq ? tw / ly->dk : th / ly->dq);
    c = c < 1 ? 1 : c > MAX_CELL ? MAX_CELL : c;
    ly->cw = ly->ch = c;
    if (ly->dq * ly->ch < MIN_PLOT)
        ly->ch = (int)(min_int(MIN_PLOT, avail_h) / ly->dq);
    if (ly->dk * ly->cw < MIN_PLOT)
        ly->cw = (int)(min_int(MIN_PLOT, avail_w) / ly->dk);
    ly->ch = max_int(ly->ch, c);
    ly->cw = max_int(ly->cw, c);
    ly->plot_w = (int)ly->dk * ly->cw;
    ly->plot_h = (int)ly->dq * ly->ch;
    ly->panel_w += ly->plot_w;
    ly->panel_h += ly->plot_h;
    ly->grid_w = ly->ncols * ly->panel_w + (ly->ncols - 1) * PANEL_GAP;
    ly->grid_h = ly->nrows * ly->panel_h + (ly->nrows - 1) * PANEL_GAP;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Data                                                                                        */
/* ------------------------------------------------------------------------------------------ */

/* out (dq, dk) = the means of the fq x fk blocks of m (Lq, Lk); the last block of a row or
 * column may be smaller and is averaged over what it holds. A non-finite value makes its
 * block's mean non-finite, so that a NaN is never averaged out of sight. acc: dk doubles. */
static void reduce_blocks(float *out, const float *m, int64_t Lq, int64_t Lk, int64_t fq,
                          int64_t fk, int64_t dq, int64_t dk, double *acc) {
    for (int64_t r = 0; r < dq; r++) {
        const int64_t i0 = r * fq, i1 = i0 + fq < Lq ? i0 + fq : Lq;
        for (int64_t c = 0; c < dk; c++)
            acc[c] = 0.0;
        for (int64_t i = i0; i < i1; i++) {
            const float *m_i = m + i * Lk;
            for (int64_t j = 0; j < Lk; j++)
                acc[j / fk] += (double)m_i[j];
        }
        for (int64_t c = 0; c < dk; c++) {
            const int64_t j0 = c * fk, j1 = j0 + fk < Lk ? j0 + fk : Lk;
            out[r * dk + c] = (float)(acc[c] / (double)((i1 - i0) * (j1 - j0)));
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* The picture                                                                                 */
/* ------------------------------------------------------------------------------------------ */

heatmap_opts heatmap_opts_default(void) {
    heatmap_opts o = {0, 0, NULL, NULL, HEATMAP_DEFAULT_CELLS};
    return o;
}

static int check_args(const float *w, int64_t B, int64_t H, int64_t Lq, int64_t Lk,
                      const heatmap_opts *o, char *err, size_t errlen) {
    if (w == NULL) {
        snprintf(err, errlen, "no weights given");
        return -1;
    }
    if (B < 1 || H < 1 || Lq < 1 || Lk < 1) {
        snprintf(err, errlen,
                 "weights of shape (%lld, %lld, %lld, %lld): every extent must be >= 1",
                 (long long)B, (long long)H, (long long)Lq, (long long)Lk);
        return -1;
    }
    /* The caller holds B * H * Lq * Lk floats, so the product fits; check anyway before any
     * offset is computed from it. */
    const int64_t lim =
        (int64_t)(SIZE_MAX / sizeof(float) < INT64_MAX ? SIZE_MAX / sizeof(float) : INT64_MAX);
    if (Lq > lim / Lk || H > lim / (Lq * Lk) || B > lim / (H * Lq * Lk)) {
        snprintf(err, errlen, "weights of shape (%lld, %lld, %lld, %lld) overflow", (long long)B,
                 (long long)H, (long long)Lq, (long long)Lk);
        return -1;
    }
    if (o->batch < 0 || o->batch >= B) {
        snprintf(err, errlen, "batch %lld is out of range: the weights have B = %lld",
                 (long long)o->batch, (long long)B);
        return -1;
    }
    if (o->head < -1 || o->head >= H) {
        snprintf(err, errlen, "head %lld is out of range: the weights have H = %lld",
                 (long long)o->head, (long long)H);
        return -1;
    }
    if (o->head == -1 && H > HEATMAP_MAX_PANELS) {
        snprintf(err, errlen, "%lld heads are too many for one grid (at most %d): choose one head",
                 (long long)H, HEATMAP_MAX_PANELS);
        return -1;
    }
    return 0;
}

/* The colour scale over every drawn cell: lo = min(0, least finite), hi = largest finite. */
static void colour_scale(const float *cells, size_t n, heatmap_geometry *g) {
    double lo = 0.0, hi = -INFINITY;
    g->nonfinite = g->infinite = 0;
    for (size_t i = 0; i < n; i++) {
        const double v = cells[i];
        if (!isfinite(v)) {
            g->nonfinite++;
            g->infinite += isinf(v) != 0;
            continue;
        }
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    if (!(hi > lo))
        hi = lo + 1.0; /* all zero (every row masked) or nothing finite */
    g->lo = lo;
    g->hi = hi;
}

/* Counts the values below 0 of one head's weights m (n values) into g, before averaging:
 * attention weights are never negative, and a block's mean can hide those that are. */
static void count_negative(const float *m, size_t n, heatmap_geometry *g) {
    for (size_t i = 0; i < n; i++)
        if (m[i] < 0.0f) {
            g->negative++;
            g->least = m[i] < g->least ? m[i] : g->least;
        }
}

static const uint8_t *cell_colour(double v, const heatmap_geometry *g, const colormap_lut *lut) {
    if (!isfinite(v))
        return heatmap_nan_rgb;
    long idx = lrint((v - g->lo) / (g->hi - g->lo) * (COLORMAP_LEVELS - 1));
    idx = idx < 0 ? 0 : idx > COLORMAP_LEVELS - 1 ? COLORMAP_LEVELS - 1 : idx;
    return lut->rgb[idx];
}

/* One panel: cells, their values when the cells are large, frame, ticks and tick labels. */
static void draw_panel(canvas *cv, const layout *ly, const heatmap_geometry *g, int p,
                       const float *cells, int64_t Lq, int64_t Lk, int vscale,
                       const colormap_lut *lut) {
    const int x0 = g->plot_x[p], y0 = g->plot_y[p];
    char buf[64];
    snprintf(buf, sizeof buf, "head %lld", (long long)g->heads[p]);
    draw_text(cv, x0 + (ly->plot_w - text_width(buf, S)) / 2, y0 - LINE_H + 2, buf, S, ink_rgb);
    /* Cells large enough carry their value (vscale > 0): a learner reads the numbers. */
    for (int64_t r = 0; r < ly->dq; r++)
        for (int64_t c = 0; c < ly->dk; c++) {
            const float v = cells[r * ly->dk + c];
            const uint8_t *rgb = cell_colour(v, g, lut);
            const int cx = x0 + (int)c * ly->cw, cy = y0 + (int)r * ly->ch;
            fill_rect(cv, cx, cy, ly->cw, ly->ch, rgb);
            if (vscale == 0)
                continue;
            format_cell_value(buf, sizeof buf, v, g);
            const int tw = text_width(buf, vscale);
            draw_text(cv, cx + (ly->cw - tw) / 2 + 1, cy + (ly->ch - FONT_ASCENT * vscale) / 2, buf,
                      vscale, text_colour_on(rgb));
        }
    frame_rect(cv, x0, y0, ly->plot_w, ly->plot_h, frame_rgb);

    /* Ticks at multiples of a 1-2-5 step of positions, far enough apart for their labels;
     * a position p lies at (p + 0.5) / f cells from the edge, averaged or not. */
    const double px_q = (double)ly->ch / (double)ly->fq, px_k = (double)ly->cw / (double)ly->fk;
    const int64_t step_q = nice_position_step((TEXT_H + 22) / px_q);
    for (int64_t i = 0; i < Lq; i += step_q) {
        const int y = y0 + (int)((double)i * px_q + 0.5 * px_q);
        fill_rect(cv, x0 - 1 - TICK, y, TICK, 1, frame_rgb);
        snprintf(buf, sizeof buf, "%lld", (long long)i);
        draw_text(cv, x0 - 1 - TICK - GAP - text_width(buf, S), y - TEXT_H / 2, buf, S, ink_rgb);
    }
    snprintf(buf, sizeof buf, "%lld", (long long)(Lk - 1));
    const int64_t step_k = nice_position_step((text_width(buf, S) + 14) / px_k);
    for (int64_t j = 0; j < Lk; j += step_k) {
        const int x = x0 + (int)((double)j * px_k + 0.5 * px_k);
        fill_rect(cv, x, y0 + ly->plot_h + 1, 1, TICK, frame_rgb);
        snprintf(buf, sizeof buf, "%lld", (long long)j);
        draw_text(cv, x - text_width(buf, S) / 2, y0 + ly->plot_h + 1 + TICK + GAP, buf, S,
                  ink_rgb);
    }
}

/* The colour bar, its ticks (lo, hi and 3 to 5 round values) and the NaN legend. */
static void draw_colour_bar(canvas *cv, const heatmap_geometry *g, int averaged,
                            const colormap_lut *lut) {
    const int bx = g->bar_x, by = g->bar_y, bw = g->bar_w, bh = g->bar_h;
    draw_text(cv, bx, by - LINE_H - 4, averaged ? "mean weight" : "weight", S, ink_rgb);
    for (int y = 0; y < bh; y++) {
        const double t = bh > 1 ? 1.0 - (double)y / (bh - 1) : 1.0;
        fill_rect(cv, bx, by + y, bw, 1, lut->rgb[lrint(t * (COLORMAP_LEVELS - 1))]);
    }
    frame_rect(cv, bx, by, bw, bh, frame_rgb);

    const double lo = g->lo, hi = g->hi, step = colour_bar_step(lo, hi);
    const int lx = bx + bw + 1 + TICK + GAP;
    char buf[64];
    /* The top is labelled with hi itself, the largest weight shown; round ticks closer than
     * a label's height to it are left out so that labels never overlap. */
    if (fabs(hi / step - nearbyint(hi / step)) < 1e-9)
        format_scale_value(buf, sizeof buf, hi, step, hi);
    else
        snprintf(buf, sizeof buf, "%.3g", hi);
    fill_rect(cv, bx + bw + 1, by, TICK, 1, frame_rgb);
    draw_text(cv, lx, by - TEXT_H / 2, buf, S, ink_rgb);
    for (double n = ceil(lo / step - 1e-9); n * step <= hi - 1e-9 * step; n += 1.0) {
        const double v = fabs(n) < 0.5 ? 0.0 : n * step;
        const int y = by + (int)lrint((hi - v) / (hi - lo) * (bh - 1));
        if (y - by < TEXT_H + 8)
            continue;
        format_scale_value(buf, sizeof buf, v, step, hi);
        fill_rect(cv, bx + bw + 1, y, TICK, 1, frame_rgb);
        draw_text(cv, lx, y - TEXT_H / 2, buf, S, ink_rgb);
    }
    if (g->nonfinite > 0) {
        const int y = by + bh + TEXT_H + 10;
        fill_rect(cv, bx, y, bw, TEXT_H + 2, heatmap_nan_rgb);
        frame_rect(cv, bx, y, bw, TEXT_H + 2, frame_rgb);
        draw_text(cv, lx, y + 1, g->infinite > 0 ? "NaN/Inf" : "NaN", S, ink_rgb);
        snprintf(buf, sizeof buf, "%lld cell%s", (long long)g->nonfinite,
                 g->nonfinite == 1 ? "" : "s");
        draw_text(cv, lx, y + LINE_H, buf, S, note_rgb);
    }
}

/* The title: the caller's line (or "attention weights"), its subtitle if any, the shape
 * with the batch element and head(s) shown, and the averaging note if blocks are averaged.
 * @return the number of lines. */
static int title_lines(char lines[TITLE_LINES_MAX][512], const heatmap_opts *o, int64_t B,
                       int64_t H, int64_t Lq, int64_t Lk, const layout *ly,
                       const heatmap_geometry *g) {
    int k = 0;
    snprintf(lines[k++], 512, "%s",
             o->title != NULL && o->title[0] != '\0' ? o->title : "attention weights");
    if (o->subtitle != NULL && o->subtitle[0] != '\0')
        snprintf(lines[k++], 512, "%s", o->subtitle);
    char which[96];
    if (o->head < 0)
        snprintf(which, sizeof which, "batch %lld, all %lld heads", (long long)o->batch,
                 (long long)H);
    else
        snprintf(which, sizeof which, "batch %lld, head %lld", (long long)o->batch,
                 (long long)o->head);
    snprintf(lines[k++], 512, "B=%lld H=%lld Lq=%lld Lk=%lld; %s", (long long)B, (long long)H,
             (long long)Lq, (long long)Lk, which);
    if (ly->fq > 1 || ly->fk > 1)
        snprintf(lines[k++], 512, "averaged over %lldx%lld blocks (query x key positions per cell)",
                 (long long)ly->fq, (long long)ly->fk);
    if (g->negative > 0)
        snprintf(lines[k++], 512, "%lld value%s below 0 (least %.3g)%s: not attention weights",
                 (long long)g->negative, g->negative == 1 ? "" : "s", g->least,
                 ly->fq > 1 || ly->fk > 1 ? ", averaged into the blocks" : "");
    return k;
}

int heatmap_render(const float *w, int64_t B, int64_t H, int64_t Lq, int64_t Lk,
                   const heatmap_opts *o, uint8_t **rgb, heatmap_geometry *g, char *err,
                   size_t errlen) {
    *rgb = NULL;
    memset(g, 0, sizeof *g);
    const heatmap_opts defaults = heatmap_opts_default();
    if (o == NULL)
        o = &defaults;
    if (check_args(w, B, H, Lq, Lk, o, err, errlen) != 0)
        return -1;
    const int max_cells = o->max_cells > 0 ? o->max_cells : HEATMAP_DEFAULT_CELLS;
    /* A "grid" of one head is that head, titled as such. */
    heatmap_opts opts = *o;
    if (opts.head < 0 && H == 1)
        opts.head = 0;
    o = &opts;
    const int grid = o->head < 0;
    g->npanels = grid ? (int)H : 1;
    for (int p = 0; p < g->npanels; p++)
        g->heads[p] = grid ? p : o->head;

    layout ly;
    if (plan_layout(&ly, g->npanels, Lq, Lk, max_cells, err, errlen) != 0)
        return -1;
    const int averaged = ly.fq > 1 || ly.fk > 1;
    for (int p = 0; p < g->npanels; p++)
        count_negative(w + ((o->batch * H + g->heads[p]) * Lq) * Lk, (size_t)(Lq * Lk), g);
    char lines[TITLE_LINES_MAX][512];
    const int k = title_lines(lines, o, B, H, Lq, Lk, &ly, g);
    ly.grid_y = MARGIN + k * LINE_H + 10;
    /* The picture's size: the grid and colour bar, widened for a long title up to
     * TITLE_WIDE pixels; a title longer still is cut. */
    const int content_w = ly.grid_x + ly.grid_w + ly.bar_area_w + MARGIN;
    int width = content_w;
    char tmp[sizeof lines[0]];
    for (int i = 0; i < k; i++) {
        printable_text(tmp, sizeof tmp, lines[i], INT_MAX);
        memcpy(lines[i], tmp, sizeof tmp);
        width = max_int(width, 2 * MARGIN + text_width(lines[i], S));
    }
    width = min_int(width, max_int(content_w, TITLE_WIDE));
    for (int i = 0; i < k; i++) {
        printable_text(tmp, sizeof tmp, lines[i], width - 2 * MARGIN);
        memcpy(lines[i], tmp, sizeof tmp);
    }
    /* Reduce every shown head, then find the scale over all of them, so that the panels of a
     * grid share one colour bar and can be compared. */
    const size_t per_panel = (size_t)ly.dq * (size_t)ly.dk;
    float *cells = malloc(per_panel * (size_t)g->npanels * sizeof *cells);
    double *acc = malloc((size_t)ly.dk * sizeof *acc);
    if (cells == NULL || acc == NULL) {
        free(cells);
        free(acc);
        snprintf(err, errlen, "out of memory for %lld x %lld cells", (long long)ly.dq,
                 (long long)ly.dk);
        return -1;
    }
    for (int p = 0; p < g->npanels; p++) {
        const float *m = w + ((o->batch * H + g->heads[p]) * Lq) * Lk;
        reduce_blocks(cells + per_panel * (size_t)p, m, Lq, Lk, ly.fq, ly.fk, ly.dq, ly.dk, acc);
    }
    free(acc);
    colour_scale(cells, per_panel * (size_t)g->npanels, g);
    const int vscale = value_scale(cells, per_panel * (size_t)g->npanels, ly.cw, ly.ch, g);

    g->cell_w = ly.cw;
    g->cell_h = ly.ch;
    g->rows = ly.dq;
    g->cols = ly.dk;
    g->block_q = ly.fq;
    g->block_k = ly.fk;
    for (int p = 0; p < g->npanels; p++) {
        const int col = p % ly.ncols, row = p / ly.ncols;
        g->plot_x[p] = ly.grid_x + col * (ly.panel_w + PANEL_GAP) + ly.left_gutter;
        g->plot_y[p] = ly.grid_y + row * (ly.panel_h + PANEL_GAP) + LINE_H;
    }
    g->bar_x = ly.grid_x + ly.grid_w + BAR_GAP;
    g->bar_y = g->plot_y[0];
    g->bar_w = BAR_W;
    g->bar_h = g->plot_y[g->npanels - 1] + ly.plot_h - g->bar_y;
    const int legend_bottom =
        g->bar_y + g->bar_h + (g->nonfinite > 0 ? TEXT_H + 10 + 2 * LINE_H : 0);
    const int height = max_int(ly.grid_y + ly.grid_h + XLABEL_H, legend_bottom) + MARGIN;
    g->width = width;
    g->height = height;
    canvas cv = {width, height, malloc((size_t)width * (size_t)height * 3)};
    if (cv.px == NULL) {
        free(cells);
        snprintf(err, errlen, "out of memory for a %d x %d picture", width, height);
        return -1;
    }

    colormap_lut lut;
    colormap_table(&lut);
    fill_rect(&cv, 0, 0, width, height, white_rgb);
    for (int i = 0; i < k; i++)
        draw_text(&cv, MARGIN, MARGIN + i * LINE_H, lines[i], S, i == 0 ? ink_rgb : note_rgb);
    for (int p = 0; p < g->npanels; p++)
        draw_panel(&cv, &ly, g, p, cells + per_panel * (size_t)p, Lq, Lk, vscale, &lut);
    free(cells);

    /* The axis names, once for the whole grid; a short one beside a strip. */
    const int rows_top = g->plot_y[0], rows_bottom = g->plot_y[g->npanels - 1] + ly.plot_h;
    const char *ylabel = "query position i", *xlabel = "key position j";
    if (text_width(ylabel, S) > rows_bottom - rows_top + 16)
        ylabel = "query i";
    draw_text_up(&cv, MARGIN, (rows_top + rows_bottom - text_width(ylabel, S)) / 2, ylabel, S,
                 ink_rgb);
    const int cols_left = g->plot_x[0],
              cols_right = g->plot_x[min_int(g->npanels, ly.ncols) - 1] + ly.plot_w;
    draw_text(&cv, (cols_left + cols_right - text_width(xlabel, S)) / 2, ly.grid_y + ly.grid_h + 10,
              xlabel, S, ink_rgb);
    draw_colour_bar(&cv, g, averaged, &lut);
    *rgb = cv.px;
    return 0;
}

int heatmap_png_write(FILE *f, const void *arg, char *err, size_t errlen) {
    const heatmap_png *pic = arg;
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = (png_uint_32)pic->width;
    img.height = (png_uint_32)pic->height;
    img.format = PNG_FORMAT_RGB;
    if (!png_image_write_to_stdio(&img, f, 0, pic->rgb, 0, NULL)) {
        snprintf(err, errlen, "cannot write the PNG: %s", img.message);
        png_image_free(&img);
        return -1;
    }
    return 0;
}

int heatmap_write_png(const char *path, const float *w, int64_t B, int64_t H, int64_t Lq,
                      int64_t Lk, const heatmap_opts *o, char *err, size_t errlen) {
    uint8_t *px;
    heatmap_geometry g;
    if (heatmap_render(w, B, H, Lq, Lk, o, &px, &g, err, errlen) != 0)
        return -1;
    const heatmap_png pic = {px, g.width, g.height};
    const int rc = outputs_write_one(path, heatmap_png_write, &pic, err, errlen);
    free(px);
    return rc;
}
