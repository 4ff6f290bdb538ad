/*
 * sdpa_py.h — what the two files of the extension sdpa._sdpa share: the context object, one
 * tensor argument taken from a buffer, and the library's errors as Python exceptions.
 * _sdpa.c defines these and the module; fast.c holds the fast path of
 * scaled_dot_product_attention. Internal to the extension (its symbols are hidden).
 */
#ifndef SDPA_PY_H
#define SDPA_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "sdpa.h"

/* An sdpa.Context: the library context it owns (NULL until __init__ succeeds). */
typedef struct {
    PyObject_HEAD sdpa_ctx *ctx;
} sdpa_py_context;

extern PyTypeObject sdpa_py_context_type;

/* One argument: the buffer it holds and the view of it the library reads or writes. */
typedef struct sdpa_py_arg {
    Py_buffer buf;
    int held;
    sdpa_tensor t;
} sdpa_py_arg;

/* Releases a's buffer if it holds one; safe to call twice. */
void sdpa_py_drop(sdpa_py_arg *a);

/* Raises the Python exception for a library status, with the context's message.
 * @return NULL. */
PyObject *sdpa_py_fail(sdpa_status st, const sdpa_ctx *ctx);

/* fast.c: _sdpa.set_numpy and _sdpa.fast_forward (METH_FASTCALL). */
PyObject *sdpa_py_set_numpy(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *sdpa_py_fast_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif /* SDPA_PY_H */
