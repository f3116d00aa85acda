/*
 * broker/entry_format/_batch_decoder.c: a batch payload split into messages, natively.
 *
 * Role: every read of a batched entry (dispatch to consumers, readers, the check of a client's
 * batch on publish) splits its payload, [size u32][SingleMessageMetadata][message bytes] per
 * message, into DecodedMessage tuples; in Python that loop costs about a microsecond per
 * message. batch.py uses this module when it was built (`pip install` with a C compiler) and its
 * own decoder otherwise.
 *
 * Invariants: decode_batch(buf, count, first_offset, base_sequence_id) returns exactly the list
 * batch.py's Python decoder returns, or None when it cannot vouch for that: anything it does not
 * read itself (a buffer that is not bytes, a field it does not know, a multi-byte tag, a
 * property not in protobuf's short form, a repeated key, a varint past 64 bits, text that is not
 * UTF-8) and anything malformed. The Python decoder then decides, so the two never disagree, also in what
 * they raise. Nothing is read outside the buffer: every read is checked against the end of the
 * message's metadata or of the batch before it is made.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_wire.h"

static PyTypeObject *message_type = NULL; /* DecodedMessage: a tuple subclass of 12 fields */

#define FIELDS 12

/* A length-delimited field's bounds at *pos (after its tag), within end. */
static int read_span(const unsigned char *p, Py_ssize_t end, Py_ssize_t *pos, Py_ssize_t *start,
                     Py_ssize_t *stop) {
    uint64_t length;
    if (!wire_read_varint(p, end, pos, &length) || length > (uint64_t)(end - *pos)) {
        return 0;
    }
    *start = *pos;
    *stop = *pos + (Py_ssize_t)length;
    *pos = *stop;
    return 1;
}

/* Add one KeyValue in protobuf's short form (0a len name 12 len value) to props; 0 otherwise. */
static int add_property(PyObject *props, const unsigned char *p, Py_ssize_t start, Py_ssize_t stop) {
    if (stop - start < 4 || p[start] != 0x0A || p[start + 1] >= 0x80) {
        return 0;
    }
    Py_ssize_t split = start + 2 + p[start + 1];
    if (split + 2 > stop || p[split] != 0x12 || p[split + 1] >= 0x80 || split + 2 + p[split + 1] != stop) {
        return 0;
    }
    PyObject *name = PyUnicode_DecodeUTF8((const char *)p + start + 2, split - start - 2, "strict");
    if (name == NULL) {
        return 0;
    }
    PyObject *value = PyUnicode_DecodeUTF8((const char *)p + split + 2, stop - split - 2, "strict");
    if (value == NULL) {
        Py_DECREF(name);
        return 0;
    }
    int failed = PyDict_SetItem(props, name, value);
    Py_DECREF(name);
    Py_DECREF(value);
    return failed == 0;
}

/* The message at *pos (index in the batch), or NULL with no exception set when the Python
 * decoder must decide, or NULL with an exception set (out of memory). */
static PyObject *decode_one(const unsigned char *p, Py_ssize_t total, Py_ssize_t *pos, Py_ssize_t index,
                            PyObject *first_offset, PyObject *base_sequence_id) {
    if (total - *pos < 4) {
        return NULL;
    }
    uint32_t meta_size = (uint32_t)p[*pos] << 24 | (uint32_t)p[*pos + 1] << 16 | (uint32_t)p[*pos + 2] << 8 |
                         (uint32_t)p[*pos + 3];
    Py_ssize_t at = *pos + 4;
    if ((uint64_t)meta_size > (uint64_t)(total - at)) {
        return NULL;
    }
    Py_ssize_t end = at + (Py_ssize_t)meta_size;
    int has_payload_size = 0, has_sequence_id = 0, has_event_time = 0;
    uint64_t payload_size = 0, sequence_id = 0, event_time = 0;
    Py_ssize_t key_start = -1, key_stop = -1, ordering_start = -1, ordering_stop = -1;
    int key_b64 = 0, null_value = 0, null_key = 0, compacted_out = 0;
    PyObject *props = PyDict_New();
    if (props == NULL) {
        return NULL;
    }
    while (at < end) {
        unsigned char tag = p[at++];
        uint64_t value;
        Py_ssize_t start, stop;
        switch (tag) {
            case 0x18: /* payload_size */
                if (!wire_read_varint(p, end, &at, &payload_size)) goto fallback;
                has_payload_size = 1;
                break;
            case 0x40: /* sequence_id */
                if (!wire_read_varint(p, end, &at, &sequence_id)) goto fallback;
                has_sequence_id = 1;
                break;
            case 0x28: /* event_time */
                if (!wire_read_varint(p, end, &at, &event_time)) goto fallback;
                has_event_time = 1;
                break;
            case 0x12: /* partition_key (the Python decoder decodes every occurrence: leave a repeat to it) */
                if (key_start >= 0 || !read_span(p, end, &at, &key_start, &key_stop)) goto fallback;
                break;
            case 0x3A: /* ordering_key */
                if (!read_span(p, end, &at, &ordering_start, &ordering_stop)) goto fallback;
                break;
            case 0x0A: /* a property */
                if (!read_span(p, end, &at, &start, &stop) || !add_property(props, p, start, stop)) goto fallback;
                break;
            case 0x30: case 0x20: case 0x48: case 0x50: /* the bools */
                if (!wire_read_varint(p, end, &at, &value)) goto fallback;
                if (tag == 0x30) key_b64 = value != 0;
                else if (tag == 0x20) compacted_out = value != 0;
                else if (tag == 0x48) null_value = value != 0;
                else null_key = value != 0;
                break;
            default: /* a field this reader does not know, or a multi-byte tag */
                goto fallback;
        }
    }
    if (!has_payload_size || payload_size > (uint64_t)INT64_MAX || payload_size > (uint64_t)(total - end)) {
        goto fallback;
    }
    PyObject *key = Py_None, *ordering_key = Py_None, *event = Py_None, *offset = Py_None, *sequence;
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    PyObject *payload = NULL, *batch_index = NULL, *message = NULL;
    if (key_start >= 0) {
        Py_DECREF(key);
        key = PyUnicode_DecodeUTF8((const char *)p + key_start, key_stop - key_start, "strict");
        if (key == NULL) {
            PyErr_Clear();
            Py_DECREF(ordering_key);
            Py_DECREF(event);
            Py_DECREF(offset);
            goto fallback;
        }
    }
    if (ordering_start >= 0) {
        Py_DECREF(ordering_key);
        ordering_key = PyBytes_FromStringAndSize((const char *)p + ordering_start, ordering_stop - ordering_start);
    }
    if (has_event_time) {
        Py_DECREF(event);
        event = PyLong_FromUnsignedLongLong(event_time);
    }
    batch_index = PyLong_FromSsize_t(index);
    if (first_offset != Py_None && batch_index != NULL) {
        Py_DECREF(offset);
        offset = PyNumber_Add(first_offset, batch_index);
    }
    sequence = has_sequence_id ? PyLong_FromUnsignedLongLong(sequence_id)
               : (batch_index == NULL ? NULL : PyNumber_Add(base_sequence_id, batch_index));
    payload = PyBytes_FromStringAndSize((const char *)p + end, (Py_ssize_t)payload_size);
    if (ordering_key != NULL && event != NULL && batch_index != NULL && offset != NULL && sequence != NULL &&
        payload != NULL) {
        message = message_type->tp_alloc(message_type, FIELDS);
    }
    if (message == NULL) {
        Py_XDECREF(key);
        Py_XDECREF(ordering_key);
        Py_XDECREF(event);
        Py_XDECREF(batch_index);
        Py_XDECREF(offset);
        Py_XDECREF(sequence);
        Py_XDECREF(payload);
        Py_DECREF(props);
        return NULL; /* out of memory: the exception is set */
    }
    PyTuple_SET_ITEM(message, 0, batch_index);
    PyTuple_SET_ITEM(message, 1, offset);
    PyTuple_SET_ITEM(message, 2, payload);
    PyTuple_SET_ITEM(message, 3, key);
    PyTuple_SET_ITEM(message, 4, props);
    PyTuple_SET_ITEM(message, 5, event);
    PyTuple_SET_ITEM(message, 6, sequence);
    PyTuple_SET_ITEM(message, 7, ordering_key);
    PyTuple_SET_ITEM(message, 8, Py_NewRef(key_b64 ? Py_True : Py_False));
    PyTuple_SET_ITEM(message, 9, Py_NewRef(null_value ? Py_True : Py_False));
    PyTuple_SET_ITEM(message, 10, Py_NewRef(null_key ? Py_True : Py_False));
    PyTuple_SET_ITEM(message, 11, Py_NewRef(compacted_out ? Py_True : Py_False));
    *pos = end + (Py_ssize_t)payload_size;
    return message;

fallback:
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        Py_DECREF(props);
        return NULL;
    }
    PyErr_Clear();
    Py_DECREF(props);
    return NULL;
}

/* decode_batch(buf, count, first_offset, base_sequence_id) -> list of DecodedMessage, or None. */
static PyObject *decode_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (message_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_batch_decoder.set_message_type was not called");
        return NULL;
    }
    if (nargs != 4 || !PyBytes_CheckExact(args[0]) || !PyLong_CheckExact(args[1]) ||
        !(args[2] == Py_None || PyLong_CheckExact(args[2])) || !PyLong_CheckExact(args[3])) {
        Py_RETURN_NONE;
    }
    if (args[2] != Py_None) { /* a negative first offset numbers no message: the Python decoder's case */
        long long first = PyLong_AsLongLong(args[2]);
        if ((first == -1 && PyErr_Occurred()) || first < 0) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
    }
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    if (count == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t total = PyBytes_GET_SIZE(args[0]);
    if (count <= 0 || count > total / 6) {
        Py_RETURN_NONE;
    }
    PyObject *messages = PyList_New(count);
    if (messages == NULL) {
        return NULL;
    }
    Py_ssize_t pos = 0;
    for (Py_ssize_t index = 0; index < count; index++) {
        PyObject *message = decode_one(p, total, &pos, index, args[2], args[3]);
        if (message == NULL) {
            Py_DECREF(messages);
            if (PyErr_Occurred()) {
                return NULL;
            }
            Py_RETURN_NONE;
        }
        PyList_SET_ITEM(messages, index, message);
    }
    if (pos != total) {
        Py_DECREF(messages);
        Py_RETURN_NONE;
    }
    return messages;
}

static PyObject *set_message_type(PyObject *self, PyObject *cls) {
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "the message type must be a tuple subclass");
        return NULL;
    }
    Py_XSETREF(message_type, (PyTypeObject *)Py_NewRef(cls));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_batch", (PyCFunction)(void (*)(void))decode_batch, METH_FASTCALL,
     "The messages of a batch payload, or None when the Python decoder must decide."},
    {"set_message_type", set_message_type, METH_O, "The DecodedMessage named tuple to build."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_batch_decoder", "Batch payloads split into messages, natively (see batch.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__batch_decoder(void) { return PyModule_Create(&module); }
