/*
 * explain_print.h — the typesetting of `sdpa explain` (explain.c): headings, word-wrapped
 * paragraphs, matrices laid out in 80 columns, and sums written out term by term. Colour (ANSI
 * bold headings, the largest weight of a row highlighted) only when stdout is a terminal.
 */
#ifndef SDPA_CLI_EXPLAIN_PRINT_H
#define SDPA_CLI_EXPLAIN_PRINT_H

#include <stddef.h>

#define XP_WIDTH 80 /* no printed line is longer */

#if defined(__GNUC__)
#define XP_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define XP_PRINTF(f, a)
#endif

typedef struct xp_out {
    int color; /* emit ANSI escapes */
} xp_out;

/* How a number is written. XP_AUTO picks XP_FIXED2 or XP_SCI from the values of a table. */
typedef enum xp_fmt {
    XP_NONE,   /* (xp_sum_end: no result) */
    XP_AUTO,   /* decided by xp_style() over the table's values */
    XP_FIXED2, /* 1.93 — the notebook's rounding */
    XP_FIXED3, /* 0.979 — weights */
    XP_FIXED4, /* 1.0219 */
    XP_SCI,    /* 1.23e-05 — values too small or too large for two decimals */
    XP_EXP,    /* exponentials in (0, 1]: 0.0213 or 1.59e-06, exactly 0 as 0 */
    XP_PROB    /* PyTorch-like probabilities: 0.6285, 3.78e-44, 0.0000 */
} xp_fmt;

/* Colour only when stdout is a terminal, NO_COLOR is unset or empty, TERM is not "dumb" and
 * the user did not ask for none. */
void xp_out_init(xp_out *o, int no_color);

void xp_title(xp_out *o, const char *text);
/* "Step N. text", underlined; step 0 prints the text alone. */
void xp_heading(xp_out *o, int step, const char *text);

/* A paragraph, word-wrapped to XP_WIDTH - 2 columns, followed by a blank line. The first line
 * of each '\n'-separated part is indented by ind1, its continuation lines by ind2. '\x01' is a
 * space that never breaks. */
void xp_para(xp_out *o, int ind1, int ind2, const char *fmt, ...) XP_PRINTF(4, 5);

/* Formats into buf (like snprintf) with every space made non-breaking, so that a formula
 * such as "409.1 / 8 = 51.13" is never split across lines when passed to xp_para as %s. */
const char *xp_glue(char *buf, size_t len, const char *fmt, ...) XP_PRINTF(3, 4);

/* XP_FIXED2, or XP_SCI when the largest finite magnitude is >= 1e5 or below 0.05 (but not 0). */
xp_fmt xp_style(const double *x, int n);
xp_fmt xp_style_f(const float *x, int n);

/* One number as text, in one of a few rotating static buffers (several may appear in one
 * printf call). -inf prints as "-inf"; a rounded negative zero as a plain zero. */
const char *xp_cell(double x, xp_fmt fmt);

/* Index of the largest entry (the first of equals). */
int xp_argmax(const double *x, int n);

/*
 * A matrix of rows x cols under a title line "title (rows x cols)", each row labelled
 * rowpfx + index and, when colpfx is given, each column headed colpfx + index. Columns that do
 * not fit in XP_WIDTH are wrapped into blocks of equal size, each introduced by a line that
 * names its columns. mark_max highlights the largest entry of each row (in colour only);
 * rowsums, when given, adds a "row sum" column. -inf entries are dimmed.
 */
void xp_grid(xp_out *o, const char *title, const double *m, int rows, int cols, xp_fmt fmt,
             const char *rowpfx, const char *colpfx, int mark_max, const double *rowsums);
/* The same for a float matrix, without column headings. */
void xp_matrix(xp_out *o, const char *name, const float *m, int rows, int cols, const char *rowpfx);

/* A few labelled rows of cols numbers, each in its own format, under column headings
 * k0, k1, ... (the softmax of one row, worked out). */
void xp_row_table(xp_out *o, const double *const *rows, const char *const *labels,
                  const xp_fmt *fmts, int nrows, int cols);

/* A sum written out term by term, "label a*b + c*d + ... = result", wrapped with the
 * continuation lines aligned after the label. */
typedef struct xp_sum {
    char text[4096];
    size_t indent; /* where continuation lines start */
    int terms;
} xp_sum;

void xp_sum_begin(xp_sum *s, const char *label);
void xp_sum_product(xp_sum *s, double a, xp_fmt fa, double b, xp_fmt fb); /* a*b */
void xp_sum_term(xp_sum *s, double a, xp_fmt fa);                         /* a */
void xp_sum_weighted(xp_sum *s, double w, const char *vec, int j);        /* w x vecj */
void xp_sum_end(xp_sum *s, double result, xp_fmt fmt); /* " = result" unless XP_NONE */
void xp_sum_print(xp_out *o, const xp_sum *s);

#endif /* SDPA_CLI_EXPLAIN_PRINT_H */
