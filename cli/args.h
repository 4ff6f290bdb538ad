/*
 * args.h — what every subcommand of `sdpa` needs to read its options, in one place: usage
 * errors in one format ("sdpa CMD: what is wrong (try 'sdpa CMD --help')", exit code 2),
 * "--opt VALUE" and "--opt=VALUE", and strict numbers (the whole string, in range).
 */
#ifndef SDPA_CLI_ARGS_H
#define SDPA_CLI_ARGS_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* Prints the message for subcommand cmd on stderr. @return CLI_USAGE (2). */
int cli_usage_error(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Writes "NAME: message" into err (which may be NULL or empty). A name longer than half of
 * err keeps its start and its end around "...", so that the message, the part that says what
 * is wrong, still fits (a path of 4000 characters once left no room for it). */
void cli_verror(char *err, size_t errlen, const char *name, const char *fmt, va_list ap);
void cli_error(char *err, size_t errlen, const char *name, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* @return 1 if arg asks for the help text: "--help" or "-h". */
int cli_is_help(const char *arg);

/* The arguments of a subcommand that takes no options: the help text (puts: a newline is
 * added) for --help or -h, a usage error for anything else.
 * @return -1 when there are no arguments (go on), else the exit code (CLI_OK after the
 *         help, CLI_USAGE after the message). */
int cli_no_options(const char *cmd, int argc, char **argv, const char *help);

/* @return 1 if argv[*i] is opt, as "--opt VALUE" (then *i moves to the value) or
 * "--opt=VALUE", with the value in *val (NULL when "--opt" is last); 0 otherwise. */
int cli_option_value(int argc, char **argv, int *i, const char *opt, const char **val);

/* A whole decimal integer in [lo, hi]: no spaces, no trailing characters, no overflow.
 * @return 0 and sets *out, or -1 (also for NULL). */
int cli_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out);

/* A whole number, as an f32. Subnormal values are taken (1e-40 is a valid tiny number).
 * @return 0 and sets *out; -1 if s is not a number (also for NULL, inf and nan); -2 if it is
 *         one that f32 cannot hold: beyond about 3.4e38, or so small that it rounds to 0. */
int cli_parse_float(const char *s, float *out);

#endif
