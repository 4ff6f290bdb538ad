/*
 * test_run.c — `sdpa run` as a user drives it: arrays written to .npy, the command run as a
 * separate process, its files read back and compared with the library's reference on the
 * same arrays; every option, and every error path (exit code, a message that names the file
 * or option, and no output or temporary file left behind).
 * Usage: test_run PATH/TO/sdpa
 */
#define _XOPEN_SOURCE 700 /* realpath */

#include "check.h"
#include "npy.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *sdpa_bin;
static char dir[256];
static char out_text[1 << 16], err_text[1 << 16];

static void path_of(char *buf, size_t len, const char *name) {
    snprintf(buf, len, "%s/%s", dir, name);
}

static void slurp(const char *path, char *buf, size_t len) {
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, len - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
}

/* Runs `sdpa run ARGS` (paths in ARGS are relative to dir) and returns its exit code. */
static int run(const char *args) {
    char cmd[4096], o[512], e[512];
    path_of(o, sizeof o, "stdout.txt");
    path_of(e, sizeof e, "stderr.txt");
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' run %s > '%s' 2> '%s'", dir, sdpa_bin, args, o, e);
    const int status = system(cmd);
    slurp(o, out_text, sizeof out_text);
    slurp(e, err_text, sizeof err_text);
    unlink(o);
    unlink(e);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int exists(const char *name) {
    char p[512];
    path_of(p, sizeof p, name);
    struct stat st;
    return stat(p, &st) == 0;
}

/* No "*.tmp.*" file may remain in dir. */
static int no_temp_files(void) {
    return tu_count_entries(dir, ".tmp.") == 0;
}

static void save(const char *name, sdpa_dtype dt, int nd, const int64_t *shape, const void *data) {
    char p[512], err[512];
    path_of(p, sizeof p, name);
    if (npy_save(p, dt, nd, shape, data, err, sizeof err) != 0) {
        fprintf(stderr, "test_run: %s\n", err);
        exit(2);
    }
}

/* A version-1.0 .npy file of any descr, written by hand (npy_save writes only the dtypes the
 * command reads): an int64 attention_mask, as tokenizers return it. */
static void save_raw(const char *name, const char *descr, const char *shape, const void *data,
                     size_t bytes) {
    char p[512], dict[128];
    path_of(p, sizeof p, name);
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                     descr, shape);
    while ((10 + n + 1) % 64 != 0)
        dict[n++] = ' ';
    dict[n++] = '\n';
    FILE *f = fopen(p, "wb");
    const unsigned char pre[10] = {
        0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(n & 255), (unsigned char)(n >> 8)};
    if (f == NULL || fwrite(pre, 1, 10, f) != 10 || fwrite(dict, 1, (size_t)n, f) != (size_t)n ||
        fwrite(data, 1, bytes, f) != bytes || fclose(f) != 0) {
        fprintf(stderr, "test_run: cannot write %s\n", p);
        exit(2);
    }
}

static npy_array load(const char *name) {
    char p[512], err[512];
    npy_array a;
    memset(&a, 0, sizeof a);
    path_of(p, sizeof p, name);
    if (npy_load(p, 1, &a, err, sizeof err) != 0)
        printf("    load %s: %s\n", name, err);
    return a;
}

/* The problem every case starts from: B=2, Hq=3, Hkv=1, Lq=5, Lk=7, Dk=8, Dv=6. */
enum { B = 2, HQ = 3, HKV = 1, LQ = 5, LK = 7, DK = 8, DV = 6 };
static tu_tensor q, k, v, dout;

static void write_inputs(void) {
    tu_rng r = {2024};
    q = tu_alloc(SDPA_F32, B, HQ, LQ, DK, TU_BHLD, 0, 0);
    k = tu_alloc(SDPA_F32, B, HKV, LK, DK, TU_BHLD, 0, 0);
    v = tu_alloc(SDPA_F32, B, HKV, LK, DV, TU_BHLD, 0, 0);
    tu_fill_randn(&q, &r, 1, 0);
    tu_fill_randn(&k, &r, 1, 0);
    tu_fill_randn(&v, &r, 1, 0);
    const int64_t sq[4] = {B, HQ, LQ, DK}, sk[4] = {B, HKV, LK, DK}, sv[4] = {B, HKV, LK, DV};
    save("q.npy", SDPA_F32, 4, sq, q.t.data);
    save("k.npy", SDPA_F32, 4, sk, k.t.data);
    save("v.npy", SDPA_F32, 4, sv, v.t.data);
    /* rank 2 and 3 views of head 0 of batch 0, and a mismatched K */
    const int64_t q2[2] = {LQ, DK}, k2[2] = {LK, DK}, v2[2] = {LK, DV}, q3[3] = {HQ, LQ, DK};
    save("q2.npy", SDPA_F32, 2, q2, q.t.data);
    save("k2.npy", SDPA_F32, 2, k2, k.t.data);
    save("v2.npy", SDPA_F32, 2, v2, v.t.data);
    save("q3.npy", SDPA_F32, 3, q3, q.t.data);
    const int64_t kbad[4] = {B, HKV, LK, DK - 1};
    save("kbad.npy", SDPA_F32, 4, kbad, k.t.data);
    /* a bool mask (Lq, Lk) that leaves key 0 to everyone, an additive one (B, 1, 1, Lk) */
    unsigned char mb[(LQ + 1) * LK]; /* room for the (Lq + 1, Lk) mask that must not fit */
    float ma[B * LK];
    for (int i = 0; i < (LQ + 1) * LK; i++)
        mb[i] = (unsigned char)(i % LK == 0 || (i * 7) % 3 != 0);
    for (int i = 0; i < B * LK; i++)
        ma[i] = i % 4 == 1 ? -INFINITY : 0.25f * (float)(i % 5);
    const int64_t smb[2] = {LQ, LK}, sma[4] = {B, 1, 1, LK}, sbad[2] = {LQ + 1, LK};
    save("mask_bool.npy", SDPA_BOOL, 2, smb, mb);
    save("mask_add.npy", SDPA_F32, 4, sma, ma);
    save("mask_bad.npy", SDPA_BOOL, 2, sbad, mb);
    /* a tokenizer's attention_mask: int64 (B, Lk), 1 = attend; and the same as bool */
    int64_t am[B * LK];
    for (int i = 0; i < B * LK; i++)
        am[i] = i % LK < LK - 2 * (i / LK);
    char am_shape[32];
    snprintf(am_shape, sizeof am_shape, "(%d, %d)", B, LK);
    save_raw("mask_int64.npy", "<i8", am_shape, am, sizeof am);
    unsigned char amb[B * LK];
    for (int i = 0; i < B * LK; i++)
        amb[i] = (unsigned char)am[i];
    const int64_t sam[2] = {B, LK};
    save("mask_padding.npy", SDPA_BOOL, 2, sam, amb);
    /* integer keep-masks, read as bool: the attention_mask reshaped to (B, 1, 1, Lk), the
     * bool (Lq, Lk) mask as uint8, one holding a 2, and a float64 mask (refused) */
    char am4_shape[32];
    snprintf(am4_shape, sizeof am4_shape, "(%d, 1, 1, %d)", B, LK);
    save_raw("mask_int64_4d.npy", "<i8", am4_shape, am, sizeof am);
    char mb_shape[32];
    snprintf(mb_shape, sizeof mb_shape, "(%d, %d)", LQ, LK);
    save_raw("mask_u1.npy", "|u1", mb_shape, mb, (size_t)(LQ * LK));
    int32_t mi[LQ * LK];
    for (int i = 0; i < LQ * LK; i++)
        mi[i] = mb[i];
    mi[LK + 3] = 2;
    save_raw("mask_int_bad.npy", "<i4", mb_shape, mi, sizeof mi);
    double md[LQ * LK];
    for (int i = 0; i < LQ * LK; i++)
        md[i] = mb[i];
    save_raw("mask_f64.npy", "<f8", mb_shape, md, sizeof md);
    /* ALiBi slopes: the standard ones for 3 heads (2^-4, 2^-8, then 2^-2 from the 4-head
     * sequence) and a wrong-length file */
    const float sl[3] = {0.0625f, 0.00390625f, 0.25f};
    const int64_t ssl[1] = {3}, ssl2[1] = {2};
    save("slopes.npy", SDPA_F32, 1, ssl, sl);
    save("slopes_bad.npy", SDPA_F32, 1, ssl2, sl);
    /* f16 and bf16 copies */
    tu_tensor qh = tu_alloc(SDPA_F16, B, HQ, LQ, DK, TU_BHLD, 0, 0);
    tu_tensor qb = tu_alloc(SDPA_BF16, B, HQ, LQ, DK, TU_BHLD, 0, 0);
    tu_copy(&qh.t, &q.t);
    tu_copy(&qb.t, &q.t);
    save("q_f16.npy", SDPA_F16, 4, sq, qh.t.data);
    save("q_bf16.npy", SDPA_BF16, 4, sq, qb.t.data);
    tu_free(&qh);
    tu_free(&qb);
    /* dL/dout for the backward, and one of Dk's width instead of Dv's */
    dout = tu_alloc(SDPA_F32, B, HQ, LQ, DV, TU_BHLD, 0, 0);
    tu_fill_randn(&dout, &r, 1, 0);
    const int64_t so[4] = {B, HQ, LQ, DV}, sbad_o[4] = {B, HQ, LQ, DK};
    save("dout.npy", SDPA_F32, 4, so, dout.t.data);
    save("dout_bad.npy", SDPA_F32, 4, sbad_o, q.t.data);
}

/* The reference's output for params p, as doubles (B, HQ, LQ, DV). */
static double *reference(const sdpa_params *p, const sdpa_tensor *qq) {
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    tu_tensor o = tu_alloc(SDPA_F32, B, HQ, LQ, DV, TU_BHLD, 0, 0);
    CHECK_INT_EQ(tu_golden_forward(ctx, qq ? qq : &q.t, &k.t, &v.t, p, &o.t, NULL), SDPA_OK);
    double *x = tu_to_doubles(&o.t);
    tu_free(&o);
    sdpa_ctx_destroy(ctx);
    return x;
}

/* out.npy against the reference, within f32 rounding of the fast path. */
static void check_out(const char *what, const sdpa_params *p, double tol) {
    npy_array a = load("out.npy");
    CHECK_MSG(a.data != NULL && a.count == B * HQ * LQ * DV, "%s: out.npy missing or wrong size",
              what);
    if (a.data != NULL && a.count == B * HQ * LQ * DV) {
        double *want = reference(p, NULL);
        double worst = 0.0;
        for (int64_t n = 0; n < a.count; n++) {
            const double got = (double)((const float *)a.data)[n];
            const double e = fabs(got - want[n]) / (1.0 + fabs(want[n]));
            worst = e > worst || isnan(got) != isnan(want[n]) ? (isnan(e) ? 1.0 : e) : worst;
        }
        CHECK_MSG(worst <= tol, "%s: out.npy differs from the reference by %.3g", what, worst);
        free(want);
    }
    npy_free(&a);
    char p2[512];
    path_of(p2, sizeof p2, "out.npy");
    unlink(p2);
}

static void test_basic_outputs(void) {
    CHECK_INT_EQ(run("--q q.npy --k k.npy --v v.npy --out out.npy --lse lse.npy --weights w.npy"),
                 0);
    npy_array l = load("lse.npy"), w = load("w.npy");
    CHECK(l.ndim == 3 && l.shape[0] == B && l.shape[1] == HQ && l.shape[2] == LQ);
    CHECK(w.ndim == 4 && w.shape[3] == LK && w.dtype == SDPA_F32);
    if (w.data != NULL) { /* rows of weights sum to 1 */
        double worst = 0.0;
        for (int64_t r = 0; r < B * HQ * LQ; r++) {
            double sum = 0.0;
            for (int j = 0; j < LK; j++)
                sum += ((const float *)w.data)[r * LK + j];
            worst = fmax(worst, fabs(sum - 1.0));
        }
        CHECK(worst < 1e-5);
    }
    npy_free(&l);
    npy_free(&w);
    sdpa_params p = {0};
    check_out("plain", &p, 1e-5);
    CHECK(no_temp_files());
}

static void test_every_parameter(void) {
    sdpa_params p = {0};
    CHECK_INT_EQ(run("--q q.npy --k k.npy --v v.npy --causal --out out.npy"), 0);
    p.causal = 1;
    check_out("--causal", &p, 1e-5);
    CHECK_INT_EQ(run("--q q.npy --k k.npy --v v.npy --causal bottom-right --out out.npy"), 0);
    p.align = SDPA_ALIGN_BOTTOM_RIGHT;
    check_out("--causal bottom-right", &p, 1e-5);
    memset(&p, 0, sizeof p);
    CHECK_INT_EQ(run("--q q.npy --k k.npy --v v.npy --window 1,1 --align bottom-right "
                     "--out out.npy"),
                 0);
    p.use_window = 1;
    p.window_left = p.window_right = 1;
    p.align = SDPA_ALIGN_BOTTOM_RIGHT;
    check_out("--window 1,1 --align bottom-right", &p, 1e-5);
    /* an R longer than any fixed buffer is taken whole (it was once cut to 63 characters
     * and run as R = 0) */
    memset(&p, 0, sizeof p);
    CHECK_INT_EQ(run("--q q.npy --k k.npy --v v.npy --align bottom-right --window "
                     "1,00000000000000000000000000000000000000000000000000000000000000000000002 "
                     "--out out.npy"),
                 0);
    p.use_window = 1;
    p.window_left = 1;
    p.window_right = 2;
    p.align = SDPA_ALIGN_BOTTOM_RIGHT;
    check_out("--window 1,000...0002", &p, 1e-5);
    memset(&p, 0, sizeof p);
    CHECK_INT_EQ(run("--q q.npy --k k.npy --v v.npy --window -1,0 --out out.npy"), 0);
    p.use_window = 1;
    p.window_left = -1;
    p.window_right = 0;
    check_out("--window -1,0", &p, 1e-5);
    memset(&p, 0, sizeof p);
    CHECK_INT_EQ(run("--q q.npy --k k.npy --v v.npy --scale 0.5 --softcap 3 --out out.npy"), 0);
    p.scale = 0.5f;
    p.softcap = 3.0f;
    check_out("--scale --softcap", &p, 1e-5);
    /* a subnormal softcap is a number f32 holds: taken, not called "not positive" */
    memset(&p, 0, sizeof p);
    CHECK_INT_EQ(run("--q q.npy --k k.npy --v v.npy --softcap 1e-40 --out out.npy"), 0);
    p.softcap = 1e-40f;
    check_out("--softcap 1e-40", &p, 1e-5);
    memset(&p, 0, sizeof p);
    const float sl[3] = {0.0625f, 0.00390625f, 0.25f};
    p.alibi_slopes = sl;
    CHECK_INT_EQ(run("--q q.npy --k k.npy --v v.npy --alibi --out out.npy"), 0);
    check_out("--alibi (standard slopes for 3 heads)", &p, 1e-5);
    CHECK_INT_EQ(run("--q q.npy --k k.npy --v v.npy --alibi-slopes slopes.npy --out out.npy"), 0);
    check_out("--alibi-slopes", &p, 1e-5);
    memset(&p, 0, sizeof p);
    npy_array mb = load("mask_bool.npy"), ma = load("mask_add.npy");
    sdpa_tensor tmb = sdpa_tensor_bhld(mb.data, SDPA_BOOL, 1, 1, LQ, LK);
    sdpa_tensor tma = sdpa_tensor_bhld(ma.data, SDPA_F32, B, 1, 1, LK);
    CHECK_INT_EQ(run("--q q.npy --k k.npy --v v.npy --mask mask_bool.npy --out out.npy"), 0);
    p.mask = &tmb;
    check_out("--mask bool (Lq, Lk)", &p, 1e-5);
    CHECK_INT_EQ(run("--q q.npy --k k.npy --v v.npy --mask mask_add.npy --out out.npy"), 0);
    p.mask = &tma;
    check_out("--mask additive (B, 1, 1, Lk)", &p, 1e-5);
    /* integer keep-masks: the same as their bool twins */
    CHECK_INT_EQ(run("--q q.npy --k k.npy --v v.npy --mask mask_u1.npy --out out.npy"), 0);
    p.mask = &tmb;
    check_out("--mask uint8 (Lq, Lk)", &p, 1e-5);
    npy_array mp = load("mask_padding.npy");
    sdpa_tensor tmp4 = sdpa_tensor_bhld(mp.data, SDPA_BOOL, B, 1, 1, LK);
    CHECK_INT_EQ(run("--q q.npy --k k.npy --v v.npy --mask mask_int64_4d.npy --out out.npy"), 0);
    p.mask = &tmp4;
    check_out("--mask int64 attention_mask (B, 1, 1, Lk)", &p, 1e-5);
    npy_free(&mp);
    npy_free(&mb);
    npy_free(&ma);
}

static void test_threads_dtypes_ranks(void) {
    char a[512], b[512];
    CHECK_INT_EQ(run("--q q.npy --k k.npy --v v.npy --causal --threads 1 --out t1.npy"), 0);
    CHECK_INT_EQ(run("--q q.npy --k k.npy --v v.npy --causal --threads 2 --out t2.npy"), 0);
    npy_array t1 = load("t1.npy"), t2 = load("t2.npy");
    CHECK(t1.data && t2.data && t1.nbytes == t2.nbytes && memcmp(t1.data, t2.data, t1.nbytes) == 0);
    npy_free(&t1);
    npy_free(&t2);
    path_of(a, sizeof a, "t1.npy");
    path_of(b, sizeof b, "t2.npy");
    unlink(a);
    unlink(b);
    /* f16 queries: f16 output; bf16 needs --dtype bf16 */
    CHECK_INT_EQ(run("--q q_f16.npy --k k.npy --v v.npy --out oh.npy"), 0);
    npy_array oh = load("oh.npy");
    CHECK(oh.dtype == SDPA_F16 && oh.count == B * HQ * LQ * DV);
    npy_free(&oh);
    CHECK_INT_EQ(run("--q q_bf16.npy --k k.npy --v v.npy --out ob.npy"), 1);
    CHECK_STR_CONTAINS(err_text, "q_bf16.npy");
    CHECK_INT_EQ(run("--q q_bf16.npy --k k.npy --v v.npy --dtype bf16 --out ob.npy"), 0);
    npy_array ob = load("ob.npy");
    CHECK(ob.dtype == SDPA_BF16);
    /* --out-dtype: bf16 queries, an f32 file numpy reads as numbers; the same values as the
     * bf16 file to within bf16's rounding of them */
    CHECK_INT_EQ(run("--q q_bf16.npy --k k.npy --v v.npy --dtype bf16 --out-dtype f32 "
                     "--out ob32.npy"),
                 0);
    npy_array ob32 = load("ob32.npy");
    CHECK(ob32.dtype == SDPA_F32 && ob32.count == ob.count);
    for (int64_t i = 0; ob32.data && ob.data && i < ob.count; i++) {
        uint32_t bits = (uint32_t)((const uint16_t *)ob.data)[i] << 16;
        float wide;
        memcpy(&wide, &bits, sizeof wide);
        const float got = ((const float *)ob32.data)[i];
        CHECK_MSG(fabsf(got - wide) <= 0x1p-8f * fabsf(wide) + 1e-30f, "out[%lld]: %g vs %g",
                  (long long)i, (double)got, (double)wide);
    }
    npy_free(&ob32);
    npy_free(&ob);
    CHECK_INT_EQ(run("--q q.npy --k k.npy --v v.npy --out-dtype f16 --out oh2.npy"), 0);
    npy_array oh2 = load("oh2.npy");
    CHECK(oh2.dtype == SDPA_F16 && oh2.count == B * HQ * LQ * DV);
    npy_free(&oh2);
    /* rank 2 in, rank 2 out; rank 3 queries need rank 3 keys */
    CHECK_INT_EQ(run("--q q2.npy --k k2.npy --v v2.npy --out o2.npy --lse l2.npy"), 0);
    npy_array o2 = load("o2.npy"), l2 = load("l2.npy");
    CHECK(o2.ndim == 2 && o2.shape[0] == LQ && o2.shape[1] == DV);
    CHECK(l2.ndim == 1 && l2.shape[0] == LQ);
    npy_free(&o2);
    npy_free(&l2);
    CHECK_INT_EQ(run("--q q3.npy --k k.npy --v v.npy"), 1);
    CHECK_STR_CONTAINS(err_text, "k.npy has shape (2, 1, 7, 8) but q3.npy has shape (3, 5, 8)");
    /* no output option: the result is printed */
    CHECK_INT_EQ(run("--q q2.npy --k k2.npy --v v2.npy"), 0);
    CHECK_STR_CONTAINS(out_text, "output (5, 6)");
}

/* The gradients the command writes: the library's sdpa_backward on the same arrays, each
 * shaped and typed like its input; with dropout, the same mask in out.npy and the gradients. */
static void check_grads(const char *args, const sdpa_params *p) {
    CHECK_MSG(run(args) == 0, "%s: %s", args, err_text);
    sdpa_ctx *ctx = tu_ctx(1, SDPA_ISA_AUTO);
    tu_tensor o = tu_alloc(SDPA_F32, B, HQ, LQ, DV, TU_BHLD, 0, 0);
    tu_tensor l = tu_alloc(SDPA_F32, B, HQ, LQ, 1, TU_BHLD, 0, 0);
    tu_tensor g[3] = {tu_alloc(SDPA_F32, B, HQ, LQ, DK, TU_BHLD, 0, 0),
                      tu_alloc(SDPA_F32, B, HKV, LK, DK, TU_BHLD, 0, 0),
                      tu_alloc(SDPA_F32, B, HKV, LK, DV, TU_BHLD, 0, 0)};
    CHECK(sdpa_forward(ctx, &q.t, &k.t, &v.t, p, &o.t, &l.t) == SDPA_OK);
    CHECK(sdpa_backward(ctx, &q.t, &k.t, &v.t, &o.t, &l.t, &dout.t, p, &g[0].t, &g[1].t, &g[2].t) ==
          SDPA_OK);
    static const char *const files[3] = {"gq.npy", "gk.npy", "gv.npy"};
    for (int n = 0; n < 3; n++) {
        npy_array a = load(files[n]);
        const int64_t want = g[n].t.shape[0] * g[n].t.shape[1] * g[n].t.shape[2] * g[n].t.shape[3];
        CHECK_MSG(a.data != NULL && a.dtype == SDPA_F32 && a.ndim == 4 && a.count == want,
                  "%s: %s missing or misshapen", args, files[n]);
        double worst = 0.0;
        for (int64_t i = 0; a.data != NULL && a.count == want && i < want; i++)
            worst = fmax(worst, fabs((double)((const float *)a.data)[i] -
                                     (double)((const float *)g[n].t.data)[i]));
        CHECK_MSG(worst <= 1e-6, "%s: %s differs by %g", args, files[n], worst);
        npy_free(&a);
        tu_free(&g[n]);
    }
    npy_array a = load("out.npy");
    CHECK(a.data != NULL && a.count == B * HQ * LQ * DV &&
          memcmp(a.data, o.t.data, (size_t)a.count * 4) == 0);
    npy_free(&a);
    tu_free(&o);
    tu_free(&l);
    sdpa_ctx_destroy(ctx);
}

static void test_backward(void) {
    sdpa_params p = {0};
    check_grads("--q q.npy --k k.npy --v v.npy --dout dout.npy --out out.npy --dq gq.npy "
                "--dk gk.npy --dv gv.npy",
                &p);
    p.causal = 1;
    p.align = SDPA_ALIGN_BOTTOM_RIGHT;
    p.dropout_p = 0.25f;
    p.dropout_seed = 7;
    p.dropout_offset = 3;
    check_grads("--q q.npy --k k.npy --v v.npy --causal bottom-right --dropout 0.25 --seed 7 "
                "--dropout-offset 3 --dout dout.npy --out out.npy --dq gq.npy --dk gk.npy "
                "--dv gv.npy",
                &p);
    /* one gradient alone; nothing printed when only gradients are asked for */
    CHECK_INT_EQ(run("--q q.npy --k k.npy --v v.npy --dout dout.npy --dk gk_only.npy"), 0);
    CHECK(exists("gk_only.npy") && out_text[0] == '\0');
}

static void test_heatmap(void) {
    CHECK_INT_EQ(run("--q q.npy --k k.npy --v v.npy --causal --heatmap w.png"), 0);
    char p[512], sig[8] = {0};
    path_of(p, sizeof p, "w.png");
    FILE *f = fopen(p, "rb");
    CHECK(f != NULL && fread(sig, 1, 8, f) == 8 && memcmp(sig, "\x89PNG\r\n\x1a\n", 8) == 0);
    if (f)
        fclose(f);
    CHECK_INT_EQ(run("--q q.npy --k k.npy --v v.npy --heatmap w1.png --head 2"), 0);
    CHECK(exists("w1.png"));
    CHECK_INT_EQ(run("--q q.npy --k k.npy --v v.npy --heatmap w2.png --head 3"), 2);
    CHECK_STR_CONTAINS(err_text, "--head 3");
    CHECK(!exists("w2.png"));
}

/* Each error: its exit code, a message naming what is wrong, and nothing written. */
static void test_errors(void) {
    static const struct {
        const char *args, *message;
        int code;
    } cases[] = {
        {"--k k.npy --v v.npy --out e.npy", "--q, --k and --v are required", 2},
        {"--q q.npy --k k.npy --v v.npy --frob --out e.npy", "unknown option '--frob'", 2},
        {"--q q.npy --k k.npy --v v.npy --out", "--out needs a value", 2},
        {"--q q.npy --k k.npy --v v.npy --window 3 --out e.npy", "--window 3", 2},
        {"--q q.npy --k k.npy --v v.npy --window -2,0 --out e.npy", "--window -2,0", 2},
        {"--q q.npy --k k.npy --v v.npy --scale nan --out e.npy", "--scale nan", 2},
        {"--q q.npy --k k.npy --v v.npy --softcap -1 --out e.npy", "--softcap -1", 2},
        {"--q q.npy --k k.npy --v v.npy --softcap 1e-50 --out e.npy",
         "--softcap 1e-50: out of f32's range", 2},
        {"--q q.npy --k k.npy --v v.npy --scale 1e39 --out e.npy", "--scale 1e39: out of f32's", 2},
        {"--q q.npy --k k.npy --v v.npy --window "
         "1,000000000000000000000000000000000000000000000000000000000000000000000x --out e.npy",
         "L and R must be integers", 2},
        {"--q q.npy --k k.npy --v v.npy --window "
         "0000000000000000000000000000000000000000000001,1 --out e.npy",
         "L and R must be integers", 2},
        {"--q q.npy --k k.npy --v v.npy --causal diagonal --out e.npy",
         "--causal diagonal: expected top-left or bottom-right", 2},
        {"--q q.npy --k k.npy --v v.npy --mask q_bf16.npy --dtype bf16 --out e.npy",
         "save a keep-mask as bool (mask.astype(bool))", 1},
        {"--q slopes.npy --k k.npy --v v.npy --out e.npy", "slopes.npy (the queries) has rank 1",
         1},
        {"--q q.npy --k k.npy --v v.npy --mask mask_f64.npy --out e.npy",
         "convert a keep-mask (1 = attend) with arr.astype(bool)", 1},
        {"--q q.npy --k k.npy --v v.npy --mask mask_int64.npy --out e.npy",
         "a (B, Lk) padding mask needs the shape (B, 1, 1, Lk)", 1},
        {"--q q.npy --k k.npy --v v.npy --mask mask_int_bad.npy --out e.npy",
         "an integer mask must hold only 0 and 1 (a keep-mask: 1 = attend), but the element at "
         "(1, 3) is 2",
         1},
        {"--q q.npy --k k.npy --v v.npy --out-dtype f64 --out e.npy",
         "--out-dtype f64: expected f32, f16 or bf16", 2},
        {"--q q.npy --k k.npy --v v.npy --out-dtype f32 --lse e.npy",
         "--out-dtype only applies to --out", 2},
        {"--q q.npy --k k.npy --v v.npy --dq e.npy", "--dq, --dk and --dv need --dout FILE", 2},
        {"--q q.npy --k k.npy --v v.npy --dout dout.npy --out e.npy", "--dout is for the backward",
         2},
        {"--q q.npy --k k.npy --v v.npy --seed 4 --out e.npy",
         "--seed and --dropout-offset only apply with --dropout P", 2},
        {"--q q.npy --k k.npy --v v.npy --dropout 1 --out e.npy", "--dropout 1: expected", 2},
        {"--q q.npy --k k.npy --v v.npy --dropout 0.1 --seed -1 --out e.npy",
         "--seed -1: expected an integer", 2},
        {"--q q.npy --k k.npy --v v.npy --dout dout.npy --dq dout.npy --out e.npy",
         "--dq dout.npy is the input --dout dout.npy", 2},
        {"--q q.npy --k k.npy --v v.npy --dout dout_bad.npy --dq e.npy",
         "dout_bad.npy has shape (2, 3, 5, 8), but the output it is the gradient of has shape "
         "(2, 3, 5, 6)",
         1},
        {"--q q.npy --k k.npy --v v.npy --mask mask_padding.npy --out e.npy",
         "a (B, Lk) padding mask needs the shape (B, 1, 1, Lk): save mask[:, None, None, :]", 1},
        {"--q q.npy --k k.npy --v v.npy --threads x --out e.npy", "--threads x", 2},
        {"--q q.npy --k k.npy --v v.npy --align middle --out e.npy", "--align middle", 2},
        {"--q q.npy --k k.npy --v v.npy --dtype f64 --out e.npy", "--dtype f64", 2},
        {"--q q.npy --k k.npy --v v.npy --head 1 --out e.npy", "--head only applies", 2},
        {"--q q.npy --k k.npy --v v.npy --alibi --alibi-slopes slopes.npy --out e.npy",
         "exclude each other", 2},
        {"--q missing.npy --k k.npy --v v.npy --out e.npy", "missing.npy", 1},
        {"--q q.npy --k kbad.npy --v v.npy --out e.npy",
         "kbad.npy has shape (2, 1, 7, 7) but q.npy has shape (2, 3, 5, 8)", 1},
        {"--q q.npy --k k.npy --v v.npy --mask mask_bad.npy --out e.npy",
         "mask_bad.npy has shape (6, 7), which does not broadcast", 1},
        {"--q mask_bool.npy --k k.npy --v v.npy --out e.npy", "mask_bool.npy", 1},
        {"--q q.npy --k k.npy --v v.npy --alibi-slopes slopes_bad.npy --out e.npy",
         "slopes_bad.npy has shape (2,)", 1},
        {"--q q.npy --k k.npy --v v.npy --out no/such/dir/e.npy", "no/such/dir/e.npy", 1},
    };
    for (size_t n = 0; n < sizeof cases / sizeof cases[0]; n++) {
        const int rc = run(cases[n].args);
        CHECK_MSG(rc == cases[n].code, "'%s': exit %d, want %d", cases[n].args, rc, cases[n].code);
        CHECK_MSG(strstr(err_text, cases[n].message) != NULL, "'%s': stderr \"%s\" lacks \"%s\"",
                  cases[n].args, err_text, cases[n].message);
        CHECK_MSG(!exists("e.npy") && no_temp_files(), "'%s' left a file behind", cases[n].args);
    }
    CHECK_INT_EQ(run("--help"), 0);
    CHECK_STR_CONTAINS(out_text, "usage: sdpa run");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_run PATH/TO/sdpa\n");
        return 2;
    }
    static char bin[4096];
    if (realpath(argv[1], bin) == NULL) { /* the commands run from the scratch directory */
        perror(argv[1]);
        return 2;
    }
    sdpa_bin = bin;
    if (tu_scratch_dir(dir, sizeof dir, "sdpa-test-run.") != 0) {
        perror("test_run: mkdtemp");
        return 2;
    }
    write_inputs();
    const int rc = CHECK_RUN(argc - 1, argv + 1, CASE(test_basic_outputs),
                             CASE(test_every_parameter), CASE(test_threads_dtypes_ranks),
                             CASE(test_backward), CASE(test_heatmap), CASE(test_errors));
    if (tu_remove_dir(dir) != 0)
        fprintf(stderr, "test_run: could not remove %s\n", dir);
    tu_free(&q);
    tu_free(&k);
    tu_free(&v);
    tu_free(&dout);
    return rc;
}
