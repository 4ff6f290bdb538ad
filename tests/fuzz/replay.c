/*
 * replay.c — runs a fuzz target's LLVMFuzzerTestOneInput over every file of the directories
 * (or the files) named on the command line, so that the committed corpus is replayed as an
 * ordinary test in every build, sanitized or not, without libFuzzer. The target reports a
 * finding by crashing or aborting, which fails the test; so does finding no input at all (a
 * lost corpus must not pass quietly). Each input is passed in an allocation of exactly its
 * size, as libFuzzer does, so that ASan sees reads past the end.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Runs the target on one file; an unreadable file ends the program with an error. */
static void replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        exit(1);
    }
    struct stat st;
    if (stat(path, &st) != 0 || st.st_size > (1 << 24)) {
        fprintf(stderr, "replay: %s: not a corpus file (over 16 MiB?)\n", path);
        exit(1);
    }
    const size_t size = (size_t)st.st_size;
    uint8_t *data = malloc(size > 0 ? size : 1);
    if (data == NULL || fread(data, 1, size, f) != size) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        exit(1);
    }
    fclose(f);
    LLVMFuzzerTestOneInput(data, size);
    free(data);
}

int main(int argc, char **argv) {
    long n = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s does not exist\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            replay_file(argv[i]);
            n++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (d == NULL) {
            fprintf(stderr, "replay: cannot list %s\n", argv[i]);
            return 1;
        }
        char path[4096];
        for (struct dirent *e; (e = readdir(d)) != NULL;) {
            if (e->d_name[0] == '.')
                continue;
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
                replay_file(path);
                n++;
            }
        }
        closedir(d);
    }
    printf("replayed %ld inputs\n", n);
    return n > 0 ? 0 : 1;
}
