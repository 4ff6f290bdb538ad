/*
 * _sdpa.c — the CPython extension under the `sdpa` package: a thin layer over sdpa.h.
 *
 * It knows nothing of numpy or torch: every tensor reaches it as an object with the buffer
 * protocol (a numpy array; torch tensors are viewed as numpy arrays by sdpa/__init__.py) of
 * rank 4, with the sdpa dtype as a separate code (so bfloat16, which has no buffer format,
 * arrives as 2-byte unsigned integers). Strides come from the buffer, converted from bytes to
 * elements, so any view the C API can express is taken without a copy. The GIL is released
 * while the library computes; a library error becomes ValueError (arguments), TypeError
 * (dtypes), MemoryError (memory) or RuntimeError (anything else), with the library's message.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "sdpa.h"

#include <string.h>

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
