/*
 * context.c — the context: creation (CPU probe, ISA caps, the implementation each operation
 * runs, thread count, allocator), destruction, the services lower layers ask of it
 * (core/services.h: error messages, scratch allocation, parallel loops) and the description
 * shown by `sdpa info`.
 */
#include "context.h"

#include "core/services.h"
#include "dispatch/cpu.h"
#include "thread/pool.h"

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

/* The acquire pairs with release's store, so each call sees everything the previous one
 * wrote into the context. */
int sdpa__claim(sdpa_ctx *ctx) {
    return atomic_exchange_explicit(&ctx->busy, 1, memory_order_acquire);
}

sdpa_status sdpa__release(sdpa_ctx *ctx, sdpa_status status) {
    atomic_store_explicit(&ctx->busy, 0, memory_order_release);
    return status;
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

static void describe(sdpa_ctx *ctx, uint32_t features, sdpa_isa param_cap, const char *env,
                     int env_unknown, sdpa_isa env_cap) {
    char *d = ctx->describe;
    const size_t cap = sizeof ctx->describe;
    char names[256];
    d[0] = '\0';
    append(d, cap, "sdpa %s\n", sdpa_version());
    sdpa__cpu_feature_names(features, names, sizeof names);
    append(d, cap, "cpu:      %s\n", names);
    append(d, cap, "cpu isa:  %s (CPUID and XGETBV)\n", sdpa_isa_name(sdpa__cpu_level(features)));
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
    append(d, cap, "isa:      %s\n", sdpa_isa_name(sdpa_ctx_isa(ctx)));
    append(d, cap, "threads:  %d\n", ctx->n_threads);
    int count;
    const sdpa__impl *const *list = sdpa__impls(&count);
    static const char *const op_names[SDPA__N_OPS] = {"forward: ", "weights: ", "backward:"};
    for (int op = 0; op < SDPA__N_OPS; op++) {
        const sdpa__impl *impl = ctx->impl[op];
        append(d, cap, "%s %s", op_names[op], impl->name);
        /* one that takes only some problems: what it takes, and what runs the others */
        if (impl->supports != NULL) {
            const sdpa__impl *rest = list[0];
            for (int n = 0; list[n] != impl; n++)
                if (sdpa__impl_offers(list[n], (sdpa__op)op) && list[n]->supports == NULL &&
                    sdpa__impl_allowed(list[n], features, ctx->cap))
                    rest = list[n];
            append(d, cap, " (%s)\n          %s (the others)", impl->takes, rest->name);
        }
        append(d, cap, "\n");
    }
    append(d, cap, "kernels:");
    for (int n = count - 1; n >= 0; n--) {
        const sdpa__impl *impl = list[n];
        /* (under a cap below amx the tile permission is never asked for: not a lack) */
        uint32_t lacks = impl->needs & ~features;
        if (ctx->cap != SDPA_ISA_AUTO && ctx->cap < SDPA_ISA_AMX)
            lacks &= ~(uint32_t)SDPA__CPU_AMX_PERM;
        const char *why = "";
        if (lacks != 0)
            why = ", unavailable: the CPU lacks ";
        else if (!sdpa__impl_allowed(impl, features, ctx->cap))
            why = ", unavailable: above the cap";
        append(d, cap, " %s(%s%s", impl->name, sdpa_isa_name(impl->level), why);
        if (lacks != 0) {
            sdpa__cpu_feature_names(lacks, names, sizeof names);
            append(d, cap, "%s", names);
        }
        append(d, cap, ")");
    }
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
    atomic_init(&ctx->busy, 0);
    atomic_init(&ctx->last, NULL);
    ctx->allocator = allocator;
    ctx->n_threads = params->n_threads == 0 ? online_cores() : params->n_threads;
    const sdpa_status st = sdpa__pool_create(ctx->n_threads, &ctx->allocator, &ctx->pool);
    if (st != SDPA_OK) {
        allocator.free(ctx, allocator.user);
        return st;
    }

    const char *env = getenv("SDPA_MAX_ISA");
    int env_unknown = 0;
    const sdpa_isa env_cap = sdpa__parse_isa(env, &env_unknown);
    ctx->cap = params->max_isa;
    if (env_cap != SDPA_ISA_AUTO && (ctx->cap == SDPA_ISA_AUTO || env_cap < ctx->cap))
        ctx->cap = env_cap;
    sdpa__cpu cpu;
    sdpa__cpu_probe(&cpu);
    /* The tile permission is asked for only when a registered table needs it and the cap lets
     * it run: it is a change to the process, never undone. */
    if ((sdpa__impls_needs() & SDPA__CPU_AMX_PERM) &&
        (ctx->cap == SDPA_ISA_AUTO || ctx->cap >= SDPA_ISA_AMX))
        sdpa__cpu_request_tiles(&cpu);
    ctx->features = cpu.features;
    for (int op = 0; op < SDPA__N_OPS; op++)
        ctx->impl[op] = sdpa__select(ctx->features, ctx->cap, (sdpa__op)op, NULL);
    describe(ctx, ctx->features, params->max_isa, env, env_unknown, env_cap);
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
    return ctx == NULL ? SDPA_ISA_GENERIC : ctx->impl[SDPA__OP_FORWARD]->level;
}

sdpa_isa sdpa_ctx_cpu_isa(const sdpa_ctx *ctx) {
    return ctx == NULL ? SDPA_ISA_GENERIC : sdpa__cpu_level(ctx->features);
}

const char *sdpa_ctx_kernel(const sdpa_ctx *ctx) {
    return ctx == NULL ? "" : ctx->impl[SDPA__OP_FORWARD]->name;
}

const char *sdpa_ctx_last_kernel(const sdpa_ctx *ctx) {
    const sdpa__impl *last =
        ctx == NULL ? NULL : atomic_load_explicit(&ctx->last, memory_order_relaxed);
    return last == NULL ? "" : last->name;
}

const char *sdpa_ctx_describe(const sdpa_ctx *ctx) {
    return ctx == NULL ? "" : ctx->describe;
}
