/*
 * broker/entry_format/_common_entry.c: the fast path's reading of a common stored entry, natively.
 *
 * Role: every read of an entry the broker wrote (a dispatch, a WebSocket reader, a range read)
 * first asks codec.py's ``_common_batch`` whether the entry is of the common kind: a broker
 * prefix (broker timestamp and index), a verified CRC32C, and a ``MessageMetadata`` with only the
 * fields Magnetar's producers and Pulsar's clients set without batching' extras, uncompressed.
 * In Python that check reads a dozen varints and tags one bytecode at a time, a large share of a
 * one-message entry's read. ``common_batch(data)`` does the same here.
 *
 * Invariants: for every bytes object, ``common_batch`` returns exactly what the Python
 * ``_common_batch`` returns, a tuple ``(payload start, message count, first offset, sequence id,
 * delivery time or None, lone fields or None)`` where the lone fields are ``(partition key or
 * None, event time or None, ordering key or None, key is base64)``, or None for every entry the
 * Python code would refuse or leave to the general decoder (property-tested against it, with
 * corruption). Varints follow wire.py's reader: at most ten bytes, at most 64 bits. The checksum
 * is the ``crc32c`` package's, called once per entry over a view of the entry's bytes. Nothing
 * is raised but MemoryError.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define MAGIC_BROKER_ENTRY_METADATA 0x0E02
#define MAGIC_CRC32C 0x0E01
#define CHECKSUM_HEADER_BYTES 10
#define INT32_MAX_VALUE 2147483647ULL

static PyObject *crc32c_function = NULL;

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* The varint at *pos (bounded by n): 0 and the value with *pos past it, or -1 for one that runs
 * past n, is longer than ten bytes or wider than 64 bits (wire.py's reader raises for those). */
static int read_varint(const unsigned char *p, Py_ssize_t n, Py_ssize_t *pos, uint64_t *out) {
    uint64_t value = 0;
    int shift = 0;
    Py_ssize_t i = *pos;
    while (i < n && shift <= 63) {
        unsigned char b = p[i++];
        if (shift == 63 && (b & 0x7F) > 1) {
            return -1;
        }
        value |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *pos = i;
            *out = value;
            return 0;
        }
        shift += 7;
    }
    return -1;
}

/* 1 when the CRC32C of p[0:n] is ``expected``, 0 when not, -1 on an error (raised). */
static int checksum_matches(const unsigned char *p, Py_ssize_t n, uint32_t expected) {
    PyObject *view = PyMemoryView_FromMemory((char *)p, n, PyBUF_READ);
    if (view == NULL) {
        return -1;
    }
    PyObject *result = PyObject_CallOneArg(crc32c_function, view);
    Py_DECREF(view);
    if (result == NULL) {
        return -1;
    }
    unsigned long value = PyLong_AsUnsignedLong(result);
    Py_DECREF(result);
    if (value == (unsigned long)-1 && PyErr_Occurred()) {
        return -1;
    }
    return value == expected;
}

static PyObject *common_batch(PyObject *self, PyObject *data) {
    if (crc32c_function == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_common_entry: the crc32c package could not be imported");
        return NULL;
    }
    if (!PyBytes_CheckExact(data)) {
        PyErr_SetString(PyExc_TypeError, "common_batch takes a bytes object");
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    PyObject *producer = NULL, *key = NULL, *ordering_key = NULL, *result = NULL;

    /* the broker prefix: broker timestamp (1) and index (2), nothing else */
    if (n < 6 || p[0] != 0x0E || p[1] != 0x02) {
        Py_RETURN_NONE;
    }
    Py_ssize_t end = 6 + (Py_ssize_t)be32(p + 2);
    if (end > n) {
        Py_RETURN_NONE;
    }
    Py_ssize_t pos = 6;
    int have_timestamp = 0, have_index = 0;
    uint64_t index = 0, value = 0;
    while (pos < end) {
        unsigned char tag = p[pos++];
        if (tag != 0x08 && tag != 0x10) {
            Py_RETURN_NONE;
        }
        if (read_varint(p, n, &pos, &value) < 0) {
            Py_RETURN_NONE;
        }
        if (tag == 0x08) {
            have_timestamp = 1;
        } else {
            have_index = 1;
            index = value;
        }
    }
    if (pos != end || !have_timestamp || !have_index) {
        Py_RETURN_NONE;
    }

    /* the checksum header and the MessageMetadata */
    Py_ssize_t start = end;
    if (n - start < CHECKSUM_HEADER_BYTES) {
        Py_RETURN_NONE;
    }
    if ((((uint32_t)p[start] << 8) | p[start + 1]) != MAGIC_CRC32C) {
        Py_RETURN_NONE;
    }
    int matches = checksum_matches(p + start + 6, n - start - 6, be32(p + start + 2));
    if (matches < 0) {
        return NULL;
    }
    if (!matches) {
        Py_RETURN_NONE;
    }
    pos = start + CHECKSUM_HEADER_BYTES;
    uint64_t metadata_size = be32(p + start + 6);
    if (metadata_size > (uint64_t)(n - pos)) {
        Py_RETURN_NONE;
    }
    Py_ssize_t payload_start = pos + (Py_ssize_t)metadata_size;
    int have_sequence = 0, have_publish = 0, have_count = 0, have_deliver = 0, have_event = 0, key_b64 = 0;
    uint64_t sequence_id = 0, count = 0, deliver_at = 0, event_time = 0, length = 0;
    while (pos < payload_start) {
        unsigned char tag = p[pos];
        if (tag == 0x0A || tag == 0x32) { /* producer_name (1), partition_key (6): UTF-8 strings */
            pos += 1;
            if (read_varint(p, n, &pos, &length) < 0 || length > (uint64_t)(payload_start - pos)) {
                goto refuse;
            }
            PyObject *text = PyUnicode_DecodeUTF8((const char *)p + pos, (Py_ssize_t)length, NULL);
            if (text == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                    goto fail;
                }
                PyErr_Clear();
                goto refuse;
            }
            if (tag == 0x0A) {
                Py_XSETREF(producer, text);
            } else {
                Py_XSETREF(key, text);
            }
            pos += (Py_ssize_t)length;
        } else if (tag == 0x10 || tag == 0x18 || tag == 0x58 || tag == 0x40 || tag == 0x48 || tag == 0x60) {
            pos += 1;
            if (read_varint(p, n, &pos, &value) < 0) {
                goto refuse;
            }
            switch (tag) {
            case 0x10: sequence_id = value; have_sequence = 1; break;
            case 0x18: have_publish = 1; break;
            case 0x58: count = value; have_count = 1; break;
            case 0x40:
                if (value != 0) {
                    goto refuse; /* compressed: decode_entry decompresses */
                }
                break;
            case 0x60: event_time = value; have_event = 1; break;
            default: break; /* uncompressed_size */
            }
        } else if (tag == 0x82 || tag == 0x92 || tag == 0x88 || tag == 0xC0 || tag == 0x98) {
            /* fields 16-19 and 24: a two-byte tag */
            if (pos + 1 >= n || p[pos + 1] != 0x01) {
                goto refuse;
            }
            pos += 2;
            if (read_varint(p, n, &pos, &value) < 0) {
                goto refuse;
            }
            if (tag == 0x82 || tag == 0x92) { /* schema_version, ordering_key: bytes */
                if (value > (uint64_t)(payload_start - pos)) {
                    goto refuse;
                }
                if (tag == 0x92) {
                    PyObject *bytes = PyBytes_FromStringAndSize((const char *)p + pos, (Py_ssize_t)value);
                    if (bytes == NULL) {
                        goto fail;
                    }
                    Py_XSETREF(ordering_key, bytes);
                }
                pos += (Py_ssize_t)value;
            } else if (tag == 0x88) {
                key_b64 = value != 0;
            } else if (tag == 0x98) {
                deliver_at = value;
                have_deliver = 1;
            }
        } else {
            goto refuse; /* properties, encryption, chunks, transactions, markers, replication */
        }
    }
    int lone = !have_count;
    if (lone) {
        count = 1;
    }
    if (pos != payload_start || producer == NULL || !have_sequence || !have_publish || count == 0 ||
        count > INT32_MAX_VALUE || index < count - 1) {
        goto refuse;
    }
    PyObject *lone_fields;
    if (lone) {
        PyObject *event = have_event ? PyLong_FromUnsignedLongLong(event_time) : Py_NewRef(Py_None);
        if (event == NULL) {
            goto fail;
        }
        lone_fields = PyTuple_Pack(4, key != NULL ? key : Py_None, event,
                                   ordering_key != NULL ? ordering_key : Py_None, key_b64 ? Py_True : Py_False);
        Py_DECREF(event);
    } else {
        lone_fields = Py_NewRef(Py_None);
    }
    if (lone_fields == NULL) {
        goto fail;
    }
    PyObject *deliver;
    if (have_deliver) {
        deliver = PyLong_FromLongLong((long long)deliver_at); /* int64: two's complement, as wire.py */
        if (deliver == NULL) {
            Py_DECREF(lone_fields);
            goto fail;
        }
    } else {
        deliver = Py_NewRef(Py_None);
    }
    result = Py_BuildValue("(nKKKNN)", payload_start, (unsigned long long)count,
                           (unsigned long long)(index - (count - 1)), (unsigned long long)sequence_id, deliver,
                           lone_fields);
    Py_XDECREF(producer);
    Py_XDECREF(key);
    Py_XDECREF(ordering_key);
    return result;

refuse:
    Py_XDECREF(producer);
    Py_XDECREF(key);
    Py_XDECREF(ordering_key);
    Py_RETURN_NONE;

fail:
    Py_XDECREF(producer);
    Py_XDECREF(key);
    Py_XDECREF(ordering_key);
    return NULL;
}

static PyMethodDef methods[] = {
    {"common_batch", common_batch, METH_O,
     "codec._common_batch of a bytes object: the common entry's fields, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_common_entry", "The fast path's reading of a common stored entry (see codec.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__common_entry(void) {
    PyObject *crc = PyImport_ImportModule("crc32c");
    if (crc == NULL) {
        return NULL;
    }
    crc32c_function = PyObject_GetAttrString(crc, "crc32c");
    Py_DECREF(crc);
    if (crc32c_function == NULL) {
        return NULL;
    }
    return PyModule_Create(&module);
}
