/*
 * test_heatmap.c — the PNG heatmaps of cli/heatmap.h: every picture is written, decoded back
 * with libpng and compared with the in-memory rendering and its geometry, so that the checks
 * below are about the file a person opens. Checked: the size bound, the colour map's extremes
 * where the data has its minimum and maximum, one colour per head in a grid, block averaging
 * of long sequences, NaN cells and their legend, fully masked rows, the colour bar, argument
 * errors, and that a failed write leaves neither the file nor a temporary one behind.
 *
 * HEATMAP_TEST_KEEP=DIR keeps the pictures in DIR (which must exist) to look at them.
 */
#include "check.h"
#include "testutil.h"

#include "colormap.h"
#include "font.h"
#include "heatmap.h"

#include <png.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The directory the pictures go to: a fresh temporary one unless HEATMAP_TEST_KEEP is set. */
static char out_dir[200];
static int keep_files;

static void out_path(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s", out_dir, name);
}

/* Decodes a PNG as 8-bit RGB. @return the pixels (free them), or NULL. */
static uint8_t *read_png(const char *path, int *w, int *h) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&img, path)) {
        fprintf(stderr, "  %s: %s\n", path, img.message);
        return NULL;
    }
    img.format = PNG_FORMAT_RGB;
    uint8_t *px = malloc(PNG_IMAGE_SIZE(img));
    if (px == NULL || !png_image_finish_read(&img, NULL, px, 0, NULL)) {
        fprintf(stderr, "  %s: %s\n", path, img.message);
        free(px);
        png_image_free(&img);
        return NULL;
    }
    *w = (int)img.width;
    *h = (int)img.height;
    return px;
}

static const uint8_t *pixel(const uint8_t *px, int w, int x, int y) {
    return px + ((size_t)y * (size_t)w + (size_t)x) * 3;
}

static int same_rgb(const uint8_t *a, const uint8_t *b) {
    return a[0] == b[0] && a[1] == b[1] && a[2] == b[2];
}

#define CHECK_RGB(got, want)                                                                       \
    do {                                                                                           \
        const uint8_t *check__g = (got), *check__w = (want);                                       \
        CHECK_MSG(same_rgb(check__g, check__w), "%s: (%d,%d,%d), want (%d,%d,%d)", #got,           \
                  check__g[0], check__g[1], check__g[2], check__w[0], check__w[1], check__w[2]);   \
    } while (0)

/* A picture as the file holds it, with the geometry of its rendering. */
typedef struct picture {
    uint8_t *px;
    int w, h;
    heatmap_geometry g;
} picture;

/* Renders into memory and writes the PNG, then checks that the decoded file is the rendering,
 * pixel for pixel, and fits the size bound. @return 0 (fills *pic), or -1. */
static int render_and_read(const char *name, const float *w, int64_t B, int64_t H, int64_t Lq,
                           int64_t Lk, const heatmap_opts *o, picture *pic) {
    char path[280], err[200];
    out_path(path, sizeof path, name);
    uint8_t *mem;
    if (heatmap_render(w, B, H, Lq, Lk, o, &mem, &pic->g, err, sizeof err) != 0) {
        CHECK_MSG(0, "render %s: %s", name, err);
        return -1;
    }
    const int wrote = heatmap_write_png(path, w, B, H, Lq, Lk, o, err, sizeof err);
    CHECK_MSG(wrote == 0, "write %s: %s", name, err);
    pic->px = wrote == 0 ? read_png(path, &pic->w, &pic->h) : NULL;
    if (pic->px == NULL) {
        free(mem);
        CHECK_MSG(0, "%s could not be decoded", path);
        return -1;
    }
    CHECK_INT_EQ(pic->w, pic->g.width);
    CHECK_INT_EQ(pic->h, pic->g.height);
    CHECK(pic->w <= HEATMAP_MAX_SIDE && pic->h <= HEATMAP_MAX_SIDE);
    CHECK(memcmp(mem, pic->px, (size_t)pic->w * (size_t)pic->h * 3) == 0);
    free(mem);
    return 0;
}

/* The colour at cell (r, c) of panel p, sampled near the cell's corner, away from the value
 * that large cells have written in their middle. */
static const uint8_t *cell_pixel(const picture *pic, int p, int64_t r, int64_t c) {
    const heatmap_geometry *g = &pic->g;
    const int x = g->plot_x[p] + (int)c * g->cell_w + (g->cell_w > 2 ? 1 : 0);
    const int y = g->plot_y[p] + (int)r * g->cell_h + (g->cell_h > 2 ? 1 : 0);
    return pixel(pic->px, pic->w, x, y);
}

/* The colour the renderer gives to t in [0, 1]: the map quantised to its 256 levels. */
static void colour_of(double t, uint8_t rgb[3]) {
    colormap_viridis((double)lrint(t * (COLORMAP_LEVELS - 1)) / (COLORMAP_LEVELS - 1), rgb);
}

/* The colour bar runs from colormap(1) at its top to colormap(0) at its bottom, and has
 * tick labels (dark pixels) to its right. */
static void check_colour_bar(const picture *pic) {
    const heatmap_geometry *g = &pic->g;
    uint8_t top[3], bottom[3];
    colour_of(1.0, top);
    colour_of(0.0, bottom);
    CHECK(g->bar_h >= 64);
    CHECK_RGB(pixel(pic->px, pic->w, g->bar_x + g->bar_w / 2, g->bar_y), top);
    CHECK_RGB(pixel(pic->px, pic->w, g->bar_x + g->bar_w / 2, g->bar_y + g->bar_h - 1), bottom);
    int dark = 0;
    for (int y = g->bar_y - 8; y < g->bar_y + g->bar_h + 8; y++)
        for (int x = g->bar_x + g->bar_w + 2; x < g->bar_x + g->bar_w + 80 && x < pic->w; x++)
            dark += pixel(pic->px, pic->w, x, y)[0] < 100;
    CHECK_MSG(dark > 100, "only %d dark pixels of tick labels beside the colour bar", dark);
}

/* n weights, every one `value`; a failed check and NULL when memory is short. */
static float *constant_weights(size_t n, float value) {
    float *w = malloc(n * sizeof *w);
    CHECK_MSG(w != NULL, "no memory for %zu weights", n);
    for (size_t i = 0; w != NULL && i < n; i++)
        w[i] = value;
    return w;
}

static void free_picture(picture *pic) {
    free(pic->px);
    pic->px = NULL;
}

/* ------------------------------------------------------------------------------------------ */

/* CIE L* of an 8-bit sRGB colour (D65). */
static double lightness(const uint8_t rgb[3]) {
    double lin[3];
    for (int c = 0; c < 3; c++) {
        const double v = rgb[c] / 255.0;
        lin[c] = v <= 0.04045 ? v / 12.92 : pow((v + 0.055) / 1.055, 2.4);
    }
    const double y = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2];
    return y > 216.0 / 24389.0 ? 116.0 * cbrt(y) - 16.0 : y * 24389.0 / 27.0;
}

static void test_colormap(void) {
    uint8_t lo[3], hi[3];
    colormap_viridis(0.0, lo);
    colormap_viridis(1.0, hi);
    CHECK_RGB(lo, ((const uint8_t[3]){0x44, 0x01, 0x54}));
    CHECK_RGB(hi, ((const uint8_t[3]){0xFD, 0xE7, 0x25}));
    /* A perceptual ramp, judged in CIE L* (a different space from the Oklab the map is
     * interpolated in): lightness never falls between neighbouring levels beyond 8-bit
     * rounding, and rises by nearly equal amounts over each sixteenth of the map. */
    colormap_lut t;
    colormap_table(&t);
    double prev = -1.0, min_rise = INFINITY, max_rise = 0.0;
    for (int i = 0; i < COLORMAP_LEVELS; i++) {
        const double l = lightness(t.rgb[i]);
        CHECK_MSG(l > prev - 0.1, "L* falls from %.2f to %.2f at level %d", prev, l, i);
        prev = l;
    }
    for (int k = 0; k < 16; k++) {
        const double rise = lightness(t.rgb[(k + 1) * 255 / 16]) - lightness(t.rgb[k * 255 / 16]);
        min_rise = rise < min_rise ? rise : min_rise;
        max_rise = rise > max_rise ? rise : max_rise;
    }
    CHECK_MSG(min_rise > 3.0 && max_rise < 1.5 * min_rise, "L* rises by %.2f to %.2f per 1/16",
              min_rise, max_rise);
    /* Out of range and NaN clamp to the ends. */
    uint8_t c[3];
    colormap_viridis(-3.0, c);
    CHECK_RGB(c, lo);
    colormap_viridis(7.0, c);
    CHECK_RGB(c, hi);
    colormap_viridis(NAN, c);
    CHECK_RGB(c, lo);
}

static void test_font(void) {
    /* Every printable character but the space has pixels; other bytes draw as '?'. */
    for (int ch = '!'; ch <= '~'; ch++) {
        unsigned any = 0;
        for (int r = 0; r < FONT_H; r++)
            any |= font_glyph_row((unsigned char)ch, r);
        CHECK_MSG(any != 0, "glyph '%c' is empty", ch);
    }
    for (int r = 0; r < FONT_H; r++) {
        CHECK_INT_EQ(font_glyph_row(' ', r), 0);
        CHECK_INT_EQ(font_glyph_row(0xC3, r), font_glyph_row('?', r));
        CHECK(font_glyph_row('W', r) < (1u << FONT_W));
    }
}

/* A causal 4 x 4 pattern: row i spreads its weight evenly over keys 0..i. */
static void test_single_head(void) {
    float w[16] = {0};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j <= i; j++)
            w[i * 4 + j] = 1.0f / (float)(i + 1);
    heatmap_opts o = heatmap_opts_default();
    o.title = "attention weights q.npy x k.npy";
    o.subtitle = "causal top-left, scale 0.5";
    picture pic;
    if (render_and_read("single.png", w, 1, 1, 4, 4, &o, &pic) != 0)
        return;
    const heatmap_geometry *g = &pic.g;
    CHECK_INT_EQ(g->npanels, 1);
    CHECK_INT_EQ(g->rows, 4);
    CHECK_INT_EQ(g->cols, 4);
    CHECK_INT_EQ(g->block_q, 1);
    CHECK(g->cell_w >= 40 && g->cell_h == g->cell_w); /* a small matrix gets big cells */
    CHECK_NEAR(g->lo, 0.0, 0.0);
    CHECK_NEAR(g->hi, 1.0, 0.0);
    uint8_t top[3], bottom[3], mid[3];
    colour_of(1.0, top);
    colour_of(0.0, bottom);
    colour_of(0.5, mid);
    CHECK_RGB(cell_pixel(&pic, 0, 0, 0), top);    /* w = 1, the maximum */
    CHECK_RGB(cell_pixel(&pic, 0, 0, 3), bottom); /* w = 0, masked */
    CHECK_RGB(cell_pixel(&pic, 0, 1, 1), mid);
    CHECK_INT_EQ(g->nonfinite, 0);
    check_colour_bar(&pic);
    /* The title is there: dark pixels in the top margin. */
    int dark = 0;
    for (int y = 20; y < 50; y++)
        for (int x = 20; x < pic.w / 2; x++)
            dark += pixel(pic.px, pic.w, x, y)[0] < 100;
    CHECK(dark > 100);
    free_picture(&pic);
}

/* A grid of 4 heads of batch element 1 of 2; head h of batch b is filled with the constant
 * (b + 1) * (h + 1) / 8, so each panel must show its own colour. */
static void test_grid(void) {
    enum { B = 2, H = 4, LQ = 6, LK = 5 };
    static float w[B * H * LQ * LK];
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < LQ * LK; i++)
                w[((b * H + h) * LQ * LK) + i] = (float)((b + 1) * (h + 1)) / 8.0f;
    w[((1 * H + 0) * LQ * LK) + 0] = 0.0f; /* the minimum, in head 0 */
    heatmap_opts o = heatmap_opts_default();
    o.batch = 1;
    o.head = -1;
    picture pic;
    if (render_and_read("grid.png", w, B, H, LQ, LK, &o, &pic) != 0)
        return;
    const heatmap_geometry *g = &pic.g;
    CHECK_INT_EQ(g->npanels, H);
    CHECK_NEAR(g->hi, 1.0, 0.0); /* batch 1, head 3: 2 * 4 / 8 */
    uint8_t want[3];
    for (int p = 0; p < H; p++) {
        CHECK_INT_EQ(g->heads[p], p);
        colour_of((double)(2 * (p + 1)) / 8.0, want);
        CHECK_RGB(cell_pixel(&pic, p, LQ - 1, LK - 1), want);
    }
    colour_of(0.0, want);
    CHECK_RGB(cell_pixel(&pic, 0, 0, 0), want);
    /* Panels do not overlap: the second starts to the right of the first one's cells. */
    CHECK(g->plot_x[1] > g->plot_x[0] + (int)g->cols * g->cell_w);
    check_colour_bar(&pic);
    free_picture(&pic);

    /* One head of the same array. */
    o.head = 2;
    if (render_and_read("grid_head2.png", w, B, H, LQ, LK, &o, &pic) != 0)
        return;
    CHECK_INT_EQ(pic.g.npanels, 1);
    CHECK_INT_EQ(pic.g.heads[0], 2);
    colour_of(1.0, want);
    CHECK_RGB(cell_pixel(&pic, 0, 2, 2), want); /* its own maximum, 6/8 */
    free_picture(&pic);
}

/* 1000 x 1500 is shown as 250 x 250 means of 4 x 6 blocks. */
static void test_large_averaged(void) {
    enum { LQ = 1000, LK = 1500 };
    float *w = constant_weights((size_t)LQ * LK, 1.0f / LK);
    if (w == NULL)
        return;
    /* Block (10, 20) holds the largest mean; block (100, 200) and all of row block 249 are 0. */
    for (int i = 40; i < 44; i++)
        for (int j = 120; j < 126; j++)
            w[i * LK + j] = 0.5f;
    for (int i = 400; i < 404; i++)
        for (int j = 1200; j < 1206; j++)
            w[i * LK + j] = 0.0f;
    w[600 * LK + 600] = 0.25f; /* one large weight in block (150, 100) */
    picture pic;
    if (render_and_read("large.png", w, 1, 1, LQ, LK, NULL, &pic) != 0) {
        free(w);
        return;
    }
    const heatmap_geometry *g = &pic.g;
    CHECK_INT_EQ(g->block_q, 4);
    CHECK_INT_EQ(g->block_k, 6);
    CHECK_INT_EQ(g->rows, 250);
    CHECK_INT_EQ(g->cols, 250);
    CHECK_NEAR(g->hi, 0.5, 1e-7);
    uint8_t want[3];
    colour_of(1.0, want);
    CHECK_RGB(cell_pixel(&pic, 0, 10, 20), want);
    colour_of(0.0, want);
    CHECK_RGB(cell_pixel(&pic, 0, 100, 200), want);
    /* The block with one large weight is its mean, not its maximum. */
    const double mean = (0.25 + 23.0 / LK) / 24.0;
    colour_of(mean / 0.5, want);
    CHECK_RGB(cell_pixel(&pic, 0, 150, 100), want);
    check_colour_bar(&pic);
    free_picture(&pic);
    free(w);
}

/* Values below 0 are not attention weights: they are counted (before any averaging, which
 * can hide them in a block's mean) with the least of them, for the title and the command's
 * warning; unaveraged, the colour scale reaches down to them. */
static void test_negative(void) {
    enum { LQ = 600, LK = 600 };
    float *w = constant_weights((size_t)LQ * LK, 1.0f / LK);
    if (w == NULL)
        return;
    for (int i = 0; i < LQ; i++)
        for (int j = 0; j < LK; j += 3)
            w[i * LK + j] = -1.0f / LK; /* every third column: block means stay positive */
    picture pic;
    if (render_and_read("negative_averaged.png", w, 1, 1, LQ, LK, NULL, &pic) == 0) {
        CHECK(pic.g.block_q > 1 && pic.g.block_k > 1);
        CHECK_INT_EQ(pic.g.negative, (int64_t)LQ * (LK / 3));
        CHECK_NEAR(pic.g.least, -1.0 / LK, 1e-9);
        CHECK(pic.g.lo >= 0.0); /* the means hide them: hence the count */
        free_picture(&pic);
    }
    free(w);
    const float small[2 * 3] = {0.5f, -0.25f, 0.75f, 1.0f, 0.0f, 0.0f};
    if (render_and_read("negative.png", small, 1, 1, 2, 3, NULL, &pic) == 0) {
        CHECK_INT_EQ(pic.g.negative, 1);
        CHECK_NEAR(pic.g.least, -0.25, 1e-9);
        CHECK_NEAR(pic.g.lo, -0.25, 1e-9);
        free_picture(&pic);
    }
    const float none[2] = {0.5f, 0.5f};
    if (render_and_read("no_negative.png", none, 1, 1, 1, 2, NULL, &pic) == 0) {
        CHECK_INT_EQ(pic.g.negative, 0);
        CHECK(pic.g.least == 0.0);
        free_picture(&pic);
    }
}

/* NaN cells are magenta, counted, and shown in a legend; a NaN in a block makes the block's
 * mean NaN rather than disappear in it. */
static void test_nan(void) {
    float w[3 * 5];
    for (int i = 0; i < 15; i++)
        w[i] = 0.2f;
    w[1 * 5 + 2] = NAN;
    w[2 * 5 + 4] = INFINITY;
    w[0] = 0.9f;
    picture pic;
    if (render_and_read("nan.png", w, 1, 1, 3, 5, NULL, &pic) != 0)
        return;
    CHECK_INT_EQ(pic.g.nonfinite, 2);
    CHECK_NEAR(pic.g.hi, 0.9, 1e-6);
    CHECK_RGB(cell_pixel(&pic, 0, 1, 2), heatmap_nan_rgb);
    CHECK_RGB(cell_pixel(&pic, 0, 2, 4), heatmap_nan_rgb);
    uint8_t want[3];
    colour_of(1.0, want);
    CHECK_RGB(cell_pixel(&pic, 0, 0, 0), want);
    /* The legend: a magenta swatch under the colour bar. */
    int legend = 0;
    for (int y = pic.g.bar_y + pic.g.bar_h + 2; y < pic.h; y++)
        for (int x = pic.g.bar_x; x < pic.g.bar_x + pic.g.bar_w; x++)
            legend += same_rgb(pixel(pic.px, pic.w, x, y), heatmap_nan_rgb);
    CHECK_MSG(legend > 100, "%d magenta pixels in the legend", legend);
    free_picture(&pic);

    /* Averaged: one NaN among 600 x 600 weights taints exactly its block. */
    enum { L = 600 };
    float *big = constant_weights((size_t)L * L, 1.0f / L);
    if (big == NULL)
        return;
    big[300 * L + 301] = NAN;
    if (render_and_read("nan_large.png", big, 1, 1, L, L, NULL, &pic) == 0) {
        CHECK_INT_EQ(pic.g.block_q, 3);
        CHECK_INT_EQ(pic.g.nonfinite, 1);
        CHECK_RGB(cell_pixel(&pic, 0, 100, 100), heatmap_nan_rgb);
        colour_of(1.0, want);
        CHECK_RGB(cell_pixel(&pic, 0, 100, 101), want);
        free_picture(&pic);
    }
    free(big);
}

/* Fully masked rows are all zero: drawn as the map's low end, and the scale is unaffected.
 * Everything masked still draws, on a 0 to 1 scale. */
static void test_masked_rows(void) {
    enum { LQ = 5, LK = 7 };
    float w[LQ * LK] = {0};
    for (int i = 0; i < LQ; i++)
        if (i != 1 && i != 3)
            for (int j = 0; j < LK; j++)
                w[i * LK + j] = j == i ? 0.7f : 0.05f;
    picture pic;
    if (render_and_read("masked.png", w, 1, 1, LQ, LK, NULL, &pic) != 0)
        return;
    CHECK_NEAR(pic.g.hi, 0.7, 1e-6);
    uint8_t zero[3], top[3];
    colour_of(0.0, zero);
    colour_of(1.0, top);
    for (int j = 0; j < LK; j++) {
        CHECK_RGB(cell_pixel(&pic, 0, 1, j), zero);
        CHECK_RGB(cell_pixel(&pic, 0, 3, j), zero);
    }
    CHECK_RGB(cell_pixel(&pic, 0, 2, 2), top);
    free_picture(&pic);

    float none[LQ * LK] = {0};
    if (render_and_read("all_masked.png", none, 1, 1, LQ, LK, NULL, &pic) != 0)
        return;
    CHECK_NEAR(pic.g.lo, 0.0, 0.0);
    CHECK_NEAR(pic.g.hi, 1.0, 0.0);
    CHECK_RGB(cell_pixel(&pic, 0, 4, 6), zero);
    free_picture(&pic);
}

/* A single query row over many keys (decoding) is a strip, stretched to be visible. */
static void test_strip_and_many_heads(void) {
    enum { LK = 1000 };
    static float w[LK];
    for (int j = 0; j < LK; j++)
        w[j] = j == 999 ? 0.5f : 0.5f / (LK - 1);
    picture pic;
    if (render_and_read("strip.png", w, 1, 1, 1, LK, NULL, &pic) == 0) {
        CHECK(pic.g.cell_h * pic.g.rows >= 64);
        CHECK_INT_EQ(pic.g.block_k, 4);
        free_picture(&pic);
    }
    /* 64 heads of 300 x 300 still fit in 2000 pixels, averaged more than max_cells asks. */
    enum { H = 64, L = 300 };
    float *many = constant_weights((size_t)H * L * L, 0.0f);
    if (many == NULL)
        return;
    for (int64_t i = 0; i < (int64_t)H * L * L; i++)
        many[i] = (float)(i % 7) / 6.0f;
    heatmap_opts o = heatmap_opts_default();
    o.head = -1;
    if (render_and_read("many_heads.png", many, 1, H, L, L, &o, &pic) == 0) {
        CHECK_INT_EQ(pic.g.npanels, H);
        CHECK(pic.g.block_q > 1 && pic.g.block_k > 1);
        free_picture(&pic);
    }
    free(many);
}

static void test_errors(void) {
    float w[8] = {0};
    char err[200] = "";
    char path[280];
    heatmap_opts o = heatmap_opts_default();

    /* A missing directory: an error naming the file, and nothing created. */
    snprintf(path, sizeof path, "%s/no/such/dir/w.png", out_dir);
    CHECK_INT_EQ(heatmap_write_png(path, w, 1, 1, 2, 4, &o, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, path);
    CHECK(access(path, F_OK) != 0);

    /* Bad arguments fail before any file is made, and leave an existing file alone. */
    char sub[220];
    snprintf(sub, sizeof sub, "%s/errors", out_dir);
    mkdir(sub, 0777);
    snprintf(path, sizeof path, "%s/w.png", sub);
    unlink(path); /* from an earlier run with HEATMAP_TEST_KEEP */
    o.batch = 1;
    CHECK_INT_EQ(heatmap_write_png(path, w, 1, 1, 2, 4, &o, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "batch 1");
    o.batch = 0;
    o.head = 2;
    CHECK_INT_EQ(heatmap_write_png(path, w, 1, 2, 1, 4, &o, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "head 2");
    o.head = -1;
    static float many[65];
    CHECK_INT_EQ(heatmap_write_png(path, many, 1, 65, 1, 1, &o, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "65 heads");
    CHECK_INT_EQ(heatmap_write_png(path, w, 1, 1, 0, 4, &o, err, sizeof err), -1);
    CHECK_INT_EQ(heatmap_write_png(path, NULL, 1, 1, 2, 4, &o, err, sizeof err), -1);
    CHECK_INT_EQ(tu_count_entries(sub, NULL), 0);

    /* A write over an existing file replaces it and leaves no temporary file. */
    o.head = 0;
    CHECK_INT_EQ(heatmap_write_png(path, w, 1, 1, 2, 4, &o, err, sizeof err), 0);
    CHECK_INT_EQ(heatmap_write_png(path, w, 1, 1, 2, 4, &o, err, sizeof err), 0);
    CHECK_INT_EQ(tu_count_entries(sub, NULL), 1);
    /* A directory in the way of the target: the rename fails, the temporary file goes. */
    char blocked[280];
    snprintf(blocked, sizeof blocked, "%s/blocked.png", sub);
    mkdir(blocked, 0777);
    CHECK_INT_EQ(heatmap_write_png(blocked, w, 1, 1, 2, 4, &o, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, blocked);
    CHECK_INT_EQ(tu_count_entries(sub, NULL), 2);
    rmdir(blocked);
    if (!keep_files) {
        unlink(path);
        rmdir(sub);
    }
}

/* Long titles, with UTF-8, are cut to the picture's width instead of widening it. */
static void test_long_title(void) {
    char title[1200];
    memset(title, 'x', sizeof title - 1);
    title[sizeof title - 1] = '\0';
    memcpy(title, "caf\xc3\xa9 ", 6);
    float w[4] = {0.25f, 0.75f, 0.5f, 0.5f};
    heatmap_opts o = heatmap_opts_default();
    o.title = title;
    picture pic;
    if (render_and_read("long_title.png", w, 1, 1, 2, 2, &o, &pic) == 0) {
        CHECK(pic.w <= HEATMAP_MAX_SIDE);
        free_picture(&pic);
    }
}

int main(int argc, char **argv) {
    const char *keep = getenv("HEATMAP_TEST_KEEP");
    if (keep != NULL && keep[0] != '\0') {
        snprintf(out_dir, sizeof out_dir, "%s", keep);
        keep_files = 1;
    } else if (tu_scratch_dir(out_dir, sizeof out_dir, "sdpa_heatmap_") != 0) {
        perror("mkdtemp");
        return 1;
    }
    const int rc = CHECK_RUN(
        argc, argv, CASE(test_colormap), CASE(test_font), CASE(test_single_head), CASE(test_grid),
        CASE(test_large_averaged), CASE(test_nan), CASE(test_negative), CASE(test_masked_rows),
        CASE(test_strip_and_many_heads), CASE(test_errors), CASE(test_long_title));
    if (!keep_files)
        tu_remove_dir(out_dir);
    return rc;
}
