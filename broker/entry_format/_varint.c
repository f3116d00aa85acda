/*
 * broker/entry_format/_varint.c: protobuf's base-128 varint of an integer, natively.
 *
 * Role: every entry written carries several varints (sequence ids, publish and event times,
 * sizes, the broker index); written in Python each costs about ten times what it costs here.
 * wire.py uses this module when it was built (`pip install` with a C compiler) and its own
 * Python encoder otherwise.
 *
 * Invariant: encode_varint(v) returns exactly the bytes of wire.py's Python encoder for every
 * int 0 <= v < 2^64; any other argument (a negative or larger int, a bool subclass is an int
 * and is encoded as one, anything that is not an int) is handed to the Python encoder given
 * to set_fallback, so the two never disagree, also in what they raise.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *fallback = NULL;

static PyObject *encode_varint(PyObject *self, PyObject *value) {
    if (PyLong_CheckExact(value)) {
        unsigned long long v = PyLong_AsUnsignedLongLong(value);
        if (!(v == (unsigned long long)-1 && PyErr_Occurred())) {
            unsigned char out[10];
            Py_ssize_t n = 0;
            while (v >= 0x80) {
                out[n++] = (unsigned char)((v & 0x7F) | 0x80);
                v >>= 7;
            }
            out[n++] = (unsigned char)v;
            return PyBytes_FromStringAndSize((const char *)out, n);
        }
        PyErr_Clear(); /* negative or past 64 bits: the Python encoder decides */
    }
    if (fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_varint.set_fallback was not called");
        return NULL;
    }
    return PyObject_CallOneArg(fallback, value);
}

static PyObject *set_fallback(PyObject *self, PyObject *encoder) {
    Py_XSETREF(fallback, Py_NewRef(encoder));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"encode_varint", encode_varint, METH_O, "Protobuf's base-128 varint of a non-negative integer."},
    {"set_fallback", set_fallback, METH_O, "The Python encoder for what this one does not take."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_varint", "Protobuf varints, natively (see wire.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__varint(void) { return PyModule_Create(&module); }
