/*
 * explain_print.c — the typesetting of `sdpa explain`; see explain_print.h. Everything goes to
 * stdout and no line is longer than XP_WIDTH columns: prose is word-wrapped, and a matrix too
 * wide for the terminal is cut into blocks of columns rather than into unreadable lines.
 */
#include "explain_print.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { CELL = 24, MAX_ROWS = 16, MAX_COLS = 16, WRAP = XP_WIDTH - 2 };

#define ANSI_BOLD "\033[1m"
#define ANSI_MARK "\033[1;33m" /* bold yellow: the largest weight of a row */
#define ANSI_DIM "\033[2m"
#define ANSI_RESET "\033[0m"

void xp_out_init(xp_out *o, int no_color) {
    /* NO_COLOR (no-color.org): present and not empty means no colour. A pipe or a file never
     * gets escapes, so `sdpa explain | less` and the tests read plain text. */
    const char *nc = getenv("NO_COLOR"), *term = getenv("TERM");
    o->color =
        !no_color && isatty(STDOUT_FILENO) && !(nc && *nc) && !(term && strcmp(term, "dumb") == 0);
}

static void spaces(int n) {
    for (int i = 0; i < n; i++)
        putchar(' ');
}

static void underline(size_t n, char c) {
    for (size_t i = 0; i < n; i++)
        putchar(c);
    putchar('\n');
}

void xp_title(xp_out *o, const char *text) {
    printf("%s%s%s\n", o->color ? ANSI_BOLD : "", text, o->color ? ANSI_RESET : "");
    underline(strlen(text), '=');
    putchar('\n');
}

void xp_heading(xp_out *o, int step, const char *text) {
    char buf[160];
    if (step > 0)
        snprintf(buf, sizeof buf, "Step %d. %s", step, text);
    else
        snprintf(buf, sizeof buf, "%s", text);
    printf("\n%s%s%s\n", o->color ? ANSI_BOLD : "", buf, o->color ? ANSI_RESET : "");
    underline(strlen(buf), '-');
    putchar('\n');
}

/* ---------------------------------------------------------------------------------------- */
/* Word wrapping                                                                             */
/* ---------------------------------------------------------------------------------------- */

/* Prints one '\n'-free part of a paragraph. Words are separated by runs of spaces; a run is
 * printed as it is (so aligned columns in the text survive) unless the line breaks there. */
static void wrap_part(const char *p, const char *end, int ind1, int ind2) {
    while (p < end && *p == ' ') { /* leading spaces deepen the indent of this part */
        ind1++;
        ind2++;
        p++;
    }
    spaces(ind1);
    int col = ind1, first = 1;
    while (p < end) {
        const char *gap = p;
        while (p < end && *p == ' ')
            p++;
        const int gap_len = (int)(p - gap);
        const char *word = p;
        while (p < end && *p != ' ')
            p++;
        const int len = (int)(p - word);
        if (len == 0)
            break; /* trailing spaces */
        if (!first && col + gap_len + len > WRAP) {
            putchar('\n');
            spaces(ind2);
            col = ind2;
        } else if (!first) {
            spaces(gap_len);
            col += gap_len;
        }
        for (int i = 0; i < len; i++)
            putchar(word[i] == '\x01' ? ' ' : word[i]);
        col += len;
        first = 0;
    }
    putchar('\n');
}

static void wrap(const char *text, int ind1, int ind2) {
    for (;;) {
        const char *nl = strchr(text, '\n');
        const char *end = nl ? nl : text + strlen(text);
        wrap_part(text, end, ind1, ind2);
        if (!nl)
            break;
        text = nl + 1;
    }
}

void xp_para(xp_out *o, int ind1, int ind2, const char *fmt, ...) {
    (void)o;
    char buf[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    wrap(buf, ind1, ind2);
    putchar('\n');
}

const char *xp_glue(char *buf, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    for (char *c = buf; *c; c++)
        if (*c == ' ')
            *c = '\x01';
    return buf;
}

/* ---------------------------------------------------------------------------------------- */
/* Numbers                                                                                   */
/* ---------------------------------------------------------------------------------------- */

xp_fmt xp_style(const double *x, int n) {
    double m = 0.0;
    for (int i = 0; i < n; i++)
        if (isfinite(x[i]) && fabs(x[i]) > m)
            m = fabs(x[i]);
    return m != 0.0 && (m >= 1e5 || m < 0.05) ? XP_SCI : XP_FIXED2;
}

xp_fmt xp_style_f(const float *x, int n) {
    double tmp[MAX_ROWS * MAX_COLS];
    for (int i = 0; i < n && i < MAX_ROWS * MAX_COLS; i++)
        tmp[i] = x[i];
    return xp_style(tmp, n < MAX_ROWS * MAX_COLS ? n : MAX_ROWS * MAX_COLS);
}

static void format_number(char *buf, size_t len, double x, xp_fmt fmt) {
    if (isinf(x)) {
        snprintf(buf, len, x < 0 ? "-inf" : "inf");
        return;
    }
    if (x == 0.0)
        x = 0.0; /* no "-0" from a negative zero */
    switch (fmt) {
    case XP_FIXED3: /* weights: an exact 0 (a masked key) is told apart from 0.000 */
        snprintf(buf, len, x == 0.0 ? "0" : "%.3f", x);
        break;
    case XP_FIXED4:
        snprintf(buf, len, "%.4f", x);
        break;
    case XP_SCI:
        snprintf(buf, len, "%.2e", x);
        break;
    case XP_EXP:
        if (x == 0.0)
            snprintf(buf, len, "0");
        else
            snprintf(buf, len, fabs(x) >= 1e-3 ? "%.4f" : "%.2e", x);
        break;
    case XP_PROB:
        snprintf(buf, len, x == 0.0 || fabs(x) >= 1e-4 ? "%.4f" : "%.2e", x);
        break;
    default:
        snprintf(buf, len, "%.2f", x);
        break;
    }
    /* A tiny negative number rounds to "-0.00": print it as the zero it shows. */
    if (buf[0] == '-' && strspn(buf + 1, "0.") == strlen(buf + 1))
        memmove(buf, buf + 1, strlen(buf));
}

const char *xp_cell(double x, xp_fmt fmt) {
    static char ring[8][CELL];
    static int next;
    char *buf = ring[next];
    next = (next + 1) % 8;
    format_number(buf, CELL, x, fmt);
    return buf;
}

int xp_argmax(const double *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* ---------------------------------------------------------------------------------------- */
/* Tables                                                                                    */
/* ---------------------------------------------------------------------------------------- */

enum { FLAG_MARK = 1, FLAG_DIM = 2 };

/* A table ready to lay out: every entry already written as text. */
typedef struct table {
    int rows, cols;
    char cell[MAX_ROWS][MAX_COLS][CELL];
    unsigned char flag[MAX_ROWS][MAX_COLS];
    char label[MAX_ROWS][CELL];
    const char *colpfx;   /* NULL: no column headings */
    const char *trail_hd; /* NULL: no trailing column */
    char trail[MAX_ROWS][CELL];
} table;

static int max_len(int n, const char *s, size_t stride) {
    size_t m = 0;
    for (int i = 0; i < n; i++)
        if (strlen(s + (size_t)i * stride) > m)
            m = strlen(s + (size_t)i * stride);
    return (int)m;
}

/* Row layout: "  LABEL [ c c c ]   TRAIL". Blocks of columns keep every line within
 * XP_WIDTH; the blocks are made equal in size, which reads better than 10 + 6. */
static void layout(const xp_out *o, const table *t) {
    int lw = max_len(t->rows, t->label[0], CELL), cw = 1;
    for (int i = 0; i < t->rows; i++)
        for (int j = 0; j < t->cols; j++)
            if ((int)strlen(t->cell[i][j]) > cw)
                cw = (int)strlen(t->cell[i][j]);
    char head[MAX_COLS][CELL];
    for (int j = 0; j < t->cols; j++) {
        snprintf(head[j], CELL, "%s%d", t->colpfx ? t->colpfx : "", j);
        if (t->colpfx && (int)strlen(head[j]) > cw)
            cw = (int)strlen(head[j]);
    }
    int tw = 0;
    if (t->trail_hd) {
        tw = max_len(t->rows, t->trail[0], CELL);
        if ((int)strlen(t->trail_hd) > tw)
            tw = (int)strlen(t->trail_hd);
    }
    const int fixed = 2 + lw + 2 + 2 + (t->trail_hd ? 3 + tw : 0);
    int per = (XP_WIDTH - fixed) / (cw + 1);
    if (per < 1)
        per = 1;
    const int blocks = (t->cols + per - 1) / per;
    per = (t->cols + blocks - 1) / blocks;

    for (int c0 = 0; c0 < t->cols; c0 += per) {
        const int c1 = c0 + per < t->cols ? c0 + per : t->cols;
        const int last = c1 == t->cols;
        if (blocks > 1)
            printf("  columns %d-%d of %d%s\n", c0, c1 - 1, t->cols,
                   c0 == 0 ? " (wrapped to fit 80 columns)" : "");
        if (t->colpfx || (last && t->trail_hd)) {
            spaces(2 + lw + 2);
            for (int j = c0; j < c1; j++)
                printf(" %*s", cw, t->colpfx ? head[j] : "");
            if (last && t->trail_hd)
                printf("     %*s", tw, t->trail_hd);
            putchar('\n');
        }
        for (int i = 0; i < t->rows; i++) {
            printf("  %*s [", lw, t->label[i]);
            for (int j = c0; j < c1; j++) {
                const unsigned char f = t->flag[i][j];
                const char *on = !o->color       ? ""
                                 : f & FLAG_MARK ? ANSI_MARK
                                 : f & FLAG_DIM  ? ANSI_DIM
                                                 : "";
                const int pad = cw - (int)strlen(t->cell[i][j]);
                putchar(' ');
                spaces(pad);
                printf("%s%s%s", on, t->cell[i][j], *on ? ANSI_RESET : "");
            }
            printf(" ]");
            if (last && t->trail_hd)
                printf("   %*s", tw, t->trail[i]);
            putchar('\n');
        }
        putchar('\n');
    }
}

static void fill(table *t, const double *m, int rows, int cols, xp_fmt fmt, int mark_max) {
    t->rows = rows < MAX_ROWS ? rows : MAX_ROWS;
    t->cols = cols < MAX_COLS ? cols : MAX_COLS;
    if (fmt == XP_AUTO)
        fmt = xp_style(m, rows * cols);
    for (int i = 0; i < t->rows; i++) {
        const int top = xp_argmax(m + i * cols, cols);
        for (int j = 0; j < t->cols; j++) {
            const double x = m[i * cols + j];
            format_number(t->cell[i][j], CELL, x, fmt);
            t->flag[i][j] =
                (unsigned char)((mark_max && j == top ? FLAG_MARK : 0) |
                                ((isinf(x) && x < 0) || (fmt == XP_FIXED3 && x == 0.0) ? FLAG_DIM
                                                                                       : 0));
        }
    }
}

void xp_grid(xp_out *o, const char *title, const double *m, int rows, int cols, xp_fmt fmt,
             const char *rowpfx, const char *colpfx, int mark_max, const double *rowsums) {
    static table t;
    memset(&t, 0, sizeof t);
    fill(&t, m, rows, cols, fmt, mark_max);
    for (int i = 0; i < t.rows; i++) {
        snprintf(t.label[i], CELL, "%s%d", rowpfx, i);
        if (rowsums)
            snprintf(t.trail[i], CELL, "%.6f", rowsums[i]);
    }
    t.colpfx = colpfx;
    t.trail_hd = rowsums ? "row sum" : NULL;
    printf("%s, %d x %d:\n", title, rows, cols);
    layout(o, &t);
}

void xp_matrix(xp_out *o, const char *name, const float *m, int rows, int cols,
               const char *rowpfx) {
    double tmp[MAX_ROWS * MAX_COLS];
    const int n = rows * cols < MAX_ROWS * MAX_COLS ? rows * cols : MAX_ROWS * MAX_COLS;
    for (int i = 0; i < n; i++)
        tmp[i] = m[i];
    xp_grid(o, name, tmp, rows, cols, XP_AUTO, rowpfx, NULL, 0, NULL);
}

void xp_row_table(xp_out *o, const double *const *rows, const char *const *labels,
                  const xp_fmt *fmts, int nrows, int cols) {
    static table t;
    memset(&t, 0, sizeof t);
    t.rows = nrows < MAX_ROWS ? nrows : MAX_ROWS;
    t.cols = cols < MAX_COLS ? cols : MAX_COLS;
    for (int i = 0; i < t.rows; i++) {
        const xp_fmt f = fmts[i] == XP_AUTO ? xp_style(rows[i], cols) : fmts[i];
        snprintf(t.label[i], CELL, "%s", labels[i]);
        for (int j = 0; j < t.cols; j++) {
            format_number(t.cell[i][j], CELL, rows[i][j], f);
            t.flag[i][j] = isinf(rows[i][j]) && rows[i][j] < 0 ? FLAG_DIM : 0;
        }
    }
    t.colpfx = "k";
    layout(o, &t);
}

/* ---------------------------------------------------------------------------------------- */
/* Sums written out                                                                          */
/* ---------------------------------------------------------------------------------------- */

static void append(xp_sum *s, const char *fmt, ...) XP_PRINTF(2, 3);
static void append(xp_sum *s, const char *fmt, ...) {
    const size_t n = strlen(s->text);
    if (n + 1 >= sizeof s->text)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->text + n, sizeof s->text - n, fmt, ap);
    va_end(ap);
}

void xp_sum_begin(xp_sum *s, const char *label) {
    snprintf(s->text, sizeof s->text, "%s", label);
    s->indent = strlen(label);
    s->terms = 0;
}

/* Terms are joined by " +\x01": a line may break before a "+" but never after it. */
static void next_term(xp_sum *s) {
    if (s->terms++ > 0)
        append(s, " +\x01");
}

void xp_sum_product(xp_sum *s, double a, xp_fmt fa, double b, xp_fmt fb) {
    char sa[CELL], sb[CELL];
    format_number(sa, sizeof sa, a, fa);
    format_number(sb, sizeof sb, b, fb);
    next_term(s);
    /* Negative factors in parentheses, so no term reads "+ -x" or "*-y". */
    append(s, "%s%s%s*%s%s%s", sa[0] == '-' ? "(" : "", sa, sa[0] == '-' ? ")" : "",
           sb[0] == '-' ? "(" : "", sb, sb[0] == '-' ? ")" : "");
}

void xp_sum_term(xp_sum *s, double a, xp_fmt fa) {
    char sa[CELL];
    format_number(sa, sizeof sa, a, fa);
    next_term(s);
    append(s, "%s", sa);
}

void xp_sum_weighted(xp_sum *s, double w, const char *vec, int j) {
    char sw[CELL];
    format_number(sw, sizeof sw, w, XP_FIXED3);
    next_term(s);
    append(s, "%s\x01x\x01%s%d", sw, vec, j);
}

void xp_sum_end(xp_sum *s, double result, xp_fmt fmt) {
    if (fmt == XP_NONE)
        return;
    char sr[CELL];
    format_number(sr, sizeof sr, result, fmt);
    append(s, " =\x01%s", sr);
}

void xp_sum_print(xp_out *o, const xp_sum *s) {
    (void)o;
    wrap(s->text, 2, 2 + (int)s->indent);
    putchar('\n');
}
