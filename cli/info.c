/*
 * info.c — `sdpa info`: what the library detected and chose on this machine.
 */
#include "args.h"
#include "cli.h"

#include "sdpa.h"

#include <stdio.h>

static const char help[] =
    "usage: sdpa info\n\n"
    "Prints the CPU features the library detected (CPUID and XGETBV), the caps\n"
    "applied (SDPA_MAX_ISA in the environment may lower the choice), the\n"
    "instruction-set level chosen, the thread count and the kernels.";

int cli_info(int argc, char **argv) {
    const int prc = cli_no_options("info", argc, argv, help);
    if (prc >= 0)
        return prc;
    sdpa_ctx *ctx;
    sdpa_status st = sdpa_ctx_create(NULL, &ctx);
    if (st != SDPA_OK) {
        fprintf(stderr, "sdpa info: cannot create a context: %s\n", sdpa_status_str(st));
        return CLI_RUNTIME;
    }
    fputs(sdpa_ctx_describe(ctx), stdout);
    sdpa_ctx_destroy(ctx);
    return CLI_OK;
}
