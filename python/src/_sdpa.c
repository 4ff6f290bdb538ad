/*
 * _sdpa.c — the CPython extension under the `sdpa` package: a thin layer over sdpa.h.
 *
 * It is built without numpy's or torch's headers: every tensor reaches it as an object with
 * the buffer protocol (a numpy array; torch tensors are viewed as numpy arrays by
 * sdpa/__init__.py) of rank 4, with the sdpa dtype as a separate code (so bfloat16, which has
 * no buffer format, arrives as 2-byte unsigned integers). Strides come from the buffer,
 * converted from bytes to elements, so any view the C API can express is taken without a copy.
 * fast_forward, the common case of scaled_dot_product_attention in one call, reads numpy
 * arrays of any rank the same way and makes its result with numpy.empty, both of which
 * sdpa/__init__.py hands over through set_numpy (see "the fast path" below); merge takes its
 * parts as two sequences of (buffer, dtype) pairs. The GIL is released while the library
 * computes; a library error becomes ValueError (arguments), TypeError (dtypes), MemoryError
 * (memory) or RuntimeError (anything else), with the library's message.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "sdpa.h"

#include <string.h>

/* the highest rank the fast path takes (numpy's limit is 64) */
#define SDPA_PY_MAX_RANK 64

/* ---- the context ---- */

typedef struct {
    PyObject_HEAD sdpa_ctx *ctx;
} ContextObject;

static void context_dealloc(ContextObject *self) {
    sdpa_ctx_destroy(self->ctx);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int context_init(ContextObject *self, PyObject *args, PyObject *kwargs) {
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

static PyObject *context_get(ContextObject *self, void *what) {
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
    return PyUnicode_FromString(sdpa_ctx_describe(self->ctx));
}

static PyGetSetDef context_getset[] = {
    {"n_threads", (getter)context_get, NULL, "threads the context computes with", "n_threads"},
    {"isa", (getter)context_get, NULL, "instruction-set level of the kernels", "isa"},
    {"kernel", (getter)context_get, NULL, "the implementation sdpa_forward runs", "kernel"},
    {"description", (getter)context_get, NULL, "sdpa_ctx_describe(): features and dispatch",
     "describe"},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject ContextType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sdpa._sdpa.Context",
    .tp_basicsize = sizeof(ContextObject),
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

/* One argument: the buffer it holds and the view of it the library reads or writes. */
typedef struct arg {
    Py_buffer buf;
    int held;
    sdpa_tensor t;
} arg;

/* Takes obj (rank 4, with the buffer protocol) as a tensor of dtype; writable for outputs.
 * @return 0, or -1 with a Python exception naming the argument. */
static int take(arg *a, PyObject *obj, int dtype, int writable, const char *name) {
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

static void drop(arg *a) {
    if (a->held)
        PyBuffer_Release(&a->buf);
    a->held = 0;
}

/* Raises the Python exception for a library status, with the context's message. */
static PyObject *fail(sdpa_status st, const sdpa_ctx *ctx) {
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

/* The parameters, from a tuple the Python layer builds:
 *   (scale, causal, align, window or None, softcap, slopes buffer or None, dropout_p, seed,
 *    offset). */
static int parse_params(PyObject *t, sdpa_params *p, Py_buffer *slopes, int *have_slopes) {
    memset(p, 0, sizeof *p);
    *have_slopes = 0;
    double scale, softcap, dropout_p;
    int causal, align;
    PyObject *window, *sl;
    unsigned long long seed, offset;
    if (!PyArg_ParseTuple(t, "dpiOdOdKK", &scale, &causal, &align, &window, &softcap, &sl,
                          &dropout_p, &seed, &offset))
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
    if (sl != Py_None) {
        if (PyObject_GetBuffer(sl, slopes, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0)
            return -1;
        *have_slopes = 1;
        if (slopes->itemsize != 4 || slopes->format == NULL || strcmp(slopes->format, "f") != 0) {
            PyErr_SetString(PyExc_TypeError, "alibi_slopes: float32 values expected");
            return -1;
        }
        p->alibi_slopes = slopes->buf;
    }
    return 0;
}

/* A tensor argument: (buffer, dtype code) or None. */
static int take_opt(arg *a, PyObject *pair, int writable, const char *name) {
    memset(a, 0, sizeof *a);
    if (pair == Py_None)
        return 0;
    PyObject *obj;
    int dtype;
    if (!PyArg_ParseTuple(pair, "Oi", &obj, &dtype))
        return -1;
    return take(a, obj, dtype, writable, name);
}

static ContextObject *context_of(PyObject *o) {
    if (!PyObject_TypeCheck(o, &ContextType) || ((ContextObject *)o)->ctx == NULL) {
        PyErr_SetString(PyExc_TypeError, "context: an initialised sdpa.Context expected");
        return NULL;
    }
    return (ContextObject *)o;
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
    ContextObject *c = context_of(ctx_obj);
    if (c == NULL)
        return NULL;
    arg a[9], mask;
    memset(a, 0, sizeof a);
    memset(&mask, 0, sizeof mask);
    Py_buffer slopes;
    int have_slopes = 0;
    sdpa_params p;
    PyObject *result = NULL;
    for (int n = 0; n < 9; n++)
        if (take_opt(&a[n], t[n], outputs[op][n], names[n]) != 0)
            goto done;
    if (take_opt(&mask, mask_obj, 0, "attn_mask") != 0 ||
        parse_params(params_obj, &p, &slopes, &have_slopes) != 0)
        goto done;
    if (mask.held)
        p.mask = &mask.t;
    sdpa_tensor *v[9];
    for (int n = 0; n < 9; n++)
        v[n] = a[n].held ? &a[n].t : NULL;
    sdpa_status st;
    Py_BEGIN_ALLOW_THREADS;
    if (op == OP_FORWARD)
        st = sdpa_forward(c->ctx, v[0], v[1], v[2], &p, v[3], v[4]);
    else if (op == OP_WEIGHTS)
        st = sdpa_weights(c->ctx, v[0], v[1], &p, v[3]);
    else
        st = sdpa_backward(c->ctx, v[0], v[1], v[2], v[3], v[4], v[5], &p, v[6], v[7], v[8]);
    Py_END_ALLOW_THREADS;
    if (st != SDPA_OK) {
        fail(st, c->ctx);
        goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    for (int n = 0; n < 9; n++)
        drop(&a[n]);
    drop(&mask);
    if (have_slopes)
        PyBuffer_Release(&slopes);
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

/* merge(ctx, [(out_p, dt), ...], [(lse_p, dt), ...], (out, dt), (lse, dt) | None): sdpa_merge
 * on rank-4 buffers, the parts given as two sequences of the same length (>= 1). */
static PyObject *py_merge(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ctx_obj, *outs_obj, *lses_obj, *out_obj, *lse_obj;
    if (!PyArg_ParseTuple(args, "OOOOO", &ctx_obj, &outs_obj, &lses_obj, &out_obj, &lse_obj))
        return NULL;
    ContextObject *c = context_of(ctx_obj);
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
    arg *a = PyMem_Calloc((size_t)(2 * n + 2), sizeof *a);
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
        fail(st, c->ctx);
        goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    if (a != NULL)
        for (Py_ssize_t k = 0; k < 2 * n + 2; k++)
            drop(&a[k]);
    PyMem_Free(a);
    PyMem_Free(t);
    Py_DECREF(outs);
    Py_DECREF(lses);
    return result;
}

/* ---- the fast path of scaled_dot_product_attention ----
 *
 * sdpa/__init__.py hands every call to fast_forward first. It takes the common case without
 * building a single Python object but the result: numpy arrays (exactly numpy.ndarray) of
 * float32 or float16 in native byte order, read through the buffer protocol, of the same rank
 * >= 2 whose leading dimensions merge into one without a copy, no mask, no ALiBi, no dropout,
 * parameters of their plain types (bool, float, None, a tuple of two ints, one of the two
 * alignment strings), and as many heads in the query as in the key unless enable_gqa is True.
 * For anything else it returns NotImplemented, and the Python path (which checks, converts and
 * explains) takes the call; so every exception and message stays the Python path's. Where the
 * fast path computes, the library sees the very tensors and parameters the Python path would
 * give it, so an error the library reports reads the same too. numpy itself is not linked: its
 * ndarray type, numpy.empty and the two dtypes come from set_numpy(), called by __init__.py. */

static PyObject *np_ndarray, *np_empty, *np_f32, *np_f16;

static PyObject *py_set_numpy(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "set_numpy(numpy.ndarray, numpy.empty, "
                                         "numpy.dtype('float32'), numpy.dtype('float16'))");
        return NULL;
    }
    PyObject **slots[4] = {&np_ndarray, &np_empty, &np_f32, &np_f16};
    for (int n = 0; n < 4; n++) {
        Py_INCREF(args[n]);
        Py_XSETREF(*slots[n], args[n]);
    }
    Py_RETURN_NONE;
}

/* Maps an array of rank n >= 2, (..., L, E) with shape and strides in bytes, to the library's
 * rank 4 as sdpa/__init__.py's _rank4 does (rank 2 and 3 gain leading extents of 1 and stride
 * 0, as numpy's a[None] gives; rank > 4 merges the leading extents into one, as numpy reshapes
 * without a copy: extents of 1 are ignored, and the others must follow one another in memory).
 * @return 0, or 1 where the Python path must take the array (the leading extents do not merge,
 * an extent is 0, a stride is not a whole number of elements). */
static int rank4(int n, const Py_ssize_t *shape, const Py_ssize_t *strides, Py_ssize_t size,
                 sdpa_tensor *t) {
    Py_ssize_t sh[4], st[4];
    for (int d = 0; d < n; d++)
        if (shape[d] == 0 || strides[d] % size != 0)
            return 1;
    const int lead = n - 3; /* extents before (H, L, E); < 1 for rank 2 and 3 */
    for (int d = 0; d < 3 && d < n; d++) {
        sh[3 - d] = shape[n - 1 - d];
        st[3 - d] = strides[n - 1 - d];
    }
    if (n == 2) {
        sh[0] = sh[1] = 1;
        st[0] = st[1] = 0;
    } else if (n == 3) {
        sh[0] = 1;
        st[0] = 0;
    } else if (n == 4) {
        sh[0] = shape[0];
        st[0] = strides[0];
    } else {
        Py_ssize_t b = 1, stride = strides[lead] * shape[lead], prev = -1;
        for (int d = 0; d < lead; d++) {
            if (shape[d] == 1)
                continue;
            if (prev >= 0 && strides[prev] != strides[d] * shape[d])
                return 1;
            b *= shape[d];
            stride = strides[d];
            prev = d;
        }
        sh[0] = b;
        st[0] = stride;
    }
    for (int d = 0; d < 4; d++) {
        t->shape[d] = sh[d];
        t->stride[d] = st[d] / size;
    }
    return 0;
}

/* Takes obj if it is a numpy array of float32 or float16 of rank >= 2.
 * @return 0 (a->buf held), or 1 (the Python path's: no exception set). */
static int fast_take(arg *a, PyObject *obj) {
    if ((PyObject *)Py_TYPE(obj) != np_ndarray)
        return 1;
    if (PyObject_GetBuffer(obj, &a->buf, PyBUF_STRIDES | PyBUF_FORMAT) != 0) {
        PyErr_Clear(); /* bfloat16, say: numpy has no buffer format for it */
        return 1;
    }
    a->held = 1;
    const char *f = a->buf.format;
    if (f == NULL || f[0] == 0 || f[1] != 0 || a->buf.ndim < 2)
        return 1;
    if (f[0] == 'f' && a->buf.itemsize == 4)
        a->t.dtype = SDPA_F32;
    else if (f[0] == 'e' && a->buf.itemsize == 2)
        a->t.dtype = SDPA_F16;
    else
        return 1;
    a->t.data = a->buf.buf;
    return 0;
}

static int same_extents(const Py_ssize_t *a, const Py_ssize_t *b, int n) {
    for (int d = 0; d < n; d++)
        if (a[d] != b[d])
            return 0;
    return 1;
}

/* A new C-contiguous numpy array of the shape, and its rank-4 view for the library: out
 * (the shape's last extent e) or lse (e < 0: the shape without it, and a last extent of 1 and
 * stride 0, as lse[..., None] gives). @return the array, or NULL with an exception. */
static PyObject *fast_new(arg *a, const Py_ssize_t *shape, int n, Py_ssize_t e, PyObject *dtype,
                          sdpa_dtype code) {
    const int rank = e < 0 ? n - 1 : n;
    PyObject *dims = PyTuple_New(rank);
    if (dims == NULL)
        return NULL;
    for (int d = 0; d < rank; d++) {
        PyObject *x = PyLong_FromSsize_t(d == n - 1 ? e : shape[d]);
        if (x == NULL) {
            Py_DECREF(dims);
            return NULL;
        }
        PyTuple_SET_ITEM(dims, d, x);
    }
    PyObject *call_args[2] = {dims, dtype};
    PyObject *arr = PyObject_Vectorcall(np_empty, call_args, 2, NULL);
    Py_DECREF(dims);
    if (arr == NULL)
        return NULL;
    if (PyObject_GetBuffer(arr, &a->buf, PyBUF_STRIDES | PyBUF_WRITABLE) != 0) {
        Py_DECREF(arr);
        return NULL;
    }
    a->held = 1;
    Py_ssize_t sh[SDPA_PY_MAX_RANK], st[SDPA_PY_MAX_RANK];
    for (int d = 0; d < rank; d++) {
        sh[d] = a->buf.shape[d];
        st[d] = a->buf.strides[d];
    }
    if (e < 0) {
        sh[n - 1] = 1;
        st[n - 1] = 0;
    }
    a->t.data = a->buf.buf;
    a->t.dtype = code;
    if (rank4(n, sh, st, a->buf.itemsize, &a->t) != 0) {
        /* cannot happen: a new contiguous array of nonzero extents merges */
        PyErr_SetString(PyExc_SystemError, "sdpa: a new array has an unexpected layout");
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

/* fast_forward(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
 *              window, alignment, softcap, alibi_slopes, return_lse, dropout_seed,
 *              dropout_offset): out, (out, lse), or NotImplemented (see above). */
static PyObject *py_fast_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 16) {
        PyErr_SetString(PyExc_TypeError, "fast_forward: 16 arguments expected");
        return NULL;
    }
    PyObject *const ctx_obj = args[0], *const mask_obj = args[4], *const p_obj = args[5],
                    *const causal_obj = args[6], *const scale_obj = args[7],
                    *const gqa_obj = args[8], *const window_obj = args[9],
                    *const align_obj = args[10], *const softcap_obj = args[11],
                    *const slopes_obj = args[12], *const lse_obj = args[13];
    if (np_ndarray == NULL || !PyObject_TypeCheck(ctx_obj, &ContextType) ||
        ((ContextObject *)ctx_obj)->ctx == NULL || mask_obj != Py_None || slopes_obj != Py_None ||
        args[14] != Py_None || args[15] != Py_None ||
        (causal_obj != Py_True && causal_obj != Py_False) ||
        (lse_obj != Py_True && lse_obj != Py_False))
        Py_RETURN_NOTIMPLEMENTED;
    if (!(PyFloat_CheckExact(p_obj) && PyFloat_AS_DOUBLE(p_obj) == 0.0) &&
        !(PyLong_CheckExact(p_obj) && PyObject_Not(p_obj) == 1))
        Py_RETURN_NOTIMPLEMENTED;
    sdpa_params p;
    memset(&p, 0, sizeof p);
    p.causal = causal_obj == Py_True;
    if (scale_obj != Py_None) {
        if (!PyFloat_CheckExact(scale_obj) || PyFloat_AS_DOUBLE(scale_obj) == 0.0)
            Py_RETURN_NOTIMPLEMENTED; /* 0: the Python path says why it refuses it */
        p.scale = (float)PyFloat_AS_DOUBLE(scale_obj);
    }
    if (softcap_obj != Py_None) {
        if (!PyFloat_CheckExact(softcap_obj))
            Py_RETURN_NOTIMPLEMENTED;
        p.softcap = (float)PyFloat_AS_DOUBLE(softcap_obj);
    }
    if (!PyUnicode_CheckExact(align_obj))
        Py_RETURN_NOTIMPLEMENTED;
    if (PyUnicode_CompareWithASCIIString(align_obj, "top-left") == 0)
        p.align = SDPA_ALIGN_TOP_LEFT;
    else if (PyUnicode_CompareWithASCIIString(align_obj, "bottom-right") == 0)
        p.align = SDPA_ALIGN_BOTTOM_RIGHT;
    else
        Py_RETURN_NOTIMPLEMENTED;
    if (window_obj != Py_None) {
        if (!PyTuple_CheckExact(window_obj) || PyTuple_GET_SIZE(window_obj) != 2)
            Py_RETURN_NOTIMPLEMENTED;
        long long w[2];
        for (int n = 0; n < 2; n++) {
            PyObject *x = PyTuple_GET_ITEM(window_obj, n);
            int overflow = 0;
            w[n] = PyLong_CheckExact(x) ? PyLong_AsLongLongAndOverflow(x, &overflow) : 0;
            if (!PyLong_CheckExact(x) || overflow != 0 || (w[n] == -1 && PyErr_Occurred())) {
                PyErr_Clear();
                Py_RETURN_NOTIMPLEMENTED;
            }
        }
        p.use_window = 1;
        p.window_left = w[0];
        p.window_right = w[1];
    }

    arg a[5]; /* q, k, v, out, lse */
    memset(a, 0, sizeof a);
    const Py_buffer *q = &a[0].buf, *k = &a[1].buf, *v = &a[2].buf;
    ContextObject *c = (ContextObject *)ctx_obj;
    PyObject *out = NULL, *lse = NULL, *result = NULL;
    int fallback = 1, r = 0;
    sdpa_status st;
    for (int n = 0; n < 3; n++)
        if (fast_take(&a[n], args[1 + n]) != 0)
            goto done;
    r = q->ndim;
    if (k->ndim != r || v->ndim != r || r > SDPA_PY_MAX_RANK ||
        !same_extents(v->shape, k->shape, r - 1) ||
        (r >= 4 && !same_extents(q->shape, k->shape, r - 3)))
        goto done;
    if (r >= 3 && q->shape[r - 3] != k->shape[r - 3] && gqa_obj != Py_True)
        goto done; /* the Python path's message: pass enable_gqa=True */
    for (int n = 0; n < 3; n++)
        if (rank4(r, a[n].buf.shape, a[n].buf.strides, a[n].buf.itemsize, &a[n].t) != 0)
            goto done;
    fallback = 0;
    out = fast_new(&a[3], q->shape, r, v->shape[r - 1], a[0].t.dtype == SDPA_F32 ? np_f32 : np_f16,
                   a[0].t.dtype);
    if (out == NULL)
        goto done;
    if (lse_obj == Py_True && (lse = fast_new(&a[4], q->shape, r, -1, np_f32, SDPA_F32)) == NULL)
        goto done;
    Py_BEGIN_ALLOW_THREADS;
    st = sdpa_forward(c->ctx, &a[0].t, &a[1].t, &a[2].t, &p, &a[3].t, lse ? &a[4].t : NULL);
    Py_END_ALLOW_THREADS;
    if (st != SDPA_OK) {
        fail(st, c->ctx);
        goto done;
    }
    if (lse == NULL) {
        result = out;
        out = NULL;
    } else {
        result = PyTuple_Pack(2, out, lse);
    }
done:
    for (int n = 0; n < 5; n++)
        drop(&a[n]);
    Py_XDECREF(out);
    Py_XDECREF(lse);
    if (fallback)
        Py_RETURN_NOTIMPLEMENTED;
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
    {"merge", py_merge, METH_VARARGS,
     "merge(ctx, [(out_p, dt), ...], [(lse_p, dt), ...], (out, dt), lse|None): sdpa_merge"},
    {"fast_forward", (PyCFunction)(void (*)(void))py_fast_forward, METH_FASTCALL,
     "fast_forward(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, "
     "window, alignment, softcap, alibi_slopes, return_lse, dropout_seed, dropout_offset): "
     "scaled_dot_product_attention's common case on numpy arrays, or NotImplemented"},
    {"set_numpy", (PyCFunction)(void (*)(void))py_set_numpy, METH_FASTCALL,
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

PyMODINIT_FUNC PyInit__sdpa(void) {
    if (PyType_Ready(&ContextType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&ContextType);
    if (PyModule_AddObject(m, "Context", (PyObject *)&ContextType) < 0) {
        Py_DECREF(&ContextType);
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
