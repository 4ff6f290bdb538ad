/*
 * fuzz_npy_load.c — libFuzzer target: npy_load_buffer (cli/npy.h) on arbitrary bytes.
 *
 * The last input byte is a parameter (bit 0: allow_bf16); the bytes before it are the file,
 * copied into an allocation of exactly their size so that ASan sees any read past the end.
 * Checked on success: count = product of the shape, nbytes = count times the element size,
 * the data is readable and equals the file's last nbytes (no trailing bytes are accepted),
 * and npy_parse_header agrees. On failure: the message starts with the file name and nothing
 * is left allocated. The first 64 accepted inputs of a process, then every 1000th, are also
 * saved with npy_save to a scratch directory and loaded back, which must give the same array
 * (bool bytes come back as 0 or 1): often enough to cover the writer, rare enough to keep
 * the target fast; and an input that crashes there crashes when replayed alone too.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#endif

#include "fuzz_npy.h"

#include <stdio.h>
#include <unistd.h>

static char scratch_dir[256], scratch_file[300];

static void remove_scratch(void) {
    if (scratch_file[0] != '\0')
        unlink(scratch_file);
    if (scratch_dir[0] != '\0')
        rmdir(scratch_dir);
}

static const char *scratch_path(void) {
    if (scratch_dir[0] == '\0') {
        const char *base = getenv("TMPDIR");
        snprintf(scratch_dir, sizeof scratch_dir, "%s/fuzz_npy_XXXXXX",
                 base != NULL ? base : "/tmp");
        if (mkdtemp(scratch_dir) == NULL)
            abort();
        snprintf(scratch_file, sizeof scratch_file, "%s/a.npy", scratch_dir);
        atexit(remove_scratch);
    }
    return scratch_file;
}

static void check_save_reload(const npy_array *a, int allow_bf16) {
    char err[512];
    const char *path = scratch_path();
    require(npy_save(path, a->dtype, a->ndim, a->shape, a->data, err, sizeof err) == 0);
    npy_array b;
    require(npy_load(path, allow_bf16, &b, err, sizeof err) == 0);
    require(b.dtype == a->dtype && b.ndim == a->ndim && b.count == a->count &&
            b.nbytes == a->nbytes);
    require(memcmp(b.shape, a->shape, sizeof a->shape[0] * (size_t)a->ndim) == 0);
    const unsigned char *x = a->data, *y = b.data;
    for (size_t i = 0; i < a->nbytes; i++)
        require(a->dtype == SDPA_BOOL ? y[i] == (x[i] != 0) : y[i] == x[i]);
    npy_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static unsigned long accepted;
    if (size == 0)
        return 0;
    const int allow_bf16 = data[size - 1] & 1;
    const size_t n = size - 1;
    unsigned char *file = malloc(n > 0 ? n : 1);
    require(file != NULL);
    memcpy(file, data, n);

    npy_array a;
    char err[512];
    if (npy_load_buffer(file, n, allow_bf16, fuzz_npy_name, &a, err, sizeof err) != 0) {
        require(a.data == NULL);
        require_names_file(err);
        free(file);
        return 0;
    }
    require_array(a.dtype, a.ndim, a.shape, a.count, a.nbytes);
    require(a.nbytes <= n && a.data != NULL);
    require(memcmp(a.data, file + (n - a.nbytes), a.nbytes) == 0);
    npy_header h;
    require(npy_parse_header(file, n, allow_bf16, fuzz_npy_name, &h, err, sizeof err) == 0);
    require(h.data_offset + h.data_bytes == n && h.dtype == a.dtype);
    if (accepted < 64 || accepted % 1000 == 0)
        check_save_reload(&a, allow_bf16);
    accepted++;
    npy_free(&a);
    free(file);
    return 0;
}
