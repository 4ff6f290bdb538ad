/*
 * outputs.h — the files one command writes, committed all or nothing.
 *
 * A command names its outputs (outputs_add) while it reads its options, checks them all
 * (outputs_check) before any work, and writes them (outputs_commit) when everything is
 * computed. The rules, which docs/sdpa.1 states for the user:
 *
 * - A regular file (existing, or a new name) is written to a temporary file in its directory
 *   and renamed over it only when every output is complete: an error or a signal leaves every
 *   output as it was and no temporary file behind. A replaced file keeps its mode (and its
 *   owner, where the user may set it). A symbolic link is written through: its target is
 *   replaced, the link stays.
 * - A character device (/dev/null, a terminal) or a FIFO is written directly, in place, after
 *   every regular output is complete and before any is renamed; /dev/stdout, /dev/stderr and
 *   /dev/fd/N write to that descriptor at its position, whatever it is (a pipe, a terminal, a
 *   file the shell opened). Bytes written there cannot be taken back: if a later step fails,
 *   the regular outputs are still left as they were.
 * - Directories, block devices and sockets are refused.
 * - No two outputs may be one file, and no output may be an input (compared by device and
 *   inode where the file exists, by directory and name where it does not). Character devices
 *   are streams and exempt: --out /dev/null --lse /dev/null is fine.
 * - A name longer than its file system allows, a missing or read-only directory: refused by
 *   outputs_check, before the work.
 */
#ifndef SDPA_CLI_OUTPUTS_H
#define SDPA_CLI_OUTPUTS_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

enum { OUTPUTS_MAX = 8, OUTPUTS_PATH = 4096 };

/* Writes one output's bytes to f. @return 0, or -1 with a message in err (the caller adds
 * the file's name). Write errors on f need no message: ferror and the close are checked. */
typedef int (*output_writer)(FILE *f, const void *arg, char *err, size_t errlen);

typedef enum output_kind {
    OUTPUT_NEW,     /* a name that does not exist yet: created by rename */
    OUTPUT_REPLACE, /* an existing regular file: replaced by rename */
    OUTPUT_STREAM,  /* a character device or FIFO: opened and written in place */
    OUTPUT_FD       /* /dev/stdout, /dev/fd/N and the like: written to descriptor fd */
} output_kind;

typedef struct output {
    const char *path;              /* as the user gave it */
    char label[OUTPUTS_PATH + 64]; /* for messages: "--out PATH" (or the path alone) */
    output_writer write;
    const void *arg;
    /* found by outputs_check */
    output_kind kind;
    char target[OUTPUTS_PATH]; /* NEW, REPLACE: the name renamed over (symlinks followed) */
    int fd;                    /* OUTPUT_FD */
    int is_chr;                /* a character device (exempt from the distinctness rule) */
    mode_t mode;               /* the mode the file gets (REPLACE: the old one) */
    uid_t uid;                 /* REPLACE: the old owner */
    gid_t gid;
    dev_t dev; /* the file (existing) or its directory (NEW) */
    ino_t ino;
    /* during outputs_commit */
    char tmp[OUTPUTS_PATH];
    char backup[OUTPUTS_PATH];
} output;

typedef struct outputs {
    int n;
    output o[OUTPUTS_MAX];
} outputs;

void outputs_init(outputs *s);

/* Names an output (a NULL path is ignored), written by write(f, arg, ...) at the commit;
 * arg may be filled in later, before outputs_commit. opt, the option that named it, starts
 * the messages about it ("--out x.npy: ..."); NULL for none. At most OUTPUTS_MAX. */
void outputs_add(outputs *s, const char *opt, const char *path, output_writer write,
                 const void *arg);

/* Checks every output against the rules above and the inputs (n_in options and paths; a NULL
 * path is skipped), with a message in err for the first that fails.
 * @return 0, 1 (the file system says no) or 2 (the arguments contradict each other: the
 *         command's usage-error code). */
int outputs_check(outputs *s, int n_in, const char *const *in_opts, const char *const *in_paths,
                  char *err, size_t errlen);

/* Writes every output and commits them (see the top of this file). Signals that end the
 * process (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE) remove the temporary files first.
 * @return 0, or -1 with a message naming the file in err. */
int outputs_commit(outputs *s, char *err, size_t errlen);

/* One file, checked and committed alone: for writers outside a command (npy_save). */
int outputs_write_one(const char *path, output_writer write, const void *arg, char *err,
                      size_t errlen);

#endif
