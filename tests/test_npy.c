/*
 * test_npy.c — tests of the .npy reader and writer of the sdpa command (cli/npy.h).
 *
 * The fixtures in tests/npy/fixtures/ were written by numpy (tests/npy/make_npy_fixtures.py);
 * their MANIFEST says which must load (with dtype, shape, and data following the script's
 * PATTERN) and which must be refused (with a piece of the message). Every fixture is read
 * both from its file and from memory. Files marked `same` must be reproduced byte for byte by
 * npy_save, which is how we know numpy reads our files as we meant them. The rest: header
 * edge cases on in-memory buffers (each copied into an allocation of exactly its size, so
 * that ASan sees any read past the end), limits, and the atomic replacement of outputs.
 */
#include "../src/core/half.h"
#include "check.h"
#include "npy.h"
#include "testutil.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef NPY_FIXTURE_DIR
#error "NPY_FIXTURE_DIR must name tests/npy/fixtures (tests/CMakeLists.txt sets it)"
#endif

/* ---- helpers ------------------------------------------------------------------------------ */

static char tmp_dir[256]; /* this run's scratch directory (made by main) */

static void tmp_path(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%.200s/%.100s", tmp_dir, name);
}

/* check.h's CHECK_STR_CONTAINS, with the strings cut in its message so that GCC can prove
 * the message fits (-Wformat-truncation in release builds). */
#define CHECK_CONTAINS(hay, needle)                                                                \
    CHECK_MSG(strstr((hay), (needle)) != NULL, "\"%.200s\" does not contain \"%.200s\"", (hay),    \
              (needle))

/* The whole file in a malloc'ed buffer of exactly its size (1 byte for an empty file). */
static unsigned char *read_all(const char *path, size_t *len) {
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    size_t cap = 4096, n = 0;
    unsigned char *buf = malloc(cap);
    size_t got;
    while (buf != NULL && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            unsigned char *bigger = realloc(buf, cap *= 2);
            if (bigger == NULL)
                free(buf);
            buf = bigger;
        }
    }
    fclose(f);
    if (buf == NULL)
        return NULL;
    unsigned char *exact = malloc(n > 0 ? n : 1);
    if (exact != NULL)
        memcpy(exact, buf, n);
    free(buf);
    *len = n;
    return exact;
}

static int write_all(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    const int ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static sdpa_dtype dtype_from_name(const char *s) {
    return strcmp(s, "f16") == 0    ? SDPA_F16
           : strcmp(s, "bf16") == 0 ? SDPA_BF16
           : strcmp(s, "bool") == 0 ? SDPA_BOOL
                                    : SDPA_F32;
}

static size_t size_of(sdpa_dtype dt) {
    return dt == SDPA_F32 ? 4 : dt == SDPA_BOOL ? 1 : 2;
}

/* The PATTERN of make_npy_fixtures.py in the storage format of dt: element i holds
 * ((7 i) mod 23) / 4 - 2.5 (exact in f32, f16 and bf16), or i mod 3 == 0 for bool. */
static unsigned char *make_pattern(sdpa_dtype dt, int64_t count) {
    unsigned char *p = malloc((size_t)count * size_of(dt) + 1);
    for (int64_t i = 0; p != NULL && i < count; i++) {
        const float v = (float)((7 * i) % 23) * 0.25f - 2.5f;
        uint32_t u;
        memcpy(&u, &v, sizeof u);
        const uint16_t h = dt == SDPA_F16 ? sdpa__f64_to_f16(v) : (uint16_t)(u >> 16);
        if (dt == SDPA_F32)
            memcpy(p + 4 * i, &v, 4);
        else if (dt == SDPA_BOOL)
            p[i] = i % 3 == 0;
        else
            memcpy(p + 2 * i, &h, 2);
    }
    return p;
}

/* "3,4" -> {3, 4}; "-" -> 0-d. @return ndim. */
static int parse_shape_field(const char *s, int64_t *shape) {
    int n = 0;
    if (strcmp(s, "-") == 0)
        return 0;
    for (char *end; *s != '\0' && n < NPY_MAX_DIMS; s = *end == ',' ? end + 1 : end) {
        shape[n++] = strtoll(s, &end, 10);
        if (end == s)
            break;
    }
    return n;
}

/* Saves a, loads it back, and checks that nothing changed. */
static void check_round_trip(const npy_array *a, const char *what) {
    char path[512], err[512];
    tmp_path(path, sizeof path, "round_trip.npy");
    CHECK_MSG(npy_save(path, a->dtype, a->ndim, a->shape, a->data, err, sizeof err) == 0,
              "%.100s: save: %.300s", what, err);
    npy_array b;
    CHECK_MSG(npy_load(path, a->dtype == SDPA_BF16, &b, err, sizeof err) == 0,
              "%.100s: reload: %.300s", what, err);
    CHECK(b.dtype == a->dtype && b.ndim == a->ndim && b.count == a->count);
    CHECK(memcmp(b.shape, a->shape, sizeof a->shape[0] * (size_t)a->ndim) == 0);
    CHECK_MSG(b.nbytes == a->nbytes && memcmp(b.data, a->data, a->nbytes) == 0,
              "%s: the round trip changed the data", what);
    npy_free(&b);
}

/* ---- the fixtures ------------------------------------------------------------------------- */

static void check_accepted(const char *name, char *fields) {
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/%.200s", NPY_FIXTURE_DIR, name);
    char *save = NULL;
    const char *dt_s = strtok_r(fields, " ", &save), *shape_s = strtok_r(NULL, " ", &save);
    int bf16 = 0, same = 0;
    for (const char *flag; (flag = strtok_r(NULL, " ", &save)) != NULL;) {
        bf16 |= strcmp(flag, "bf16") == 0;
        same |= strcmp(flag, "same") == 0;
    }
    if (dt_s == NULL || shape_s == NULL) {
        CHECK_MSG(0, "MANIFEST: bad line for %s", name);
        return;
    }
    const sdpa_dtype dt = dtype_from_name(dt_s);
    int64_t shape[NPY_MAX_DIMS], count = 1;
    const int ndim = parse_shape_field(shape_s, shape);
    for (int i = 0; i < ndim; i++)
        count *= shape[i];

    npy_array a;
    if (npy_load(path, bf16, &a, err, sizeof err) != 0) {
        CHECK_MSG(0, "%.100s must load: %.300s", name, err);
        return;
    }
    CHECK_MSG(a.dtype == dt && a.ndim == ndim, "%s: dtype %d ndim %d", name, a.dtype, a.ndim);
    CHECK_MSG(a.ndim != ndim || memcmp(a.shape, shape, sizeof shape[0] * (size_t)ndim) == 0,
              "%s: shape differs", name);
    CHECK_INT_EQ(a.count, count);
    CHECK_INT_EQ(a.nbytes, (size_t)count * size_of(dt));
    CHECK(a.data != NULL);
    unsigned char *want = make_pattern(dt, count);
    CHECK_MSG(a.nbytes == (size_t)count * size_of(dt) && memcmp(a.data, want, a.nbytes) == 0,
              "%s: the data differs from the PATTERN", name);

    /* The same from memory. */
    size_t len;
    unsigned char *bytes = read_all(path, &len);
    npy_array m;
    CHECK_MSG(npy_load_buffer(bytes, len, bf16, name, &m, err, sizeof err) == 0, "%.100s: %.300s",
              name, err);
    CHECK(m.dtype == a.dtype && m.ndim == a.ndim && m.nbytes == a.nbytes &&
          memcmp(m.data, a.data, a.nbytes) == 0);
    npy_free(&m);

    if (bf16) { /* raw 2-byte values are bfloat16 only when the user says so */
        CHECK(npy_load(path, 0, &m, err, sizeof err) == -1 && m.data == NULL);
        CHECK_CONTAINS(err, "pass --dtype bf16");
        CHECK(strncmp(err, path, strlen(path)) == 0);
    }
    if (same) { /* numpy's bytes, reproduced by npy_save */
        char out[512];
        tmp_path(out, sizeof out, "same.npy");
        CHECK_MSG(npy_save(out, dt, ndim, shape, want, err, sizeof err) == 0, "%.300s", err);
        size_t out_len;
        unsigned char *ours = read_all(out, &out_len);
        CHECK_MSG(ours != NULL && out_len == len && memcmp(ours, bytes, len) == 0,
                  "%s: npy_save wrote different bytes than numpy (%zu vs %zu)", name, out_len, len);
        free(ours);
    }
    check_round_trip(&a, name);
    free(bytes);
    free(want);
    npy_free(&a);
}

static void check_rejected(const char *name, const char *text) {
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/%.200s", NPY_FIXTURE_DIR, name);
    npy_array a;
    /* Refused whether or not bf16 is allowed, except what only bf16 makes acceptable. */
    const int modes = strstr(text, "--dtype bf16") != NULL ? 1 : 2;
    for (int allow = 0; allow < modes; allow++) {
        memset(&a, 0x5a, sizeof a);
        const int rc = npy_load(path, allow, &a, err, sizeof err);
        CHECK_MSG(rc == -1, "%s must be refused", name);
        CHECK(a.data == NULL);
        CHECK_CONTAINS(err, text);
        CHECK_MSG(strncmp(err, path, strlen(path)) == 0 && err[strlen(path)] == ':',
                  "the message does not start with the file name: %.300s", err);
        if (rc == 0)
            npy_free(&a);
    }
    /* From memory: the same verdict and message, under the given name. */
    size_t len;
    unsigned char *bytes = read_all(path, &len);
    CHECK(bytes != NULL);
    CHECK(npy_load_buffer(bytes, len, modes - 1, "mem.npy", &a, err, sizeof err) == -1);
    CHECK_CONTAINS(err, text);
    CHECK(strncmp(err, "mem.npy: ", 9) == 0);
    free(bytes);
}

static void test_fixtures(void) {
    char path[512], line[1024];
    snprintf(path, sizeof path, "%.400s/MANIFEST", NPY_FIXTURE_DIR);
    FILE *f = fopen(path, "r");
    CHECK_MSG(f != NULL, "cannot open %.400s", path);
    if (f == NULL)
        return;
    int n_ok = 0, n_reject = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        if (line[0] == '#' || line[0] == '\0')
            continue;
        char *save = NULL;
        const char *kind = strtok_r(line, " ", &save), *name = strtok_r(NULL, " ", &save);
        char *rest = save != NULL ? save : (char *)"";
        if (kind == NULL || name == NULL) {
            CHECK_MSG(0, "MANIFEST: bad line");
        } else if (strcmp(kind, "ok") == 0) {
            check_accepted(name, rest);
            n_ok++;
        } else if (strcmp(kind, "reject") == 0) {
            check_rejected(name, rest);
            n_reject++;
        } else {
            CHECK_MSG(0, "MANIFEST: unknown kind %s", kind);
        }
    }
    fclose(f);
    /* A lost or truncated MANIFEST must not pass quietly. */
    CHECK_MSG(n_ok >= 25 && n_reject >= 35, "MANIFEST: %d ok, %d reject", n_ok, n_reject);
}

/* ---- the header parser on in-memory buffers ------------------------------------------------ */

/* Frames dict as numpy does (version 1.0, or 2.0 when v2: padded to 64 bytes with spaces and
 * '\n'), in a buffer of exactly its size, and parses it. */
static int parse_dict_text(const char *dict, int v2, int allow_bf16, npy_header *h, char *err,
                           size_t errlen) {
    const size_t prefix = v2 ? 12 : 10, n = strlen(dict);
    const size_t hlen = n + 1 + (64 - (prefix + n + 1) % 64) % 64;
    unsigned char *buf = malloc(prefix + hlen);
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = v2 ? 2 : 1;
    buf[7] = 0;
    for (size_t i = 0; i < prefix - 8; i++)
        buf[8 + i] = (unsigned char)(hlen >> (8 * i));
    memcpy(buf + prefix, dict, n);
    memset(buf + prefix + n, ' ', hlen - n - 1);
    buf[prefix + hlen - 1] = '\n';
    const int rc = npy_parse_header(buf, prefix + hlen, allow_bf16, "h.npy", h, err, errlen);
    if (rc == 0 && h->data_offset != prefix + hlen)
        check__fail(__FILE__, __LINE__, "data_offset is not the end of the header");
    free(buf);
    return rc;
}

static void expect_dict_ok(const char *dict, sdpa_dtype dt, int ndim, int64_t d0) {
    npy_header h;
    char err[512];
    const int rc = parse_dict_text(dict, 0, 1, &h, err, sizeof err);
    CHECK_MSG(rc == 0, "%.200s: %.300s", dict, err);
    CHECK_MSG(rc != 0 || (h.dtype == dt && h.ndim == ndim && (ndim == 0 || h.shape[0] == d0)),
              "%s: dtype %d ndim %d", dict, h.dtype, h.ndim);
}

static void expect_dict_bad(const char *dict, const char *text) {
    npy_header h;
    char err[512];
    CHECK_MSG(parse_dict_text(dict, 0, 0, &h, err, sizeof err) == -1, "%s must be refused", dict);
    CHECK_CONTAINS(err, text);
    CHECK(strncmp(err, "h.npy: ", 7) == 0);
}

/* A version-1.0 file of descr and shape (Python's text) holding the n bytes at data, in a new
 * buffer of *len bytes. */
static unsigned char *file_of(const char *descr, const char *shape, const void *data, size_t n,
                              size_t *len) {
    char dict[256];
    snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr,
             shape);
    const size_t dn = strlen(dict), hlen = dn + 1 + (64 - (10 + dn + 1) % 64) % 64;
    unsigned char *buf = malloc(10 + hlen + n);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)hlen;
    buf[9] = (unsigned char)(hlen >> 8);
    memcpy(buf + 10, dict, dn);
    memset(buf + 10 + dn, ' ', hlen - dn - 1);
    buf[10 + hlen - 1] = '\n';
    if (n > 0)
        memcpy(buf + 10 + hlen, data, n);
    *len = 10 + hlen + n;
    return buf;
}

/* NPY_INT_MASK: integer arrays of 0 and 1 come out as bool; any other value is refused with
 * its index; without the flag integers stay refused. */
static void test_int_masks(void) {
    static const struct {
        const char *descr;
        int bytes;
    } types[] = {{"|i1", 1}, {"|u1", 1}, {"<i1", 1}, {"<i2", 2}, {"<u2", 2},
                 {"<i4", 4}, {"<u4", 4}, {"<i8", 8}, {"<u8", 8}};
    const unsigned char want[6] = {1, 0, 1, 1, 0, 0};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const int k = types[t].bytes;
        unsigned char data[6 * 8] = {0};
        for (int i = 0; i < 6; i++)
            data[i * k] = want[i]; /* little-endian: the low byte first */
        size_t len;
        unsigned char *buf = file_of(types[t].descr, "(2, 3)", data, (size_t)(6 * k), &len);
        npy_array a;
        char err[512];
        CHECK_MSG(npy_load_buffer(buf, len, NPY_MASK | NPY_INT_MASK | NPY_BF16, "m.npy", &a, err,
                                  sizeof err) == 0,
                  "%s: %s", types[t].descr, err);
        CHECK_MSG(a.dtype == SDPA_BOOL && a.count == 6 && a.nbytes == 6 && a.ndim == 2 &&
                      a.data != NULL && memcmp(a.data, want, 6) == 0,
                  "%s: not the bool mask", types[t].descr);
        npy_free(&a);
        /* a 2 in the last element's high byte, or (signed) -1 in element (1, 0) */
        data[5 * k + k - 1] = 2;
        free(buf);
        buf = file_of(types[t].descr, "(2, 3)", data, (size_t)(6 * k), &len);
        CHECK(npy_load_buffer(buf, len, NPY_INT_MASK, "m.npy", &a, err, sizeof err) == -1);
        CHECK_CONTAINS(err, "m.npy: an integer mask must hold only 0 and 1");
        CHECK_CONTAINS(err, "the element at (1, 2) is ");
        CHECK(a.data == NULL);
        data[5 * k + k - 1] = 0;
        memset(data + 3 * k, 0xff, (size_t)k);
        free(buf);
        buf = file_of(types[t].descr, "(2, 3)", data, (size_t)(6 * k), &len);
        CHECK(npy_load_buffer(buf, len, NPY_INT_MASK, "m.npy", &a, err, sizeof err) == -1);
        CHECK_CONTAINS(err, types[t].descr[1] == 'i' ? "the element at (1, 0) is -1"
                                                     : "the element at (1, 0) is ");
        /* without the flag: refused, with a mask's advice under NPY_MASK */
        CHECK(npy_load_buffer(buf, len, NPY_MASK, "m.npy", &a, err, sizeof err) == -1);
        CHECK_CONTAINS(err, strcmp(types[t].descr, "<u2") == 0 ? "--dtype bf16" : "astype(bool)");
        free(buf);
    }
    /* 0-d and empty integer masks; big-endian integers stay refused */
    const int64_t one = 1;
    size_t len;
    unsigned char *buf = file_of("<i8", "()", &one, 8, &len);
    npy_array a;
    char err[512];
    CHECK(npy_load_buffer(buf, len, NPY_INT_MASK, "m.npy", &a, err, sizeof err) == 0);
    CHECK(a.dtype == SDPA_BOOL && a.count == 1 && a.nbytes == 1 && *(unsigned char *)a.data == 1);
    npy_free(&a);
    free(buf);
    buf = file_of("<i4", "(0, 5)", NULL, 0, &len);
    CHECK(npy_load_buffer(buf, len, NPY_INT_MASK, "m.npy", &a, err, sizeof err) == 0);
    CHECK(a.dtype == SDPA_BOOL && a.count == 0 && a.nbytes == 0);
    npy_free(&a);
    free(buf);
    buf = file_of(">i4", "(1,)", "\0\0\0\1", 4, &len);
    CHECK(npy_load_buffer(buf, len, NPY_INT_MASK, "m.npy", &a, err, sizeof err) == -1);
    CHECK_CONTAINS(err, "big-endian");
    free(buf);
    /* through a file, as npy_load reads it */
    char path[512];
    tmp_path(path, sizeof path, "int_mask.npy");
    const int32_t ints[4] = {0, 1, 1, 0};
    buf = file_of("<i4", "(4,)", ints, sizeof ints, &len);
    CHECK(write_all(path, buf, len) == 0);
    free(buf);
    CHECK(npy_load(path, NPY_INT_MASK, &a, err, sizeof err) == 0);
    CHECK(a.dtype == SDPA_BOOL && a.count == 4 && memcmp(a.data, "\0\1\1\0", 4) == 0);
    npy_free(&a);
    remove(path);
}

static void test_header_accepts(void) {
    expect_dict_ok("{'descr':'<f4','fortran_order':False,'shape':(3,)}", SDPA_F32, 1, 3);
    expect_dict_ok("{'descr': '<f2', 'fortran_order': False, 'shape': (3, 4,), }", SDPA_F16, 2, 3);
    expect_dict_ok("\t{\r\n'shape'\t:\n(\n7\n,\n)\n,'descr':\"|b1\",'fortran_order':False}",
                   SDPA_BOOL, 1, 7);
    expect_dict_ok("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", SDPA_F32, 0, 0);
    expect_dict_ok("{'descr': '<f4', 'fortran_order': False, 'shape': (0,), }", SDPA_F32, 1, 0);
    expect_dict_ok("{'descr': '<V2', 'fortran_order': False, 'shape': (2,), }", SDPA_BF16, 1, 2);
    expect_dict_ok("{'descr': '|V2', 'fortran_order': False, 'shape': (2,), }", SDPA_BF16, 1, 2);
    expect_dict_ok("{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }", SDPA_BF16, 1, 2);
    expect_dict_ok("{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,2), }",
                   SDPA_F32, 8, 1);
    /* The largest extent: one byte per element, INT64_MAX of them, fits int64 and size_t. The
     * header is fine; loading it must fail on the data size before allocating (an allocation
     * of 2^63 bytes would abort under ASan). */
    npy_header h;
    char err[512];
    CHECK(parse_dict_text("{'descr': '|b1', 'fortran_order': False, "
                          "'shape': (9223372036854775807,), }",
                          0, 0, &h, err, sizeof err) == 0);
    CHECK(h.count == INT64_MAX && h.data_bytes == (size_t)INT64_MAX);
    /* Version 2.0 framing. */
    CHECK(parse_dict_text("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 5), }", 1, 0, &h,
                          err, sizeof err) == 0);
    CHECK(h.major == 2 && h.minor == 0 && h.count == 10 && h.data_bytes == 40);
    CHECK(h.data_offset % 64 == 0);
}

static void test_header_refuses(void) {
    expect_dict_bad("{'descr': '<f4', 'fortran_order': False, 'shape': (3,,), }",
                    "non-negative integers");
    expect_dict_bad("{'descr': '<f4', 'fortran_order': False, 'shape': (,), }",
                    "non-negative integers");
    expect_dict_bad("{'descr': '<f4', 'fortran_order': False, 'shape': (3 4), }",
                    "expected ',' or ')'");
    expect_dict_bad("{'descr': '<f4', 'fortran_order': False, 'shape': (03,), }", "leading zeros");
    expect_dict_bad("{'descr': '<f4', 'fortran_order': False, 'shape': (3L,), }",
                    "plain decimal integers");
    expect_dict_bad("{'descr': '<f4', 'fortran_order': False, 'shape': (3.0,), }",
                    "plain decimal integers");
    expect_dict_bad("{'descr': '<f4', 'fortran_order': False, 'shape': (1_0,), }",
                    "plain decimal integers");
    expect_dict_bad("{'descr': '<f4', 'fortran_order': False, 'shape': (+3,), }",
                    "non-negative integers");
    expect_dict_bad("{'descr': '<f4', 'fortran_order': False, 'shape': ((3,),), }",
                    "non-negative integers");
    expect_dict_bad("{'descr': '<f4', 'fortran_order': False, 'shape': (3,)",
                    "expected ',' or '}'");
    expect_dict_bad("{'descr': '<f4', 'fortran_order': False, 'shape': (3,",
                    "integers at the end of the header");
    expect_dict_bad("{'descr': b'<f4', 'fortran_order': False, 'shape': (3,), }", "quoted string");
    expect_dict_bad("{'descr': '<f\\x34', 'fortran_order': False, 'shape': (3,), }", "no escapes");
    expect_dict_bad("{'descr': '<f4, 'fortran_order': False, 'shape': (3,), }",
                    "expected ',' or '}'");
    expect_dict_bad("{'descr': '<f4', 'fortran_order': false, 'shape': (3,), }", "True or False");
    expect_dict_bad("{'descr': '<f4', 'fortran_order': Falsey, 'shape': (3,), }", "True or False");
    expect_dict_bad("{'descr': '<f4', 'fortran_order': True, 'shape': (3,), }", "Fortran order");
    expect_dict_bad("{'descr' '<f4', 'fortran_order': False, 'shape': (3,), }", "expected ':'");
    expect_dict_bad("{'descr': '<f4',, 'fortran_order': False, 'shape': (3,), }", "a key");
    expect_dict_bad("['descr', '<f4']", "expected a dictionary");
    expect_dict_bad("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }}", "after the dict");
    expect_dict_bad("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), } # x",
                    "after the dict");
    expect_dict_bad("{}", "the key 'descr' is missing");
    expect_dict_bad("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,)}",
                    "duplicate key 'descr'");
    expect_dict_bad("{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }",
                    "9 dimensions");
    expect_dict_bad("{'descr': '<f4', 'fortran_order': False, 'shape': "
                    "(9223372036854775808,), }",
                    "exceeds INT64_MAX");
    expect_dict_bad("{'descr': '<f4', 'fortran_order': False, 'shape': "
                    "(9223372036854775807,), }",
                    "too large");
    expect_dict_bad("{'descr': '<f4', 'fortran_order': False, 'shape': "
                    "(4294967296, 4294967296), }",
                    "too large");
    expect_dict_bad("{'descr': '<V2', 'fortran_order': False, 'shape': (3,), }",
                    "pass --dtype bf16");
    expect_dict_bad("{'descr': '>u2', 'fortran_order': False, 'shape': (3,), }", "astype('<u2')");
    expect_dict_bad("{'descr': '|O', 'fortran_order': False, 'shape': (3,), }",
                    "pickles are refused");
    expect_dict_bad("{'descr': '<M8[ns]', 'fortran_order': False, 'shape': (3,), }",
                    "(datetime64) is not supported");
    expect_dict_bad("{'descr': '<q9', 'fortran_order': False, 'shape': (3,), }",
                    "'<q9' is not supported; accepted:");
    expect_dict_bad("{'descr': '', 'fortran_order': False, 'shape': (3,), }",
                    "'' is not supported");
    expect_dict_bad("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'extra': 1}",
                    "unknown key 'extra'");
    expect_dict_bad("{'descr': '<f4', 'fortran_order': False, 'shape': 3, }", "must be a tuple");
}

/* The framing around the dictionary: magic, version, lengths and the limit. */
static void test_header_framing(void) {
    npy_header h;
    char err[512];
    /* Every prefix of a good file is refused, and never read past (ASan checks). */
    static const char dict[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
    unsigned char good[128];
    memcpy(good, "\x93NUMPY\x01\x00\x76\x00", 10);
    memcpy(good + 10, dict, sizeof dict - 1);
    memset(good + 10 + sizeof dict - 1, ' ', 128 - 10 - sizeof dict);
    good[127] = '\n';
    CHECK(npy_parse_header(good, 128, 0, "g.npy", &h, err, sizeof err) == 0);
    CHECK(h.data_offset == 128 && h.data_bytes == 12);
    for (size_t len = 0; len < 128; len++) {
        unsigned char *p = malloc(len > 0 ? len : 1);
        memcpy(p, good, len);
        CHECK_MSG(npy_parse_header(p, len, 0, "g.npy", &h, err, sizeof err) == -1,
                  "a prefix of %zu bytes was accepted", len);
        CHECK_MSG(strncmp(err, "g.npy: ", 7) == 0, "%.300s", err);
        free(p);
    }
    CHECK(npy_parse_header(NULL, 0, 0, "g.npy", &h, err, sizeof err) == -1);
    /* The length limit is checked on the 12-byte prefix alone, before looking further. */
    unsigned char v2[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0, 0, 1, 0}; /* 65536 */
    CHECK(npy_parse_header(v2, 12, 0, "l.npy", &h, err, sizeof err) == -1);
    CHECK_CONTAINS(err, "the file ends 0 bytes into it");
    v2[8] = 1; /* 65537 */
    CHECK(npy_parse_header(v2, 12, 0, "l.npy", &h, err, sizeof err) == -1);
    CHECK_CONTAINS(err, "65537 bytes long, over the limit of 65536 bytes");
    v2[8] = 0xff, v2[9] = 0xff, v2[10] = 0xff, v2[11] = 0xff;
    CHECK(npy_parse_header(v2, 12, 0, "l.npy", &h, err, sizeof err) == -1);
    CHECK_CONTAINS(err, "over the limit");
    /* A header of exactly NPY_MAX_HEADER bytes (version 3.0) is accepted. */
    const size_t big = 12 + NPY_MAX_HEADER;
    unsigned char *p = malloc(big);
    memcpy(p, "\x93NUMPY\x03\x00\x00\x00\x01\x00", 12);
    memcpy(p + 12, dict, sizeof dict - 1);
    memset(p + 12 + sizeof dict - 1, ' ', NPY_MAX_HEADER - sizeof dict);
    p[big - 1] = '\n';
    CHECK(npy_parse_header(p, big, 0, "b.npy", &h, err, sizeof err) == 0);
    CHECK(h.major == 3 && h.data_offset == big);
    free(p);
    /* Messages are cut to errlen and stay terminated; a NULL err is allowed. */
    good[6] = 9;
    char small[8];
    memset(small, 'x', sizeof small);
    CHECK(npy_parse_header(good, 128, 0, "version.npy", &h, small, sizeof small) == -1);
    CHECK(memchr(small, '\0', sizeof small) != NULL);
    CHECK(npy_parse_header(good, 128, 0, NULL, &h, NULL, 0) == -1);
    CHECK(npy_parse_header(good, 128, 0, NULL, &h, err, sizeof err) == -1);
    CHECK_CONTAINS(err, "version 9.0");
}

/* ---- loading and saving files --------------------------------------------------------------- */

static void test_load_errors(void) {
    char path[512], err[512];
    npy_array a;
    tmp_path(path, sizeof path, "does_not_exist.npy");
    CHECK(npy_load(path, 0, &a, err, sizeof err) == -1 && a.data == NULL);
    CHECK(strncmp(err, path, strlen(path)) == 0);
    CHECK_CONTAINS(err, "cannot open");
    CHECK(npy_load(tmp_dir, 0, &a, err, sizeof err) == -1);
    CHECK_CONTAINS(err, "is a directory");
    /* A header that promises INT64_MAX bytes: refused on the size, nothing allocated. */
    static const char dict[] = "{'descr': '|b1', 'fortran_order': False, "
                               "'shape': (9223372036854775807,), }";
    unsigned char buf[128];
    memcpy(buf, "\x93NUMPY\x01\x00\x76\x00", 10);
    memcpy(buf + 10, dict, sizeof dict - 1);
    memset(buf + 10 + sizeof dict - 1, ' ', 128 - 10 - sizeof dict);
    buf[127] = '\n';
    CHECK(npy_load_buffer(buf, sizeof buf, 0, "huge.npy", &a, err, sizeof err) == -1);
    CHECK_CONTAINS(err, "huge.npy: truncated .npy file");
    tmp_path(path, sizeof path, "huge.npy");
    CHECK(write_all(path, buf, sizeof buf) == 0);
    CHECK(npy_load(path, 0, &a, err, sizeof err) == -1 && a.data == NULL);
    CHECK_CONTAINS(err, "truncated .npy file");
    remove(path);
    npy_free(NULL);
    npy_free(&a);
    npy_free(&a); /* idempotent */
}

static void test_save_round_trips(void) {
    char path[512], err[512];
    tmp_path(path, sizeof path, "rt.npy");
    /* Long extents (the growth padding numpy leaves shrinks), zero-sized data, 0-d. */
    const int64_t long_shape[3] = {0, 1234567890123, 5};
    CHECK(npy_save(path, SDPA_F32, 3, long_shape, NULL, err, sizeof err) == 0);
    npy_array a;
    CHECK(npy_load(path, 0, &a, err, sizeof err) == 0);
    CHECK(a.ndim == 3 && a.shape[1] == 1234567890123 && a.count == 0 && a.nbytes == 0);
    npy_free(&a);
    size_t len;
    unsigned char *bytes = read_all(path, &len);
    CHECK(bytes != NULL && len % 64 == 0 && bytes[len - 1] == '\n');
    free(bytes);
    const float x = 3.5f;
    CHECK(npy_save(path, SDPA_F32, 0, NULL, &x, err, sizeof err) == 0);
    CHECK(npy_load(path, 0, &a, err, sizeof err) == 0);
    CHECK(a.ndim == 0 && a.count == 1 && *(float *)a.data == 3.5f);
    npy_free(&a);
    /* Bool bytes other than 0 and 1 are written as 1, the only true numpy's bool holds. */
    const unsigned char flags[5] = {0, 1, 2, 255, 0};
    const int64_t five = 5;
    CHECK(npy_save(path, SDPA_BOOL, 1, &five, flags, err, sizeof err) == 0);
    CHECK(npy_load(path, 0, &a, err, sizeof err) == 0);
    CHECK(a.nbytes == 5 && memcmp(a.data, "\0\1\1\1\0", 5) == 0);
    npy_free(&a);
    /* Every dtype at every rank. */
    static const int64_t shapes[5][4] = {{0}, {7}, {3, 5}, {2, 3, 4}, {1, 2, 3, 4}};
    for (int dt = SDPA_F32; dt <= SDPA_BOOL; dt++) {
        for (int r = 0; r < 5; r++) {
            int64_t count = 1;
            for (int i = 0; i < r; i++)
                count *= shapes[r][i];
            npy_array b = {(sdpa_dtype)dt,
                           r,
                           {0},
                           count,
                           make_pattern((sdpa_dtype)dt, count),
                           (size_t)count * size_of((sdpa_dtype)dt)};
            memcpy(b.shape, shapes[r], sizeof shapes[r]);
            check_round_trip(&b, "dtype x rank");
            free(b.data);
        }
    }
    remove(path);
    CHECK(tu_count_entries(tmp_dir, ".tmp.") == 0);
}

static void test_save_refuses(void) {
    char path[512], err[512];
    tmp_path(path, sizeof path, "refused.npy");
    const float x[4] = {1, 2, 3, 4};
    const int64_t neg[2] = {2, -2}, huge[2] = {INT64_C(1) << 62, INT64_C(1) << 62};
    const int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 4};
    CHECK(npy_save(path, SDPA_F32, 2, neg, x, err, sizeof err) == -1);
    CHECK(strncmp(err, path, strlen(path)) == 0);
    CHECK(npy_save(path, SDPA_F32, 2, huge, x, err, sizeof err) == -1);
    CHECK(npy_save(path, SDPA_F32, 9, nine, x, err, sizeof err) == -1);
    CHECK(npy_save(path, SDPA_F32, -1, nine, x, err, sizeof err) == -1);
    CHECK(npy_save(path, (sdpa_dtype)7, 1, nine, x, err, sizeof err) == -1);
    CHECK(npy_save(path, SDPA_F32, 1, &nine[8], NULL, err, sizeof err) == -1);
    struct stat st;
    CHECK(stat(path, &st) != 0 && errno == ENOENT);
    CHECK(tu_count_entries(tmp_dir, ".tmp.") == 0);
}

/* Into a directory that does not exist: an error naming the path, and nothing created. */
static void test_save_missing_dir(void) {
    char dir[512], path[600], err[1024];
    tmp_path(dir, sizeof dir, "no_such_dir");
    snprintf(path, sizeof path, "%.500s/out.npy", dir);
    const float x = 1;
    CHECK(npy_save(path, SDPA_F32, 0, NULL, &x, err, sizeof err) == -1);
    CHECK(strncmp(err, path, strlen(path)) == 0);
    struct stat st;
    CHECK(stat(dir, &st) != 0 && errno == ENOENT);
    CHECK(tu_count_entries(tmp_dir, ".tmp.") == 0);
}

/* Over an existing file: replaced whole on success, untouched when the write fails. The
 * failure is a file-size limit (RLIMIT_FSIZE), which holds even for root, unlike a read-only
 * directory; SIGXFSZ is ignored so that the write returns EFBIG instead. */
static void test_save_replaces_atomically(void) {
    char path[512], err[512];
    tmp_path(path, sizeof path, "existing.npy");
    CHECK(write_all(path, "old contents", 12) == 0);
    const int64_t n = 3;
    const float x[3] = {1, 2, 3};
    CHECK(npy_save(path, SDPA_F32, 1, &n, x, err, sizeof err) == 0);
    npy_array a;
    CHECK(npy_load(path, 0, &a, err, sizeof err) == 0);
    CHECK(a.count == 3 && memcmp(a.data, x, sizeof x) == 0);
    npy_free(&a);

    const int64_t big = 1 << 20; /* 4 MiB of f32, over the 64 KiB limit below */
    float *data = calloc((size_t)big, sizeof(float));
    struct rlimit old;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    struct rlimit lim = old;
    lim.rlim_cur = 65536;
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    const int rc = npy_save(path, SDPA_F32, 1, &big, data, err, sizeof err);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, old_handler);
    CHECK_MSG(rc == -1, "a save over the file-size limit succeeded");
    CHECK(strncmp(err, path, strlen(path)) == 0);
    CHECK(npy_load(path, 0, &a, err, sizeof err) == 0); /* the old file, intact */
    CHECK(a.count == 3 && memcmp(a.data, x, sizeof x) == 0);
    npy_free(&a);
    CHECK(tu_count_entries(tmp_dir, ".tmp.") == 0);
    free(data);
    remove(path);
}

/* ---- the helpers the commands share ------------------------------------------------------ */

/* npy_format_shape writes Python's tuple repr and stays terminated when cut. */
static void test_format_shape(void) {
    char s[NPY_SHAPE_CHARS];
    npy_format_shape(s, sizeof s, 0, NULL);
    CHECK(strcmp(s, "()") == 0);
    const int64_t one[1] = {3};
    npy_format_shape(s, sizeof s, 1, one);
    CHECK(strcmp(s, "(3,)") == 0);
    const int64_t two[2] = {3, 4};
    npy_format_shape(s, sizeof s, 2, two);
    CHECK(strcmp(s, "(3, 4)") == 0);
    /* the widest shape there is fits */
    int64_t widest[NPY_MAX_DIMS];
    for (int i = 0; i < NPY_MAX_DIMS; i++)
        widest[i] = i % 2 ? INT64_MAX : INT64_MIN;
    npy_format_shape(s, sizeof s, NPY_MAX_DIMS, widest);
    CHECK_INT_EQ(s[strlen(s) - 1], ')');
    CHECK(strncmp(s, "(-9223372036854775808, 9223372036854775807, ", 44) == 0);
    /* a short buffer holds a terminated prefix */
    char small[5];
    memset(small, 'x', sizeof small);
    npy_format_shape(small, sizeof small, 2, two);
    CHECK(strcmp(small, "(3, ") == 0);
}

/* npy_to_f32: every f16 bit pattern decodes as the library's decoder does (NaN as NaN), f32
 * is copied bit for bit, and other dtypes are refused with dst untouched. */
static void test_to_f32(void) {
    enum { N = 65536 };
    uint16_t *h = malloc(N * sizeof *h);
    float *dst = malloc(N * sizeof *dst);
    CHECK(h != NULL && dst != NULL);
    if (h == NULL || dst == NULL) {
        free(h);
        free(dst);
        return;
    }
    for (int i = 0; i < N; i++)
        h[i] = (uint16_t)i;
    npy_array a = {SDPA_F16, 1, {N}, N, h, N * sizeof *h};
    CHECK_INT_EQ(npy_to_f32(&a, dst), 0);
    int wrong = 0;
    for (int i = 0; i < N; i++) {
        const float want = sdpa__f16_to_f32(h[i]);
        if (isnan(want) ? !isnan(dst[i]) : memcmp(&want, &dst[i], sizeof want) != 0)
            wrong++;
    }
    CHECK_INT_EQ(wrong, 0);
    CHECK(dst[0x7c00] == INFINITY && dst[0xfc00] == -INFINITY && dst[1] == 0x1p-24f);
    CHECK(signbit(dst[0x8000]) && dst[0x8000] == 0.0f);

    const float f[4] = {1.5f, -0.0f, NAN, 0x1p-149f};
    npy_array b = {SDPA_F32, 1, {4}, 4, (void *)f, sizeof f};
    CHECK_INT_EQ(npy_to_f32(&b, dst), 0);
    CHECK(memcmp(f, dst, sizeof f) == 0);

    const sdpa_dtype refused[2] = {SDPA_BF16, SDPA_BOOL};
    for (int n = 0; n < 2; n++) {
        dst[0] = 7.0f;
        npy_array c = {refused[n], 1, {1}, 1, h, 2};
        CHECK_INT_EQ(npy_to_f32(&c, dst), -1);
        CHECK(dst[0] == 7.0f);
    }
    free(h);
    free(dst);
}

/* A path of 4000 characters keeps the reason in a 512-byte message: the name is shortened in
 * the middle, not the reason cut off. */
static void test_long_path_keeps_reason(void) {
    static char path[4100];
    strcpy(path, "/no/such/dir/");
    size_t n = strlen(path);
    for (; n < 4000; n++)
        path[n] = (char)('a' + n % 26);
    strcpy(path + n, ".npy");
    char err[512];
    npy_array a;
    CHECK(npy_load(path, 0, &a, err, sizeof err) != 0);
    CHECK_STR_CONTAINS(err, "cannot open: No such file or directory");
    CHECK_STR_CONTAINS(err, "/no/such/dir/");
    CHECK_STR_CONTAINS(err, "...");
    CHECK_STR_CONTAINS(err, ".npy: cannot open");
}

int main(int argc, char **argv) {
    if (tu_scratch_dir(tmp_dir, sizeof tmp_dir, "test_npy_") != 0) {
        perror("mkdtemp");
        return 1;
    }
    const int rc =
        CHECK_RUN(argc, argv, CASE(test_long_path_keeps_reason), CASE(test_fixtures),
                  CASE(test_header_accepts), CASE(test_header_refuses), CASE(test_header_framing),
                  CASE(test_load_errors), CASE(test_save_round_trips), CASE(test_save_refuses),
                  CASE(test_save_missing_dir), CASE(test_save_replaces_atomically),
                  CASE(test_format_shape), CASE(test_to_f32), CASE(test_int_masks));
    tu_remove_dir(tmp_dir);
    return rc;
}
