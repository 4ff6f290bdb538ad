/*
 * fast.c — the fast path of sdpa.scaled_dot_product_attention, part of the extension
 * sdpa._sdpa (see _sdpa.c for the rest and sdpa_py.h for what they share).
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
 * ndarray type, numpy.empty and the two dtypes come from set_numpy(), called by __init__.py.
 * A call with attention sinks never comes here (__init__.py takes it itself).
 */
#include "sdpa_py.h"

#include <string.h>

/* the highest rank the fast path takes (numpy's limit is 64) */
#define SDPA_PY_MAX_RANK 64

static PyObject *np_ndarray, *np_empty, *np_f32, *np_f16;

PyObject *sdpa_py_set_numpy(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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
static int fast_take(sdpa_py_arg *a, PyObject *obj) {
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
static PyObject *fast_new(sdpa_py_arg *a, const Py_ssize_t *shape, int n, Py_ssize_t e,
                          PyObject *dtype, sdpa_dtype code) {
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
PyObject *sdpa_py_fast_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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
    if (np_ndarray == NULL || !PyObject_TypeCheck(ctx_obj, &sdpa_py_context_type) ||
        ((sdpa_py_context *)ctx_obj)->ctx == NULL || mask_obj != Py_None || slopes_obj != Py_None ||
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

    sdpa_py_arg a[5]; /* q, k, v, out, lse */
    memset(a, 0, sizeof a);
    const Py_buffer *q = &a[0].buf, *k = &a[1].buf, *v = &a[2].buf;
    sdpa_py_context *c = (sdpa_py_context *)ctx_obj;
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
        sdpa_py_fail(st, c->ctx);
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
        sdpa_py_drop(&a[n]);
    Py_XDECREF(out);
    Py_XDECREF(lse);
    if (fallback)
        Py_RETURN_NOTIMPLEMENTED;
    return result;
}
