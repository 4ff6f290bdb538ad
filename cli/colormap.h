/*
 * colormap.h — the colour map of the heatmaps: viridis, a perceptually uniform ramp from dark
 * blue-violet (low) through teal and green to yellow (high). Its lightness rises steadily, so
 * it reads correctly in greyscale and for the common colour-vision deficiencies, and equal
 * steps in weight look like equal steps in colour.
 */
#ifndef SDPA_CLI_COLORMAP_H
#define SDPA_CLI_COLORMAP_H

#include <stdint.h>

/* Entries of the table that colormap_table fills: the renderer quantises t to 256 levels. */
#define COLORMAP_LEVELS 256

/* The colour at t in [0, 1] (clamped; NaN gives the colour of 0) as 8-bit sRGB in rgb[0..3).
 * Thread safe (no state). */
void colormap_viridis(double t, uint8_t rgb[3]);

/* The map at 256 evenly spaced points: rgb[i] = colormap_viridis(i / 255.0). */
typedef struct colormap_lut {
    uint8_t rgb[COLORMAP_LEVELS][3];
} colormap_lut;

/* Fills *t. */
void colormap_table(colormap_lut *t);

#endif /* SDPA_CLI_COLORMAP_H */
