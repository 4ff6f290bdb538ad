/*
 * main.c — `sdpa`: the command line of the sdpa library. Dispatches to the subcommands.
 */
#include "cli.h"

#include "sdpa.h"

#include <stdio.h>
#include <string.h>

static const char usage[] =
    "usage: sdpa <command> [options]\n"
    "\n"
    "Scaled dot-product attention, softmax(Q K^T / sqrt(d_k)) V, exact and on the CPU.\n"
    "\n"
    "commands:\n"
    "  demo      the 4-token worked example, step by step, through the library\n"
    "  explain   attention taught step by step on small examples, yours or random\n"
    "  run       attention on your .npy arrays, with every option of the library\n"
    "  heatmap   draw attention weights saved as .npy as a PNG heatmap\n"
    "  bench     time sdpa_forward against this machine's measured FMA peak\n"
    "  info      the CPU features detected and the kernels chosen\n"
    "  version   print the library version\n"
    "  help      this text\n"
    "\n"
    "Run 'sdpa <command> --help' for a command's options.\n"
    "Exit codes: 0 success, 1 runtime error, 2 usage error.\n";

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(usage, stderr);
        return CLI_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "demo") == 0)
        return cli_demo(argc - 2, argv + 2);
    if (strcmp(cmd, "explain") == 0)
        return cli_explain(argc - 2, argv + 2);
    if (strcmp(cmd, "heatmap") == 0)
        return cli_heatmap(argc - 2, argv + 2);
    if (strcmp(cmd, "run") == 0)
        return cli_run(argc - 2, argv + 2);
    if (strcmp(cmd, "info") == 0)
        return cli_info(argc - 2, argv + 2);
    if (strcmp(cmd, "bench") == 0)
        return cli_bench(argc - 2, argv + 2);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("sdpa %s\n", sdpa_version());
        return CLI_OK;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        fputs(usage, stdout);
        return CLI_OK;
    }
    fprintf(stderr, "sdpa: unknown command '%s'\n\n%s", cmd, usage);
    return CLI_USAGE;
}
