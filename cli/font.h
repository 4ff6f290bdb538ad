/*
 * font.h — a small bitmap font for the text of the heatmaps (titles, tick labels, the colour
 * bar's numbers): every printable ASCII character as a 5 x 9 grid of pixels, drawn by the
 * renderer at an integer scale. Capitals and digits are 7 rows tall, lower case has a
 * 5-row x-height, and descenders use the last 2 rows.
 */
#ifndef SDPA_CLI_FONT_H
#define SDPA_CLI_FONT_H

enum {
    FONT_W = 5,       /* columns of a glyph */
    FONT_H = 9,       /* rows of a glyph: 7 above the baseline, 2 below */
    FONT_ASCENT = 7,  /* rows from the top to the baseline */
    FONT_ADVANCE = 6, /* columns from one character to the next (a blank column between) */
};

/* The pixels of row `row` (0 = top, < FONT_H) of character c as FONT_W bits, bit
 * FONT_W - 1 being the leftmost column. Characters outside printable ASCII (including the
 * bytes of UTF-8 sequences) are drawn as '?'. Thread safe (constant data). */
unsigned font_glyph_row(unsigned char c, int row);

#endif /* SDPA_CLI_FONT_H */
