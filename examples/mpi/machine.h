/*
 * machine.h — the machine and the process, as examples/mpi/ring.c reports them (machine.c).
 */
#ifndef SDPA_EXAMPLE_MACHINE_H
#define SDPA_EXAMPLE_MACHINE_H

#include <stddef.h>
#include <stdint.h>

/* The CPUs a process may run on, as a bit mask of CPUs 0..1023 (sent as MPI_UINT64_T). */
enum { CPU_WORDS = 16 };

/* VmHWM of /proc/self/status in bytes, or -1. */
double peak_rss(void);

/* The first "model name" of /proc/cpuinfo, into name ("unknown CPU" elsewhere). */
void cpu_model(char *name, size_t size);

/* This process's CPUs into mask. @return their number, or 0 where unknown (not Linux). */
int cpus_allowed(uint64_t mask[CPU_WORDS]);

/* Lets the calling thread, and the threads it creates from now on, run on the CPUs of mask.
 * @return 1 if it did. */
int cpus_widen(const uint64_t mask[CPU_WORDS]);

/* mask as a list of ranges, "0-3,8", into text ("?" when empty: unknown).
 * @return the number of CPUs in mask. */
int cpu_list(const uint64_t mask[CPU_WORDS], char *text, size_t size);

#endif /* SDPA_EXAMPLE_MACHINE_H */
