/*
 * machine.c — what examples/mpi/ring.c reads about the machine and its own process: the CPU's
 * name, the CPUs the process may run on (and widening them), its peak resident memory. Linux
 * gives all of them; elsewhere they read as unknown.
 */
#ifdef __linux__
#define _GNU_SOURCE /* sched_getaffinity, sched_setaffinity */
#endif
#include "machine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sched.h>
#endif

/* VmHWM of /proc/self/status in bytes, or -1. */
double peak_rss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = -1.0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, "VmHWM:", 6) == 0)
            kb = strtod(line + 6, NULL);
    if (f != NULL)
        fclose(f);
    return kb < 0 ? -1.0 : kb * 1024.0;
}

/* The first "model name" of /proc/cpuinfo, into name. */
void cpu_model(char *name, size_t size) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    snprintf(name, size, "unknown CPU");
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        const char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && colon != NULL) {
            colon += strspn(colon + 1, " \t") + 1;
            snprintf(name, size, "%.*s", (int)strcspn(colon, "\n"), colon);
            break;
        }
    }
    if (f != NULL)
        fclose(f);
}

/* This process's CPUs into mask. @return their number, or 0 where unknown (not Linux). */
int cpus_allowed(uint64_t mask[CPU_WORDS]) {
    int n = 0;
    memset(mask, 0, CPU_WORDS * sizeof *mask);
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        for (int c = 0; c < CPU_WORDS * 64 && c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &set)) {
                mask[c / 64] |= (uint64_t)1 << (c % 64);
                n++;
            }
#endif
    return n;
}

/* Lets the calling thread, and the threads it creates from now on, run on the CPUs of mask.
 * @return 1 if it did. */
int cpus_widen(const uint64_t mask[CPU_WORDS]) {
#ifdef __linux__
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c = 0; c < CPU_WORDS * 64 && c < CPU_SETSIZE; c++)
        if (mask[c / 64] >> (c % 64) & 1)
            CPU_SET(c, &set);
    return sched_setaffinity(0, sizeof set, &set) == 0;
#else
    (void)mask;
    return 0;
#endif
}

/* mask as a list of ranges, "0-3,8", into text ("?" when empty: unknown).
 * @return the number of CPUs in mask. */
int cpu_list(const uint64_t mask[CPU_WORDS], char *text, size_t size) {
    size_t at = 0;
    int n = 0;
    snprintf(text, size, "?");
    for (int c = 0; c < CPU_WORDS * 64 && at < size; c++) {
        if (!(mask[c / 64] >> (c % 64) & 1))
            continue;
        int e = c;
        while (e + 1 < CPU_WORDS * 64 && (mask[(e + 1) / 64] >> ((e + 1) % 64) & 1))
            e++;
        const int w = e > c ? snprintf(text + at, size - at, "%s%d-%d", at ? "," : "", c, e)
                            : snprintf(text + at, size - at, "%s%d", at ? "," : "", c);
        at += w > 0 ? (size_t)w : 0;
        n += e - c + 1;
        c = e;
    }
    return n;
}
