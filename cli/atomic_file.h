/*
 * atomic_file.h — writing an output file so that a failure never leaves a partial one: the
 * bytes go to a temporary file in the target's directory, which is renamed over the target
 * only when everything was written and closed successfully.
 */
#ifndef SDPA_CLI_ATOMIC_FILE_H
#define SDPA_CLI_ATOMIC_FILE_H

#include <stddef.h>
#include <stdio.h>

typedef struct atomic_file {
    FILE *f;         /* write here */
    char tmp[4096];  /* the temporary file's path */
    char path[4096]; /* the target */
} atomic_file;

/* Creates the temporary file next to path. @return 0, or -1 with a message in err. */
int atomic_file_open(atomic_file *af, const char *path, char *err, size_t errlen);

/* Closes the temporary file and renames it over the target. On any error (including an
 * earlier write error on af->f) removes the temporary file and returns -1 with a message. */
int atomic_file_commit(atomic_file *af, char *err, size_t errlen);

/* Gives up: closes and removes the temporary file. Safe to call after a failed commit. */
void atomic_file_abort(atomic_file *af);

#endif
