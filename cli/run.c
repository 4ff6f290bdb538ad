/*
 * run.c — `sdpa run`: attention on the user's own .npy arrays, with every parameter of the
 * library's contract on the command line, writing the output (and, on request, the
 * log-sum-exp, the attention weights and a heatmap of them) as .npy / .png files.
 *
 * Arrays of rank 2 (L, D), 3 (H, L, D) or 4 (B, H, L, D) are aligned on the right, as numpy
 * broadcasts; a mask of rank 1 to 4 likewise (shape (..., Lq, Lk)). Everything is checked and
 * computed before the first file is written, and the files are committed all or nothing
 * (outputs.h): an error never leaves a partial file behind, or some files new and some old.
 */
#include "args.h"
#include "cli.h"
#include "heatmap.h"
#include "npy.h"
#include "outputs.h"

#include "sdpa.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
    "usage: sdpa run --q Q.npy --k K.npy --v V.npy [options]\n"
    "\n"
    "Computes softmax(Q K^T * scale + bias) V on .npy arrays and writes the output.\n"
    "Q is (Lq, Dk), (Hq, Lq, Dk) or (B, Hq, Lq, Dk); K is (.., Hkv, Lk, Dk) and V\n"
    "(.., Hkv, Lk, Dv) of the same rank; Hq must be a multiple of Hkv (grouped-query\n"
    "attention). dtypes: <f4, <f2 (and bfloat16 stored as <V2/<u2 with --dtype bf16).\n"
    "\n"
    "inputs:\n"
    "  --q FILE, --k FILE, --v FILE   the queries, keys and values (required)\n"
    "  --mask FILE          keep-mask (bool |b1, or integers of 0 and 1; nonzero = may\n"
    "                       attend) or additive mask (<f4/<f2) whose shape broadcasts to\n"
    "                       (B, Hq, Lq, Lk), aligned on the right; a tokenizer's\n"
    "                       attention_mask (B, L) is saved for it as mask[:, None, None, :]\n"
    "  --dtype bf16         read 2-byte raw arrays (<V2, <u2) as bfloat16\n"
    "\n"
    "parameters:\n"
    "  --causal [top-left|bottom-right]  hide keys after the query's aligned position;\n"
    "                       top-left (default) is PyTorch's is_causal, bottom-right aligns\n"
    "                       the last query with the last key (KV-cache decoding)\n"
    "  --align top-left|bottom-right    alignment for --window without --causal\n"
    "  --window L,R         key j visible to query i iff i+off-L <= j <= i+off+R; -1 leaves\n"
    "                       a side open (off = 0 top-left, Lk-Lq bottom-right)\n"
    "  --scale S            scores are scale * q.k (default 1/sqrt(Dk))\n"
    "  --softcap C          scores become C * tanh(s / C)\n"
    "  --alibi              ALiBi with the standard slopes for Hq heads\n"
    "  --alibi-slopes FILE  ALiBi with the Hq slopes in FILE (<f4, rank 1)\n"
    "  --threads N          threads (default: all cores)\n"
    "\n"
    "outputs (all or nothing: each file is written to a temporary file, and all are renamed\n"
    "into place together at the end; /dev/stdout, devices and FIFOs are written directly;\n"
    "no output may name an input or another output; see sdpa(1), OUTPUT FILES):\n"
    "  --out FILE           the output, shape (.., Hq, Lq, Dv), dtype of Q\n"
    "  --out-dtype T        f32, f16 or bf16: the output's dtype instead (bf16 is saved as\n"
    "                       raw <V2, which numpy shows as bytes: f32 for numpy)\n"
    "  --lse FILE           the log-sum-exp of each row, (.., Hq, Lq), <f4\n"
    "  --weights FILE       the attention weights, (.., Hq, Lq, Lk), <f4\n"
    "  --heatmap FILE.png   a picture of the weights (all heads of batch element 0)\n"
    "  --head H             with --heatmap: only head H\n"
    "\n"
    "the backward (gradients of a loss L through the output, given dL/dout):\n"
    "  --dout FILE          dL/dout, shaped like the output (dtype <f4, <f2 or bf16)\n"
    "  --dq FILE, --dk FILE, --dv FILE   write dL/dq, dL/dk, dL/dv, each shaped and typed\n"
    "                       like its input (at least one; needs --dout)\n"
    "  --dropout P          drop each weight with chance P (0 <= P < 1), scale the kept by\n"
    "                       1/(1-P); the same mask in the output and the gradients\n"
    "  --seed S, --dropout-offset N   which mask (integers, default 0; a training step\n"
    "                       advances the offset)\n"
    "\n"
    "Without any output option the output is printed (small arrays) or summarised.\n"
    "Exit codes: 0 success, 1 runtime error (files, memory), 2 usage error.\n";

typedef struct run_args {
    const char *q, *k, *v, *mask, *slopes, *out, *lse, *weights, *heatmap;
    const char *dout, *dq, *dk, *dv; /* the backward: dL/dout in, the gradients out */
    int seeded;                      /* --seed or --dropout-offset given */
    int bf16, alibi, threads;
    int out_dtype; /* -1: Q's; else the sdpa_dtype of --out */
    int64_t head;
    sdpa_params p;
} run_args;

/* One loaded input: the array and its 4-d view. */
typedef struct input {
    const char *path;
    npy_array a;
    sdpa_tensor t;
} input;

static int parse_align(const char *s, sdpa_align *out) {
    if (strcmp(s, "top-left") == 0)
        *out = SDPA_ALIGN_TOP_LEFT;
    else if (strcmp(s, "bottom-right") == 0)
        *out = SDPA_ALIGN_BOTTOM_RIGHT;
    else
        return -1;
    return 0;
}

/* @return CLI_OK, CLI_USAGE (message printed), or -1 for --help (usage printed). */
static int parse_args(int argc, char **argv, run_args *a) {
    memset(a, 0, sizeof *a);
    a->head = -1;
    a->out_dtype = -1;
    /* The options that name a file, and where each goes; then the other options that take a
     * value. */
    const struct {
        const char *opt;
        const char **dst;
    } files[] = {{"--q", &a->q},
                 {"--k", &a->k},
                 {"--v", &a->v},
                 {"--mask", &a->mask},
                 {"--alibi-slopes", &a->slopes},
                 {"--out", &a->out},
                 {"--lse", &a->lse},
                 {"--weights", &a->weights},
                 {"--heatmap", &a->heatmap},
                 {"--dout", &a->dout},
                 {"--dq", &a->dq},
                 {"--dk", &a->dk},
                 {"--dv", &a->dv}};
    static const char *const with_value[] = {
        "--dtype", "--align",     "--window",  "--scale", "--softcap",       "--threads",
        "--head",  "--out-dtype", "--dropout", "--seed",  "--dropout-offset"};
    for (int i = 0; i < argc; i++) {
        const char *opt = argv[i];
        if (cli_is_help(opt)) {
            fputs(usage, stdout);
            return -1;
        }
        if (strcmp(opt, "--alibi") == 0) {
            a->alibi = 1;
            continue;
        }
        if (strcmp(opt, "--causal") == 0) {
            a->p.causal = 1;
            /* its value is optional: anything but an option after it is meant as one */
            if (i + 1 < argc && argv[i + 1][0] != '-') {
                if (parse_align(argv[i + 1], &a->p.align) != 0)
                    return cli_usage_error("run",
                                           "--causal %s: expected top-left or bottom-right (or "
                                           "nothing, for top-left)",
                                           argv[i + 1]);
                i++;
            }
            continue;
        }
        const char **file = NULL;
        for (size_t n = 0; n < sizeof files / sizeof files[0]; n++)
            if (strcmp(opt, files[n].opt) == 0)
                file = files[n].dst;
        int known = file != NULL;
        for (size_t n = 0; n < sizeof with_value / sizeof with_value[0]; n++)
            known |= strcmp(opt, with_value[n]) == 0;
        if (!known)
            return cli_usage_error("run", "unknown option '%s'", opt);
        if (i + 1 >= argc)
            return cli_usage_error("run", "%s needs a value", opt);
        const char *val = argv[++i];
        if (file != NULL)
            *file = val;
        else if (strcmp(opt, "--dtype") == 0) {
            if (strcmp(val, "bf16") != 0)
                return cli_usage_error("run",
                                       "--dtype %s: only bf16 can be asked for (f32 and f16 are "
                                       "read from the files)",
                                       val);
            a->bf16 = 1;
        } else if (strcmp(opt, "--out-dtype") == 0) {
            if (strcmp(val, "f32") == 0)
                a->out_dtype = SDPA_F32;
            else if (strcmp(val, "f16") == 0)
                a->out_dtype = SDPA_F16;
            else if (strcmp(val, "bf16") == 0)
                a->out_dtype = SDPA_BF16;
            else
                return cli_usage_error("run", "--out-dtype %s: expected f32, f16 or bf16", val);
        } else if (strcmp(opt, "--align") == 0) {
            if (parse_align(val, &a->p.align) != 0)
                return cli_usage_error("run", "--align %s: expected top-left or bottom-right", val);
        } else if (strcmp(opt, "--window") == 0) {
            /* L is parsed from a copy of the whole of it (a fixed buffer once cut a long
             * argument short and ran with another value) */
            const char *comma = strchr(val, ',');
            if (comma == NULL)
                return cli_usage_error("run", "--window %s: expected L,R (e.g. 128,0; -1 = open)",
                                       val);
            char left[32];
            const size_t n = (size_t)(comma - val);
            int bad = n >= sizeof left;
            if (!bad) {
                memcpy(left, val, n);
                left[n] = '\0';
                bad = cli_parse_int(left, INT64_MIN, INT64_MAX, &a->p.window_left) != 0 ||
                      cli_parse_int(comma + 1, INT64_MIN, INT64_MAX, &a->p.window_right) != 0 ||
                      a->p.window_left < -1 || a->p.window_right < -1;
            }
            if (bad)
                return cli_usage_error("run", "--window %s: L and R must be integers >= -1", val);
            a->p.use_window = 1;
        } else if (strcmp(opt, "--scale") == 0) {
            const int rc = cli_parse_float(val, &a->p.scale);
            if (rc == -2)
                return cli_usage_error("run",
                                       "--scale %s: out of f32's range (its magnitude "
                                       "must be about 1.4e-45 to 3.4e38)",
                                       val);
            if (rc != 0 || a->p.scale == 0.0f)
                return cli_usage_error("run", "--scale %s: expected a finite, non-zero number",
                                       val);
        } else if (strcmp(opt, "--softcap") == 0) {
            const int rc = cli_parse_float(val, &a->p.softcap);
            if (rc == -2)
                return cli_usage_error("run",
                                       "--softcap %s: out of f32's range (about 1.4e-45 "
                                       "to 3.4e38)",
                                       val);
            if (rc != 0 || a->p.softcap <= 0.0f)
                return cli_usage_error("run", "--softcap %s: expected a positive number", val);
        } else if (strcmp(opt, "--dropout") == 0) {
            const int rc = cli_parse_float(val, &a->p.dropout_p);
            if (rc != 0 || !(a->p.dropout_p >= 0.0f && a->p.dropout_p < 1.0f))
                return cli_usage_error("run",
                                       "--dropout %s: expected the chance of dropping a weight, "
                                       "0 <= P < 1",
                                       val);
        } else if (strcmp(opt, "--seed") == 0 || strcmp(opt, "--dropout-offset") == 0) {
            int64_t n;
            if (cli_parse_int(val, 0, INT64_MAX, &n) != 0)
                return cli_usage_error("run", "%s %s: expected an integer from 0 to 2^63 - 1", opt,
                                       val);
            *(opt[2] == 's' ? &a->p.dropout_seed : &a->p.dropout_offset) = (uint64_t)n;
            a->seeded = 1;
        } else if (strcmp(opt, "--threads") == 0) {
            int64_t n;
            if (cli_parse_int(val, INT64_MIN, INT64_MAX, &n) != 0 || n < 0 || n > SDPA_MAX_THREADS)
                return cli_usage_error("run", "--threads %s: expected 0 (all cores) to 1024", val);
            a->threads = (int)n;
        } else if (strcmp(opt, "--head") == 0) {
            if (cli_parse_int(val, INT64_MIN, INT64_MAX, &a->head) != 0 || a->head < 0)
                return cli_usage_error("run", "--head %s: expected a head index >= 0", val);
        }
    }
    if (a->q == NULL || a->k == NULL || a->v == NULL)
        return cli_usage_error("run", "--q, --k and --v are required");
    if (a->alibi && a->slopes != NULL)
        return cli_usage_error("run", "--alibi and --alibi-slopes exclude each other");
    if (a->head >= 0 && a->heatmap == NULL)
        return cli_usage_error("run", "--head only applies to --heatmap");
    if (a->out_dtype >= 0 && a->out == NULL)
        return cli_usage_error("run", "--out-dtype only applies to --out");
    const int grads = a->dq != NULL || a->dk != NULL || a->dv != NULL;
    if (grads && a->dout == NULL)
        return cli_usage_error("run", "--dq, --dk and --dv need --dout FILE: the gradient of the "
                                      "loss by the output");
    if (a->dout != NULL && !grads)
        return cli_usage_error("run", "--dout is for the backward: name at least one of --dq, "
                                      "--dk and --dv to write");
    if (a->seeded && a->p.dropout_p == 0.0f)
        return cli_usage_error("run", "--seed and --dropout-offset only apply with --dropout P");
    return CLI_OK;
}

/* Loads an input and views it as 4-d, aligned on the right. */
static int load_input(input *in, const char *path, int flags, int min_rank, const char *what) {
    char err[512];
    in->path = path;
    if (npy_load(path, flags, &in->a, err, sizeof err) != 0) {
        fprintf(stderr, "sdpa run: %s\n", err);
        return CLI_RUNTIME;
    }
    if (in->a.ndim < min_rank || in->a.ndim > 4) {
        char s[NPY_SHAPE_CHARS];
        npy_format_shape(s, sizeof s, in->a.ndim, in->a.shape);
        fprintf(stderr, "sdpa run: %s (%s) has rank %d, shape %s; expected rank %d to 4\n", path,
                what, in->a.ndim, s, min_rank);
        return CLI_RUNTIME;
    }
    int64_t shape[4] = {1, 1, 1, 1};
    for (int d = 0; d < in->a.ndim; d++)
        shape[4 - in->a.ndim + d] = in->a.shape[d];
    in->t = sdpa_tensor_bhld(in->a.data, in->a.dtype, shape[0], shape[1], shape[2], shape[3]);
    return CLI_OK;
}

/* Q, K and V must have the same rank and agree where they must; the message names both files
 * and both shapes. */
static int check_shapes(const input *q, const input *k, const input *v) {
    const input *pair[3][2] = {{k, q}, {v, k}, {v, q}};
    for (int n = 0; n < 3; n++) {
        const input *a = pair[n][0], *b = pair[n][1];
        char sa[NPY_SHAPE_CHARS], sb[NPY_SHAPE_CHARS], why[160] = "";
        npy_format_shape(sa, sizeof sa, a->a.ndim, a->a.shape);
        npy_format_shape(sb, sizeof sb, b->a.ndim, b->a.shape);
        if (a->a.ndim != b->a.ndim)
            snprintf(why, sizeof why, "the ranks differ (%d and %d)", a->a.ndim, b->a.ndim);
        else if (n == 0 && a->t.shape[3] != b->t.shape[3])
            snprintf(why, sizeof why, "the last dimensions (d_k) differ");
        else if (n == 1 && a->t.shape[2] != b->t.shape[2])
            snprintf(why, sizeof why, "the key lengths (second to last) differ");
        else if (n == 1 && a->t.shape[1] != b->t.shape[1])
            snprintf(why, sizeof why, "the numbers of heads differ");
        else if (a->t.shape[0] != b->t.shape[0])
            snprintf(why, sizeof why, "the batch sizes differ");
        else if (n == 0 && b->t.shape[1] % a->t.shape[1] != 0)
            snprintf(why, sizeof why,
                     "the query heads (%lld) are not a multiple of the key heads (%lld)",
                     (long long)b->t.shape[1], (long long)a->t.shape[1]);
        if (why[0] != '\0') {
            fprintf(stderr, "sdpa run: %s has shape %s but %s has shape %s: %s\n", a->path, sa,
                    b->path, sb, why);
            return CLI_RUNTIME;
        }
    }
    return CLI_OK;
}

/* ALiBi's standard slopes (Press et al.): for n = 2^floor(log2 H) heads 2^(-8i/n), i = 1..n;
 * the remaining H - n heads take every other slope of the 2n-head sequence. */
void cli_alibi_slopes(int64_t h, float *slopes) {
    int64_t n = 1;
    while (n * 2 <= h)
        n *= 2;
    for (int64_t i = 0; i < n; i++)
        slopes[i] = (float)pow(2.0, -8.0 * (double)(i + 1) / (double)n);
    for (int64_t i = 0; i < h - n; i++)
        slopes[n + i] = (float)pow(2.0, -8.0 * (double)(2 * i + 1) / (double)(2 * n));
}

/* The shape of an output: Q's leading dimensions, then `last` (0 = drop the last). */
static int out_shape(const input *q, int64_t last, int64_t *shape) {
    int nd = q->a.ndim;
    for (int d = 0; d < nd; d++)
        shape[d] = q->a.shape[d];
    if (last == 0)
        return nd - 1;
    shape[nd - 1] = last;
    return nd;
}

/* Prints a small output, or a summary of a large one, when no output file was asked for. */
static void print_result(const float *o, int64_t rows, int64_t cols, const input *q) {
    char s[NPY_SHAPE_CHARS];
    npy_array shown = q->a;
    shown.shape[shown.ndim - 1] = cols;
    npy_format_shape(s, sizeof s, shown.ndim, shown.shape);
    printf("output %s (rows of Dv; --out FILE saves it):\n", s);
    const int64_t max_rows = 16, max_cols = 8;
    for (int64_t r = 0; r < rows && r < max_rows; r++) {
        printf("  [");
        for (int64_t c = 0; c < cols && c < max_cols; c++)
            printf("%s%9.4f", c ? " " : "", (double)o[r * cols + c]);
        printf("%s ]\n", cols > max_cols ? " ..." : "");
    }
    if (rows > max_rows)
        printf("  ... %lld more rows\n", (long long)(rows - max_rows));
}

int cli_run(int argc, char **argv) {
    run_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc != CLI_OK)
        return rc < 0 ? CLI_OK : rc;
    /* every output checked before any work: distinct, not an input, writable */
    npy_out o_out = {0}, o_lse = {0}, o_w = {0}, o_dq = {0}, o_dk = {0}, o_dv = {0};
    heatmap_png pic = {0};
    outputs outs;
    outputs_init(&outs);
    outputs_add(&outs, "--out", a.out, npy_write, &o_out);
    outputs_add(&outs, "--lse", a.lse, npy_write, &o_lse);
    outputs_add(&outs, "--weights", a.weights, npy_write, &o_w);
    outputs_add(&outs, "--heatmap", a.heatmap, heatmap_png_write, &pic);
    outputs_add(&outs, "--dq", a.dq, npy_write, &o_dq);
    outputs_add(&outs, "--dk", a.dk, npy_write, &o_dk);
    outputs_add(&outs, "--dv", a.dv, npy_write, &o_dv);
    {
        const char *const in_opts[] = {"--q", "--k", "--v", "--mask", "--alibi-slopes", "--dout"};
        const char *const in_paths[] = {a.q, a.k, a.v, a.mask, a.slopes, a.dout};
        char why[1024];
        if ((rc = outputs_check(&outs, 6, in_opts, in_paths, why, sizeof why)) != 0) {
            fprintf(stderr, "sdpa run: %s\n", why);
            return rc;
        }
    }

    input q = {0}, k = {0}, v = {0}, mask = {0}, sl = {0}, dout = {0};
    void *grad[3] = {NULL, NULL, NULL}; /* dq, dk, dv */
    float *slopes = NULL, *lse = NULL, *w = NULL;
    void *out = NULL;
    uint8_t *px = NULL;
    sdpa_ctx *ctx = NULL;
    rc = CLI_RUNTIME;
    const int qkv_flags = a.bf16 ? NPY_BF16 : 0;
    if (load_input(&q, a.q, qkv_flags, 2, "the queries") ||
        load_input(&k, a.k, qkv_flags, 2, "keys") || load_input(&v, a.v, qkv_flags, 2, "values") ||
        check_shapes(&q, &k, &v))
        goto done;
    const sdpa_dtype dts[3] = {q.a.dtype, k.a.dtype, v.a.dtype};
    const char *paths[3] = {a.q, a.k, a.v};
    for (int n = 0; n < 3; n++)
        if (dts[n] == SDPA_BOOL) {
            fprintf(stderr, "sdpa run: %s: bool arrays are for --mask; Q, K, V are <f4 or <f2\n",
                    paths[n]);
            goto done;
        }
    const int64_t B = q.t.shape[0], Hq = q.t.shape[1], Lq = q.t.shape[2];
    const int64_t Lk = k.t.shape[2], Dv = v.t.shape[3];
    if (a.mask != NULL) {
        /* integers of 0 and 1 are a keep-mask (a tokenizer's attention_mask); 2-byte raw
         * values are read as bf16 only to say what to do instead: --dtype bf16 applies to Q,
         * K and V, and no mask is bf16 */
        if (load_input(&mask, a.mask, NPY_BF16 | NPY_MASK | NPY_INT_MASK, 1, "the mask"))
            goto done;
        if (mask.a.dtype == SDPA_BF16) {
            fprintf(stderr,
                    "sdpa run: %s: a mask of 2-byte raw values (bfloat16) cannot be read; save a "
                    "keep-mask as bool (mask.astype(bool)) or an additive one as <f4 or <f2\n",
                    a.mask);
            goto done;
        }
        const int64_t want[4] = {B, Hq, Lq, Lk};
        for (int d = 0; d < 4; d++)
            if (mask.t.shape[d] != 1 && mask.t.shape[d] != want[d]) {
                char s[NPY_SHAPE_CHARS];
                npy_format_shape(s, sizeof s, mask.a.ndim, mask.a.shape);
                /* (B, Lk): a padding mask as tokenizers give it, aligned on the wrong axes */
                const int padding =
                    mask.a.ndim == 2 && mask.a.shape[0] == B && mask.a.shape[1] == Lk;
                fprintf(stderr,
                        "sdpa run: %s has shape %s, which does not broadcast to (B, Hq, Lq, Lk) "
                        "= (%lld, %lld, %lld, %lld) from %s and %s%s\n",
                        a.mask, s, (long long)B, (long long)Hq, (long long)Lq, (long long)Lk, a.q,
                        a.k,
                        padding ? "; a (B, Lk) padding mask needs the shape (B, 1, 1, Lk): save "
                                  "mask[:, None, None, :]"
                                : "");
                goto done;
            }
        a.p.mask = &mask.t;
    }
    if (a.alibi || a.slopes != NULL) {
        slopes = malloc((size_t)Hq * sizeof *slopes);
        if (slopes == NULL)
            goto nomem;
        if (a.alibi) {
            cli_alibi_slopes(Hq, slopes);
        } else {
            if (load_input(&sl, a.slopes, 0, 1, "the slopes"))
                goto done;
            if (sl.a.ndim != 1 || sl.a.dtype != SDPA_F32 || sl.a.shape[0] != Hq) {
                char s[NPY_SHAPE_CHARS];
                npy_format_shape(s, sizeof s, sl.a.ndim, sl.a.shape);
                fprintf(stderr,
                        "sdpa run: %s has shape %s (%s); expected (%lld,) <f4: one slope "
                        "per query head of %s\n",
                        a.slopes, s, sdpa_dtype_name(sl.a.dtype), (long long)Hq, a.q);
                goto done;
            }
            memcpy(slopes, sl.a.data, (size_t)Hq * sizeof *slopes);
        }
        a.p.alibi_slopes = slopes;
    }
    if (a.head >= Hq) {
        fprintf(stderr, "sdpa run: --head %lld: %s has %lld heads\n", (long long)a.head, a.q,
                (long long)Hq);
        rc = CLI_USAGE;
        goto done;
    }
    if (a.dout != NULL) {
        /* dL/dout has the output's shape: Q's leading extents, then Dv */
        if (load_input(&dout, a.dout, qkv_flags, 2, "the output's gradient"))
            goto done;
        int64_t want[NPY_MAX_DIMS];
        const int nd = out_shape(&q, Dv, want);
        int same = dout.a.ndim == nd;
        for (int d = 0; same && d < nd; d++)
            same = dout.a.shape[d] == want[d];
        if (!same) {
            char s[NPY_SHAPE_CHARS], sw[NPY_SHAPE_CHARS];
            npy_format_shape(s, sizeof s, dout.a.ndim, dout.a.shape);
            npy_format_shape(sw, sizeof sw, nd, want);
            fprintf(stderr,
                    "sdpa run: %s has shape %s, but the output it is the gradient of has shape "
                    "%s (the leading extents of %s, then Dv of %s)\n",
                    a.dout, s, sw, a.q, a.v);
            goto done;
        }
    }

    sdpa_ctx_params cp = {0};
    cp.n_threads = a.threads;
    sdpa_status st = sdpa_ctx_create(&cp, &ctx);
    if (st != SDPA_OK) {
        fprintf(stderr, "sdpa run: cannot create a context: %s\n", sdpa_status_str(st));
        goto done;
    }
    const size_t n_out = (size_t)(B * Hq * Lq * Dv), n_rows = (size_t)(B * Hq * Lq);
    /* the output in Q's dtype or --out-dtype's; f32 when it is only printed */
    const sdpa_dtype out_dt = a.out == NULL      ? SDPA_F32
                              : a.out_dtype >= 0 ? (sdpa_dtype)a.out_dtype
                                                 : q.a.dtype;
    out = malloc(n_out * sdpa_dtype_size(out_dt));
    lse = malloc(n_rows * sizeof *lse);
    if (out == NULL || lse == NULL)
        goto nomem;
    sdpa_tensor to = sdpa_tensor_bhld(out, out_dt, B, Hq, Lq, Dv);
    sdpa_tensor tl = sdpa_tensor_bhld(lse, SDPA_F32, B, Hq, Lq, 1);
    st = sdpa_forward(ctx, &q.t, &k.t, &v.t, &a.p, &to, &tl);
    if (st == SDPA_OK && (a.weights != NULL || a.heatmap != NULL)) {
        if ((double)n_rows * (double)Lk * 4.0 > 4e9) {
            fprintf(stderr,
                    "sdpa run: the weights would take %.1f GB (%lld x %lld per head); "
                    "ask for them on a shorter sequence\n",
                    (double)n_rows * (double)Lk * 4e-9, (long long)Lq, (long long)Lk);
            goto done;
        }
        w = malloc(n_rows * (size_t)Lk * sizeof *w);
        if (w == NULL)
            goto nomem;
        sdpa_tensor tw = sdpa_tensor_bhld(w, SDPA_F32, B, Hq, Lq, Lk);
        st = sdpa_weights(ctx, &q.t, &k.t, &a.p, &tw);
    }
    if (st == SDPA_OK && a.dout != NULL) {
        /* every gradient is computed (the call writes all three), each in its input's dtype;
         * only those asked for are written */
        const input *of[3] = {&q, &k, &v};
        sdpa_tensor tg[3];
        for (int n = 0; n < 3; n++) {
            const sdpa_tensor *t = &of[n]->t;
            grad[n] = malloc((size_t)(t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3]) *
                             sdpa_dtype_size(t->dtype));
            if (grad[n] == NULL)
                goto nomem;
            tg[n] = sdpa_tensor_bhld(grad[n], t->dtype, t->shape[0], t->shape[1], t->shape[2],
                                     t->shape[3]);
        }
        st = sdpa_backward(ctx, &q.t, &k.t, &v.t, &to, &tl, &dout.t, &a.p, &tg[0], &tg[1], &tg[2]);
        npy_out *og[3] = {&o_dq, &o_dk, &o_dv};
        for (int n = 0; n < 3; n++) {
            og[n]->dtype = of[n]->a.dtype;
            og[n]->ndim = of[n]->a.ndim;
            memcpy(og[n]->shape, of[n]->a.shape, sizeof og[n]->shape);
            og[n]->data = grad[n];
        }
    }
    if (st != SDPA_OK) {
        fprintf(stderr, "sdpa run: %s: %s\n", sdpa_status_str(st), sdpa_ctx_last_error(ctx));
        goto done;
    }

    /* everything is computed: now the files, all or nothing */
    char err[1024];
    o_out.dtype = out_dt;
    o_out.ndim = out_shape(&q, Dv, o_out.shape);
    o_out.data = out;
    o_lse.dtype = SDPA_F32;
    o_lse.ndim = out_shape(&q, 0, o_lse.shape);
    o_lse.data = lse;
    o_w.dtype = SDPA_F32;
    o_w.ndim = out_shape(&q, Lk, o_w.shape);
    o_w.data = w;
    if (a.heatmap != NULL) {
        char title[512], sub[256];
        snprintf(title, sizeof title, "attention weights %s x %s", a.q, a.k);
        snprintf(sub, sizeof sub, "%s%s%s%s", a.p.causal ? "causal " : "",
                 a.p.causal || a.p.use_window
                     ? (a.p.align == SDPA_ALIGN_BOTTOM_RIGHT ? "bottom-right " : "top-left ")
                     : "",
                 a.mask != NULL ? "masked " : "", a.alibi || a.slopes ? "ALiBi" : "");
        heatmap_opts ho = heatmap_opts_default();
        ho.head = a.head;
        ho.title = title;
        ho.subtitle = sub[0] != '\0' ? sub : NULL;
        heatmap_geometry g;
        if (heatmap_render(w, B, Hq, Lq, Lk, &ho, &px, &g, err, sizeof err) != 0)
            goto save_failed;
        pic.rgb = px;
        pic.width = g.width;
        pic.height = g.height;
    }
    if (outputs_commit(&outs, err, sizeof err) != 0)
        goto save_failed;
    if (outs.n == 0) /* no file asked for: the output is shown */
        print_result(out, (int64_t)n_rows, Dv, &q);
    rc = CLI_OK;
    goto done;

save_failed:
    fprintf(stderr, "sdpa run: %s\n", err);
    goto done;
nomem:
    fprintf(stderr, "sdpa run: out of memory\n");
done:
    sdpa_ctx_destroy(ctx);
    npy_free(&q.a);
    npy_free(&k.a);
    npy_free(&v.a);
    npy_free(&mask.a);
    npy_free(&sl.a);
    npy_free(&dout.a);
    for (int n = 0; n < 3; n++)
        free(grad[n]);
    free(slopes);
    free(out);
    free(lse);
    free(w);
    free(px);
    return rc;
}
