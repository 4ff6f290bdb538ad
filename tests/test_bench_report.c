/*
 * test_bench_report.c — what `sdpa bench` says about a run whose peaks moved
 * (cli/bench_report.c): the spread of two measurements of a peak, the table's note where the
 * FMA peaks or the AMX tile peaks at the start and at the end are more than BENCH_PEAK_SPREAD
 * apart, and the JSON's peak.fma_spread, peak.tile_spread and peak.disturbed. The runs are
 * made up here: no timing is taken or asserted.
 */
#include "bench.h"
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_spread(void) {
    CHECK_NEAR(bench_peak_spread(300.0, 300.0), 0.0, 0.0);
    CHECK_NEAR(bench_peak_spread(300.0, 200.0), 1.0 / 3.0, 1e-12); /* of the higher */
    CHECK_NEAR(bench_peak_spread(200.0, 300.0), 1.0 / 3.0, 1e-12); /* symmetric */
    CHECK(isnan(bench_peak_spread(NAN, 300.0)));
    CHECK(isnan(bench_peak_spread(300.0, NAN)));
    CHECK(isnan(bench_peak_spread(0.0, 300.0)));
    CHECK(isnan(bench_peak_spread(300.0, -1.0)));
    CHECK(isnan(bench_peak_spread(INFINITY, 300.0)));
}

/* A run with these peaks (tile NAN: not measured) and no shape. */
static bench_run made_up(double fma0, double fma1, double tile0, double tile1) {
    bench_run r;
    memset(&r, 0, sizeof r);
    r.n_threads = 2;
    r.isa = "avx512";
    r.kernel = "flash-avx512";
    r.cpu_isa = "avx512";
    strcpy(r.cpu, "a made-up CPU");
    strcpy(r.date, "2026-11-29T00:00:00Z");
    r.peak_start = (bench_peak){SDPA_ISA_AVX512, 2, fma0, 20.0, tile0};
    r.peak_end = (bench_peak){SDPA_ISA_AVX512, 2, fma1, 20.0, tile1};
    r.peak_gflops = fma0 > fma1 ? fma0 : fma1;
    r.peak_gbs = 20.0;
    r.peak_tile_gflops = isfinite(tile0) ? (tile0 > tile1 ? tile0 : tile1) : NAN;
    return r;
}

/* What a writer of the report put in a file, as a string (freed by the caller). */
static char *report(int json, const bench_run *r) {
    FILE *f = tmpfile();
    if (f == NULL)
        return NULL;
    if (json)
        bench_write_json(f, r, NULL, 0);
    else
        bench_print_table(f, r, NULL, 0);
    const long n = ftell(f);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s != NULL) {
        rewind(f);
        s[fread(s, 1, (size_t)n, f)] = '\0';
    }
    fclose(f);
    return s;
}

static void expect(const bench_run *r, const char *table_has, const char *json_has) {
    char *t = report(0, r), *j = report(1, r);
    CHECK(t != NULL && j != NULL);
    if (t != NULL && j != NULL) {
        if (table_has != NULL)
            CHECK_MSG(strstr(t, table_has) != NULL, "the table lacks \"%s\":\n%s", table_has, t);
        else
            CHECK_MSG(strstr(t, "was busy") == NULL, "a note where the peaks agree:\n%s", t);
        CHECK_MSG(strstr(j, json_has) != NULL, "the JSON lacks \"%s\":\n%s", json_has, j);
    }
    free(t);
    free(j);
}

static void test_notes(void) {
    bench_run r = made_up(300.0, 310.0, NAN, NAN); /* 3 %: a quiet run */
    expect(&r, NULL, "\"disturbed\": false");
    expect(&r, NULL, "\"tile_spread\": null");
    r = made_up(300.0, 200.0, NAN, NAN); /* the FMA units slowed for part of it */
    expect(&r, "the FMA peaks at the start and at the end differ by 33.3 % of the higher",
           "\"disturbed\": true");
    expect(&r, "run it again", "\"fma_spread\": 0.333333333,");
    r = made_up(300.0, 340.0, NAN, NAN); /* 11.8 %: under the limit */
    expect(&r, NULL, "\"disturbed\": false");
    r = made_up(300.0, 255.0, NAN, NAN); /* 15 % exactly: not more than the limit */
    expect(&r, NULL, "\"disturbed\": false");
    r = made_up(300.0, 362.0, NAN, NAN); /* 17.1 %: just over it */
    expect(&r, "differ by 17.1 % of the higher (more than 15 %)", "\"disturbed\": true");
    r = made_up(300.0, 305.0, 2200.0, 1000.0); /* the tile unit slowed, the FMAs did not */
    expect(&r, "the AMX tile peaks at the start and at the end differ by 54.5 % of the higher",
           "\"disturbed\": true");
    expect(&r, "was busy", "\"tile_spread\": 0.545454545,");
    r = made_up(300.0, 305.0, 2200.0, 2150.0); /* both quiet */
    expect(&r, NULL, "\"disturbed\": false");
    r = made_up(300.0, 150.0, 2200.0, 1000.0); /* both moved: both are named */
    expect(&r,
           "the FMA peaks and the AMX tile peaks at the start and at the end differ by 50.0 % "
           "and 54.5 % of the higher",
           "\"disturbed\": true");
}

CHECK_MAIN(CASE(test_spread), CASE(test_notes))
