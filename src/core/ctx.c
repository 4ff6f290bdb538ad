/*
 * ctx.c — the context: creation (CPU probe, ISA caps, thread count, allocator), destruction,
 * error messages, scratch allocation and the description shown by `sdpa info`.
 */
#include "../dispatch/cpu.h"
#include "../kernels/kernels.h"
#include "../thread/pool.h"
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

sdpa_status sdpa__fail(sdpa_ctx *ctx, sdpa_status status, const char *fmt, ...) {
    if (ctx != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
        va_end(ap);
    }
    return status;
}

static void *default_alloc(size_t size, size_t align, void *user) {
    (void)user;
    void *p = NULL;
    if (align < sizeof(void *))
        align = sizeof(void *);
    if (posix_memalign(&p, align, size) != 0)
        return NULL;
    return p;
}

static void default_free(void *ptr, void *user) {
    (void)user;
    free(ptr);
}

void *sdpa__alloc(const sdpa_ctx *ctx, size_t size, size_t align) {
    return ctx->allocator.alloc(size == 0 ? 1 : size, align, ctx->allocator.user);
}

void sdpa__free(const sdpa_ctx *ctx, void *ptr) {
    if (ptr != NULL)
        ctx->allocator.free(ptr, ctx->allocator.user);
}

int sdpa__n_workers(const sdpa_ctx *ctx) {
    return ctx->n_threads;
}

void sdpa__parallel_for(sdpa_ctx *ctx, int64_t n_tasks, void (*fn)(void *, int64_t, int),
                        void *arg) {
    sdpa__pool_run(ctx->pool, n_tasks, fn, arg);
}

static int online_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        return 1;
    return n > SDPA_MAX_THREADS ? SDPA_MAX_THREADS : (int)n;
}

static void append(char *buf, size_t cap, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static void append(char *buf, size_t cap, const char *fmt, ...) {
    size_t len = strlen(buf);
    if (len + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
}

static void describe(sdpa_ctx *ctx, const sdpa__cpu *cpu, sdpa_isa param_cap, const char *env,
                     int env_unknown, sdpa_isa env_cap) {
    char *d = ctx->describe;
    const size_t cap = sizeof ctx->describe;
    d[0] = '\0';
    append(d, cap, "sdpa %s\n", sdpa_version());
    append(d, cap,
           "cpu:      avx2=%d fma=%d f16c=%d avx512f=%d avx512bw=%d avx512dq=%d "
           "avx512vl=%d avx512_bf16=%d avx512_fp16=%d amx_tile=%d amx_bf16=%d\n",
           cpu->avx2, cpu->fma, cpu->f16c, cpu->avx512f, cpu->avx512bw, cpu->avx512dq,
           cpu->avx512vl, cpu->avx512_bf16, cpu->avx512_fp16, cpu->amx_tile, cpu->amx_bf16);
    append(d, cap, "cpu isa:  %s (CPUID and XGETBV)\n", sdpa_isa_name(cpu->best));
    append(d, cap, "max_isa:  %s (context parameter)\n", sdpa_isa_name(param_cap));
    if (env == NULL)
        append(d, cap, "env:      SDPA_MAX_ISA not set\n");
    else if (env_unknown)
        append(d, cap,
               "env:      SDPA_MAX_ISA=\"%.40s\" is not generic|avx2|avx512|amx: "
               "ignored\n",
               env);
    else
        append(d, cap, "env:      SDPA_MAX_ISA=%s\n", sdpa_isa_name(env_cap));
    append(d, cap, "isa:      %s\n", sdpa_isa_name(ctx->isa));
    append(d, cap, "threads:  %d\n", ctx->n_threads);
    int count;
    const sdpa__impl *const *list = sdpa__impls(&count);
    append(d, cap, "kernels:");
    for (int n = count - 1; n >= 0; n--)
        append(d, cap, " %s(%s%s)", list[n]->name, sdpa_isa_name(list[n]->isa),
               list[n]->isa <= ctx->isa ? "" : ", unavailable");
    append(d, cap, "\n");
}

sdpa_status sdpa_ctx_create(const sdpa_ctx_params *params, sdpa_ctx **out) {
    if (out == NULL)
        return SDPA_ERR_NULL;
    *out = NULL;
    const sdpa_ctx_params defaults = {0};
    if (params == NULL)
        params = &defaults;
    if (params->n_threads < 0 || params->n_threads > SDPA_MAX_THREADS)
        return SDPA_ERR_THREADS;
    if ((int)params->max_isa < SDPA_ISA_AUTO || (int)params->max_isa > SDPA_ISA_AMX)
        return SDPA_ERR_PARAM;
    if ((params->allocator.alloc == NULL) != (params->allocator.free == NULL))
        return SDPA_ERR_PARAM;

    sdpa_allocator allocator = params->allocator;
    if (allocator.alloc == NULL) {
        allocator.alloc = default_alloc;
        allocator.free = default_free;
        allocator.user = NULL;
    }
    sdpa_ctx *ctx = allocator.alloc(sizeof *ctx, 64, allocator.user);
    if (ctx == NULL)
        return SDPA_ERR_NOMEM;
    memset(ctx, 0, sizeof *ctx);
    ctx->allocator = allocator;
    ctx->n_threads = params->n_threads == 0 ? online_cores() : params->n_threads;
    const sdpa_status st = sdpa__pool_create(ctx->n_threads, &ctx->allocator, &ctx->pool);
    if (st != SDPA_OK) {
        allocator.free(ctx, allocator.user);
        return st;
    }

    sdpa__cpu cpu;
    sdpa__cpu_probe(&cpu);
    ctx->cpu_isa = cpu.best;
    ctx->isa = cpu.best;
    if (params->max_isa != SDPA_ISA_AUTO && params->max_isa < ctx->isa)
        ctx->isa = params->max_isa;
    const char *env = getenv("SDPA_MAX_ISA");
    int env_unknown = 0;
    const sdpa_isa env_cap = sdpa__parse_isa(env, &env_unknown);
    if (env_cap != SDPA_ISA_AUTO && env_cap < ctx->isa)
        ctx->isa = env_cap;
    describe(ctx, &cpu, params->max_isa, env, env_unknown, env_cap);
    *out = ctx;
    return SDPA_OK;
}

void sdpa_ctx_destroy(sdpa_ctx *ctx) {
    if (ctx == NULL)
        return;
    sdpa__pool_destroy(ctx->pool);
    sdpa_allocator a = ctx->allocator;
    a.free(ctx, a.user);
}

const char *sdpa_ctx_last_error(const sdpa_ctx *ctx) {
    return ctx == NULL ? "" : ctx->err;
}

int sdpa_ctx_n_threads(const sdpa_ctx *ctx) {
    return ctx == NULL ? 1 : ctx->n_threads;
}

sdpa_isa sdpa_ctx_isa(const sdpa_ctx *ctx) {
    return ctx == NULL ? SDPA_ISA_GENERIC : ctx->isa;
}

const char *sdpa_ctx_describe(const sdpa_ctx *ctx) {
    return ctx == NULL ? "" : ctx->describe;
}
