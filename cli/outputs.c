/*
 * outputs.c — see outputs.h. The commit runs in three steps:
 *   1. every regular output is written to a temporary file (mkstemp, ".sdpa.tmp.XXXXXX" in
 *      the target's directory: a fixed short name, so an output name as long as the file
 *      system allows still has room), flushed, synced and closed;
 *   2. every stream is opened and written in place;
 *   3. with the catchable signals blocked, each existing target gets a hard link as a backup,
 *      the temporaries are renamed over their targets, and on a failed rename the targets
 *      already renamed are put back from their backups (or removed, when they were new).
 * A signal during steps 1 and 2 runs on_signal, which removes the registered temporaries and
 * ends the process with the same signal.
 */
#define _GNU_SOURCE /* strerror, fchown, mkostemp, O_CLOEXEC */
#include "outputs.h"

#include "args.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void outputs_init(outputs *s) {
    memset(s, 0, sizeof *s);
}

void outputs_add(outputs *s, const char *opt, const char *path, output_writer write,
                 const void *arg) {
    if (path == NULL || s->n >= OUTPUTS_MAX)
        return;
    output *o = &s->o[s->n++];
    memset(o, 0, sizeof *o);
    o->path = path;
    snprintf(o->label, sizeof o->label, "%s%s%s", opt != NULL ? opt : "", opt != NULL ? " " : "",
             path);
    o->write = write;
    o->arg = arg;
    o->fd = -1;
}

/* ---- finding what a path names ---- */

/* The directory part of path (".", "/" or the text before the last slash) into dir. */
static void dir_of(const char *path, char *dir, size_t len) {
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        snprintf(dir, len, ".");
    else if (slash == path)
        snprintf(dir, len, "/");
    else
        snprintf(dir, len, "%.*s", (int)(slash - path), path);
}

static const char *base_of(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash != NULL ? slash + 1 : path;
}

/* The descriptor a path names by itself: /dev/stdout, /dev/stderr, /dev/fd/N,
 * /proc/self/fd/N and /proc/PID/fd/N of this process. @return it, or -1. */
static int fd_alias(const char *path) {
    if (strcmp(path, "/dev/stdout") == 0)
        return 1;
    if (strcmp(path, "/dev/stderr") == 0)
        return 2;
    char self[64];
    snprintf(self, sizeof self, "/proc/%ld/fd/", (long)getpid());
    const char *prefixes[] = {"/dev/fd/", "/proc/self/fd/", "/proc/thread-self/fd/", self};
    for (size_t n = 0; n < sizeof prefixes / sizeof prefixes[0]; n++) {
        const size_t len = strlen(prefixes[n]);
        if (strncmp(path, prefixes[n], len) != 0)
            continue;
        const char *num = path + len;
        char *end;
        errno = 0;
        const long fd = strtol(num, &end, 10);
        if (num[0] >= '0' && num[0] <= '9' && *end == '\0' && errno == 0 && fd <= INT_MAX)
            return (int)fd;
    }
    return -1;
}

/* A name that does not exist: where a chain of symbolic links ends (a link to a missing
 * file is written through, as the shell's > does). @return 0 with the name in out, or -1. */
static int follow_dangling(const char *path, char *out, size_t len) {
    char cur[OUTPUTS_PATH];
    snprintf(cur, sizeof cur, "%s", path);
    for (int hops = 0; hops < 40; hops++) {
        struct stat st;
        if (lstat(cur, &st) != 0) {
            if (errno != ENOENT)
                return -1;
            snprintf(out, len, "%s", cur);
            return 0;
        }
        if (!S_ISLNK(st.st_mode)) {
            errno = EEXIST; /* it exists after all: a race with another process */
            return -1;
        }
        char link[OUTPUTS_PATH];
        const ssize_t n = readlink(cur, link, sizeof link - 1);
        if (n < 0)
            return -1;
        link[n] = '\0';
        char next[OUTPUTS_PATH], dir[OUTPUTS_PATH];
        dir_of(cur, dir, sizeof dir);
        const int w = link[0] == '/' ? snprintf(next, sizeof next, "%s", link)
                                     : snprintf(next, sizeof next, "%s/%s", dir, link);
        if (w < 0 || (size_t)w >= sizeof next) {
            errno = ENAMETOOLONG;
            return -1;
        }
        memcpy(cur, next, sizeof cur);
    }
    errno = ELOOP;
    return -1;
}

/* Whether a new file named base can be made in directory dir; sets o's dev/ino to the
 * directory's. @return 0, or -1 with a message. */
static int check_new_name(output *o, const char *dir, const char *base, char *err, size_t errlen) {
    struct stat st;
    if (stat(dir, &st) != 0) {
        cli_error(err, errlen, o->label, "no directory %s: %s", dir, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        cli_error(err, errlen, o->label, "%s is not a directory", dir);
        return -1;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        cli_error(err, errlen, o->label, "cannot write in %s: %s", dir, strerror(errno));
        return -1;
    }
    if (base[0] == '\0') {
        cli_error(err, errlen, o->label, "no file name after the directory");
        return -1;
    }
    const long name_max = pathconf(dir, _PC_NAME_MAX);
    if (name_max > 0 && strlen(base) > (size_t)name_max) {
        cli_error(err, errlen, o->label,
                  "the file name is too long (%zu bytes; this file system takes %ld)", strlen(base),
                  name_max);
        return -1;
    }
    o->dev = st.st_dev;
    o->ino = st.st_ino;
    return 0;
}

/* What o->path names, and whether it can be written. @return 0, or -1 with a message. */
static int resolve(output *o, char *err, size_t errlen) {
    struct stat st;
    const int fd = fd_alias(o->path);
    if (fd >= 0) {
        const int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || (fl & O_ACCMODE) == O_RDONLY || fstat(fd, &st) != 0) {
            cli_error(err, errlen, o->label, "descriptor %d is not open for writing", fd);
            return -1;
        }
        o->kind = OUTPUT_FD;
        o->fd = fd;
        o->is_chr = S_ISCHR(st.st_mode);
        o->dev = st.st_dev;
        o->ino = st.st_ino;
        return 0;
    }
    if (stat(o->path, &st) != 0) {
        if (errno != ENOENT) {
            cli_error(err, errlen, o->label, "%s", strerror(errno));
            return -1;
        }
        if (follow_dangling(o->path, o->target, sizeof o->target) != 0) {
            cli_error(err, errlen, o->label, "%s", strerror(errno));
            return -1;
        }
        char dir[OUTPUTS_PATH];
        dir_of(o->target, dir, sizeof dir);
        o->kind = OUTPUT_NEW;
        const mode_t mask = umask(0);
        umask(mask);
        o->mode = 0666 & ~mask;
        return check_new_name(o, dir, base_of(o->target), err, errlen);
    }
    o->dev = st.st_dev;
    o->ino = st.st_ino;
    if (S_ISREG(st.st_mode)) {
        if (realpath(o->path, o->target) == NULL) {
            cli_error(err, errlen, o->label, "%s", strerror(errno));
            return -1;
        }
        char dir[OUTPUTS_PATH];
        dir_of(o->target, dir, sizeof dir);
        if (access(dir, W_OK | X_OK) != 0) {
            cli_error(err, errlen, o->label, "cannot write in %s: %s", dir, strerror(errno));
            return -1;
        }
        o->kind = OUTPUT_REPLACE;
        o->mode = st.st_mode & 07777;
        o->uid = st.st_uid;
        o->gid = st.st_gid;
        return 0;
    }
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
        if (access(o->path, W_OK) != 0) {
            cli_error(err, errlen, o->label, "%s", strerror(errno));
            return -1;
        }
        o->kind = OUTPUT_STREAM;
        o->is_chr = S_ISCHR(st.st_mode);
        return 0;
    }
    cli_error(err, errlen, o->label,
              "is a %s; an output is a regular file, a character device (/dev/null), a "
              "FIFO or /dev/stdout",
              S_ISDIR(st.st_mode)    ? "directory"
              : S_ISBLK(st.st_mode)  ? "block device"
              : S_ISSOCK(st.st_mode) ? "socket"
                                     : "special file");
    return -1;
}

/* Whether outputs a and b are one file. New names compare by directory and name. */
static int same_file(const output *a, const output *b) {
    if (a->is_chr || b->is_chr)
        return 0;
    const int a_new = a->kind == OUTPUT_NEW, b_new = b->kind == OUTPUT_NEW;
    if (a_new != b_new)
        return 0;
    if (a->dev != b->dev || a->ino != b->ino)
        return 0;
    return !a_new || strcmp(base_of(a->target), base_of(b->target)) == 0;
}

int outputs_check(outputs *s, int n_in, const char *const *in_opts, const char *const *in_paths,
                  char *err, size_t errlen) {
    for (int n = 0; n < s->n; n++)
        if (resolve(&s->o[n], err, errlen) != 0)
            return 1;
    for (int a = 0; a < s->n; a++)
        for (int b = a + 1; b < s->n; b++)
            if (same_file(&s->o[a], &s->o[b])) {
                snprintf(err, errlen, "%s and %s name the same file: each output needs its own",
                         s->o[a].label, s->o[b].label);
                return 2;
            }
    for (int i = 0; i < n_in; i++) {
        struct stat st;
        if (in_paths[i] == NULL || stat(in_paths[i], &st) != 0 || S_ISCHR(st.st_mode))
            continue;
        for (int n = 0; n < s->n; n++) {
            const output *o = &s->o[n];
            if (o->kind != OUTPUT_NEW && !o->is_chr && o->dev == st.st_dev && o->ino == st.st_ino) {
                snprintf(err, errlen, "%s is the input %s %s: an output may not overwrite an input",
                         o->label, in_opts[i], in_paths[i]);
                return 2;
            }
        }
    }
    return 0;
}

/* ---- signals: remove the temporaries, then die of the signal ---- */

static const int caught[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE};
enum { N_CAUGHT = sizeof caught / sizeof caught[0] };
/* The temporaries on_signal removes: slots are filled with signals blocked. */
static char registered[OUTPUTS_MAX][OUTPUTS_PATH];
static volatile sig_atomic_t n_registered;

static void on_signal(int sig) {
    for (sig_atomic_t i = 0; i < n_registered; i++)
        if (registered[i][0] != '\0')
            unlink(registered[i]);
    signal(sig, SIG_DFL);
    raise(sig); /* SA_NODEFER: delivered now, with the default action */
}

static void block_signals(sigset_t *old) {
    sigset_t set;
    sigemptyset(&set);
    for (int n = 0; n < N_CAUGHT; n++)
        sigaddset(&set, caught[n]);
    sigprocmask(SIG_BLOCK, &set, old);
}

/* ---- the commit ---- */

/* The temporary file for o, registered for on_signal, its mode (and owner) set.
 * @return its descriptor, or -1 with a message. */
static int make_temp(output *o, char *err, size_t errlen) {
    char dir[OUTPUTS_PATH];
    dir_of(o->target, dir, sizeof dir);
    const int w = snprintf(o->tmp, sizeof o->tmp, "%s/.sdpa.tmp.XXXXXX", dir);
    if (w < 0 || (size_t)w >= sizeof o->tmp) {
        cli_error(err, errlen, o->label, "path too long");
        o->tmp[0] = '\0';
        return -1;
    }
    sigset_t old;
    block_signals(&old);
    const int fd = mkostemp(o->tmp, O_CLOEXEC);
    const int saved = errno;
    if (fd >= 0)
        memcpy(registered[n_registered++], o->tmp, sizeof o->tmp);
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (fd < 0) {
        cli_error(err, errlen, o->label, "cannot create a file in %s: %s", dir, strerror(saved));
        o->tmp[0] = '\0';
        return -1;
    }
    mode_t mode = o->mode;
    if (o->kind == OUTPUT_REPLACE && (o->uid != geteuid() || o->gid != getegid()) &&
        fchown(fd, o->uid, o->gid) != 0)
        mode &= 0777; /* not set-id bits for someone else's file under our name */
    (void)fchmod(fd, mode);
    return fd;
}

/* Runs o's writer on descriptor fd (closed here). @return 0, or -1 with a message. */
static int write_to(output *o, int fd, int sync, char *err, size_t errlen) {
    FILE *f = fdopen(fd, "wb");
    if (f == NULL) {
        cli_error(err, errlen, o->label, "%s", strerror(errno));
        close(fd);
        return -1;
    }
    char why[512] = "";
    int bad = o->write(f, o->arg, why, sizeof why) != 0;
    int saved = 0;
    if (!bad && (fflush(f) != 0 || ferror(f) || (sync && fsync(fd) != 0 && errno != EINVAL))) {
        bad = 1;
        saved = errno;
    }
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        saved = errno;
    }
    if (bad)
        cli_error(err, errlen, o->label, "%s%s",
                  why[0] ? why : "write failed: ", why[0] ? "" : strerror(saved ? saved : EIO));
    return bad ? -1 : 0;
}

/* Removes every temporary and backup and forgets them. */
static void clean_up(outputs *s) {
    sigset_t old;
    block_signals(&old);
    for (int n = 0; n < s->n; n++) {
        if (s->o[n].tmp[0] != '\0')
            unlink(s->o[n].tmp);
        if (s->o[n].backup[0] != '\0')
            unlink(s->o[n].backup);
        s->o[n].tmp[0] = s->o[n].backup[0] = '\0';
    }
    n_registered = 0;
    sigprocmask(SIG_SETMASK, &old, NULL);
}

/* A hard link to o's old file under a fresh name, to put it back if a later rename fails.
 * A file system without hard links leaves o without one (it cannot be put back). */
static void make_backup(output *o) {
    char dir[OUTPUTS_PATH];
    dir_of(o->target, dir, sizeof dir);
    static unsigned long counter;
    for (int tries = 0; tries < 100; tries++) {
        const int w = snprintf(o->backup, sizeof o->backup, "%s/.sdpa.bak.%ld.%lu", dir,
                               (long)getpid(), counter++);
        if (w > 0 && (size_t)w < sizeof o->backup && link(o->target, o->backup) == 0)
            return;
        if (errno != EEXIST)
            break;
    }
    o->backup[0] = '\0';
}

/* Step 3: renames every temporary over its target, all or (as far as the file system lets)
 * none. Called with the signals blocked. @return 0, or -1 with a message. */
static int rename_all(outputs *s, char *err, size_t errlen) {
    for (int n = 0; n < s->n; n++)
        if (s->o[n].kind == OUTPUT_REPLACE)
            make_backup(&s->o[n]);
    for (int n = 0; n < s->n; n++) {
        output *o = &s->o[n];
        if (o->kind != OUTPUT_NEW && o->kind != OUTPUT_REPLACE)
            continue;
        if (rename(o->tmp, o->target) == 0) {
            o->tmp[0] = '\0';
            continue;
        }
        cli_error(err, errlen, o->label, "cannot replace it: %s", strerror(errno));
        for (int back = 0; back < n; back++) {
            output *b = &s->o[back];
            if (b->kind == OUTPUT_NEW)
                unlink(b->target);
            else if (b->kind == OUTPUT_REPLACE && b->backup[0] != '\0' &&
                     rename(b->backup, b->target) == 0)
                b->backup[0] = '\0';
        }
        return -1;
    }
    return 0;
}

int outputs_commit(outputs *s, char *err, size_t errlen) {
    struct sigaction act, old_act[N_CAUGHT], old_xfsz;
    memset(&act, 0, sizeof act);
    act.sa_handler = on_signal;
    act.sa_flags = SA_NODEFER | SA_RESETHAND;
    sigemptyset(&act.sa_mask);
    for (int n = 0; n < N_CAUGHT; n++) {
        sigaction(caught[n], NULL, &old_act[n]);
        if (old_act[n].sa_handler != SIG_IGN) /* ignored stays ignored (nohup, a & job) */
            sigaction(caught[n], &act, NULL);
    }
    /* past the file-size limit a write fails with EFBIG and a message, not a core dump */
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigaction(SIGXFSZ, &ign, &old_xfsz);

    int rc = 0;
    // 1: the regular files, complete in their temporaries
    for (int n = 0; rc == 0 && n < s->n; n++) {
        output *o = &s->o[n];
        if (o->kind != OUTPUT_NEW && o->kind != OUTPUT_REPLACE)
            continue;
        const int fd = make_temp(o, err, errlen);
        rc = fd < 0 ? -1 : write_to(o, fd, 1, err, errlen);
    }
    // 2: the streams, in place
    fflush(NULL); /* what the command printed comes before what it writes to stdout */
    for (int n = 0; rc == 0 && n < s->n; n++) {
        output *o = &s->o[n];
        int fd = -1;
        if (o->kind == OUTPUT_FD)
            fd = dup(o->fd);
        else if (o->kind == OUTPUT_STREAM)
            fd = open(o->path, O_WRONLY | O_NOCTTY | O_CLOEXEC);
        else
            continue;
        if (fd < 0) {
            cli_error(err, errlen, o->label, "%s", strerror(errno));
            rc = -1;
        } else {
            rc = write_to(o, fd, 0, err, errlen);
        }
    }
    // 3: the renames
    if (rc == 0) {
        sigset_t old;
        block_signals(&old);
        rc = rename_all(s, err, errlen);
        sigprocmask(SIG_SETMASK, &old, NULL);
    }
    clean_up(s);
    for (int n = 0; n < N_CAUGHT; n++)
        sigaction(caught[n], &old_act[n], NULL);
    sigaction(SIGXFSZ, &old_xfsz, NULL);
    return rc;
}

int outputs_write_one(const char *path, output_writer write, const void *arg, char *err,
                      size_t errlen) {
    outputs s;
    outputs_init(&s);
    outputs_add(&s, NULL, path, write, arg);
    if (outputs_check(&s, 0, NULL, NULL, err, errlen) != 0)
        return -1;
    return outputs_commit(&s, err, errlen);
}
