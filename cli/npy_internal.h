/*
 * npy_internal.h — what the two halves of the .npy code share, and nothing the commands use:
 * npy.c (loading, converting, writing) defines these, npy_header.c (the header parser) and
 * npy.c both call them. The contract of the reader and writer is npy.h.
 */
#ifndef SDPA_CLI_NPY_INTERNAL_H
#define SDPA_CLI_NPY_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define NPY_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define NPY_PRINTF(f, a)
#endif

/* The six bytes every .npy file starts with: \x93NUMPY. */
extern const unsigned char npy_magic[6];

/* "NAME: message" into err, the name shortened in the middle when long (cli_verror); a
 * NULL name reads "(buffer)". */
void npy_set_err(char *err, size_t errlen, const char *name, const char *fmt, ...) NPY_PRINTF(4, 5);

/* Checks that the shape describes an array this program can hold: every extent >= 0, and the
 * product of the non-zero extents times the element size fits in both int64_t and size_t.
 * Zero extents are skipped in that product on purpose: a (0, 2^62, 2^62) array holds nothing,
 * but a caller that computes strides from its shape would still overflow.
 * @return 0 and sets *count (the product of the extents) and *bytes (count * esize), or -1. */
int npy_check_extent(int ndim, const int64_t *shape, size_t esize, int64_t *count, size_t *bytes);

#endif /* SDPA_CLI_NPY_INTERNAL_H */
