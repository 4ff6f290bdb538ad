/*
 * info.c — `sdpa info`: what the library detected and chose on this machine.
 */
#include "args.h"
#include "cli.h"

#include "sdpa.h"

#include <stdio.h>
#include <string.h>

int cli_info(int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            puts("usage: sdpa info\n\n"
                 "Prints the CPU features the library detected (CPUID and XGETBV), the caps\n"
                 "applied (SDPA_MAX_ISA in the environment may lower the choice), the\n"
                 "instruction-set level chosen, the thread count and the kernels.");
            return CLI_OK;
        }
        return cli_usage_error("info", "unknown option '%s'", argv[i]);
    }
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
