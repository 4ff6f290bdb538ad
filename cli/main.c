/*
 * main.c — `sdpa`: the command line of the sdpa library. Dispatches to the subcommands.
 */
#include "args.h"
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

/* The subcommands, by name; each takes the arguments after its own name. */
static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
} commands[] = {{"demo", cli_demo}, {"explain", cli_explain}, {"heatmap", cli_heatmap},
                {"run", cli_run},   {"info", cli_info},       {"bench", cli_bench}};

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(usage, stderr);
        return CLI_USAGE;
    }
    const char *cmd = argv[1];
    for (size_t n = 0; n < sizeof commands / sizeof commands[0]; n++)
        if (strcmp(cmd, commands[n].name) == 0)
            return commands[n].run(argc - 2, argv + 2);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("sdpa %s\n", sdpa_version());
        return CLI_OK;
    }
    if (strcmp(cmd, "help") == 0 || cli_is_help(cmd)) {
        fputs(usage, stdout);
        return CLI_OK;
    }
    fprintf(stderr, "sdpa: unknown command '%s'\n\n%s", cmd, usage);
    return CLI_USAGE;
}
