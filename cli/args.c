/*
 * args.c — see args.h.
 */
#include "args.h"

#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "sdpa %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (try 'sdpa %s --help')\n", cmd);
    va_end(ap);
    return CLI_USAGE;
}

void cli_verror(char *err, size_t errlen, const char *name, const char *fmt, va_list ap) {
    if (err == NULL || errlen == 0)
        return;
    const size_t len = strlen(name), room = errlen / 2;
    int n;
    if (len > room && room >= 16) {
        const int part = (int)(room / 2) - 2;
        n = snprintf(err, errlen, "%.*s...%s: ", part, name, name + len - (size_t)part);
    } else {
        n = snprintf(err, errlen, "%s: ", name);
    }
    if (n < 0 || (size_t)n >= errlen)
        return;
    vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
}

void cli_error(char *err, size_t errlen, const char *name, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cli_verror(err, errlen, name, fmt, ap);
    va_end(ap);
}

int cli_is_help(const char *arg) {
    return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0;
}

int cli_no_options(const char *cmd, int argc, char **argv, const char *help) {
    if (argc == 0)
        return -1;
    if (cli_is_help(argv[0])) {
        puts(help);
        return CLI_OK;
    }
    return cli_usage_error(cmd, "unknown option '%s'", argv[0]);
}

int cli_option_value(int argc, char **argv, int *i, const char *opt, const char **val) {
    const size_t n = strlen(opt);
    if (strncmp(argv[*i], opt, n) != 0)
        return 0;
    if (argv[*i][n] == '=') {
        *val = argv[*i] + n + 1;
        return 1;
    }
    if (argv[*i][n] != '\0')
        return 0;
    *val = *i + 1 < argc ? argv[++*i] : NULL;
    return 1;
}

int cli_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    /* strtoll would skip leading spaces and take a '+': a typo should not pass as a number */
    if (s == NULL ||
        !(isdigit((unsigned char)s[0]) || (s[0] == '-' && isdigit((unsigned char)s[1]))))
        return -1;
    char *end;
    errno = 0;
    const long long v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = (int64_t)v;
    return 0;
}

int cli_parse_float(const char *s, float *out) {
    if (s == NULL || *s == '\0' || isspace((unsigned char)s[0]))
        return -1;
    char *end;
    errno = 0;
    const float v = strtof(s, &end);
    if (*end != '\0' || end == s)
        return -1;
    const int range = errno == ERANGE;
    /* strtof reports ERANGE for a subnormal result too, which f32 does hold */
    if (range && (v == 0.0f || !isfinite(v)))
        return -2;
    if (!isfinite(v)) /* "inf", "nan" */
        return -1;
    *out = v;
    return 0;
}
