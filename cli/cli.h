/*
 * cli.h — the subcommands of the `sdpa` command. Each takes the arguments after its own name
 * and returns the process exit code: 0 ok, 1 runtime error, 2 usage error.
 */
#ifndef SDPA_CLI_H
#define SDPA_CLI_H

#include <stdint.h>

enum { CLI_OK = 0, CLI_RUNTIME = 1, CLI_USAGE = 2 };

int cli_demo(int argc, char **argv);
int cli_info(int argc, char **argv);
int cli_run(int argc, char **argv);     /* run.c */
int cli_explain(int argc, char **argv); /* explain.c */
int cli_heatmap(int argc, char **argv); /* heatmap_cmd.c */
int cli_bench(int argc, char **argv);   /* bench.c */

/* ALiBi's standard slopes for h heads into slopes[h] (run.c; sdpa run and sdpa bench --alibi). */
void cli_alibi_slopes(int64_t h, float *slopes);

#endif
