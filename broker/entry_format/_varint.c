/*
 * broker/entry_format/_varint.c: protobuf's base-128 varint of an integer, natively.
 *
 * Role: every entry written and read carries several varints (sequence ids, publish and event
 * times, sizes, the broker index); in Python each costs about ten times what it costs here.
 * wire.py uses this module when it was built (`pip install` with a C compiler) and its own
 * Python encoder otherwise.
 *
 * Invariants: encode_varint(v) returns exactly the bytes of wire.py's Python encoder for every
 * int 0 <= v < 2^64; any other argument (a negative or larger int, anything that is not an
 * exact int) is handed to the Python encoder given to set_fallback, so the two never disagree,
 * also in what they raise. read_varint(buf, pos) reads a well-formed varint of a bytes object
 * itself and hands every other call to the Python reader given to set_read_fallback, likewise.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *fallback = NULL;
static PyObject *read_fallback = NULL;

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

/* read_varint(buf, pos) -> (value, next pos) for a bytes object and 0 <= pos: the common case,
 * read here; everything else (another buffer type, a negative position, a varint that runs past
 * the end, is longer than 10 bytes or wider than 64 bits) goes to the Python reader, which
 * returns or raises exactly what it always does. */
static PyObject *read_varint(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs == 2 && PyBytes_CheckExact(args[0]) && PyLong_CheckExact(args[1])) {
        Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
        if (pos == -1 && PyErr_Occurred()) {
            PyErr_Clear();
        } else if (pos >= 0) {
            const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(args[0]);
            Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
            unsigned long long value = 0;
            int shift = 0;
            Py_ssize_t i = pos;
            while (i < n && shift <= 63) {
                unsigned char b = p[i++];
                if (shift == 63 && (b & 0x7F) > 1) {
                    break; /* wider than 64 bits */
                }
                value |= (unsigned long long)(b & 0x7F) << shift;
                if (b < 0x80) {
                    return Py_BuildValue("(Kn)", value, i);
                }
                shift += 7;
            }
        }
    }
    if (read_fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_varint.set_read_fallback was not called");
        return NULL;
    }
    return PyObject_Vectorcall(read_fallback, args, (size_t)nargs, NULL);
}

static PyObject *set_read_fallback(PyObject *self, PyObject *reader) {
    Py_XSETREF(read_fallback, Py_NewRef(reader));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"encode_varint", encode_varint, METH_O, "Protobuf's base-128 varint of a non-negative integer."},
    {"set_fallback", set_fallback, METH_O, "The Python encoder for what this one does not take."},
    {"read_varint", (PyCFunction)(void (*)(void))read_varint, METH_FASTCALL,
     "(value, next position) of the varint at a position of a bytes object."},
    {"set_read_fallback", set_read_fallback, METH_O, "The Python reader for what this one does not take."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_varint", "Protobuf varints, natively (see wire.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__varint(void) { return PyModule_Create(&module); }
