/*
 * heatmap.h — pictures of attention weights as PNG files: one head, or a grid of all heads of
 * one batch element, in a perceptually uniform colour map (colormap.h) with a colour bar and
 * its scale, tick labels for query positions (rows) and key positions (columns), and a title
 * that gives the shape and options. Long sequences are reduced by averaging blocks of cells,
 * and the title says so. Non-finite weights are drawn in magenta and counted in the legend.
 *
 * The picture is rendered into memory (heatmap_render, which the tests use to know where
 * each cell lies) and written by libpng (heatmap_png_write), committed as cli/outputs.h says,
 * so a failure never leaves a partial file. Both are thread safe: all state lives in their
 * arguments.
 */
#ifndef SDPA_CLI_HEATMAP_H
#define SDPA_CLI_HEATMAP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define HEATMAP_MAX_PANELS 64     /* heads in one grid; more would leave each too small */
#define HEATMAP_MAX_SIDE 2000     /* pixels; the picture fits in this square */
#define HEATMAP_DEFAULT_CELLS 256 /* the default of heatmap_opts.max_cells */

typedef struct heatmap_opts {
    int64_t batch;        /* which batch element (default 0) */
    int64_t head;         /* which head, or -1 for a grid of all heads of that batch element */
    const char *title;    /* first title line, e.g. "attention weights q.npy x k.npy";
                             NULL: "attention weights" */
    const char *subtitle; /* second line, e.g. "causal top-left, scale 0.125"; may be NULL */
    int max_cells;        /* largest Lq or Lk drawn cell by cell (<= 0: 256); above it, blocks
                             of ceil(L / max_cells) positions are averaged. A grid of many
                             heads may average more so that the picture fits. */
} heatmap_opts;

/* The options' defaults: batch 0, head 0, no title or subtitle, 256 cells. */
heatmap_opts heatmap_opts_default(void);

/* Where things were drawn (pixels from the top-left corner of the picture). */
typedef struct heatmap_geometry {
    int width, height;                 /* of the picture */
    int npanels;                       /* 1, or H for a grid */
    int64_t heads[HEATMAP_MAX_PANELS]; /* the head shown in each panel */
    int plot_x[HEATMAP_MAX_PANELS];    /* each panel's first cell, (row 0, column 0) */
    int plot_y[HEATMAP_MAX_PANELS];
    int cell_w, cell_h;       /* pixels per drawn cell */
    int64_t rows, cols;       /* cells drawn per panel: ceil(Lq / block_q), ceil(Lk / block_k) */
    int64_t block_q, block_k; /* positions averaged into one cell along each axis (1: none) */
    int bar_x, bar_y, bar_w, bar_h; /* the colour bar's coloured area; its top is hi */
    double lo, hi;                  /* the colour scale: lo = min(0, least finite value shown),
                                       hi = the largest (lo + 1 if nothing is above lo) */
    int64_t nonfinite;              /* cells drawn in the NaN colour */
    int64_t infinite;               /* ... of which infinite rather than NaN */
    int64_t negative;               /* values below 0 in the heads shown, counted before any
                                       averaging (which may hide them: lo only sees means) */
    double least;                   /* the least of those values (0 when there is none) */
} heatmap_geometry;

/* The colour of cells whose value is NaN or infinite (or whose block holds one). */
extern const uint8_t heatmap_nan_rgb[3];

/* Renders weights w of shape (B, H, Lq, Lk), contiguous f32, into a new buffer *rgb of
 * g->width * g->height RGB pixels, row by row (free it with free()), and describes the layout
 * in *g. Values outside [0, 1] are drawn on the same linear scale (lo to hi above).
 * @return 0, or -1 with a message in err (bad extents, batch or head out of range, more than
 *         HEATMAP_MAX_PANELS heads in a grid, out of memory); *rgb is then NULL. */
int heatmap_render(const float *w, int64_t B, int64_t H, int64_t Lq, int64_t Lk,
                   const heatmap_opts *o, uint8_t **rgb, heatmap_geometry *g, char *err,
                   size_t errlen);

/* A rendered picture (heatmap_render's buffer and size), to write as a PNG. */
typedef struct heatmap_png {
    const uint8_t *rgb;
    int width, height;
} heatmap_png;

/* Writes the heatmap_png at arg to f as a PNG (an output_writer of outputs.h).
 * @return 0, or -1 with libpng's message in err. */
int heatmap_png_write(FILE *f, const void *arg, char *err, size_t errlen);

/* Renders weights (B, H, Lq, Lk), contiguous f32, and writes the PNG to path, committed as
 * outputs.h says. o may be NULL for the defaults.
 * @return 0, or -1 with a message in err that names the file where the file is at fault;
 *         path is then untouched and no temporary file remains. */
int heatmap_write_png(const char *path, const float *w, int64_t B, int64_t H, int64_t Lq,
                      int64_t Lk, const heatmap_opts *o, char *err, size_t errlen);

#endif /* SDPA_CLI_HEATMAP_H */
