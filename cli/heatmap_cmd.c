/*
 * heatmap_cmd.c — `sdpa heatmap`: draws attention weights saved as .npy (by `sdpa run
 * --weights`, or by numpy) as a PNG heatmap (heatmap.h). Exit codes: 0 ok, 1 runtime error
 * (a file that cannot be read or written), 2 usage error (options, or options that do not
 * fit the array, such as a head it does not have).
 */
#include "args.h"
#include "cli.h"
#include "heatmap.h"
#include "npy.h"
#include "outputs.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char heatmap_usage[] =
    "usage: sdpa heatmap --weights W.npy --out W.png [--head H|all] [--batch B]\n"
    "                    [--title TEXT] [--subtitle TEXT] [--max-cells N]\n"
    "\n"
    "Draws attention weights as a PNG heatmap: row i is query position i, column j is key\n"
    "position j, and the colour of cell (i, j) is the weight query i gives to key j (each row\n"
    "sums to 1). The colour map is viridis (dark violet for 0, or for the least value when\n"
    "some are negative, yellow for the largest shown); the colour bar on the right gives the\n"
    "scale. Cells that are NaN or infinite are magenta and counted under the colour bar.\n"
    "Values below 0 (not attention weights) are counted in the title and warned about, also\n"
    "when averaging hides them. Large cells show their value.\n"
    "\n"
    "options:\n"
    "  --weights FILE  a float32 .npy array of weights: (Lq, Lk), (H, Lq, Lk) or\n"
    "                  (B, H, Lq, Lk), as written by 'sdpa run --weights'\n"
    "  --out FILE      the PNG to write (through a temporary file, so a failure never\n"
    "                  leaves a partial one; not the weights' own file; /dev/stdout works)\n"
    "  --head H        draw head H only; 'all' (the default) draws a grid of every head of\n"
    "                  the batch element, at most 64, on one shared colour scale\n"
    "  --batch B       the batch element to draw (default 0)\n"
    "  --title TEXT    the first title line (default: 'attention weights from FILE')\n"
    "  --subtitle TEXT a second title line, e.g. the options the weights were computed with\n"
    "  --max-cells N   the longest axis drawn cell by cell (default 256); a longer one is\n"
    "                  shown as means over blocks of ceil(L / N) positions, and the title\n"
    "                  says so. A grid of many heads may average more to fit 2000 pixels.\n"
    "\n"
    "The title also gives the shape (B, H, Lq, Lk) and which batch element and head.\n"
    "Exit codes: 0 success, 1 runtime error, 2 usage error.\n";

int cli_heatmap(int argc, char **argv) {
    const char *weights = NULL, *out = NULL, *title = NULL, *subtitle = NULL, *v;
    int64_t head = -1, batch = 0, max_cells = HEATMAP_DEFAULT_CELLS;
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            fputs(heatmap_usage, stdout);
            return CLI_OK;
        } else if (cli_option_value(argc, argv, &i, "--weights", &v)) {
            if (v == NULL || *v == '\0')
                return cli_usage_error("heatmap", "--weights needs a file");
            weights = v;
        } else if (cli_option_value(argc, argv, &i, "--out", &v)) {
            if (v == NULL || *v == '\0')
                return cli_usage_error("heatmap", "--out needs a file");
            out = v;
        } else if (cli_option_value(argc, argv, &i, "--head", &v)) {
            if (v != NULL && strcmp(v, "all") == 0)
                head = -1;
            else if (cli_parse_int(v, 0, INT64_MAX, &head) != 0)
                return cli_usage_error(
                    "heatmap", "--head needs a head number >= 0 or 'all', not '%s'", v ? v : "");
        } else if (cli_option_value(argc, argv, &i, "--batch", &v)) {
            if (cli_parse_int(v, 0, INT64_MAX, &batch) != 0)
                return cli_usage_error("heatmap", "--batch needs a number >= 0, not '%s'",
                                       v ? v : "");
        } else if (cli_option_value(argc, argv, &i, "--title", &v)) {
            if (v == NULL)
                return cli_usage_error("heatmap", "--title needs a text");
            title = v;
        } else if (cli_option_value(argc, argv, &i, "--subtitle", &v)) {
            if (v == NULL)
                return cli_usage_error("heatmap", "--subtitle needs a text");
            subtitle = v;
        } else if (cli_option_value(argc, argv, &i, "--max-cells", &v)) {
            if (cli_parse_int(v, 1, HEATMAP_MAX_SIDE, &max_cells) != 0)
                return cli_usage_error("heatmap", "--max-cells needs a number in [1, %d], not '%s'",
                                       HEATMAP_MAX_SIDE, v ? v : "");
        } else {
            return cli_usage_error("heatmap", "unknown option '%s'", argv[i]);
        }
    }
    if (weights == NULL || out == NULL)
        return cli_usage_error("heatmap", "--weights and --out are required");

    char err[1024];
    heatmap_png pic = {0};
    outputs outs;
    outputs_init(&outs);
    outputs_add(&outs, "--out", out, heatmap_png_write, &pic);
    const char *const in_opt = "--weights";
    const int bad = outputs_check(&outs, 1, &in_opt, &weights, err, sizeof err);
    if (bad != 0) {
        fprintf(stderr, "sdpa heatmap: %s\n", err);
        return bad;
    }
    npy_array a;
    if (npy_load(weights, 0, &a, err, sizeof err) != 0) {
        fprintf(stderr, "sdpa heatmap: %s\n", err);
        return CLI_RUNTIME;
    }
    int rc = CLI_OK;
    if (a.dtype != SDPA_F32) {
        fprintf(stderr, "sdpa heatmap: %s: the weights must be float32 ('<f4'), not %s\n", weights,
                sdpa_dtype_name(a.dtype));
        rc = CLI_RUNTIME;
        goto done;
    }
    if (a.ndim < 2 || a.ndim > 4) {
        fprintf(stderr,
                "sdpa heatmap: %s: an array of rank %d; weights have rank 2 (Lq, Lk), "
                "3 (H, Lq, Lk) or 4 (B, H, Lq, Lk)\n",
                weights, a.ndim);
        rc = CLI_RUNTIME;
        goto done;
    }
    /* Pad the shape on the left to (B, H, Lq, Lk). */
    int64_t shape[4] = {1, 1, 1, 1};
    for (int d = 0; d < a.ndim; d++)
        shape[4 - a.ndim + d] = a.shape[d];
    if (a.count == 0) {
        fprintf(stderr, "sdpa heatmap: %s: the array is empty\n", weights);
        rc = CLI_RUNTIME;
        goto done;
    }
    if (batch >= shape[0] || head >= shape[1]) {
        rc = cli_usage_error("heatmap",
                             "%s has shape (B, H, Lq, Lk) = (%lld, %lld, %lld, %lld): no %s %lld",
                             weights, (long long)shape[0], (long long)shape[1], (long long)shape[2],
                             (long long)shape[3], batch >= shape[0] ? "batch" : "head",
                             (long long)(batch >= shape[0] ? batch : head));
        goto done;
    }
    if (head < 0 && shape[1] > HEATMAP_MAX_PANELS) {
        rc = cli_usage_error("heatmap",
                             "%s has %lld heads, too many for one grid (at most %d): choose one "
                             "with --head",
                             weights, (long long)shape[1], HEATMAP_MAX_PANELS);
        goto done;
    }

    char default_title[600];
    snprintf(default_title, sizeof default_title, "attention weights from %s", weights);
    heatmap_opts o = heatmap_opts_default();
    o.batch = batch;
    o.head = head;
    o.title = title != NULL ? title : default_title;
    o.subtitle = subtitle;
    o.max_cells = (int)max_cells;
    uint8_t *px = NULL;
    heatmap_geometry g;
    if (heatmap_render(a.data, shape[0], shape[1], shape[2], shape[3], &o, &px, &g, err,
                       sizeof err) == 0) {
        pic.rgb = px;
        pic.width = g.width;
        pic.height = g.height;
    }
    if (px == NULL || outputs_commit(&outs, err, sizeof err) != 0) {
        fprintf(stderr, "sdpa heatmap: %s\n", err);
        rc = CLI_RUNTIME;
    } else if (g.negative > 0) {
        /* not an error (any float array can be drawn), but not attention weights either */
        fprintf(stderr,
                "sdpa heatmap: warning: %s: %lld value%s below 0 (the least %.3g), which "
                "attention weights never are; they are drawn on the same linear scale%s\n",
                weights, (long long)g.negative, g.negative == 1 ? " is" : "s are", g.least,
                g.least < g.lo ? ", but averaging blocks hides them: --max-cells to draw "
                                 "every cell"
                               : "");
    }
    free(px);
done:
    npy_free(&a);
    return rc;
}
