/*
 * npy_header.c — the parser of a .npy file's header (npy_parse_header, contract in npy.h):
 * the magic, the version, the header's length and its dictionary, the descr mapped to a dtype
 * or refused with the numpy line that fixes it.
 *
 * The header dictionary is parsed by hand, not evaluated: a small recursive-descent reader of
 * exactly the Python literals numpy writes (a dict of three quoted keys, a quoted descr, True
 * or False, a tuple of decimal integers), with the whitespace and trailing commas Python
 * allows. Everything about the size of the data (each extent, the element count, the byte
 * count, the end of the data in the file) is checked for overflow before anything is
 * allocated, so a hostile header costs at most NPY_MAX_HEADER bytes of memory. The parser
 * itself never reads past the bytes it is given and never allocates.
 */
#include "npy.h"

#include "npy_internal.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
        npy_set_err(err, errlen, name,
                    "dtype '%s' holds 2-byte raw values; pass --dtype bf16 to read 2-byte raw "
                    "values as bfloat16",
                    d);
        return -1;
    }
    const char order = (d[0] == '<' || d[0] == '>' || d[0] == '|' || d[0] == '=') ? d[0] : 0;
    const char *t = order ? d + 1 : d;
    if (t[0] == 'O') {
        npy_set_err(err, errlen, name,
                    "holds pickled Python objects (dtype '%s'); pickles are refused for safety "
                    "(loading one can run arbitrary code)",
                    d);
        return -1;
    }
    char desc[32];
    const char *what = describe_type(t, desc, sizeof desc);
    const int fixable = strcmp(t, "f2") == 0 || strcmp(t, "f4") == 0 || strcmp(t, "u2") == 0;
    if (order == '>') {
        npy_set_err(err, errlen, name,
                    "big-endian data (dtype '%s'); convert with arr.astype('<%s')", d,
                    fixable ? t : "f4");
        return -1;
    }
    if ((order == 0 || order == '=') && fixable) {
        npy_set_err(err, errlen, name,
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
    npy_set_err(err, errlen, name, "dtype '%s'%s%s%s is not supported; " NPY_ACCEPTED "%s", d,
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
        npy_set_err(ps->err, ps->errlen, ps->name, "bad .npy header: %s at the end of the header",
                    what);
    else
        npy_set_err(ps->err, ps->errlen, ps->name, "bad .npy header: %s at byte %zu (\"%s\")", what,
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
            npy_set_err(ps->err, ps->errlen, ps->name, "bad .npy header: the key '%s' is missing",
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
        npy_set_err(err, errlen, name, "empty file, not a .npy file");
        return -1;
    }
    if (memcmp(buf, npy_magic, magic_n) != 0) {
        if (len >= 4 && memcmp(buf, "PK\x03\x04", 4) == 0)
            npy_set_err(err, errlen, name,
                        "is a .npz archive, not a .npy file; extract one array with "
                        "np.save('a.npy', np.load(FILE)['NAME'])");
        else
            npy_set_err(err, errlen, name, "not a .npy file (it does not start with \\x93NUMPY)");
        return -1;
    }
    if (len < 8) {
        npy_set_err(err, errlen, name, "truncated .npy file (%zu bytes, shorter than its header)",
                    len);
        return -1;
    }
    const int major = buf[6], minor = buf[7];
    if ((major != 1 && major != 2 && major != 3) || minor != 0) {
        npy_set_err(err, errlen, name,
                    "unsupported .npy format version %d.%d (versions 1.0, 2.0 and 3.0 are read)",
                    major, minor);
        return -1;
    }
    /* 1.0 stores the header length in 2 bytes, 2.0 and 3.0 in 4 (3.0 only allows utf-8 in
     * the header; we accept ASCII only, so the two are read alike). */
    const size_t prefix = major == 1 ? 10 : 12;
    if (len < prefix) {
        npy_set_err(err, errlen, name, "truncated .npy file (%zu bytes, shorter than its header)",
                    len);
        return -1;
    }
    uint32_t hlen = (uint32_t)buf[8] | (uint32_t)buf[9] << 8;
    if (major != 1)
        hlen |= (uint32_t)buf[10] << 16 | (uint32_t)buf[11] << 24;
    if (hlen > NPY_MAX_HEADER) {
        npy_set_err(err, errlen, name,
                    "the header is %" PRIu32 " bytes long, over the limit of %d bytes", hlen,
                    NPY_MAX_HEADER);
        return -1;
    }
    if (hlen > len - prefix) {
        npy_set_err(err, errlen, name,
                    "truncated .npy file: the header is %" PRIu32 " bytes long, but the file "
                    "ends %zu bytes into it",
                    hlen, len - prefix);
        return -1;
    }
    const char *text = (const char *)buf + prefix;
    for (uint32_t i = 0; i < hlen; i++) {
        const unsigned char c = (unsigned char)text[i];
        if ((c < 0x20 || c > 0x7e) && c != '\n' && c != '\r' && c != '\t') {
            npy_set_err(err, errlen, name,
                        "bad .npy header: byte %zu is 0x%02x; only ASCII text is accepted",
                        prefix + i, c);
            return -1;
        }
    }
    if (hlen == 0 || text[hlen - 1] != '\n') {
        npy_set_err(err, errlen, name, "bad .npy header: it does not end with a newline");
        return -1;
    }

    hdict d;
    memset(&d, 0, sizeof d);
    hparse ps = {text, text, text + hlen, prefix, name, err, errlen};
    if (parse_dict(&ps, &d) != 0)
        return -1;
    if (d.ndim > NPY_MAX_DIMS) {
        npy_set_err(err, errlen, name, "%d dimensions; at most %d are supported", d.ndim,
                    NPY_MAX_DIMS);
        return -1;
    }
    sdpa_dtype dtype;
    if (classify_descr(d.descr, flags, name, &dtype, h, err, errlen) != 0)
        return -1;
    /* the bytes of one element in the file: an integer mask's, else its dtype's */
    const size_t esize = h->int_bytes > 0 ? (size_t)h->int_bytes : sdpa_dtype_size(dtype);
    if (d.fortran) {
        npy_set_err(err, errlen, name,
                    "Fortran order is not supported; save np.ascontiguousarray(arr) instead");
        return -1;
    }
    int64_t count;
    size_t bytes;
    if (npy_check_extent(d.ndim, d.shape, esize, &count, &bytes) != 0) {
        char s[NPY_SHAPE_CHARS];
        npy_format_shape(s, sizeof s, d.ndim, d.shape);
        npy_set_err(err, errlen, name,
                    "the shape %s is too large: the product of its non-zero extents times %zu "
                    "bytes overflows",
                    s, esize);
        return -1;
    }
    const size_t offset = prefix + hlen;
    if (bytes > SIZE_MAX - offset) {
        npy_set_err(err, errlen, name, "the data is too large for this machine");
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
