/*
 * consumers/eventsourcing/_notifications.c: the optional native maker of a range read's
 * notifications (records.py).
 *
 * Role: a recorder's sequential reader turns every row of a range read into the library's
 * ``Notification`` and its originator id into a ``UUID``. Arrow's kernels select the rows and
 * columns; what is left is making two Python objects a row, which in Python costs about half a
 * microsecond a row: the largest share of reading notifications. Two functions make them here,
 * as records.py's Python path makes them:
 *
 * - ``uuids(uuid_type, set_int, set_is_safe, is_safe, bits)``: for every 16 bytes of ``bits``
 *   (big-endian), ``object.__new__(uuid_type)`` with its ``int`` slot set to their value and its
 *   ``is_safe`` slot to ``is_safe``, each through the given slot descriptor (what
 *   ``UUID.__init__`` sets, without parsing text).
 * - ``notifications(notification_type, offsets, originator_ids, versions, topics, states)``:
 *   for every row, ``object.__new__(notification_type)`` whose ``__dict__`` is
 *   ``{"originator_id", "originator_version", "topic", "state", "id": offset + 1}``, set as
 *   ``object.__setattr__(n, "__dict__", d)`` sets it (what the dataclass's generated
 *   ``__init__`` leaves; records.py uses this path only while that holds).
 *
 * Invariants: the arguments are what records.py passes (lists of equal length; offsets ints;
 * ``bits`` a bytes object whose length is a multiple of 16); anything else raises TypeError or
 * ValueError and makes nothing. A failure midway releases every object made so far. What can
 * be in no reference cycle is not tracked by the collector: a UUID made here, and a
 * notification's dict whose values are such UUIDs, strs, ints and bytes (tracked again by
 * CPython when anything else goes in); the notification itself is tracked.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define UUID_BYTES 16

static PyObject *key_originator_id, *key_originator_version, *key_topic, *key_state, *key_id, *key_dict;

static int set_through(PyObject *descriptor, PyObject *target, PyObject *value) {
    descrsetfunc set = Py_TYPE(descriptor)->tp_descr_set;
    if (set == NULL) {
        PyErr_SetString(PyExc_TypeError, "a slot descriptor is expected");
        return -1;
    }
    return set(descriptor, target, value);
}

/* Whether a notification's fields can hold no cycle, so its dict need not be tracked (CPython
 * tracks a dict once a value that may be tracked goes in, and again whenever one does later):
 * the originator id a str or an untracked UUID, the version an int, the topic a str, the state
 * bytes, the id an int. */
static int atomic_fields(PyObject *originator_id, PyObject *version, PyObject *topic, PyObject *state) {
    int atomic_id = PyUnicode_CheckExact(originator_id) ||
                    (PyObject_IS_GC(originator_id) && !PyObject_GC_IsTracked(originator_id));
    return atomic_id && PyLong_CheckExact(version) && PyUnicode_CheckExact(topic) && PyBytes_CheckExact(state);
}

/* uuids(uuid_type, set_int, set_is_safe, is_safe, bits) -> list of UUIDs */
static PyObject *uuids(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "uuids(uuid_type, set_int, set_is_safe, is_safe, bits)");
        return NULL;
    }
    PyObject *type_object = args[0], *set_int = args[1], *set_is_safe = args[2], *is_safe = args[3];
    if (!PyType_Check(type_object) || !PyBytes_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "uuids: a type and bytes are expected");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)type_object;
    Py_ssize_t size = PyBytes_GET_SIZE(args[4]);
    if (size % UUID_BYTES) {
        PyErr_SetString(PyExc_ValueError, "uuids: bits are 16 bytes a UUID");
        return NULL;
    }
    const unsigned char *bits = (const unsigned char *)PyBytes_AS_STRING(args[4]);
    Py_ssize_t count = size / UUID_BYTES;
    PyObject *made = PyList_New(count);
    if (made == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *uuid = type->tp_alloc(type, 0);
        if (uuid == NULL)
            goto failed;
        PyList_SET_ITEM(made, i, uuid);
        PyObject *value = _PyLong_FromByteArray(bits + i * UUID_BYTES, UUID_BYTES, 0, 0);
        if (value == NULL)
            goto failed;
        int failed = set_through(set_int, uuid, value);
        Py_DECREF(value);
        if (failed || set_through(set_is_safe, uuid, is_safe))
            goto failed;
        /* It holds only its int and the SafeUUID member it was given (made before it, unable
         * to refer to it), and UUID refuses every attribute set: it can be in no reference
         * cycle, and is left out of the collector's lists, as CPython leaves out a tuple of
         * atomic values. */
        if (PyObject_IS_GC(uuid))
            PyObject_GC_UnTrack(uuid); /* (a no-op when it is not tracked) */
    }
    return made;
failed:
    Py_DECREF(made); /* (the items not made yet are NULL, which a list's release skips) */
    return NULL;
}

/* notifications(notification_type, offsets, originator_ids, versions, topics, states) -> list */
static PyObject *notifications(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "notifications(notification_type, offsets, originator_ids, versions, topics, states)");
        return NULL;
    }
    if (!PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "notifications: a type is expected");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)args[0];
    for (int column = 1; column < 6; column++) {
        if (!PyList_CheckExact(args[column])) {
            PyErr_SetString(PyExc_TypeError, "notifications: the columns are lists");
            return NULL;
        }
    }
    Py_ssize_t count = PyList_GET_SIZE(args[1]);
    for (int column = 2; column < 6; column++) {
        if (PyList_GET_SIZE(args[column]) != count) {
            PyErr_SetString(PyExc_ValueError, "notifications: the columns are of one length");
            return NULL;
        }
    }
    PyObject *made = PyList_New(count);
    if (made == NULL)
        return NULL;
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL)
        goto failed;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *offset = PyList_GET_ITEM(args[1], i);
        if (!PyLong_CheckExact(offset)) {
            PyErr_SetString(PyExc_TypeError, "notifications: offsets are ints");
            goto failed;
        }
        PyObject *id = PyNumber_Add(offset, one);
        if (id == NULL)
            goto failed;
        PyObject *fields = _PyDict_NewPresized(5);
        if (fields == NULL) {
            Py_DECREF(id);
            goto failed;
        }
        int failed = PyDict_SetItem(fields, key_originator_id, PyList_GET_ITEM(args[2], i)) ||
                     PyDict_SetItem(fields, key_originator_version, PyList_GET_ITEM(args[3], i)) ||
                     PyDict_SetItem(fields, key_topic, PyList_GET_ITEM(args[4], i)) ||
                     PyDict_SetItem(fields, key_state, PyList_GET_ITEM(args[5], i)) ||
                     PyDict_SetItem(fields, key_id, id);
        Py_DECREF(id);
        if (!failed && atomic_fields(PyList_GET_ITEM(args[2], i), PyList_GET_ITEM(args[3], i),
                                     PyList_GET_ITEM(args[4], i), PyList_GET_ITEM(args[5], i)))
            PyObject_GC_UnTrack(fields);
        PyObject *notification = failed ? NULL : type->tp_alloc(type, 0);
        if (notification == NULL) {
            Py_DECREF(fields);
            goto failed;
        }
        PyList_SET_ITEM(made, i, notification);
        failed = PyObject_GenericSetAttr(notification, key_dict, fields);
        Py_DECREF(fields);
        if (failed)
            goto failed;
    }
    Py_DECREF(one);
    return made;
failed:
    Py_XDECREF(one);
    Py_DECREF(made);
    return NULL;
}

static PyMethodDef methods[] = {
    {"uuids", (PyCFunction)(void (*)(void))uuids, METH_FASTCALL,
     "uuids(uuid_type, set_int, set_is_safe, is_safe, bits): a UUID for every 16 bytes of bits."},
    {"notifications", (PyCFunction)(void (*)(void))notifications, METH_FASTCALL,
     "notifications(notification_type, offsets, originator_ids, versions, topics, states): a Notification a row."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_notifications", "A range read's notifications, made natively (see records.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__notifications(void) {
    key_originator_id = PyUnicode_InternFromString("originator_id");
    key_originator_version = PyUnicode_InternFromString("originator_version");
    key_topic = PyUnicode_InternFromString("topic");
    key_state = PyUnicode_InternFromString("state");
    key_id = PyUnicode_InternFromString("id");
    key_dict = PyUnicode_InternFromString("__dict__");
    if (!key_originator_id || !key_originator_version || !key_topic || !key_state || !key_id || !key_dict)
        return NULL;
    return PyModule_Create(&module);
}
