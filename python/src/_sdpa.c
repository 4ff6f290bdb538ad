/*
 * _sdpa.c — the CPython extension under the `sdpa` package: a thin layer over sdpa.h.
 *
 * It is built without numpy's or torch's headers: every tensor reaches it as an object with
 * the buffer protocol (a numpy array; torch tensors are viewed as numpy arrays by
 * sdpa/__init__.py) of rank 4, with the sdpa dtype as a separate code (so bfloat16, which has
 * no buffer format, arrives as 2-byte unsigned integers). Strides come from the buffer,
 * converted from bytes to elements, so any view the C API can express is taken without a copy.
 * fast_forward (fast.c), the common case of scaled_dot_product_attention in one call, reads
 * numpy arrays of any rank the same way and makes its result with numpy.empty, both of which
 * sdpa/__init__.py hands over through set_numpy; merge takes its parts as two sequences of
 * (buffer, dtype) pairs; forward_kv takes a KV cache's lengths and block table as C-contiguous
 * int32 buffers, whose lengths it checks against the batch (the library cannot). The GIL is
 * released while the library computes; a library error becomes ValueError (arguments and
 * indices), TypeError (dtypes), MemoryError (memory) or RuntimeError (anything else, such as
 * a context busy in another thread), with the library's message.
 */
#include "sdpa_py.h"

#include <string.h>

/* ---- the context ---- */

static void context_dealloc(sdpa_py_context *self) {
    sdpa_ctx_destroy(self->ctx);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int context_init(sdpa_py_context *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"n_threads", "max_isa", NULL};
    int n_threads = 0, max_isa = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|ii", names, &n_threads, &max_isa))
        return -1;
    if (self->ctx != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the context is already initialised");
        return -1;
    }
    sdpa_ctx_params p = {0};
    p.n_threads = n_threads;
    p.max_isa = (sdpa_isa)max_isa;
    const sdpa_status st = sdpa_ctx_create(&p, &self->ctx);
    if (st != SDPA_OK) {
        PyErr_Format(st == SDPA_ERR_NOMEM ? PyExc_MemoryError : PyExc_ValueError,
                     "cannot create a context (n_threads=%d, max_isa=%d): %s", n_threads, max_isa,
                     sdpa_status_str(st));
        return -1;
    }
    return 0;
}

static PyObject *context_get(sdpa_py_context *self, void *what) {
    if (self->ctx == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the context is not initialised");
        return NULL;
    }
    const char *w = what;
    if (strcmp(w, "n_threads") == 0)
        return PyLong_FromLong(sdpa_ctx_n_threads(self->ctx));
    if (strcmp(w, "isa") == 0)
        return PyUnicode_FromString(sdpa_isa_name(sdpa_ctx_isa(self->ctx)));
    if (strcmp(w, "kernel") == 0)
        return PyUnicode_FromString(sdpa_ctx_kernel(self->ctx));
    if (strcmp(w, "last_kernel") == 0)
        return PyUnicode_FromString(sdpa_ctx_last_kernel(self->ctx));
    return PyUnicode_FromString(sdpa_ctx_describe(self->ctx));
}

static PyGetSetDef context_getset[] = {
    {"n_threads", (getter)context_get, NULL, "threads the context computes with", "n_threads"},
    {"isa", (getter)context_get, NULL, "instruction-set level of the kernels", "isa"},
    {"kernel", (getter)context_get, NULL, "the implementation sdpa_forward prefers", "kernel"},
    {"last_kernel", (getter)context_get, NULL,
     "the implementation the last successful call ran ('' before any)", "last_kernel"},
    {"description", (getter)context_get, NULL, "sdpa_ctx_describe(): features and dispatch",
     "describe"},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject sdpa_py_context_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sdpa._sdpa.Context",
    .tp_basicsize = sizeof(sdpa_py_context),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Context(n_threads=0, max_isa=0): the library's threads, kernels and scratch.\n"
              "One call at a time uses a context; another thread's call on it fails with\n"
              "SDPA_ERR_BUSY (sdpa.Context in Python gives each thread its own by default).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)context_init,
    .tp_dealloc = (destructor)context_dealloc,
    .tp_getset = context_getset,
};

/* ---- tensors from buffers ---- */

/* Takes obj (rank 4, with the buffer protocol) as a tensor of dtype; writable for outputs.
 * @return 0, or -1 with a Python exception naming the argument. */
static int take(sdpa_py_arg *a, PyObject *obj, int dtype, int writable, const char *name) {
    memset(a, 0, sizeof *a);
    const int flags = PyBUF_STRIDES | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &a->buf, flags) != 0) {
        PyErr_Format(PyExc_TypeError, "%s: not a %sbuffer (a numpy array or a CPU tensor)", name,
                     writable ? "writable " : "");
        return -1;
    }
    a->held = 1;
    const size_t size = sdpa_dtype_size((sdpa_dtype)dtype);
    if (a->buf.ndim != 4 || size == 0 || (size_t)a->buf.itemsize != size) {
        PyErr_Format(PyExc_ValueError, "%s: a rank-%d buffer of %zd-byte items for dtype %s", name,
                     a->buf.ndim, a->buf.itemsize, sdpa_dtype_name((sdpa_dtype)dtype));
        return -1;
    }
    a->t.data = a->buf.buf;
    a->t.dtype = (sdpa_dtype)dtype;
    for (int d = 0; d < 4; d++) {
        a->t.shape[d] = a->buf.shape[d];
        const Py_ssize_t s = a->buf.strides[d];
        if (s % (Py_ssize_t)size != 0) {
            PyErr_Format(PyExc_ValueError,
                         "%s: stride %zd bytes along axis %d is not a whole number of elements",
                         name, s, d);
            return -1;
        }
        a->t.stride[d] = s / (Py_ssize_t)size;
    }
    return 0;
}

void sdpa_py_drop(sdpa_py_arg *a) {
    if (a->held)
        PyBuffer_Release(&a->buf);
    a->held = 0;
}

/* Raises the Python exception for a library status, with the context's message. */
PyObject *sdpa_py_fail(sdpa_status st, const sdpa_ctx *ctx) {
    PyObject *type = PyExc_RuntimeError;
    switch (st) {
    case SDPA_ERR_NOMEM:
        type = PyExc_MemoryError;
        break;
    case SDPA_ERR_DTYPE:
        type = PyExc_TypeError;
        break;
    case SDPA_ERR_NULL:
    case SDPA_ERR_DIM:
    case SDPA_ERR_SHAPE:
    case SDPA_ERR_HEADS:
    case SDPA_ERR_BROADCAST:
    case SDPA_ERR_OVERFLOW:
    case SDPA_ERR_PARAM:
    case SDPA_ERR_ALIAS:
    case SDPA_ERR_INDEX:
        type = PyExc_ValueError;
        break;
    default:
        break;
    }
    const char *msg = sdpa_ctx_last_error(ctx);
    PyErr_Format(type, "%s (%s)%s%s", sdpa_status_str(st), sdpa_status_name(st), msg[0] ? ": " : "",
                 msg);
    return NULL;
}

/* The parameters and the buffers their per-head arrays point into. */
typedef struct params_arg {
    sdpa_params p;
    Py_buffer slopes, sinks;
    int have_slopes, have_sinks;
} params_arg;

/* Takes obj (None, or a C-contiguous float32 buffer) as a per-head array. */
static int take_floats(Py_buffer *b, int *held, const float **to, PyObject *obj, const char *name) {
    if (obj == Py_None)
        return 0;
    if (PyObject_GetBuffer(obj, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0)
        return -1;
    *held = 1;
    if (b->itemsize != 4 || b->format == NULL || strcmp(b->format, "f") != 0) {
        PyErr_Format(PyExc_TypeError, "%s: float32 values expected", name);
        return -1;
    }
    *to = b->buf;
    return 0;
}

/* The parameters, from a tuple the Python layer builds:
 *   (scale, causal, align, window or None, softcap, slopes buffer or None, dropout_p, seed,
 *    offset, sinks buffer or None).
 * @return 0, or -1 with an exception; release pa with params_release either way. */
static int parse_params(PyObject *t, params_arg *pa) {
    memset(pa, 0, sizeof *pa);
    sdpa_params *p = &pa->p;
    double scale, softcap, dropout_p;
    int causal, align;
    PyObject *window, *sl, *sk;
    unsigned long long seed, offset;
    if (!PyArg_ParseTuple(t, "dpiOdOdKKO", &scale, &causal, &align, &window, &softcap, &sl,
                          &dropout_p, &seed, &offset, &sk))
        return -1;
    p->scale = (float)scale;
    p->causal = causal;
    p->align = (sdpa_align)align;
    if (window != Py_None) {
        long long l, r;
        if (!PyArg_ParseTuple(window, "LL", &l, &r))
            return -1;
        p->use_window = 1;
        p->window_left = l;
        p->window_right = r;
    }
    p->softcap = (float)softcap;
    p->dropout_p = (float)dropout_p;
    p->dropout_seed = seed;
    p->dropout_offset = offset;
    if (take_floats(&pa->slopes, &pa->have_slopes, &p->alibi_slopes, sl, "alibi_slopes") != 0 ||
        take_floats(&pa->sinks, &pa->have_sinks, &p->sinks, sk, "sinks") != 0)
        return -1;
    return 0;
}

/* The library reads Hq values from each per-head array: refuse a shorter one here.
 * @return 0, or -1 with ValueError. */
static int params_check_heads(const params_arg *pa, int64_t hq) {
    const Py_buffer *b[2] = {&pa->slopes, &pa->sinks};
    const int held[2] = {pa->have_slopes, pa->have_sinks};
    static const char *const names[2] = {"alibi_slopes", "sinks"};
    for (int n = 0; n < 2; n++)
        if (held[n] && b[n]->len != hq * 4) {
            PyErr_Format(PyExc_ValueError, "%s: %zd values for %lld query heads", names[n],
                         b[n]->len / 4, (long long)hq);
            return -1;
        }
    return 0;
}

static void params_release(params_arg *pa) {
    if (pa->have_slopes)
        PyBuffer_Release(&pa->slopes);
    if (pa->have_sinks)
        PyBuffer_Release(&pa->sinks);
    pa->have_slopes = pa->have_sinks = 0;
}

/* A tensor argument: (buffer, dtype code) or None. */
static int take_opt(sdpa_py_arg *a, PyObject *pair, int writable, const char *name) {
    memset(a, 0, sizeof *a);
    if (pair == Py_None)
        return 0;
    PyObject *obj;
    int dtype;
    if (!PyArg_ParseTuple(pair, "Oi", &obj, &dtype))
        return -1;
    return take(a, obj, dtype, writable, name);
}

static sdpa_py_context *context_of(PyObject *o) {
    if (!PyObject_TypeCheck(o, &sdpa_py_context_type) || ((sdpa_py_context *)o)->ctx == NULL) {
        PyErr_SetString(PyExc_TypeError, "context: an initialised sdpa.Context expected");
        return NULL;
    }
    return (sdpa_py_context *)o;
}

/* The three entry points share this: up to 9 tensors (NULL where absent), the params. */
enum { OP_FORWARD, OP_WEIGHTS, OP_BACKWARD };

static PyObject *call(int op, PyObject *args) {
    static const char *const names[9] = {"query", "key", "value", "out", "lse",
                                         "dout",  "dq",  "dk",    "dv"};
    static const int outputs[3][9] = {
        {0, 0, 0, 1, 1, 0, 0, 0, 0}, {0, 0, 0, 1, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 1, 1, 1}};
    PyObject *ctx_obj, *params_obj, *mask_obj, *t[9];
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOO", &ctx_obj, &t[0], &t[1], &t[2], &t[3], &t[4], &t[5],
                          &t[6], &t[7], &t[8], &mask_obj, &params_obj))
        return NULL;
    sdpa_py_context *c = context_of(ctx_obj);
    if (c == NULL)
        return NULL;
    sdpa_py_arg a[9], mask;
    memset(a, 0, sizeof a);
    memset(&mask, 0, sizeof mask);
    params_arg pa;
    memset(&pa, 0, sizeof pa);
    PyObject *result = NULL;
    for (int n = 0; n < 9; n++)
        if (take_opt(&a[n], t[n], outputs[op][n], names[n]) != 0)
            goto done;
    if (take_opt(&mask, mask_obj, 0, "attn_mask") != 0 || parse_params(params_obj, &pa) != 0 ||
        (a[0].held && params_check_heads(&pa, a[0].t.shape[1]) != 0))
        goto done;
    sdpa_params *p = &pa.p;
    if (mask.held)
        p->mask = &mask.t;
    sdpa_tensor *v[9];
    for (int n = 0; n < 9; n++)
        v[n] = a[n].held ? &a[n].t : NULL;
    sdpa_status st;
    Py_BEGIN_ALLOW_THREADS;
    if (op == OP_FORWARD)
        st = sdpa_forward(c->ctx, v[0], v[1], v[2], p, v[3], v[4]);
    else if (op == OP_WEIGHTS)
        st = sdpa_weights(c->ctx, v[0], v[1], p, v[3]);
    else
        st = sdpa_backward(c->ctx, v[0], v[1], v[2], v[3], v[4], v[5], p, v[6], v[7], v[8]);
    Py_END_ALLOW_THREADS;
    if (st != SDPA_OK) {
        sdpa_py_fail(st, c->ctx);
        goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    for (int n = 0; n < 9; n++)
        sdpa_py_drop(&a[n]);
    sdpa_py_drop(&mask);
    params_release(&pa);
    return result;
}

static PyObject *py_forward(PyObject *self, PyObject *args) {
    (void)self;
    return call(OP_FORWARD, args);
}

static PyObject *py_weights(PyObject *self, PyObject *args) {
    (void)self;
    return call(OP_WEIGHTS, args);
}

static PyObject *py_backward(PyObject *self, PyObject *args) {
    (void)self;
    return call(OP_BACKWARD, args);
}

/* An int32 index array of a KV cache: None, or a C-contiguous buffer of n 4-byte integers
 * (the library reads n and cannot check it). @return 0, or -1 with an exception. */
static int take_index(Py_buffer *b, int *held, const int32_t **to, PyObject *obj, int64_t n,
                      const char *name) {
    *held = 0;
    *to = NULL;
    if (obj == Py_None)
        return 0;
    if (PyObject_GetBuffer(obj, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0)
        return -1;
    *held = 1;
    const char *f = b->format;
    if (b->itemsize != 4 || f == NULL || f[0] == 0 || f[1] != 0 ||
        (f[0] != 'i' && !(f[0] == 'l' && sizeof(long) == 4))) {
        PyErr_Format(PyExc_TypeError, "%s: int32 values expected", name);
        return -1;
    }
    if (b->len != n * 4) {
        PyErr_Format(PyExc_ValueError, "%s: %zd values, expected %lld", name, b->len / 4,
                     (long long)n);
        return -1;
    }
    *to = b->buf;
    return 0;
}

/* forward_kv(ctx, (q, dt), (k, dt), (v, dt), (out, dt), lse|None, seqlens_k|None,
 *            seqlens_q|None, block_table|None, max_pages, mask|None, params): sdpa_forward_kv
 * on rank-4 buffers, the index arrays int32 (B values each, the block table B x max_pages). */
static PyObject *py_forward_kv(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ctx_obj, *t[5], *idx_obj[3], *mask_obj, *params_obj;
    long long max_pages;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOLOO", &ctx_obj, &t[0], &t[1], &t[2], &t[3], &t[4],
                          &idx_obj[0], &idx_obj[1], &idx_obj[2], &max_pages, &mask_obj,
                          &params_obj))
        return NULL;
    sdpa_py_context *c = context_of(ctx_obj);
    if (c == NULL)
        return NULL;
    static const char *const names[5] = {"query", "k_cache", "v_cache", "out", "lse"};
    static const char *const idx_names[3] = {"seqlens_k", "seqlens_q", "block_table"};
    sdpa_py_arg a[5], mask;
    memset(a, 0, sizeof a);
    memset(&mask, 0, sizeof mask);
    Py_buffer idx[3];
    int idx_held[3] = {0, 0, 0};
    const int32_t *idx_data[3] = {NULL, NULL, NULL};
    params_arg pa;
    memset(&pa, 0, sizeof pa);
    PyObject *result = NULL;
    for (int n = 0; n < 5; n++)
        if (take_opt(&a[n], t[n], n >= 3, names[n]) != 0)
            goto done;
    if (!a[0].held || !a[1].held || !a[2].held || !a[3].held) {
        PyErr_SetString(PyExc_TypeError, "forward_kv: query, k_cache, v_cache and out are needed");
        goto done;
    }
    const int64_t batch = a[0].t.shape[0];
    if (idx_obj[2] != Py_None && max_pages < 1) {
        PyErr_Format(PyExc_ValueError, "block_table: max_pages=%lld must be >= 1", max_pages);
        goto done;
    }
    if (idx_obj[2] != Py_None && batch > INT64_MAX / 4 / max_pages) {
        PyErr_Format(PyExc_ValueError, "block_table: %lld x %lld entries are too many",
                     (long long)batch, max_pages);
        goto done;
    }
    for (int n = 0; n < 3; n++)
        if (take_index(&idx[n], &idx_held[n], &idx_data[n], idx_obj[n],
                       n == 2 ? batch * max_pages : batch, idx_names[n]) != 0)
            goto done;
    if (take_opt(&mask, mask_obj, 0, "attn_mask") != 0 || parse_params(params_obj, &pa) != 0 ||
        params_check_heads(&pa, a[0].t.shape[1]) != 0)
        goto done;
    if (mask.held)
        pa.p.mask = &mask.t;
    sdpa_kv_cache cache = {&a[1].t,     &a[2].t,     idx_data[0],
                           idx_data[1], idx_data[2], idx_data[2] != NULL ? (int64_t)max_pages : 0};
    sdpa_tensor *lse = a[4].held ? &a[4].t : NULL;
    sdpa_status st;
    Py_BEGIN_ALLOW_THREADS;
    st = sdpa_forward_kv(c->ctx, &a[0].t, &cache, &pa.p, &a[3].t, lse);
    Py_END_ALLOW_THREADS;
    if (st != SDPA_OK) {
        sdpa_py_fail(st, c->ctx);
        goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    for (int n = 0; n < 5; n++)
        sdpa_py_drop(&a[n]);
    sdpa_py_drop(&mask);
    for (int n = 0; n < 3; n++)
        if (idx_held[n])
            PyBuffer_Release(&idx[n]);
    params_release(&pa);
    return result;
}

/* merge(ctx, [(out_p, dt), ...], [(lse_p, dt), ...], (out, dt), (lse, dt) | None): sdpa_merge
 * on rank-4 buffers, the parts given as two sequences of the same length (>= 1). */
static PyObject *py_merge(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ctx_obj, *outs_obj, *lses_obj, *out_obj, *lse_obj;
    if (!PyArg_ParseTuple(args, "OOOOO", &ctx_obj, &outs_obj, &lses_obj, &out_obj, &lse_obj))
        return NULL;
    sdpa_py_context *c = context_of(ctx_obj);
    if (c == NULL)
        return NULL;
    PyObject *outs = PySequence_Fast(outs_obj, "outs: a sequence of (buffer, dtype) pairs");
    if (outs == NULL)
        return NULL;
    PyObject *lses = PySequence_Fast(lses_obj, "lses: a sequence of (buffer, dtype) pairs");
    if (lses == NULL) {
        Py_DECREF(outs);
        return NULL;
    }
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(outs);
    PyObject *result = NULL;
    /* a[0, n): the parts' outputs, a[n, 2n): their LSEs, then out and lse */
    sdpa_py_arg *a = PyMem_Calloc((size_t)(2 * n + 2), sizeof *a);
    sdpa_tensor *t = PyMem_Calloc((size_t)(2 * n + 1), sizeof *t);
    if (a == NULL || t == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (n < 1 || PySequence_Fast_GET_SIZE(lses) != n) {
        PyErr_Format(PyExc_ValueError,
                     "merge: %zd outputs and %zd LSEs; give one of each per "
                     "part, at least one part",
                     n, PySequence_Fast_GET_SIZE(lses));
        goto done;
    }
    for (Py_ssize_t k = 0; k < 2 * n; k++) {
        char name[48];
        snprintf(name, sizeof name, "%s[%zd]", k < n ? "outs" : "lses", k < n ? k : k - n);
        PyObject *pair =
            k < n ? PySequence_Fast_GET_ITEM(outs, k) : PySequence_Fast_GET_ITEM(lses, k - n);
        if (take_opt(&a[k], pair, 0, name) != 0)
            goto done;
        if (!a[k].held) {
            PyErr_Format(PyExc_TypeError, "%s: a tensor expected, not None", name);
            goto done;
        }
        t[k] = a[k].t;
    }
    if (take_opt(&a[2 * n], out_obj, 1, "out") != 0 ||
        take_opt(&a[2 * n + 1], lse_obj, 1, "lse") != 0)
        goto done;
    sdpa_tensor *out = a[2 * n].held ? &a[2 * n].t : NULL;
    sdpa_tensor *lse = a[2 * n + 1].held ? &a[2 * n + 1].t : NULL;
    sdpa_status st;
    Py_BEGIN_ALLOW_THREADS;
    st = sdpa_merge(c->ctx, (int64_t)n, t, t + n, out, lse);
    Py_END_ALLOW_THREADS;
    if (st != SDPA_OK) {
        sdpa_py_fail(st, c->ctx);
        goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    if (a != NULL)
        for (Py_ssize_t k = 0; k < 2 * n + 2; k++)
            sdpa_py_drop(&a[k]);
    PyMem_Free(a);
    PyMem_Free(t);
    Py_DECREF(outs);
    Py_DECREF(lses);
    return result;
}

static PyObject *py_version(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyUnicode_FromString(sdpa_version());
}

static PyMethodDef methods[] = {
    {"forward", py_forward, METH_VARARGS,
     "forward(ctx, (q, dt), (k, dt), (v, dt), (out, dt), lse|None, None, None, None, None, "
     "mask|None, params): sdpa_forward on rank-4 buffers"},
    {"weights", py_weights, METH_VARARGS,
     "weights(ctx, (q, dt), (k, dt), None, (w, dt), None x5, mask|None, params): sdpa_weights"},
    {"backward", py_backward, METH_VARARGS,
     "backward(ctx, q, k, v, out, lse, dout, dq, dk, dv, mask|None, params): sdpa_backward"},
    {"forward_kv", py_forward_kv, METH_VARARGS,
     "forward_kv(ctx, (q, dt), (k, dt), (v, dt), (out, dt), lse|None, seqlens_k|None, "
     "seqlens_q|None, block_table|None, max_pages, mask|None, params): sdpa_forward_kv"},
    {"merge", py_merge, METH_VARARGS,
     "merge(ctx, [(out_p, dt), ...], [(lse_p, dt), ...], (out, dt), lse|None): sdpa_merge"},
    {"fast_forward", (PyCFunction)(void (*)(void))sdpa_py_fast_forward, METH_FASTCALL,
     "fast_forward(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, "
     "window, alignment, softcap, alibi_slopes, return_lse, dropout_seed, dropout_offset): "
     "scaled_dot_product_attention's common case on numpy arrays, or NotImplemented"},
    {"set_numpy", (PyCFunction)(void (*)(void))sdpa_py_set_numpy, METH_FASTCALL,
     "set_numpy(numpy.ndarray, numpy.empty, float32 dtype, float16 dtype): for fast_forward"},
    {"version", py_version, METH_NOARGS, "the C library's version"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT,
                                    "_sdpa",
                                    "The C core of the sdpa package (use the sdpa module).",
                                    -1,
                                    methods,
                                    NULL,
                                    NULL,
                                    NULL,
                                    NULL};

PyMODINIT_FUNC PyInit__sdpa(void); /* the one exported symbol */

PyMODINIT_FUNC PyInit__sdpa(void) {
    if (PyType_Ready(&sdpa_py_context_type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&sdpa_py_context_type);
    if (PyModule_AddObject(m, "Context", (PyObject *)&sdpa_py_context_type) < 0) {
        Py_DECREF(&sdpa_py_context_type);
        Py_DECREF(m);
        return NULL;
    }
    static const struct {
        const char *name;
        long value;
    } consts[] = {{"F32", SDPA_F32},
                  {"F16", SDPA_F16},
                  {"BF16", SDPA_BF16},
                  {"BOOL", SDPA_BOOL},
                  {"ISA_AUTO", SDPA_ISA_AUTO},
                  {"ISA_GENERIC", SDPA_ISA_GENERIC},
                  {"ISA_AVX2", SDPA_ISA_AVX2},
                  {"ISA_AVX512", SDPA_ISA_AVX512},
                  {"ISA_AMX", SDPA_ISA_AMX},
                  {"ALIGN_TOP_LEFT", SDPA_ALIGN_TOP_LEFT},
                  {"ALIGN_BOTTOM_RIGHT", SDPA_ALIGN_BOTTOM_RIGHT}};
    for (size_t n = 0; n < sizeof consts / sizeof consts[0]; n++)
        if (PyModule_AddIntConstant(m, consts[n].name, consts[n].value) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    return m;
}
