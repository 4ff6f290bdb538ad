/*
 * npy.c — the strict .npy reader and writer of the sdpa command (contract in npy.h).
 *
 * The header dictionary is parsed by hand, not evaluated: a small recursive-descent reader of
 * exactly the Python literals numpy writes (a dict of three quoted keys, a quoted descr, True
 * or False, a tuple of decimal integers), with the whitespace and trailing commas Python
 * allows. Everything about the size of the data (each extent, the element count, the byte
 * count, the end of the data in the file) is checked for overflow before anything is
 * allocated, so a hostile header costs at most NPY_MAX_HEADER bytes of memory.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* fstat, fileno */
#endif

#include "npy.h"

#include "args.h"
#include "outputs.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#if defined(__GNUC__)
#define NPY_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define NPY_PRINTF(f, a)
#endif

static const unsigned char npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

/* numpy pads the header so that the data starts at a multiple of this many bytes. */
#define NPY_ALIGN 64
/* numpy leaves room for the growth axis (the first, in C order) to reach this many digits,
 * so that a header can be rewritten in place when an array is appended to. */
#define NPY_GROWTH_DIGITS 21

static const char *display_name(const char *name) {
    return name != NULL ? name : "(buffer)";
}

/* "NAME: message" into err, the name shortened in the middle when long (cli_verror). */
NPY_PRINTF(4, 5)
static void set_err(char *err, size_t errlen, const char *name, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cli_verror(err, errlen, display_name(name), fmt, ap);
    va_end(ap);
}

/* Checks that the shape describes an array this program can hold: every extent >= 0, and the
 * product of the non-zero extents times the element size fits in both int64_t and size_t.
 * Zero extents are skipped in that product on purpose: a (0, 2^62, 2^62) array holds nothing,
 * but a caller that computes strides from its shape would still overflow. */
static int check_extent(int ndim, const int64_t *shape, size_t esize, int64_t *count,
                        size_t *bytes) {
    int64_t span = (int64_t)esize, n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return -1;
        if (shape[i] == 0) {
            n = 0;
            continue;
        }
        if (span > INT64_MAX / shape[i])
            return -1;
        span *= shape[i];
        if (n != 0)
            n *= shape[i]; /* n <= span / esize, so this cannot overflow */
    }
    if ((uint64_t)span > (uint64_t)SIZE_MAX)
        return -1;
    *count = n;
    *bytes = (size_t)n * esize;
    return 0;
}

void npy_format_shape(char *out, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(out, cap, "(");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, i == 0 ? "%" PRId64 : ", %" PRId64, shape[i]);
    if (n < cap)
        snprintf(out + n, cap - n, ndim == 1 ? ",)" : ")");
}

/* ---- descr ---------------------------------------------------------------------------- */

/* "float64", "int32", ... for a numpy type string without its byte-order character, or NULL
 * when it names nothing we can describe. */
static const char *describe_type(const char *t, char *buf, size_t cap) {
    static const struct {
        char kind;
        int sized; /* the name takes the size in bits: "float" -> "float64" */
        const char *name;
    } kinds[] = {{'f', 1, "float"},
                 {'i', 1, "int"},
                 {'u', 1, "uint"},
                 {'c', 1, "complex"},
                 {'U', 0, "unicode strings"},
                 {'S', 0, "byte strings"},
                 {'a', 0, "byte strings"},
                 {'V', 0, "raw bytes (void)"},
                 {'M', 0, "datetime64"},
                 {'m', 0, "timedelta64"}};
    char *end = NULL;
    const long size = (t[0] != '\0' && t[1] >= '0' && t[1] <= '9') ? strtol(t + 1, &end, 10) : 0;
    const int sized = size > 0 && size <= 64 && end != NULL && *end == '\0';
    if (t[0] == 'b')
        return sized && size == 1 ? "bool" : NULL;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (kinds[i].kind != t[0])
            continue;
        if (!kinds[i].sized)
            return kinds[i].name;
        if (!sized)
            return NULL;
        snprintf(buf, cap, "%s%ld", kinds[i].name, size * 8);
        return buf;
    }
    return NULL;
}

#define NPY_ACCEPTED                                                                               \
    "accepted: '<f4' (float32), '<f2' (float16), '|b1' (bool), and '<V2' or '<u2' as "             \
    "bfloat16 with --dtype bf16"

/* Whether d is a little-endian (or byte-order-free, one-byte) integer type: '|i1', '<i2',
 * '<u8', ...; its size in *bytes and signedness in *is_signed. */
static int int_descr(const char *d, int *bytes, int *is_signed) {
    if ((d[0] != '<' && d[0] != '|') || (d[1] != 'i' && d[1] != 'u') || d[2] == '\0' ||
        d[3] != '\0')
        return 0;
    const int n = d[2] - '0';
    if ((n != 1 && n != 2 && n != 4 && n != 8) || (d[0] == '|' && n != 1))
        return 0;
    *bytes = n;
    *is_signed = d[1] == 'i';
    return 1;
}

/* Maps a descr to a dtype (and, for an integer keep-mask, its integers' size and sign), or
 * explains why it is refused. */
static int classify_descr(const char *d, int flags, const char *name, sdpa_dtype *dtype,
                          npy_header *h, char *err, size_t errlen) {
    /* before the table: under NPY_INT_MASK a '<u2' is a mask of integers, not bfloat16 */
    if ((flags & NPY_INT_MASK) && int_descr(d, &h->int_bytes, &h->int_signed)) {
        *dtype = SDPA_BOOL;
        return 0;
    }
    /* Two-byte raw values: '<V2' is what ml_dtypes' bfloat16 writes, '|V2' numpy's own view
     * as 'V2', '<u2' a torch bfloat16 tensor viewed as uint16. They are bfloat16 only when
     * the user says so, since a '<u2' file may just as well hold integers. */
    static const struct {
        const char *descr;
        sdpa_dtype dtype;
    } accepted[] = {{"<f4", SDPA_F32},  {"<f2", SDPA_F16},  {"|b1", SDPA_BOOL},
                    {"<V2", SDPA_BF16}, {"|V2", SDPA_BF16}, {"<u2", SDPA_BF16}};
    for (size_t i = 0; i < sizeof accepted / sizeof accepted[0]; i++) {
        if (strcmp(d, accepted[i].descr) != 0)
            continue;
        if (accepted[i].dtype != SDPA_BF16 || (flags & NPY_BF16)) {
            *dtype = accepted[i].dtype;
            return 0;
        }
        set_err(err, errlen, name,
                "dtype '%s' holds 2-byte raw values; pass --dtype bf16 to read 2-byte raw "
                "values as bfloat16",
                d);
        return -1;
    }
    const char order = (d[0] == '<' || d[0] == '>' || d[0] == '|' || d[0] == '=') ? d[0] : 0;
    const char *t = order ? d + 1 : d;
    if (t[0] == 'O') {
        set_err(err, errlen, name,
                "holds pickled Python objects (dtype '%s'); pickles are refused for safety "
                "(loading one can run arbitrary code)",
                d);
        return -1;
    }
    char desc[32];
    const char *what = describe_type(t, desc, sizeof desc);
    const int fixable = strcmp(t, "f2") == 0 || strcmp(t, "f4") == 0 || strcmp(t, "u2") == 0;
    if (order == '>') {
        set_err(err, errlen, name, "big-endian data (dtype '%s'); convert with arr.astype('<%s')",
                d, fixable ? t : "f4");
        return -1;
    }
    if ((order == 0 || order == '=') && fixable) {
        set_err(err, errlen, name,
                "dtype '%s' has no explicit byte order; convert with arr.astype('<%s')", d, t);
        return -1;
    }
    const int numeric = what != NULL && (t[0] == 'f' || t[0] == 'i' || t[0] == 'u');
    /* a mask of integers is almost always a keep-mask (a tokenizer's attention_mask: 1 =
     * attend), which astype('<f4') would turn into an additive +1/0 bias that hides nothing */
    const char *advice = !numeric             ? ""
                         : (flags & NPY_MASK) ? "; convert a keep-mask (1 = attend) with "
                                                "arr.astype(bool), an additive one with "
                                                "arr.astype('<f4')"
                                              : "; convert with arr.astype('<f4')";
    set_err(err, errlen, name, "dtype '%s'%s%s%s is not supported; " NPY_ACCEPTED "%s", d,
            what ? " (" : "", what ? what : "", what ? ")" : "", advice);
    return -1;
}

/* ---- the header dictionary ------------------------------------------------------------- */

typedef struct hparse {
    const char *p, *begin, *end; /* the dictionary text, and where the parser is */
    size_t file_offset;          /* bytes of the file before `begin` (for messages) */
    const char *name;
    char *err;
    size_t errlen;
} hparse;

NPY_PRINTF(2, 3)
static int parse_error(hparse *ps, const char *fmt, ...) {
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    /* Show a little of the text where parsing stopped; the header is ASCII (checked first),
     * so only the line breaks need replacing. */
    char near[20];
    size_t n = 0;
    for (const char *q = ps->p; q < ps->end && n < 16; q++)
        near[n++] = (*q == '\n' || *q == '\r' || *q == '\t') ? ' ' : *q;
    while (n > 0 && near[n - 1] == ' ')
        n--;
    near[n] = '\0';
    if (n == 0)
        set_err(ps->err, ps->errlen, ps->name, "bad .npy header: %s at the end of the header",
                what);
    else
        set_err(ps->err, ps->errlen, ps->name, "bad .npy header: %s at byte %zu (\"%s\")", what,
                ps->file_offset + (size_t)(ps->p - ps->begin), near);
    return -1;
}

static void skip_ws(hparse *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int peek(const hparse *ps) {
    return ps->p < ps->end ? (unsigned char)*ps->p : -1;
}

static int is_ident_char(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.';
}

/* A quoted string without escapes, copied into out[cap]. */
static int parse_string(hparse *ps, char *out, size_t cap, const char *what) {
    const int quote = peek(ps);
    if (quote != '\'' && quote != '"')
        return parse_error(ps, "expected %s as a quoted string", what);
    const char *start = ++ps->p;
    while (ps->p < ps->end && *ps->p != quote) {
        if (*ps->p == '\\' || *ps->p == '\n' || *ps->p == '\r') {
            return parse_error(ps, "%s must be a plain string (no escapes or line breaks)", what);
        }
        ps->p++;
    }
    if (ps->p >= ps->end) {
        ps->p = start - 1;
        return parse_error(ps, "unterminated string");
    }
    const size_t n = (size_t)(ps->p - start);
    if (n >= cap) {
        ps->p = start - 1;
        return parse_error(ps, "%s is too long", what);
    }
    memcpy(out, start, n);
    out[n] = '\0';
    ps->p++;
    return 0;
}

static int parse_bool(hparse *ps, int *value) {
    static const char *const words[2] = {"False", "True"};
    for (int v = 0; v < 2; v++) {
        const size_t n = strlen(words[v]);
        if ((size_t)(ps->end - ps->p) >= n && memcmp(ps->p, words[v], n) == 0 &&
            !(ps->p + n < ps->end && is_ident_char((unsigned char)ps->p[n]))) {
            ps->p += n;
            *value = v;
            return 0;
        }
    }
    return parse_error(ps, "'fortran_order' must be True or False");
}

/* A non-negative decimal integer as Python writes it: no sign, no leading zeros, no
 * underscores, no suffix. */
static int parse_extent(hparse *ps, int64_t *value) {
    if (peek(ps) == '-')
        return parse_error(ps, "'shape' has a negative extent");
    if (peek(ps) < '0' || peek(ps) > '9')
        return parse_error(ps, "'shape' must be a tuple of non-negative integers");
    const char *start = ps->p;
    int64_t v = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        const int digit = *ps->p - '0';
        if (v > (INT64_MAX - digit) / 10) {
            ps->p = start;
            return parse_error(ps, "an extent of 'shape' exceeds INT64_MAX");
        }
        v = v * 10 + digit;
        ps->p++;
    }
    if (ps->p - start > 1 && *start == '0') {
        ps->p = start;
        return parse_error(ps, "an extent of 'shape' has leading zeros");
    }
    if (ps->p < ps->end && is_ident_char((unsigned char)*ps->p)) {
        ps->p = start;
        return parse_error(ps, "'shape' must be a tuple of plain decimal integers");
    }
    *value = v;
    return 0;
}

/* '(' [int (',' int)* [',']] ')', where a single extent needs its comma: "(3)" is the number
 * 3 in Python, not a tuple. Counts extents past NPY_MAX_DIMS (storing none of them) so that
 * the message can say how many there are. */
static int parse_shape(hparse *ps, int64_t *shape, int *ndim) {
    if (peek(ps) != '(')
        return parse_error(ps, "'shape' must be a tuple such as (3, 4)");
    ps->p++;
    int n = 0, comma_after_last = 0;
    skip_ws(ps);
    while (peek(ps) != ')') {
        int64_t v = 0;
        if (parse_extent(ps, &v) != 0)
            return -1;
        if (n < NPY_MAX_DIMS)
            shape[n] = v;
        if (n < 1000000) /* only for the message; cannot be reached within NPY_MAX_HEADER */
            n++;
        skip_ws(ps);
        comma_after_last = 0;
        if (peek(ps) == ',') {
            ps->p++;
            comma_after_last = 1;
            skip_ws(ps);
        } else if (peek(ps) != ')') {
            return parse_error(ps, "expected ',' or ')' in 'shape'");
        }
    }
    if (n == 1 && !comma_after_last)
        return parse_error(ps, "'shape' of one dimension must be written (N,), not (N)");
    ps->p++;
    *ndim = n;
    return 0;
}

enum { KEY_DESCR, KEY_FORTRAN, KEY_SHAPE, KEY_COUNT };
static const char *const key_names[KEY_COUNT] = {"descr", "fortran_order", "shape"};

typedef struct hdict {
    char descr[64];
    int fortran;
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
} hdict;

static int parse_dict(hparse *ps, hdict *d) {
    int seen[KEY_COUNT] = {0};
    skip_ws(ps);
    if (peek(ps) != '{')
        return parse_error(ps, "expected a dictionary '{...}'");
    ps->p++;
    for (;;) {
        skip_ws(ps);
        if (peek(ps) == '}')
            break;
        char key[32];
        const char *key_at = ps->p;
        if (parse_string(ps, key, sizeof key, "a key") != 0)
            return -1;
        int k = 0;
        while (k < KEY_COUNT && strcmp(key, key_names[k]) != 0)
            k++;
        if (k == KEY_COUNT) {
            ps->p = key_at;
            return parse_error(ps,
                               "unknown key '%s' (the keys are 'descr', 'fortran_order' "
                               "and 'shape')",
                               key);
        }
        if (seen[k]) {
            ps->p = key_at;
            return parse_error(ps, "duplicate key '%s'", key);
        }
        seen[k] = 1;
        skip_ws(ps);
        if (peek(ps) != ':')
            return parse_error(ps, "expected ':' after the key '%s'", key);
        ps->p++;
        skip_ws(ps);
        int rc;
        if (k == KEY_DESCR) {
            if (peek(ps) == '[')
                return parse_error(ps, "structured dtypes (a list as 'descr') are not "
                                       "supported");
            rc = parse_string(ps, d->descr, sizeof d->descr, "'descr'");
        } else if (k == KEY_FORTRAN) {
            rc = parse_bool(ps, &d->fortran);
        } else {
            rc = parse_shape(ps, d->shape, &d->ndim);
        }
        if (rc != 0)
            return -1;
        skip_ws(ps);
        if (peek(ps) == ',')
            ps->p++;
        else if (peek(ps) != '}')
            return parse_error(ps, "expected ',' or '}' after the value of '%s'", key);
    }
    ps->p++;
    skip_ws(ps);
    if (ps->p != ps->end)
        return parse_error(ps, "unexpected text after the dictionary");
    for (int k = 0; k < KEY_COUNT; k++) {
        if (!seen[k]) {
            set_err(ps->err, ps->errlen, ps->name, "bad .npy header: the key '%s' is missing",
                    key_names[k]);
            return -1;
        }
    }
    return 0;
}

/* ---- the file header ------------------------------------------------------------------- */

int npy_parse_header(const unsigned char *buf, size_t len, int flags, const char *name,
                     npy_header *h, char *err, size_t errlen) {
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    memset(h, 0, sizeof *h);
    const size_t magic_n = len < sizeof npy_magic ? len : sizeof npy_magic;
    if (buf == NULL || len == 0) {
        set_err(err, errlen, name, "empty file, not a .npy file");
        return -1;
    }
    if (memcmp(buf, npy_magic, magic_n) != 0) {
        if (len >= 4 && memcmp(buf, "PK\x03\x04", 4) == 0)
            set_err(err, errlen, name,
                    "is a .npz archive, not a .npy file; extract one array with "
                    "np.save('a.npy', np.load(FILE)['NAME'])");
        else
            set_err(err, errlen, name, "not a .npy file (it does not start with \\x93NUMPY)");
        return -1;
    }
    if (len < 8) {
        set_err(err, errlen, name, "truncated .npy file (%zu bytes, shorter than its header)", len);
        return -1;
    }
    const int major = buf[6], minor = buf[7];
    if ((major != 1 && major != 2 && major != 3) || minor != 0) {
        set_err(err, errlen, name,
                "unsupported .npy format version %d.%d (versions 1.0, 2.0 and 3.0 are read)", major,
                minor);
        return -1;
    }
    /* 1.0 stores the header length in 2 bytes, 2.0 and 3.0 in 4 (3.0 only allows utf-8 in
     * the header; we accept ASCII only, so the two are read alike). */
    const size_t prefix = major == 1 ? 10 : 12;
    if (len < prefix) {
        set_err(err, errlen, name, "truncated .npy file (%zu bytes, shorter than its header)", len);
        return -1;
    }
    uint32_t hlen = (uint32_t)buf[8] | (uint32_t)buf[9] << 8;
    if (major != 1)
        hlen |= (uint32_t)buf[10] << 16 | (uint32_t)buf[11] << 24;
    if (hlen > NPY_MAX_HEADER) {
        set_err(err, errlen, name,
                "the header is %" PRIu32 " bytes long, over the limit of %d bytes", hlen,
                NPY_MAX_HEADER);
        return -1;
    }
    if (hlen > len - prefix) {
        set_err(err, errlen, name,
                "truncated .npy file: the header is %" PRIu32 " bytes long, but the file "
                "ends %zu bytes into it",
                hlen, len - prefix);
        return -1;
    }
    const char *text = (const char *)buf + prefix;
    for (uint32_t i = 0; i < hlen; i++) {
        const unsigned char c = (unsigned char)text[i];
        if ((c < 0x20 || c > 0x7e) && c != '\n' && c != '\r' && c != '\t') {
            set_err(err, errlen, name,
                    "bad .npy header: byte %zu is 0x%02x; only ASCII text is accepted", prefix + i,
                    c);
            return -1;
        }
    }
    if (hlen == 0 || text[hlen - 1] != '\n') {
        set_err(err, errlen, name, "bad .npy header: it does not end with a newline");
        return -1;
    }

    hdict d;
    memset(&d, 0, sizeof d);
    hparse ps = {text, text, text + hlen, prefix, name, err, errlen};
    if (parse_dict(&ps, &d) != 0)
        return -1;
    if (d.ndim > NPY_MAX_DIMS) {
        set_err(err, errlen, name, "%d dimensions; at most %d are supported", d.ndim, NPY_MAX_DIMS);
        return -1;
    }
    sdpa_dtype dtype;
    if (classify_descr(d.descr, flags, name, &dtype, h, err, errlen) != 0)
        return -1;
    /* the bytes of one element in the file: an integer mask's, else its dtype's */
    const size_t esize = h->int_bytes > 0 ? (size_t)h->int_bytes : sdpa_dtype_size(dtype);
    if (d.fortran) {
        set_err(err, errlen, name,
                "Fortran order is not supported; save np.ascontiguousarray(arr) instead");
        return -1;
    }
    int64_t count;
    size_t bytes;
    if (check_extent(d.ndim, d.shape, esize, &count, &bytes) != 0) {
        char s[NPY_SHAPE_CHARS];
        npy_format_shape(s, sizeof s, d.ndim, d.shape);
        set_err(err, errlen, name,
                "the shape %s is too large: the product of its non-zero extents times %zu "
                "bytes overflows",
                s, esize);
        return -1;
    }
    const size_t offset = prefix + hlen;
    if (bytes > SIZE_MAX - offset) {
        set_err(err, errlen, name, "the data is too large for this machine");
        return -1;
    }
    h->major = major;
    h->minor = minor;
    h->dtype = dtype;
    h->ndim = d.ndim;
    memcpy(h->shape, d.shape, sizeof d.shape);
    h->count = count;
    h->data_offset = offset;
    h->data_bytes = bytes;
    return 0;
}

/* ---- loading --------------------------------------------------------------------------- */

/* Compares the bytes the file has after its header with the bytes the header promises. */
static int check_data_size(const npy_header *h, size_t have, const char *name, char *err,
                           size_t errlen) {
    if (have == h->data_bytes)
        return 0;
    char s[NPY_SHAPE_CHARS];
    npy_format_shape(s, sizeof s, h->ndim, h->shape);
    if (have < h->data_bytes)
        set_err(err, errlen, name,
                "truncated .npy file: shape %s needs %zu bytes of data, the file has %zu", s,
                h->data_bytes, have);
    else
        set_err(err, errlen, name,
                "%zu unexpected bytes after the data (shape %s needs %zu bytes); the file "
                "is not a single .npy array",
                have - h->data_bytes, s, h->data_bytes);
    return -1;
}

/* An integer keep-mask read under NPY_INT_MASK: its h->int_bytes-byte integers become bool
 * bytes, in place (element i moves down to byte i), when every one is 0 or 1. Anything else
 * is refused with the first offending element: such a file is not a keep-mask, and reading
 * it as one (or as a bias) would be a guess. */
static int int_mask_to_bool(const npy_header *h, npy_array *a, const char *name, char *err,
                            size_t errlen) {
    if (h->int_bytes == 0)
        return 0;
    unsigned char *p = a->data;
    const size_t k = (size_t)h->int_bytes;
    for (int64_t i = 0; i < a->count; i++) {
        uint64_t u = 0;
        for (size_t b = 0; b < k; b++)
            u |= (uint64_t)p[(size_t)i * k + b] << (8 * b);
        if (u > 1) {
            /* the element's index as a tuple, and its value as numpy would print it */
            int64_t idx[NPY_MAX_DIMS], rest = i;
            for (int d = a->ndim - 1; d >= 0; d--) {
                idx[d] = a->shape[d] > 0 ? rest % a->shape[d] : 0;
                rest = a->shape[d] > 0 ? rest / a->shape[d] : 0;
            }
            char at[NPY_SHAPE_CHARS];
            npy_format_shape(at, sizeof at, a->ndim, idx);
            const int neg = h->int_signed && (u >> (8 * k - 1)) & 1;
            const int64_t sv = neg ? (int64_t)(u | (k < 8 ? ~UINT64_C(0) << (8 * k) : 0)) : 0;
            char val[32];
            if (neg)
                snprintf(val, sizeof val, "%" PRId64, sv);
            else
                snprintf(val, sizeof val, "%" PRIu64, u);
            set_err(err, errlen, name,
                    "an integer mask must hold only 0 and 1 (a keep-mask: 1 = attend), but the "
                    "element at %s is %s; save an additive mask with arr.astype('<f4')",
                    a->ndim > 0 ? at : "()", val);
            return -1;
        }
        p[i] = (unsigned char)u;
    }
    a->nbytes = (size_t)a->count;
    return 0;
}

/* Fills out with an allocated buffer of h->data_bytes (at least 1 byte, so that data is never
 * NULL on success, even for an empty array). */
static int alloc_array(const npy_header *h, const char *name, npy_array *out, char *err,
                       size_t errlen) {
    out->data = malloc(h->data_bytes > 0 ? h->data_bytes : 1);
    if (out->data == NULL) {
        set_err(err, errlen, name, "cannot allocate %zu bytes for the data", h->data_bytes);
        return -1;
    }
    out->dtype = h->dtype;
    out->ndim = h->ndim;
    memcpy(out->shape, h->shape, sizeof h->shape);
    out->count = h->count;
    out->nbytes = h->data_bytes;
    return 0;
}

int npy_load_buffer(const unsigned char *buf, size_t len, int flags, const char *name,
                    npy_array *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    npy_header h;
    if (npy_parse_header(buf, len, flags, name, &h, err, errlen) != 0)
        return -1;
    if (check_data_size(&h, len - h.data_offset, name, err, errlen) != 0)
        return -1;
    if (alloc_array(&h, name, out, err, errlen) != 0)
        return -1;
    memcpy(out->data, buf + h.data_offset, h.data_bytes);
    if (int_mask_to_bool(&h, out, name, err, errlen) != 0) {
        npy_free(out);
        return -1;
    }
    return 0;
}

int npy_load(const char *path, int flags, npy_array *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        set_err(err, errlen, path, "cannot open: %s", strerror(errno));
        return -1;
    }
    struct stat st;
    const int have_stat = fstat(fileno(f), &st) == 0;
    if (have_stat && S_ISDIR(st.st_mode)) {
        set_err(err, errlen, path, "is a directory, not a .npy file");
        fclose(f);
        return -1;
    }
    /* The header: its fixed prefix first, which says how long the rest is. The length is
     * checked against NPY_MAX_HEADER (by npy_parse_header on the prefix alone) before the
     * buffer for the whole header is allocated. */
    unsigned char prefix[12];
    const size_t got = fread(prefix, 1, sizeof prefix, f);
    npy_header h;
    unsigned char *head = NULL;
    size_t head_len = got;
    int rc = -1;
    if (got >= 10 && memcmp(prefix, npy_magic, sizeof npy_magic) == 0 &&
        (prefix[6] == 1 || got == 12)) {
        const size_t pre = prefix[6] == 1 ? 10 : 12;
        uint32_t hlen = (uint32_t)prefix[8] | (uint32_t)prefix[9] << 8;
        if (pre == 12)
            hlen |= (uint32_t)prefix[10] << 16 | (uint32_t)prefix[11] << 24;
        if (hlen <= NPY_MAX_HEADER && prefix[7] == 0 && prefix[6] <= 3) {
            const size_t want = pre + hlen;
            head = malloc(want);
            if (head == NULL) {
                set_err(err, errlen, path, "out of memory");
                goto done;
            }
            /* For version 1.0 the prefix read may already hold header (or even data) bytes. */
            head_len = got < want ? got : want;
            memcpy(head, prefix, head_len);
            if (want > head_len)
                head_len += fread(head + head_len, 1, want - head_len, f);
        }
    }
    if (npy_parse_header(head != NULL ? head : prefix, head_len, flags, path, &h, err, errlen) != 0)
        goto done;
    /* The stream now stands at the data, without a seek (so pipes work too): the header was
     * read whole and no further, since a valid header has at least 2 bytes and the 12-byte
     * prefix of a 1.0 file therefore never reaches into the data. */
    /* For a regular file, compare its size with the header's promise before allocating, so
     * that a lying header gets its message rather than an attempt at a huge allocation. */
    if (have_stat && S_ISREG(st.st_mode)) {
        const uint64_t size = (uint64_t)st.st_size;
        const uint64_t have = size > h.data_offset ? size - h.data_offset : 0;
        if (have > SIZE_MAX) {
            set_err(err, errlen, path, "the file is too large for this machine");
            goto done;
        }
        if (check_data_size(&h, (size_t)have, path, err, errlen) != 0)
            goto done;
    }
    if (alloc_array(&h, path, out, err, errlen) != 0)
        goto done;
    const size_t n = fread(out->data, 1, h.data_bytes, f);
    if (n < h.data_bytes && ferror(f)) {
        set_err(err, errlen, path, "read error: %s", strerror(errno));
        goto done;
    }
    /* A file that is not regular (a pipe), or one that changed since fstat: count what is
     * there to give the same messages as above. */
    size_t extra = 0;
    while (n == h.data_bytes && fgetc(f) != EOF && extra < SIZE_MAX - h.data_bytes)
        extra++;
    if (check_data_size(&h, n + extra, path, err, errlen) != 0 ||
        int_mask_to_bool(&h, out, path, err, errlen) != 0)
        goto done;
    rc = 0;
done:
    if (rc != 0)
        npy_free(out);
    free(head);
    fclose(f);
    return rc;
}

void npy_free(npy_array *a) {
    if (a == NULL)
        return;
    free(a->data);
    a->data = NULL;
    a->nbytes = 0;
}

/* binary16 scaled by hand: exact for every value, subnormals, infinities and NaN included.
 * The command's one f16 decoder; the library's (src/core/half.h) is internal, and the
 * command is a client of sdpa.h only. */
static float half_to_float(uint16_t h) {
    const int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    const double val = exp == 0    ? ldexp((double)man, -24) /* zero or subnormal */
                       : exp == 31 ? (man ? NAN : INFINITY)
                                   : ldexp((double)(man | 0x400), exp - 25);
    return (float)(h >> 15 ? -val : val);
}

int npy_to_f32(const npy_array *a, float *dst) {
    if (a->dtype != SDPA_F32 && a->dtype != SDPA_F16)
        return -1;
    for (int64_t i = 0; i < a->count; i++)
        dst[i] = a->dtype == SDPA_F32 ? ((const float *)a->data)[i]
                                      : half_to_float(((const uint16_t *)a->data)[i]);
    return 0;
}

/* ---- saving ---------------------------------------------------------------------------- */

/* Formats the whole header (magic to the final newline) exactly as numpy 1.24+ writes it:
 * "{'descr': ..., 'fortran_order': False, 'shape': ..., }", spaces for the growth axis to
 * reach NPY_GROWTH_DIGITS digits, then spaces and '\n' up to a multiple of NPY_ALIGN bytes
 * (numpy always adds at least one space, so an already aligned length gains NPY_ALIGN).
 * @return the header's length in bytes. */
static size_t format_header(unsigned char *out, size_t cap, const char *descr, int ndim,
                            const int64_t *shape) {
    char shape_s[NPY_SHAPE_CHARS];
    npy_format_shape(shape_s, sizeof shape_s, ndim, shape);
    char dict[NPY_MAX_DIMS * 22 + 128];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                     descr, shape_s);
    if (ndim > 0) {
        char first[24];
        const int digits = snprintf(first, sizeof first, "%" PRId64, shape[0]);
        for (int i = digits; i < NPY_GROWTH_DIGITS; i++)
            dict[n++] = ' ';
        dict[n] = '\0';
    }
    /* Version 1.0 holds header lengths up to 65535; NPY_MAX_DIMS keeps ours under 512, so
     * the 2.0 branch is only there to follow numpy's rule. */
    size_t prefix = 10;
    size_t hlen = (size_t)n + 1;
    size_t pad = NPY_ALIGN - (prefix + hlen) % NPY_ALIGN;
    if (hlen + pad > 65535) {
        prefix = 12;
        pad = NPY_ALIGN - (prefix + hlen) % NPY_ALIGN;
    }
    const size_t total = prefix + hlen + pad;
    if (total > cap)
        return 0;
    const size_t field = hlen + pad;
    memcpy(out, npy_magic, sizeof npy_magic);
    out[6] = prefix == 10 ? 1 : 2;
    out[7] = 0;
    for (size_t i = 0; i < prefix - 8; i++)
        out[8 + i] = (unsigned char)(field >> (8 * i));
    memcpy(out + prefix, dict, (size_t)n);
    memset(out + prefix + (size_t)n, ' ', pad);
    out[total - 1] = '\n';
    return total;
}

/* Writes bool data with every true byte as 1, the only value numpy's bool holds. */
static int write_bool(FILE *f, const unsigned char *data, size_t n) {
    unsigned char chunk[4096];
    while (n > 0) {
        const size_t m = n < sizeof chunk ? n : sizeof chunk;
        for (size_t i = 0; i < m; i++)
            chunk[i] = data[i] != 0;
        if (fwrite(chunk, 1, m, f) != m)
            return -1;
        data += m;
        n -= m;
    }
    return 0;
}

/* The header of an array, or a message (without a file name) saying why it cannot be saved.
 * @return its length, or 0. */
static size_t header_for(const npy_out *a, unsigned char *header, size_t cap, size_t *bytes,
                         char *err, size_t errlen) {
    const char *descr = a->dtype == SDPA_F32    ? "<f4"
                        : a->dtype == SDPA_F16  ? "<f2"
                        : a->dtype == SDPA_BF16 ? "<V2"
                        : a->dtype == SDPA_BOOL ? "|b1"
                                                : NULL;
    int64_t count;
    if (descr == NULL) {
        snprintf(err, errlen, "cannot save dtype %d", (int)a->dtype);
        return 0;
    }
    if (a->ndim < 0 || a->ndim > NPY_MAX_DIMS) {
        snprintf(err, errlen, "cannot save %d dimensions (0 to %d)", a->ndim, NPY_MAX_DIMS);
        return 0;
    }
    if (check_extent(a->ndim, a->shape, sdpa_dtype_size(a->dtype), &count, bytes) != 0) {
        snprintf(err, errlen, "cannot save: negative or overflowing shape");
        return 0;
    }
    if (a->data == NULL && *bytes > 0) {
        snprintf(err, errlen, "cannot save: no data");
        return 0;
    }
    const size_t len = format_header(header, cap, descr, a->ndim, a->shape);
    if (len == 0)
        snprintf(err, errlen, "cannot save: header too long");
    return len;
}

int npy_write(FILE *f, const void *arg, char *err, size_t errlen) {
    const npy_out *a = arg;
    unsigned char header[1024];
    size_t bytes = 0;
    const size_t header_len = header_for(a, header, sizeof header, &bytes, err, errlen);
    if (header_len == 0)
        return -1;
    if (fwrite(header, 1, header_len, f) != header_len)
        return 0; /* the caller sees ferror */
    if (bytes > 0) {
        if (a->dtype == SDPA_BOOL)
            (void)write_bool(f, a->data, bytes);
        else
            (void)fwrite(a->data, 1, bytes, f);
    }
    return 0;
}

int npy_save(const char *path, sdpa_dtype dtype, int ndim, const int64_t *shape, const void *data,
             char *err, size_t errlen) {
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (ndim > 0 && shape == NULL) {
        set_err(err, errlen, path, "cannot save %d dimensions without a shape", ndim);
        return -1;
    }
    npy_out a = {dtype, ndim, {0}, data};
    for (int d = 0; d < ndim && d < NPY_MAX_DIMS; d++)
        a.shape[d] = shape[d];
    /* refused before the file system is touched */
    unsigned char header[1024];
    size_t bytes;
    char why[256];
    if (header_for(&a, header, sizeof header, &bytes, why, sizeof why) == 0) {
        set_err(err, errlen, path, "%s", why);
        return -1;
    }
    return outputs_write_one(path, npy_write, &a, err, errlen);
}
