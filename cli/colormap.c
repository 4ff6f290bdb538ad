/*
 * colormap.c — viridis from eleven control points, interpolated in the Oklab colour space.
 *
 * The control points are data, not code: they are the colours of matplotlib's viridis map
 * (designed by Stéfan van der Walt and Nathaniel Smith, 2015, released CC0) at t = 0, 0.1,
 * ..., 1, as published in its documentation and as the eleven hex codes R's viridisLite
 * gives for viridis(11): #440154 #482576 #414487 #35608D #2A788E #21908C #22A884 #43BF71
 * #7AD151 #BBDF27 #FDE725. Viridis was made uniform in CAM02-UCS; between these samples we
 * interpolate in Oklab (Björn Ottosson, 2020, whose published matrices are used below),
 * which is close enough to that space that the steps between the samples stay even in
 * lightness, rather than in sRGB, whose straight lines sag in lightness between hues.
 */
#include "colormap.h"

#include <math.h>

enum { N_POINTS = 11 };

static const uint8_t viridis_points[N_POINTS][3] = {
    {0x44, 0x01, 0x54}, {0x48, 0x25, 0x76}, {0x41, 0x44, 0x87}, {0x35, 0x60, 0x8D},
    {0x2A, 0x78, 0x8E}, {0x21, 0x90, 0x8C}, {0x22, 0xA8, 0x84}, {0x43, 0xBF, 0x71},
    {0x7A, 0xD1, 0x51}, {0xBB, 0xDF, 0x27}, {0xFD, 0xE7, 0x25},
};

/* The sRGB transfer function (IEC 61966-2-1) and its inverse, on [0, 1]. */
static double srgb_to_linear(double c) {
    return c <= 0.04045 ? c / 12.92 : pow((c + 0.055) / 1.055, 2.4);
}

static double linear_to_srgb(double c) {
    return c <= 0.0031308 ? 12.92 * c : 1.055 * pow(c, 1.0 / 2.4) - 0.055;
}

/* 8-bit sRGB -> Oklab (L, a, b). */
static void srgb8_to_oklab(const uint8_t rgb[3], double lab[3]) {
    const double r = srgb_to_linear(rgb[0] / 255.0), g = srgb_to_linear(rgb[1] / 255.0),
                 b = srgb_to_linear(rgb[2] / 255.0);
    const double l = cbrt(0.4122214708 * r + 0.5363325363 * g + 0.0514459929 * b);
    const double m = cbrt(0.2119034982 * r + 0.6806995451 * g + 0.1073969566 * b);
    const double s = cbrt(0.0883024619 * r + 0.2817188376 * g + 0.6299787005 * b);
    lab[0] = 0.2104542553 * l + 0.7936177850 * m - 0.0040720468 * s;
    lab[1] = 1.9779984951 * l - 2.4285922050 * m + 0.4505937099 * s;
    lab[2] = 0.0259040371 * l + 0.7827717662 * m - 0.8086757660 * s;
}

static uint8_t to_byte(double linear) {
    double c = linear_to_srgb(linear < 0.0 ? 0.0 : linear > 1.0 ? 1.0 : linear);
    return (uint8_t)lrint(c * 255.0);
}

/* Oklab -> 8-bit sRGB, clamping the (tiny) excursions outside the gamut that rounding of the
 * control points can produce. */
static void oklab_to_srgb8(const double lab[3], uint8_t rgb[3]) {
    const double l0 = lab[0] + 0.3963377774 * lab[1] + 0.2158037573 * lab[2];
    const double m0 = lab[0] - 0.1055613458 * lab[1] - 0.0638541728 * lab[2];
    const double s0 = lab[0] - 0.0894841775 * lab[1] - 1.2914855480 * lab[2];
    const double l = l0 * l0 * l0, m = m0 * m0 * m0, s = s0 * s0 * s0;
    rgb[0] = to_byte(4.0767416621 * l - 3.3077115913 * m + 0.2309699292 * s);
    rgb[1] = to_byte(-1.2684380046 * l + 2.6097574011 * m - 0.3413193965 * s);
    rgb[2] = to_byte(-0.0041960863 * l - 0.7034186147 * m + 1.7076147010 * s);
}

void colormap_viridis(double t, uint8_t rgb[3]) {
    if (!(t > 0.0)) /* also NaN */
        t = 0.0;
    if (t > 1.0)
        t = 1.0;
    const double x = t * (N_POINTS - 1);
    int i = (int)x;
    if (i >= N_POINTS - 1)
        i = N_POINTS - 2;
    const double u = x - i;
    /* The end points are returned exactly, so the extremes of the map are the published
     * colours and a test can compare pixels with them. */
    if (u == 0.0 || u == 1.0) {
        const uint8_t *p = viridis_points[u == 0.0 ? i : i + 1];
        rgb[0] = p[0], rgb[1] = p[1], rgb[2] = p[2];
        return;
    }
    double a[3], b[3], mix[3];
    srgb8_to_oklab(viridis_points[i], a);
    srgb8_to_oklab(viridis_points[i + 1], b);
    for (int c = 0; c < 3; c++)
        mix[c] = a[c] + u * (b[c] - a[c]);
    oklab_to_srgb8(mix, rgb);
}

void colormap_table(colormap_lut *t) {
    for (int i = 0; i < COLORMAP_LEVELS; i++)
        colormap_viridis(i / (double)(COLORMAP_LEVELS - 1), t->rgb[i]);
}
