/*
 * check.h — the assertion library of sdpa's tests: a header of our own rather than cmocka,
 * because it adds no dependency to install on a fresh machine, it prints values in the units
 * our tests need (max error vs bound, status names, messages), and it is small enough to read
 * whole. A failed CHECK records the failure and continues the case; the program ends with a
 * line "N passed, M failed" and exits non-zero if anything failed, which is what CTest counts.
 *
 * Usage:
 *     static void test_something(void) { CHECK(1 + 1 == 2); CHECK_NEAR(x, 0.5, 1e-6); }
 *     CHECK_MAIN(CASE(test_something), CASE(test_other))
 * or, for a program with work to do around its cases, a main() of its own that returns
 * CHECK_RUN(argc, argv, CASE(test_something), ...). `prog NAME` runs only the cases whose name
 * contains NAME.
 *
 * The failure count is per translation unit: a CHECK counts only in the program file that
 * makes it, so helpers that check go in the test's own file or in a header like this one.
 */
#ifndef SDPA_TEST_CHECK_H
#define SDPA_TEST_CHECK_H

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct check_case {
    const char *name;
    void (*fn)(void);
} check_case;

#define CASE(fn)                                                                                   \
    { #fn, fn }

/* Failures in the current case; reset by check_run for each case. */
static int check__failures;

static inline void check__fail(const char *file, int line, const char *what) {
    check__failures++;
    fprintf(stderr, "  FAIL %s:%d: %s\n", file, line, what);
}

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            check__fail(__FILE__, __LINE__, #cond);                                                \
    } while (0)

/* Like CHECK, with a printf-style explanation. */
#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            char check__buf[512];                                                                  \
            /* a long message is cut; testing the result says that is intended */                  \
            if (snprintf(check__buf, sizeof check__buf, __VA_ARGS__) < 0)                          \
                check__buf[0] = '\0';                                                              \
            check__fail(__FILE__, __LINE__, check__buf);                                           \
        }                                                                                          \
    } while (0)

#define CHECK_INT_EQ(a, b)                                                                         \
    do {                                                                                           \
        const long long check__a = (long long)(a), check__b = (long long)(b);                      \
        CHECK_MSG(check__a == check__b, "%s == %s: %lld vs %lld", #a, #b, check__a, check__b);     \
    } while (0)

/* |a - b| <= tol, and both NaN counts as equal. */
#define CHECK_NEAR(a, b, tol)                                                                      \
    do {                                                                                           \
        const double check__a = (double)(a), check__b = (double)(b);                               \
        CHECK_MSG((isnan(check__a) && isnan(check__b)) || fabs(check__a - check__b) <= (tol),      \
                  "%s ~ %s: %.9g vs %.9g (tol %.3g)", #a, #b, check__a, check__b, (double)(tol));  \
    } while (0)

#define CHECK_STR_EQ(a, b)                                                                         \
    do {                                                                                           \
        const char *check__a = (a), *check__b = (b);                                               \
        CHECK_MSG(check__a != NULL && check__b != NULL && strcmp(check__a, check__b) == 0,         \
                  "%s == %s: \"%s\" vs \"%s\"", #a, #b, check__a ? check__a : "(null)",            \
                  check__b ? check__b : "(null)");                                                 \
    } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                                            \
    do {                                                                                           \
        const char *check__h = (hay), *check__n = (needle);                                        \
        CHECK_MSG(check__h != NULL && strstr(check__h, check__n) != NULL,                          \
                  "\"%s\" does not contain \"%s\"", check__h ? check__h : "(null)", check__n);     \
    } while (0)

static inline int check_run(const check_case *cases, size_t n, int argc, char **argv) {
    int passed = 0, failed = 0;
    for (size_t i = 0; i < n; i++) {
        if (argc > 1 && strstr(cases[i].name, argv[1]) == NULL)
            continue;
        check__failures = 0;
        cases[i].fn();
        if (check__failures == 0) {
            passed++;
            printf("  ok   %s\n", cases[i].name);
        } else {
            failed++;
            printf("  FAIL %s (%d checks)\n", cases[i].name, check__failures);
        }
        fflush(stdout);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 && passed > 0 ? 0 : 1;
}

/* check_run over the cases listed in place: CHECK_RUN(argc, argv, CASE(a), CASE(b), ...). */
#define CHECK_RUN(argc, argv, ...)                                                                 \
    check_run((const check_case[]){__VA_ARGS__},                                                   \
              sizeof((const check_case[]){__VA_ARGS__}) / sizeof(check_case), (argc), (argv))

/* The main() of a program that only runs its cases: CHECK_MAIN(CASE(a), CASE(b), ...). */
#define CHECK_MAIN(...)                                                                            \
    int main(int argc, char **argv) {                                                              \
        return CHECK_RUN(argc, argv, __VA_ARGS__);                                                 \
    }

#endif /* SDPA_TEST_CHECK_H */
