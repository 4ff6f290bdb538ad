/*
 * sdpa.h — scaled dot-product attention for C.
 *
 *     O = softmax(S) V,   s_ij = softcap(scale * q_i . k_j) + alibi_ij + mask_ij
 *
 * This header is the manual. Every function states the shapes it expects, what it returns,
 * what it requires of the caller and whether it is thread safe. The semantics (mask polarity,
 * causal alignment, fully masked rows, NaN) are written out once, in the "Semantics" section
 * below, and every code path of the library obeys them.
 *
 * Conventions
 *   - Every function that can fail returns an sdpa_status: SDPA_OK (0) or a negative error.
 *     The library never aborts, exits or prints. When a call fails, its outputs are untouched
 *     and sdpa_ctx_last_error() explains why, naming the argument and its values.
 *   - Tensors are described by sdpa_tensor: a data pointer, a dtype, a shape of four extents
 *     and four strides counted in elements (not bytes). A stride of 0 broadcasts an extent.
 *   - Sizes, strides and offsets are int64_t everywhere.
 *
 * Thread safety
 *   Functions that take no context are thread safe. A context may be used by one thread at a
 *   time; several contexts may be used from several threads at once. Nothing in the library
 *   is global and mutable. A call that finds its context inside another thread's call does
 *   nothing and returns SDPA_ERR_BUSY at once (it neither waits nor hangs, and it leaves
 *   sdpa_ctx_last_error alone: the message belongs to the other call). Destroying a context
 *   while a call runs on it is undefined.
 */
#ifndef SDPA_H
#define SDPA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* SDPA_API marks the public symbols. The shared library is built with -fvisibility=hidden,
 * so only these are exported. Define SDPA_STATIC when linking the static library on Windows. */
#if defined(_WIN32) && !defined(SDPA_STATIC)
#if defined(SDPA_BUILDING)
#define SDPA_API __declspec(dllexport)
#else
#define SDPA_API __declspec(dllimport)
#endif
#elif defined(__GNUC__)
#define SDPA_API __attribute__((visibility("default")))
#else
#define SDPA_API
#endif

/* ---------------------------------------------------------------------------------------- */
/* Version                                                                                   */
/* ---------------------------------------------------------------------------------------- */

#define SDPA_VERSION_MAJOR 0
#define SDPA_VERSION_MINOR 1
#define SDPA_VERSION_PATCH 0
#define SDPA_VERSION_NUMBER                                                                        \
    (SDPA_VERSION_MAJOR * 10000 + SDPA_VERSION_MINOR * 100 + SDPA_VERSION_PATCH)

/* @return the version of the library actually linked, as "MAJOR.MINOR.PATCH". It may differ
 *         from the SDPA_VERSION_* macros of the header a program was compiled with. */
SDPA_API const char *sdpa_version(void);

/* @return SDPA_VERSION_NUMBER of the linked library. */
SDPA_API int sdpa_version_number(void);

/* ---------------------------------------------------------------------------------------- */
/* Status codes                                                                              */
/* ---------------------------------------------------------------------------------------- */

/* One list generates the enum and the strings of sdpa_status_str(). Values are stable. */
#define SDPA_STATUS_LIST(X)                                                                        \
    X(SDPA_OK, 0, "success")                                                                       \
    X(SDPA_ERR_NULL, -1, "a required pointer is NULL")                                             \
    X(SDPA_ERR_DTYPE, -2, "unsupported or mismatched dtype")                                       \
    X(SDPA_ERR_DIM, -3, "an extent is zero, negative or above the documented limit")               \
    X(SDPA_ERR_SHAPE, -4, "shapes of the tensors are inconsistent")                                \
    X(SDPA_ERR_HEADS, -5, "query heads are not a multiple of key/value heads")                     \
    X(SDPA_ERR_BROADCAST, -6, "mask is not broadcastable to (B, Hq, Lq, Lk)")                      \
    X(SDPA_ERR_OVERFLOW, -7, "a size or address range overflows int64 or size_t")                  \
    X(SDPA_ERR_PARAM, -8, "invalid parameter value")                                               \
    X(SDPA_ERR_ALIAS, -9, "an output overlaps an input, another output or itself")                 \
    X(SDPA_ERR_NOMEM, -10, "out of memory")                                                        \
    X(SDPA_ERR_THREADS, -11, "invalid thread count or thread creation failed")                     \
    X(SDPA_ERR_UNSUPPORTED, -12, "valid request that this build does not support")                 \
    X(SDPA_ERR_INTERNAL, -13, "internal error (a bug: please report it)")                          \
    X(SDPA_ERR_BUSY, -14, "the context is in use by a call from another thread")                   \
    X(SDPA_ERR_INDEX, -15, "a length or page index of a KV-cache descriptor is out of range")      \
    X(SDPA_ERR_MISMATCH, -16, "the ranks of a distributed call disagree on shapes or parameters")  \
    X(SDPA_ERR_MPI, -17, "an MPI call failed")

#define SDPA__STATUS_ENUM(name, value, text) name = value,
typedef enum sdpa_status { SDPA_STATUS_LIST(SDPA__STATUS_ENUM) } sdpa_status;
#undef SDPA__STATUS_ENUM

/* @return a static, human-readable description of a status ("success", "out of memory"…),
 *         or "unknown status" for a value that is not in the list. Never NULL. Thread safe. */
SDPA_API const char *sdpa_status_str(sdpa_status status);

/* @return the enumerator's name ("SDPA_ERR_SHAPE"), or "SDPA_UNKNOWN". Never NULL. */
SDPA_API const char *sdpa_status_name(sdpa_status status);

/* ---------------------------------------------------------------------------------------- */
/* Tensors                                                                                   */
/* ---------------------------------------------------------------------------------------- */

typedef enum sdpa_dtype {
    SDPA_F32 = 0,  /* IEEE binary32 */
    SDPA_F16 = 1,  /* IEEE binary16; accumulated in f32 or wider */
    SDPA_BF16 = 2, /* bfloat16 (the upper half of a binary32) */
    SDPA_BOOL = 3  /* one byte, 0 = false, anything else = true; masks only */
} sdpa_dtype;

/* @return the size of one element in bytes (4, 2, 2, 1), or 0 for an unknown dtype. */
SDPA_API size_t sdpa_dtype_size(sdpa_dtype dtype);

/* @return "f32", "f16", "bf16", "bool", or "unknown". */
SDPA_API const char *sdpa_dtype_name(sdpa_dtype dtype);

/*
 * A view of caller-owned memory with four logical dimensions.
 *
 * shape is always read as (B, H, L, D): batch, heads, sequence, features (for a mask:
 * (B, Hq, Lq, Lk)). stride[i] is the distance in elements between neighbours along dimension
 * i; it may be 0 (broadcast) or negative for inputs. Element (b, h, l, d) lives at
 *     (char *)data + (b*stride[0] + h*stride[1] + l*stride[2] + d*stride[3]) * dtype size.
 * The two common memory layouts are both views, no copy needed:
 *     (B, H, L, D) contiguous: stride = {H*L*D, L*D, D, 1}  — sdpa_tensor_bhld()
 *     (B, L, H, D) contiguous: stride = {L*H*D, D, H*D, 1}  — sdpa_tensor_blhd()
 * A tensor of lower rank uses extents of 1 for the dimensions it lacks: a (L, D) matrix is
 * shape {1, 1, L, D}.
 */
typedef struct sdpa_tensor {
    void *data;
    sdpa_dtype dtype;
    int64_t shape[4];
    int64_t stride[4];
} sdpa_tensor;

/* @return a view of a contiguous (B, H, L, D) array. Does not allocate; cannot fail (the
 *         extents are checked when the tensor is used). */
SDPA_API sdpa_tensor sdpa_tensor_bhld(void *data, sdpa_dtype dtype, int64_t b, int64_t h, int64_t l,
                                      int64_t d);

/* @return a view of a contiguous (B, L, H, D) array (the layout of a fused projection
 *         output), still indexed as (b, h, l, d). */
SDPA_API sdpa_tensor sdpa_tensor_blhd(void *data, sdpa_dtype dtype, int64_t b, int64_t l, int64_t h,
                                      int64_t d);

/* ---------------------------------------------------------------------------------------- */
/* Limits                                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* Every extent must lie in [1, SDPA_MAX_EXTENT]; head dimensions (Dk, Dv) in
 * [1, SDPA_MAX_HEAD_DIM]. The address range a tensor spans (its extents times the absolute
 * values of its strides, in bytes) must fit in int64 and in size_t. Anything else returns
 * SDPA_ERR_DIM or SDPA_ERR_OVERFLOW before memory is touched. */
#define SDPA_MAX_EXTENT ((int64_t)2147483647) /* 2^31 - 1 */
#define SDPA_MAX_HEAD_DIM ((int64_t)65536)
#define SDPA_MAX_THREADS 1024

/* ---------------------------------------------------------------------------------------- */
/* Context                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* Instruction-set levels, in increasing order. A cap can only lower what the CPU offers. */
typedef enum sdpa_isa {
    SDPA_ISA_AUTO = 0,    /* no cap: the best level the CPU and OS support */
    SDPA_ISA_GENERIC = 1, /* portable C */
    SDPA_ISA_AVX2 = 2,    /* x86-64 AVX2 + FMA + F16C */
    SDPA_ISA_AVX512 = 3,  /* x86-64 AVX-512 F/BW/DQ/VL */
    SDPA_ISA_AMX = 4      /* x86-64 AMX tiles */
} sdpa_isa;

/* @return "auto", "generic", "avx2", "avx512", "amx", or "unknown". */
SDPA_API const char *sdpa_isa_name(sdpa_isa isa);

/* Optional allocator hooks. alloc must return memory aligned to at least `align` bytes (a
 * power of two, at most 4096) or NULL; free receives what alloc returned (never NULL).
 * Leave both NULL for the C library's aligned allocation. */
typedef struct sdpa_allocator {
    void *(*alloc)(size_t size, size_t align, void *user);
    void (*free)(void *ptr, void *user);
    void *user;
} sdpa_allocator;

/* Parameters of a context. A zero-initialised struct ({0}) means the defaults. */
typedef struct sdpa_ctx_params {
    int n_threads;            /* 0 = one per online core; else 1..SDPA_MAX_THREADS */
    sdpa_isa max_isa;         /* cap on the kernels chosen; SDPA_ISA_AUTO = no cap */
    sdpa_allocator allocator; /* all NULL = default allocator */
} sdpa_ctx_params;

typedef struct sdpa_ctx sdpa_ctx;

/*
 * Creates a context: it owns the kernel table chosen for this CPU, the worker threads and
 * scratch memory. The CPU is probed once, here (CPUID and XGETBV: a feature is used only if
 * the OS saves its registers; on Linux the AMX tile state is asked for only when an AMX table
 * could be chosen). Each implementation states the features it needs, and the best one the
 * CPU provides is chosen. The environment variable SDPA_MAX_ISA (generic|avx2|avx512|amx)
 * may lower the choice further, never raise it; an unknown value is ignored, and
 * sdpa_ctx_describe() says so.
 *
 * @param params  NULL or a zero-initialised struct for the defaults.
 * @param out     receives the context; set to NULL on failure.
 * @return SDPA_OK; SDPA_ERR_NULL if out is NULL; SDPA_ERR_THREADS for n_threads < 0 or
 *         > SDPA_MAX_THREADS; SDPA_ERR_PARAM for an unknown max_isa or an allocator with only
 *         one of alloc/free set; SDPA_ERR_NOMEM.
 * Thread safe.
 */
SDPA_API sdpa_status sdpa_ctx_create(const sdpa_ctx_params *params, sdpa_ctx **out);

/* Destroys a context and frees all it owns. NULL is a no-op. The context must not be in use. */
SDPA_API void sdpa_ctx_destroy(sdpa_ctx *ctx);

/* @return the message of the last failed call on this context (for example
 *         "k.shape[3]=64 but q.shape[3]=80"), or "" if none has failed. The string belongs to
 *         the context and stays valid until its next call. NULL ctx gives "". */
SDPA_API const char *sdpa_ctx_last_error(const sdpa_ctx *ctx);

/* @return the number of threads the context computes with (>= 1). */
SDPA_API int sdpa_ctx_n_threads(const sdpa_ctx *ctx);

/* @return the instruction-set level of the kernels sdpa_forward actually runs on this
 *         context: the best implementation whose CPU features (and, for AMX, the OS's tile
 *         permission) are present and whose level the caps allow ("amx" where flash-amx
 *         runs: it takes the forward of bf16 problems, flash-avx512 everything else).
 *         NULL ctx gives SDPA_ISA_GENERIC. */
SDPA_API sdpa_isa sdpa_ctx_isa(const sdpa_ctx *ctx);

/* @return the best instruction-set level this CPU and its OS support (CPUID and XGETBV), before
 *         any cap (max_isa, SDPA_MAX_ISA) and whether or not an implementation uses it: what
 *         the machine could run, beside sdpa_ctx_isa(), what it does run. Benchmarks report
 *         both, so that a figure taken under a cap is never read as the machine's best.
 *         NULL ctx gives SDPA_ISA_GENERIC. */
SDPA_API sdpa_isa sdpa_ctx_cpu_isa(const sdpa_ctx *ctx);

/* @return the name of the implementation sdpa_forward prefers on this context ("flash-amx",
 *         "flash-avx512", "flash-avx2", "flash-generic", "reference"), for reports and
 *         benchmarks. One that takes only some problems passes the others to the next one
 *         down (flash-amx takes bf16 Q, K and V of the head sizes it tiles: an f32 problem
 *         runs flash-avx512); sdpa_ctx_describe() says which, and sdpa_ctx_last_kernel()
 *         what a call ran. Static storage; NULL ctx gives "". */
SDPA_API const char *sdpa_ctx_kernel(const sdpa_ctx *ctx);

/* @return the name of the implementation the last successful call on this context ran
 *         (sdpa_forward, sdpa_forward_kv, sdpa_weights or sdpa_backward; sdpa_merge and the
 *         sdpa_mpi_* calls leave it alone): what a benchmark or a report names beside its
 *         figure. A failed call leaves it as it was. "" before any call succeeded; static
 *         storage; NULL ctx gives "". Safe to call while another thread's call runs on the
 *         context (it then gives the name before or after that call). */
SDPA_API const char *sdpa_ctx_last_kernel(const sdpa_ctx *ctx);

/* @return a multi-line, human-readable description of what the CPU offers, which cap applied
 *         (and from where) and which implementation each operation uses. Owned by the
 *         context, valid until it is destroyed. */
SDPA_API const char *sdpa_ctx_describe(const sdpa_ctx *ctx);

/* ---------------------------------------------------------------------------------------- */
/* Attention parameters                                                                      */
/* ---------------------------------------------------------------------------------------- */

/* Where the causal diagonal (and the sliding window) sits when Lq != Lk. */
typedef enum sdpa_align {
    /* Query i is aligned with key i: the diagonal starts at the top-left corner. This is
     * PyTorch's is_causal (torch.ones(Lq, Lk).tril()). */
    SDPA_ALIGN_TOP_LEFT = 0,
    /* Query i is aligned with key i + (Lk - Lq): the last query sees the last key. This is
     * FlashAttention >= 2.1 and KV-cache decoding, where the queries are the newest tokens. */
    SDPA_ALIGN_BOTTOM_RIGHT = 1
} sdpa_align;

/* What to compute. A zero-initialised struct ({0}) is plain attention with
 * scale = 1/sqrt(Dk), no mask, no window, no softcap, no ALiBi. Because a window of 0 is a
 * meaningful request (each query sees only its aligned key), the window bounds take effect
 * only when use_window is nonzero; zero-initialised bounds then mean (0, 0), and -1 leaves a
 * side open. */
typedef struct sdpa_params {
    float scale;               /* 0 = 1/sqrt(Dk); must be finite (may be negative) */
    int causal;                /* nonzero: key j is invisible to query i when j > i + off */
    sdpa_align align;          /* defines off, see Semantics; applies to causal, window, ALiBi */
    int use_window;            /* nonzero: window_left and window_right apply (else ignored) */
    int64_t window_left;       /* -1 = unbounded; else >= 0: keys j >= i + off - window_left */
    int64_t window_right;      /* -1 = unbounded; else >= 0: keys j <= i + off + window_right */
    float softcap;             /* 0 = off; else > 0 and finite: scores become c * tanh(s / c) */
    const float *alibi_slopes; /* NULL, or Hq finite slopes: bias -slope * |i + off - j| */
    const sdpa_tensor *mask;   /* NULL, or BOOL / additive F32, F16, BF16; see Semantics */
    float dropout_p;           /* 0 = off; else in (0, 1): weights dropped with this chance */
    uint64_t dropout_seed;     /* with dropout_offset, which mask is drawn (see Dropout) */
    uint64_t dropout_offset;   /* advance it (by 1) per training step for a fresh mask */
    const float *sinks;        /* NULL, or Hq attention-sink logits (see Semantics): finite,
                                * or -inf for no sink on that head; NaN and +inf refused */
} sdpa_params;

/*
 * Semantics — every path of the library obeys these.
 *
 * Scores. For query i and key j of one (batch, query head):
 *     s_ij = softcap(scale * q_i . k_j) + alibi_ij + mask_ij
 * where softcap(x) = c * tanh(x / c) when softcap = c > 0, alibi_ij = -slope_h * |i + off - j|
 * when alibi_slopes is set, and mask_ij is the additive mask value (0 for a BOOL mask).
 * This is the order FlashAttention and ggml use.
 *
 * Visibility. off = 0 for SDPA_ALIGN_TOP_LEFT and off = Lk - Lq for SDPA_ALIGN_BOTTOM_RIGHT.
 * Key j is visible to query i iff
 *     i + off - window_left <= j <= i + off + window_right
 * where a bound of -1 (or either bound when use_window is 0) is open, and causal sets
 * window_right to 0. A BOOL mask further hides
 * key j from query i where mask[b, h, i, j] == 0 (nonzero = may attend: PyTorch's polarity).
 * An additive mask of -inf hides the key the same way. An invisible key has no effect at all
 * on row i, even if its K or V holds NaN or Inf: row i is bitwise what it would be if that
 * key's K and V held any finite numbers (up to the sign of an output that is zero).
 *
 * Output. O_i = sum_j p_ij v_j with p_ij = exp(s_ij - LSE_i) over the visible keys, and
 * LSE_i = log(sum_j exp(s_ij)) (natural log). Every sum is accumulated in at least f32;
 * half-precision inputs are widened exactly and outputs rounded once, at the end. One
 * exception: where Q, K and V are all bf16 and the CPU has AMX (flash-amx), the weights p_ij
 * are rounded to bf16 before they multiply V, as FlashAttention does (docs/numerics.md gives
 * the measured error); max_isa = SDPA_ISA_AVX512 keeps them in f32. Values near
 * f32's limit: when the scores are finite and the exact O_i is finite in f32, the result is
 * finite, even where the weights' unnormalised sum times V passes FLT_MAX (V = 1e35 over 4096
 * equally weighted keys): the fast kernels compute such a row again in double.
 *
 * Fully masked rows. A row with no visible key (or whose visible scores are all -inf) has
 * O_i = 0 and LSE_i = -inf (with a sink: LSE_i = sink_h). It is not NaN.
 *
 * Attention sinks. With sinks set, query head h's softmax has one more term in its
 * denominator, exp(sink_h), as if a key of score sink_h and value 0 were visible to every
 * row (gpt-oss, ggml's flash attention "sinks"): O_i = sum_j exp(s_ij - LSE_i) v_j with
 * LSE_i = log(exp(sink_h) + sum_j exp(s_ij)), so a row's weights sum to less than 1. The
 * sink takes no part in masks, windows, ALiBi, softcap or dropout, and gets no gradient.
 *
 * NaN and Inf. NaN in Q, K or V propagates to exactly the outputs that can see it: NaN in
 * q_i makes row i NaN; NaN in k_j makes every row that sees key j NaN; NaN in v_j[d] makes
 * O[:, d] NaN in every row that sees key j. A +inf or NaN score (from the inputs or the mask)
 * makes its row NaN. Invisible keys never contribute NaN.
 *
 * Scores beyond f32. Scores are f32 values: q . k, its product with the scale, and the score
 * after ALiBi and an additive mask are each taken to +inf or -inf where they pass FLT_MAX
 * (q = k = [1e20, 1e20] gives q . k = +inf). A +inf score makes its row NaN, a -inf one hides
 * its key; softcap maps +-inf to +-C. sdpa_forward and sdpa_weights follow this one rule on
 * every kernel (the reference computes in double and applies it at each of those steps; a
 * fast kernel's f32 dot product may also overflow in a partial sum whose total would fit).
 *
 * Dropout. With dropout_p = p > 0, weight p_ij is kept or dropped by a draw that depends
 * only on (dropout_seed, dropout_offset, b, h, i, j) (Philox4x32-10, a counter-based
 * generator; h the query head): O_i = sum_j z_ij p_ij v_j with z_ij = 1 / (1 - p) when kept
 * and 0 when dropped, kept with probability 1 - p (p rounded to a multiple of 2^-32). The
 * same (seed, offset) draws the same mask in sdpa_forward and sdpa_backward, on every kernel
 * and thread count; a dropped key is still visible (it counts in the LSE, which dropout does
 * not change, and 0 * NaN in its V is NaN, as in PyTorch). sdpa_weights returns p_ij before
 * dropout. The tiled forward and backward draw the masks themselves, tile by tile.
 *
 * Shapes. mask: broadcastable to (B, Hq, Lq, Lk) — each extent equal or 1 (an extent of 1
 * is broadcast whatever its stride). Query head h reads key/value head h / (Hq / Hkv)
 * (grouped-query attention; multi-query when Hkv = 1).
 */

/* ---------------------------------------------------------------------------------------- */
/* Forward                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/*
 * Computes attention.
 *
 * @param ctx     a context (used by one thread at a time).
 * @param q       (B, Hq, Lq, Dk), F32/F16/BF16.
 * @param k       (B, Hkv, Lk, Dk), F32/F16/BF16; Hq % Hkv == 0.
 * @param v       (B, Hkv, Lk, Dv), F32/F16/BF16. Dv may differ from Dk; Lk may differ from Lq.
 * @param params  NULL or {0} for the defaults; see sdpa_params and Semantics.
 * @param out     (B, Hq, Lq, Dv), F32/F16/BF16, written.
 * @param lse     NULL, or (B, Hq, Lq, 1) F32, written with the log-sum-exp of each row.
 *
 * Inputs may use any strides (0 and negative included) and any mix of dtypes. Every data
 * pointer (and alibi_slopes) must be aligned to its element size. Outputs must not overlap
 * each other or any input: their address ranges are compared, so two interleaved views of one
 * buffer are refused too. Nor may an output overlap itself, which sdpa checks conservatively:
 * no stride 0 over an extent > 1, and, sorted by size, each |stride| must exceed the span
 * (extent - 1) x |stride| of all smaller ones together (every layout made by slicing or
 * permuting a contiguous array passes).
 *
 * @return SDPA_OK, or an error, in which case out and lse are untouched and
 *         sdpa_ctx_last_error(ctx) names the argument and its values:
 *   SDPA_ERR_NULL (a NULL ctx, tensor or data pointer), SDPA_ERR_DTYPE, SDPA_ERR_DIM,
 *   SDPA_ERR_SHAPE, SDPA_ERR_HEADS, SDPA_ERR_BROADCAST, SDPA_ERR_OVERFLOW, SDPA_ERR_PARAM
 *   (scale, softcap, window, align, ALiBi slope, dropout_p, a misaligned pointer), SDPA_ERR_ALIAS,
 *   SDPA_ERR_NOMEM; or SDPA_ERR_BUSY, with no message, when another thread's call is using
 *   ctx (see Thread safety).
 */
SDPA_API sdpa_status sdpa_forward(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                                  const sdpa_tensor *v, const sdpa_params *params, sdpa_tensor *out,
                                  sdpa_tensor *lse);

/*
 * Computes the attention probabilities p_ij themselves, for inspection and heatmaps. Rows sum
 * to 1 (less with a sink: the sink's share is missing), invisible keys are 0, fully masked
 * rows are all 0. This materialises Lq x Lk values
 * per head: use sdpa_forward for the output. Computed by the tiled kernels in f32 (within a
 * few ulp of the exact value; bitwise the same for any n_threads), before dropout.
 *
 * @param q, k, params  as for sdpa_forward (V is not needed).
 * @param weights       (B, Hq, Lq, Lk) F32, written.
 * @return as for sdpa_forward; on error weights is untouched.
 */
SDPA_API sdpa_status sdpa_weights(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                                  const sdpa_params *params, sdpa_tensor *weights);

/* ---------------------------------------------------------------------------------------- */
/* KV caches: ragged and paged                                                               */
/* ---------------------------------------------------------------------------------------- */

/*
 * Where the keys and values of a batch of sequences live during generation. Two layouts:
 *
 *   plain  (block_table NULL): k is (B, Hkv, Lk, Dk) and v (B, Hkv, Lk, Dv), as for
 *          sdpa_forward; sequence b holds its keys in rows [0, seqlens_k[b]) and the rows
 *          beyond are never read (a batch of caches filled to different lengths).
 *   paged  (block_table set): k is a pool of pages (n_pages, Hkv, page_size, Dk) and v
 *          (n_pages, Hkv, page_size, Dv); key j of sequence b is row j % page_size of page
 *          block_table[b * max_pages + j / page_size] (vLLM's and FlashAttention's
 *          block_table). Entries past a sequence's last page are never read (-1 is usual).
 *
 * Lengths: seqlens_k[b] in [0, capacity], capacity = Lk (plain) or max_pages * page_size
 * (paged); NULL means every sequence is full. seqlens_q[b] in [0, Lq]: sequence b's queries are
 * rows [0, seqlens_q[b]) of q (chunked prefill puts several new tokens per sequence; decode
 * one); NULL means Lq for every sequence. The queries are the sequence's newest tokens:
 * with SDPA_ALIGN_BOTTOM_RIGHT the offset of Semantics is off_b = seqlens_k[b] -
 * seqlens_q[b], per sequence (with top-left, 0). Causal, window, ALiBi and the mask use the
 * sequence's own positions.
 */
typedef struct sdpa_kv_cache {
    const sdpa_tensor *k, *v;
    const int32_t *seqlens_k;   /* NULL, or B key counts */
    const int32_t *seqlens_q;   /* NULL, or B query counts */
    const int32_t *block_table; /* NULL (plain), or B x max_pages page indices */
    int64_t max_pages;          /* paged: entries per sequence in block_table, >= 1 */
} sdpa_kv_cache;

/*
 * sdpa_forward over a KV cache: for each sequence b, attention of its seqlens_q[b] queries to
 * its seqlens_k[b] keys, by the rules of Semantics (a sequence with no key gives fully masked
 * rows). Rows of q past seqlens_q[b] are not read; their out rows are written 0 and their lse
 * -inf (or the sink), so every output element is defined.
 *
 * @param q       (B, Hq, Lq, Dk), F32/F16/BF16.
 * @param cache   the cache (see sdpa_kv_cache); k and v F32/F16/BF16, any strides.
 * @param params  as for sdpa_forward, but without dropout (an inference call: dropout_p must
 *                be 0). A mask is (B, Hq, Lq, capacity)-broadcastable and indexed by the
 *                sequence's own positions.
 * @param out     (B, Hq, Lq, Dv), written.
 * @param lse     NULL or (B, Hq, Lq, 1) F32, written.
 * @return as for sdpa_forward, and SDPA_ERR_INDEX when a length is negative or above the
 *         capacity, or a block-table entry that the lengths make read is outside
 *         [0, n_pages): the message names the sequence, the entry and its value. Nothing is
 *         read through an entry before every entry has been checked, and on any error out and
 *         lse are untouched.
 */
SDPA_API sdpa_status sdpa_forward_kv(sdpa_ctx *ctx, const sdpa_tensor *q,
                                     const sdpa_kv_cache *cache, const sdpa_params *params,
                                     sdpa_tensor *out, sdpa_tensor *lse);

/* ---------------------------------------------------------------------------------------- */
/* Backward                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/*
 * Computes the gradients of a loss L through sdpa_forward: given dout = dL/dout, writes
 * dq = dL/dq, dk = dL/dk and dv = dL/dv for the same q, k, v and params (dropout included:
 * the same seed and offset give the same mask). The mask, ALiBi and the scale are constants:
 * they get no gradient. Softcap is differentiated through (its derivative 1 - tanh^2). With
 * grouped-query attention, dk and dv of a key/value head sum the query heads of its group, in
 * order. Attention sinks take part through lse (sdpa_forward's, which includes them) and get
 * no gradient themselves. A fully masked row gives dq = 0 there and adds nothing to dk and dv; a
 * row that is NaN in the forward gives NaN in its dq and in dk, dv of the keys it sees; a key
 * hidden from a row (window, mask) gets nothing from it, even when its K or V holds NaN; a key that
 * no row sees gets dk = dv = 0. The results are bitwise the same for any n_threads and on repeated
 * calls.
 *
 * @param q, k, v, params  as for sdpa_forward.
 * @param out     (B, Hq, Lq, Dv), F32/F16/BF16: sdpa_forward's output for these arguments.
 * @param lse     (B, Hq, Lq, 1) F32: sdpa_forward's log-sum-exp for these arguments.
 * @param dout    (B, Hq, Lq, Dv), F32/F16/BF16: the gradient of the loss by out.
 * @param dq      (B, Hq, Lq, Dk), F32/F16/BF16, written.
 * @param dk      (B, Hkv, Lk, Dk), F32/F16/BF16, written.
 * @param dv      (B, Hkv, Lk, Dv), F32/F16/BF16, written.
 *
 * Strides, alignment and aliasing as for sdpa_forward: dq, dk and dv must not overlap each
 * other or any input. Every sum is accumulated in at least f32 and each gradient rounded
 * once. The tiled kernels read out and lse as FlashAttention-2 does (the weights are
 * recomputed as exp(s - lse), and out enters through rowsum(dout * out)), so they must be
 * what sdpa_forward wrote for these arguments: a row whose lse is -inf is taken as fully
 * masked, one whose lse is NaN as a NaN row. Extra memory is O(B x Hq x Lq) floats, partial
 * sums of dq in f32 (at most 32 MiB; where 32 MiB would keep too few threads busy, as on long
 * sequences with large query groups, at most 1 GiB: one or two query groups' dq per thread;
 * none if the allocator refuses them), rows of q and dout widened to f32 where they cannot be
 * read in place (f16, bf16, a feature stride; at most 32 MiB, none if refused), and a tile
 * per thread: never Lq x Lk.
 *
 * @return as for sdpa_forward; on error dq, dk and dv are untouched.
 */
SDPA_API sdpa_status sdpa_backward(sdpa_ctx *ctx, const sdpa_tensor *q, const sdpa_tensor *k,
                                   const sdpa_tensor *v, const sdpa_tensor *out,
                                   const sdpa_tensor *lse, const sdpa_tensor *dout,
                                   const sdpa_params *params, sdpa_tensor *dq, sdpa_tensor *dk,
                                   sdpa_tensor *dv);

/* ---------------------------------------------------------------------------------------- */
/* Merge                                                                                     */
/* ---------------------------------------------------------------------------------------- */

/*
 * Combines partial results computed over disjoint sets of keys into the exact result over
 * their union. If part p is sdpa_forward(q, K_p, V_p) with its lse, for key sets K_p that
 * together make K, the merge is sdpa_forward(q, K, V) with its lse, up to rounding. This is
 * the building block of split-KV decode (a long cache cut into chunks), chunked prefill (new
 * keys merged with a cached prefix's result) and sequence parallelism (ring attention: each
 * device's partial result merged as the K/V blocks go round). The parts must be computed with
 * the keys' global positions: causal, window, ALiBi and mask refer to the position of a key in
 * the whole sequence, so the caller applies them per part (a mask sliced to the part's keys,
 * the window and causal rule restated with the part's offset); sdpa_merge sees only (O, LSE).
 *
 * Per row, over the parts whose lse_p is not -inf (a part with no visible key, or an empty
 * part, represented as O_p = 0 and lse_p = -inf, contributes nothing, even if its O_p holds
 * NaN):
 *     M = max_p lse_p,  w_p = exp(lse_p - M),  O = sum_p w_p O_p / sum_p w_p,
 *     LSE = M + log(sum_p w_p).
 * Every part -inf: O = 0 and LSE = -inf (never NaN), as for a fully masked row. A NaN or +inf
 * lse_p makes the row NaN (O and LSE). A NaN in O_p[d] of a part whose lse_p is finite makes
 * O[d] NaN. The sums are taken in double, parts in index order, and each value is rounded
 * once to its output's dtype: the results are bitwise the same for any n_threads.
 *
 * @param ctx      a context (used by one thread at a time).
 * @param n_parts  the number of parts, >= 1.
 * @param outs     n_parts tensors (B, H, L, D), F32/F16/BF16: the parts' outputs. Each may
 *                 have its own dtype and strides.
 * @param lses     n_parts tensors (B, H, L, 1) F32: the parts' log-sum-exp, as sdpa_forward
 *                 writes them.
 * @param out      (B, H, L, D), F32/F16/BF16, written.
 * @param lse      NULL, or (B, H, L, 1) F32, written with the union's log-sum-exp.
 *
 * Strides, alignment and aliasing as for sdpa_forward: inputs may overlap each other (parts
 * may be views of one buffer), outputs must not overlap each other or any input. Extra memory
 * is n_parts x (D + 2) floats and D doubles per thread.
 *
 * @return SDPA_OK, or an error, in which case out and lse are untouched and
 *         sdpa_ctx_last_error(ctx) names the argument and its values
 *         ("outs[2].shape[1]=4 but out.shape[1]=8"):
 *   SDPA_ERR_PARAM (n_parts < 1, a misaligned pointer), SDPA_ERR_NULL (a NULL ctx, array,
 *   tensor or data pointer), SDPA_ERR_DTYPE, SDPA_ERR_DIM, SDPA_ERR_SHAPE,
 *   SDPA_ERR_OVERFLOW (an address span, or n_parts beyond what an array can hold),
 *   SDPA_ERR_ALIAS, SDPA_ERR_NOMEM; or SDPA_ERR_BUSY, with no message, when another thread's
 *   call is using ctx (see Thread safety).
 */
SDPA_API sdpa_status sdpa_merge(sdpa_ctx *ctx, int64_t n_parts, const sdpa_tensor *outs,
                                const sdpa_tensor *lses, sdpa_tensor *out, sdpa_tensor *lse);

#ifdef __cplusplus
}
#endif

#endif /* SDPA_H */
