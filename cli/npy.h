/*
 * npy.h — strict reading and writing of NumPy .npy files for the sdpa command.
 *
 * Accepted: format versions 1.0, 2.0 and 3.0 (3.0 is read like 2.0: only ASCII headers are
 * accepted); C order; the header dictionary's keys in any order, each exactly once, with the
 * whitespace and trailing commas Python allows; descr '<f4' (f32), '<f2' (f16), '|b1' (bool),
 * and — only when the caller allows bf16 — '<V2', '|V2' or '<u2' read as bfloat16 bit
 * patterns. Refused, with a message that starts with the file name and says the problem:
 * anything else (pickled objects '|O', big-endian, Fortran order, other dtypes, structured
 * dtypes), short files, trailing bytes after the data, headers over NPY_MAX_HEADER bytes,
 * more than NPY_MAX_DIMS dimensions, and shapes whose size overflows (checked before any
 * allocation: the product of the non-zero extents times the element size must fit in both
 * int64_t and size_t, so that strides computed from any shape we return cannot overflow).
 *
 * Layouts we do not read are refused, never converted: a conversion would have to guess at
 * precision (float64), meaning (int32) or cost (a transposing copy), and the fix is one line
 * of numpy, which the message gives: arr.astype('<f4') for other dtypes and big-endian data,
 * np.ascontiguousarray(arr) for Fortran order.
 *
 * Files written load in numpy with the same bytes, and are byte for byte what numpy's np.save
 * writes for the same array (tests/test_npy.c checks this against files numpy wrote): version
 * 1.0 (2.0 only if the header outgrew 65535 bytes, which NPY_MAX_DIMS rules out), '<f4' /
 * '<f2' / '|b1' / '<V2' for bf16, C order, numpy's spare room for the first extent to grow,
 * and the header padded with spaces and ended by '\n' so that the data starts at a multiple
 * of 64 bytes. They are written to a temporary file next to the target and renamed over it,
 * so a failure never leaves a partial file and never harms an existing one.
 *
 * No global state: every function is safe to call from several threads on different arrays.
 */
#ifndef SDPA_CLI_NPY_H
#define SDPA_CLI_NPY_H

#include "sdpa.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define NPY_MAX_DIMS 8
#define NPY_MAX_HEADER 65536                    /* bytes of header dictionary accepted */
#define NPY_SHAPE_CHARS (NPY_MAX_DIMS * 22 + 4) /* room for any shape npy_format_shape writes */

/* What a header says. */
typedef struct npy_header {
    int major, minor; /* format version */
    sdpa_dtype dtype; /* SDPA_F32, SDPA_F16, SDPA_BOOL, or SDPA_BF16 */
    int ndim;         /* 0..NPY_MAX_DIMS */
    int64_t shape[NPY_MAX_DIMS];
    int64_t count;      /* product of the shape (1 for ndim 0) */
    size_t data_offset; /* bytes from the start of the file to the data */
    size_t data_bytes;  /* count * element size */
    int int_bytes;  /* under NPY_INT_MASK, an integer file's element size (dtype BOOL); else 0 */
    int int_signed; /* ... and whether its integers are signed */
} npy_header;

/* An array in memory; data is owned (free with npy_free). */
typedef struct npy_array {
    sdpa_dtype dtype;
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
    int64_t count;
    void *data;
    size_t nbytes;
} npy_array;

/* The flags of npy_parse_header, npy_load and npy_load_buffer (0 = none). */
enum { NPY_BF16 = 1, NPY_MASK = 2, NPY_INT_MASK = 4 };

/* Parses the first len bytes of a file (magic, version, header length, dictionary); len may
 * cover more than the header (the data is not looked at) but not less.
 * flags: NPY_BF16 accepts '<V2'/'|V2'/'<u2' as bfloat16; NPY_MASK says the file is a mask,
 * for the advice a refused dtype gets (astype(bool) for integers); NPY_INT_MASK reads an
 * array of little-endian integers ('|i1', '<i2', '<u4', '<i8', ..., '<u2' too) as a bool
 * keep-mask (a tokenizer's attention_mask), which npy_load and npy_load_buffer accept only
 * when every element is 0 or 1 (the message names the first that is not). name: the file name used
 * in messages (NULL reads "(buffer)"; shortened in the middle, "start...end", when longer than half
 * of errlen, so that the reason fits). err may be NULL; messages are cut to errlen and always
 * terminated.
 * @return 0 and fills *h, or -1 with a message in err ("q.npy: Fortran order is not
 *         supported; save np.ascontiguousarray(arr) instead"). Never reads beyond len and
 *         never allocates. */
int npy_parse_header(const unsigned char *buf, size_t len, int flags, const char *name,
                     npy_header *h, char *err, size_t errlen);

/* Loads a whole file: the header as above, then exactly data_bytes of data and nothing after.
 * A regular file's size is compared with the header before the data is allocated; a pipe's
 * data is read into one allocation of data_bytes.
 * @return 0 and fills *out (the caller frees with npy_free; data is never NULL, even for an
 *         empty array), or -1 with a message in err and out->data NULL. */
int npy_load(const char *path, int flags, npy_array *out, char *err, size_t errlen);

/* Loads from memory (the fuzz targets and tests): as npy_load, over buf[0..len). */
int npy_load_buffer(const unsigned char *buf, size_t len, int flags, const char *name,
                    npy_array *out, char *err, size_t errlen);

/* An array to write: C order, dtype F32, F16, BF16 or BOOL, shape[0..ndim). data may be
 * NULL when the array is empty. */
typedef struct npy_out {
    sdpa_dtype dtype;
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
    const void *data;
} npy_out;

/* Writes the npy_out at arg to f (an output_writer of outputs.h). Bool bytes are written as
 * 0 or 1 (numpy bools hold nothing else). @return 0 (write errors are left in ferror(f)), or
 * -1 with a message in err when the array cannot be saved at all. */
int npy_write(FILE *f, const void *arg, char *err, size_t errlen);

/* npy_write to path, committed as outputs.h says (a temporary file renamed at the end).
 * @return 0, or -1 with a message in err that starts with path (the target is then
 *         untouched and no temporary file is left). */
int npy_save(const char *path, sdpa_dtype dtype, int ndim, const int64_t *shape, const void *data,
             char *err, size_t errlen);

/* Frees the data of an array loaded by npy_load (NULL-safe, idempotent). */
void npy_free(npy_array *a);

/* Writes a shape as Python's repr writes a tuple: "(3, 4)", "(3,)" or "()", cut to cap bytes
 * (always terminated). The messages of npy.c and of the commands all use it. */
void npy_format_shape(char *out, size_t cap, int ndim, const int64_t *shape);

/* Converts the a->count elements of a float32 or float16 array to float32 in dst, exactly
 * (every float16 value, NaN and the infinities included, is a float32 value).
 * @return 0, or -1 for any other dtype (dst untouched). */
int npy_to_f32(const npy_array *a, float *dst);

#endif /* SDPA_CLI_NPY_H */
