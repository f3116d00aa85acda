/*
 * broker/entry_format/_batch_encoder.c: a batch entry's payload, written natively.
 *
 * Role: every produced message becomes [size u32 big-endian][SingleMessageMetadata][payload]
 * in its entry's batch payload (broker/entry_format/batch.py). Checking each message and
 * writing its SingleMessageMetadata in Python costs a few microseconds per message; here it
 * costs a fraction of one. encode.py uses this module when it was built (`pip install` with a
 * C compiler) and batch.py's Python encoder otherwise.
 *
 * Invariants:
 * - encode_batch(messages, sequence_ids) returns exactly the bytes of batch.py's
 *   encode_batch(messages, sequence_ids) for every message encode.py's checks accept. It returns
 *   None, writing nothing, for anything it does not take as it is: an element that is not
 *   exactly a Message (set_message_type), a field of a type other than the exact one the
 *   checks expect (a payload that is not bytes, a key that is not str, properties that are not
 *   exactly a dict of str to str, times and sequence ids that are not exact ints in range), a
 *   message the checks refuse (a null value with a payload, key_b64_encoded without a key), a
 *   key or property that is not valid UTF-8 (a lone surrogate). encode.py then runs its checks
 *   and the Python encoder, which refuse or encode exactly as they always do.
 * - Fields are written in field-number order, as protobuf serializes them: properties (1),
 *   partition key (2), payload size (3), compacted out (4), event time (5), key base64 flag (6,
 *   written whenever a key is), ordering key (7), sequence id (8, always), null value (9), null
 *   partition key (10).
 *
 * Bounds: one output buffer grown by doubling, freed on every path; sizes are Py_ssize_t and
 * each message's metadata is below 2^32 bytes or the call returns None.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define UINT64_MAX_VALUE 0xFFFFFFFFFFFFFFFFULL
#define INT64_MAX_VALUE 0x7FFFFFFFFFFFFFFFULL
#define MESSAGE_FIELDS 10

static PyObject *message_type = NULL;
static PyObject *empty_properties = NULL; /* Message's default properties: a read-only empty mapping */

typedef struct {
    char *data;
    Py_ssize_t size;
    Py_ssize_t capacity;
} Buffer;

static int reserve(Buffer *buf, Py_ssize_t more) {
    if (buf->size + more <= buf->capacity) {
        return 0;
    }
    Py_ssize_t capacity = buf->capacity ? buf->capacity : 256;
    while (capacity < buf->size + more) {
        if (capacity > PY_SSIZE_T_MAX / 2) {
            return -1;
        }
        capacity *= 2;
    }
    char *grown = PyMem_Realloc(buf->data, (size_t)capacity);
    if (grown == NULL) {
        return -1;
    }
    buf->data = grown;
    buf->capacity = capacity;
    return 0;
}

static int put_bytes(Buffer *buf, const char *data, Py_ssize_t size) {
    if (reserve(buf, size) < 0) {
        return -1;
    }
    memcpy(buf->data + buf->size, data, (size_t)size);
    buf->size += size;
    return 0;
}

static int put_byte(Buffer *buf, unsigned char byte) {
    if (reserve(buf, 1) < 0) {
        return -1;
    }
    buf->data[buf->size++] = (char)byte;
    return 0;
}

static int put_varint(Buffer *buf, unsigned long long value) {
    if (reserve(buf, 10) < 0) {
        return -1;
    }
    while (value >= 0x80) {
        buf->data[buf->size++] = (char)((value & 0x7F) | 0x80);
        value >>= 7;
    }
    buf->data[buf->size++] = (char)value;
    return 0;
}

static int put_field(Buffer *buf, unsigned char tag, const char *data, Py_ssize_t size) {
    if (put_byte(buf, tag) < 0 || put_varint(buf, (unsigned long long)size) < 0) {
        return -1;
    }
    return put_bytes(buf, data, size);
}

static Py_ssize_t varint_size(unsigned long long value) {
    Py_ssize_t n = 1;
    while (value >= 0x80) {
        value >>= 7;
        n++;
    }
    return n;
}

/* An exact int in [0, maximum] into *out: 1; anything else: 0 (no error left set). */
static int exact_uint(PyObject *value, unsigned long long maximum, unsigned long long *out) {
    if (!PyLong_CheckExact(value)) {
        return 0;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(value);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (v > maximum) {
        return 0;
    }
    *out = v;
    return 1;
}

/* UTF-8 of a str: 1, or 0 for a str that has none (a lone surrogate; no error left set). */
static int utf8_of(PyObject *text, const char **data, Py_ssize_t *size) {
    *data = PyUnicode_AsUTF8AndSize(text, size);
    if (*data == NULL) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* 1 written, 0 not taken (the caller returns None), -1 error set (memory). */
static int encode_one(Buffer *buf, PyObject *message, PyObject *sequence_id_obj) {
    if (Py_TYPE(message) != (PyTypeObject *)message_type || PyTuple_GET_SIZE(message) != MESSAGE_FIELDS) {
        return 0;
    }
    PyObject *payload = PyTuple_GET_ITEM(message, 0);
    PyObject *key = PyTuple_GET_ITEM(message, 1);
    PyObject *properties = PyTuple_GET_ITEM(message, 2);
    PyObject *event_time = PyTuple_GET_ITEM(message, 3);
    PyObject *own_sequence_id = PyTuple_GET_ITEM(message, 4);
    PyObject *ordering_key = PyTuple_GET_ITEM(message, 5);
    unsigned long long sequence_id, event_time_ms = 0, ignored;
    if (!PyBytes_CheckExact(payload) || !exact_uint(sequence_id_obj, UINT64_MAX_VALUE, &sequence_id)) {
        return 0;
    }
    if (key != Py_None && !PyUnicode_CheckExact(key)) {
        return 0;
    }
    if (ordering_key != Py_None && !PyBytes_CheckExact(ordering_key)) {
        return 0;
    }
    if (properties == empty_properties) {
        properties = NULL;
    } else if (!PyDict_CheckExact(properties)) {
        return 0;
    }
    if (event_time != Py_None && !exact_uint(event_time, INT64_MAX_VALUE, &event_time_ms)) {
        return 0;
    }
    if (own_sequence_id != Py_None && !exact_uint(own_sequence_id, UINT64_MAX_VALUE, &ignored)) {
        return 0;
    }
    int flags[4]; /* key_b64_encoded, null_value, null_key, compacted_out */
    for (int i = 0; i < 4; i++) {
        PyObject *flag = PyTuple_GET_ITEM(message, 6 + i);
        if (flag == Py_True) {
            flags[i] = 1;
        } else if (flag == Py_False) {
            flags[i] = 0;
        } else {
            return 0; /* not a bool: the Python encoder decides what it means */
        }
    }
    int key_b64 = flags[0], null_value = flags[1], null_key = flags[2], compacted_out = flags[3];
    Py_ssize_t payload_size = PyBytes_GET_SIZE(payload);
    if ((null_value && payload_size > 0) || (key_b64 && key == Py_None)) {
        return 0;
    }
    const char *key_data = NULL;
    Py_ssize_t key_size = 0;
    if (key != Py_None && !utf8_of(key, &key_data, &key_size)) {
        return 0;
    }
    /* the metadata goes after a 4-byte size written once it is known */
    Py_ssize_t size_at = buf->size;
    if (reserve(buf, 4) < 0) {
        return -1;
    }
    buf->size += 4;
    Py_ssize_t start = buf->size;
    Py_ssize_t pos = 0;
    PyObject *name, *value;
    while (properties != NULL && PyDict_Next(properties, &pos, &name, &value)) {
        const char *name_data, *value_data;
        Py_ssize_t name_size, value_size;
        if (!PyUnicode_CheckExact(name) || !PyUnicode_CheckExact(value) || !utf8_of(name, &name_data, &name_size)
                || !utf8_of(value, &value_data, &value_size)) {
            buf->size = size_at;
            return 0;
        }
        Py_ssize_t pair_size = 1 + varint_size((unsigned long long)name_size) + name_size + 1
                               + varint_size((unsigned long long)value_size) + value_size;
        if (put_byte(buf, 0x0A) < 0 || put_varint(buf, (unsigned long long)pair_size) < 0
                || put_field(buf, 0x0A, name_data, name_size) < 0 || put_field(buf, 0x12, value_data, value_size) < 0) {
            return -1;
        }
    }
    if (key != Py_None && put_field(buf, 0x12, key_data, key_size) < 0) {
        return -1;
    }
    if (put_byte(buf, 0x18) < 0 || put_varint(buf, (unsigned long long)payload_size) < 0) {
        return -1;
    }
    if (compacted_out && (put_byte(buf, 0x20) < 0 || put_byte(buf, 0x01) < 0)) {
        return -1;
    }
    if (event_time != Py_None && (put_byte(buf, 0x28) < 0 || put_varint(buf, event_time_ms) < 0)) {
        return -1;
    }
    if (key != Py_None && (put_byte(buf, 0x30) < 0 || put_byte(buf, key_b64 ? 0x01 : 0x00) < 0)) {
        return -1;
    }
    if (ordering_key != Py_None
            && put_field(buf, 0x3A, PyBytes_AS_STRING(ordering_key), PyBytes_GET_SIZE(ordering_key)) < 0) {
        return -1;
    }
    if (put_byte(buf, 0x40) < 0 || put_varint(buf, sequence_id) < 0) {
        return -1;
    }
    if (null_value && (put_byte(buf, 0x48) < 0 || put_byte(buf, 0x01) < 0)) {
        return -1;
    }
    if (null_key && (put_byte(buf, 0x50) < 0 || put_byte(buf, 0x01) < 0)) {
        return -1;
    }
    Py_ssize_t metadata_size = buf->size - start;
    if (metadata_size > 0xFFFFFFFFLL) {
        buf->size = size_at;
        return 0;
    }
    unsigned char *size_bytes = (unsigned char *)buf->data + size_at;
    size_bytes[0] = (unsigned char)(metadata_size >> 24);
    size_bytes[1] = (unsigned char)(metadata_size >> 16);
    size_bytes[2] = (unsigned char)(metadata_size >> 8);
    size_bytes[3] = (unsigned char)metadata_size;
    return put_bytes(buf, PyBytes_AS_STRING(payload), payload_size) < 0 ? -1 : 1;
}

static PyObject *encode_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_CheckExact(args[1])) {
        Py_RETURN_NONE;
    }
    PyObject *messages = PySequence_Fast(args[0], "messages must be a sequence");
    if (messages == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *sequence_ids = args[1];
    Py_ssize_t count = PySequence_Fast_GET_SIZE(messages);
    if (message_type == NULL || count != PyList_GET_SIZE(sequence_ids)) {
        Py_DECREF(messages);
        Py_RETURN_NONE;
    }
    Buffer buf = {NULL, 0, 0};
    PyObject *result = NULL;
    int taken = 1;
    for (Py_ssize_t i = 0; i < count && taken == 1; i++) {
        taken = encode_one(&buf, PySequence_Fast_GET_ITEM(messages, i), PyList_GET_ITEM(sequence_ids, i));
    }
    if (taken == 1) {
        result = PyBytes_FromStringAndSize(buf.data ? buf.data : "", buf.size);
    } else if (taken == 0) {
        result = Py_NewRef(Py_None);
    } else {
        PyErr_NoMemory();
    }
    PyMem_Free(buf.data);
    Py_DECREF(messages);
    return result;
}

static PyObject *set_message_type(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "set_message_type takes the Message class and its default properties");
        return NULL;
    }
    Py_XSETREF(message_type, Py_NewRef(args[0]));
    Py_XSETREF(empty_properties, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"encode_batch", (PyCFunction)(void (*)(void))encode_batch, METH_FASTCALL,
     "batch.py's encode_batch(messages, sequence_ids), or None for what the Python encoder must decide."},
    {"set_message_type", (PyCFunction)(void (*)(void))set_message_type, METH_FASTCALL,
     "The Message class whose instances are encoded here, and its default (empty) properties."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_batch_encoder", "Batch payloads, natively (see batch.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__batch_encoder(void) { return PyModule_Create(&module); }
