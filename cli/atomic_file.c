/*
 * atomic_file.c — see atomic_file.h. mkstemp gives a fresh name in the target's directory (so
 * rename stays within one file system and is atomic); the file gets the usual 0666 & ~umask
 * permissions rather than mkstemp's 0600, as a file made by fopen would.
 */
#include "atomic_file.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int atomic_file_open(atomic_file *af, const char *path, char *err, size_t errlen) {
    memset(af, 0, sizeof *af);
    if (strlen(path) + 16 > sizeof af->tmp) {
        snprintf(err, errlen, "%s: path too long", path);
        return -1;
    }
    strcpy(af->path, path);
    snprintf(af->tmp, sizeof af->tmp, "%s.tmp.XXXXXX", path);
    const int fd = mkstemp(af->tmp);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot create a file there: %s", path, strerror(errno));
        af->tmp[0] = '\0';
        return -1;
    }
    const mode_t mask = umask(0);
    umask(mask);
    (void)fchmod(fd, 0666 & ~mask);
    af->f = fdopen(fd, "wb");
    if (af->f == NULL) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
        unlink(af->tmp);
        af->tmp[0] = '\0';
        return -1;
    }
    return 0;
}

int atomic_file_commit(atomic_file *af, char *err, size_t errlen) {
    if (af->f == NULL) {
        snprintf(err, errlen, "%s: not open", af->path);
        return -1;
    }
    const int write_error = ferror(af->f);
    const int close_error = fclose(af->f);
    af->f = NULL;
    if (write_error || close_error) {
        snprintf(err, errlen, "%s: write failed: %s", af->path,
                 close_error ? strerror(errno) : "I/O error");
        unlink(af->tmp);
        af->tmp[0] = '\0';
        return -1;
    }
    if (rename(af->tmp, af->path) != 0) {
        snprintf(err, errlen, "%s: cannot replace it: %s", af->path, strerror(errno));
        unlink(af->tmp);
        af->tmp[0] = '\0';
        return -1;
    }
    af->tmp[0] = '\0';
    return 0;
}

void atomic_file_abort(atomic_file *af) {
    if (af->f != NULL) {
        fclose(af->f);
        af->f = NULL;
    }
    if (af->tmp[0] != '\0') {
        unlink(af->tmp);
        af->tmp[0] = '\0';
    }
}
