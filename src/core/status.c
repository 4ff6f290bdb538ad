/*
 * status.c — the small pure functions of the public API: status strings, dtype and ISA names,
 * version, and the contiguous tensor constructors. None touches a context; all are thread
 * safe.
 */
#include "sdpa.h"

#define SDPA__STR_STRINGIFY(x) #x
#define SDPA__STR(x) SDPA__STR_STRINGIFY(x)

const char *sdpa_version(void) {
    return SDPA__STR(SDPA_VERSION_MAJOR) "." SDPA__STR(SDPA_VERSION_MINOR) "." SDPA__STR(
        SDPA_VERSION_PATCH);
}

int sdpa_version_number(void) {
    return SDPA_VERSION_NUMBER;
}

const char *sdpa_status_str(sdpa_status status) {
    switch (status) {
#define SDPA__STATUS_TEXT(name, value, text)                                                       \
    case name:                                                                                     \
        return text;
        SDPA_STATUS_LIST(SDPA__STATUS_TEXT)
#undef SDPA__STATUS_TEXT
    }
    return "unknown status";
}

const char *sdpa_status_name(sdpa_status status) {
    switch (status) {
#define SDPA__STATUS_NAME(name, value, text)                                                       \
    case name:                                                                                     \
        return #name;
        SDPA_STATUS_LIST(SDPA__STATUS_NAME)
#undef SDPA__STATUS_NAME
    }
    return "SDPA_UNKNOWN";
}

size_t sdpa_dtype_size(sdpa_dtype dtype) {
    switch (dtype) {
    case SDPA_F32:
        return 4;
    case SDPA_F16:
    case SDPA_BF16:
        return 2;
    case SDPA_BOOL:
        return 1;
    }
    return 0;
}

const char *sdpa_dtype_name(sdpa_dtype dtype) {
    switch (dtype) {
    case SDPA_F32:
        return "f32";
    case SDPA_F16:
        return "f16";
    case SDPA_BF16:
        return "bf16";
    case SDPA_BOOL:
        return "bool";
    }
    return "unknown";
}

const char *sdpa_isa_name(sdpa_isa isa) {
    switch (isa) {
    case SDPA_ISA_AUTO:
        return "auto";
    case SDPA_ISA_GENERIC:
        return "generic";
    case SDPA_ISA_AVX2:
        return "avx2";
    case SDPA_ISA_AVX512:
        return "avx512";
    case SDPA_ISA_AMX:
        return "amx";
    }
    return "unknown";
}

/* Products of extents saturate at INT64_MAX instead of overflowing, so that absurd extents
 * give a stride that the validator reports as SDPA_ERR_OVERFLOW rather than a wrapped one. */
static int64_t mul_sat(int64_t a, int64_t b) {
    int64_t r;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r))
        return INT64_MAX;
    return r;
}

sdpa_tensor sdpa_tensor_bhld(void *data, sdpa_dtype dtype, int64_t b, int64_t h, int64_t l,
                             int64_t d) {
    sdpa_tensor t = {data, dtype, {b, h, l, d}, {mul_sat(mul_sat(h, l), d), mul_sat(l, d), d, 1}};
    return t;
}

sdpa_tensor sdpa_tensor_blhd(void *data, sdpa_dtype dtype, int64_t b, int64_t l, int64_t h,
                             int64_t d) {
    sdpa_tensor t = {data, dtype, {b, h, l, d}, {mul_sat(mul_sat(l, h), d), d, mul_sat(h, d), 1}};
    return t;
}
