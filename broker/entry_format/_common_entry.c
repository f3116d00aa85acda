/*
 * broker/entry_format/_common_entry.c: the fast path's reading of a common stored entry, natively.
 *
 * Role: every read of an entry the broker wrote (a dispatch, a WebSocket reader, a range read)
 * first asks common_entry.py's ``common_batch`` whether the entry is of the common kind: a
 * broker prefix (broker timestamp and index), a verified CRC32C, and an uncompressed
 * ``MessageMetadata`` with only the fields Magnetar's producers and Pulsar's clients set. In
 * Python that check reads a dozen varints and tags one bytecode at a time, a large share of a
 * one-message entry's read. ``common_batch(data)`` does the same here, and
 * ``common_metadata(data, start)`` what ``_parse_common_metadata`` does for the checksum and
 * metadata alone (``common_client_entry``: an entry as a Pulsar client sends it).
 * ``stored_entries`` makes a range read's entries (``managed_ledger_reads._read_run``'s loop),
 * and the capsule ``_C_API`` (``_common_entry_api.h``) gives ``_range_columns.c`` the check of
 * ``common_batch`` without its tuple.
 *
 * Invariants: for every bytes object, ``common_batch`` returns exactly what the Python
 * ``common_batch`` returns, a tuple ``(payload start, message count, first offset, sequence id,
 * delivery time or None, lone fields or None)`` where the lone fields are ``(partition key or
 * None, event time or None, ordering key or None, key is base64)``, or None for every entry the
 * Python code would refuse or leave to the general decoder (property-tested against it, with
 * corruption); likewise ``common_metadata`` and ``_python_parse_common_metadata``. Varints
 * follow wire.py's reader: at most ten bytes, at most 64 bits. The checksum is CRC32C as the
 * ``crc32c`` package computes it (``storage/_crc32c.h``: the SSE 4.2 instruction where the
 * processor has it, else that package over a view of the entry's bytes). Nothing is raised but
 * MemoryError.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "_common_entry_api.h"
#include "_crc32c.h"
#include "_utf8.h"
#include "_wire.h"

#define MAGIC_BROKER_ENTRY_METADATA 0x0E02
#define MAGIC_CRC32C 0x0E01
#define CHECKSUM_HEADER_BYTES 10
#define INT32_MAX_VALUE 2147483647ULL

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* 1 when the CRC32C of p[0:n] is ``expected``, 0 when not, -1 on an error (raised). */
static int checksum_matches(const unsigned char *p, Py_ssize_t n, uint32_t expected) {
    uint32_t crc;
    if (crc32c_of(0, p, n, &crc) < 0) {
        return -1;
    }
    return crc == expected;
}

/* A common MessageMetadata, as common_entry.py's ``_parse_common_metadata`` reads it. */
typedef struct {
    Py_ssize_t payload_start;
    uint64_t count, sequence_id, deliver_at, event_time;
    int lone, have_deliver, have_event, key_b64, have_producer;
    PyObject *producer, *key, *ordering_key; /* owned; key and ordering key may be NULL (all NULL without texts) */
} Metadata;

static void metadata_clear(Metadata *m) {
    Py_CLEAR(m->producer);
    Py_CLEAR(m->key);
    Py_CLEAR(m->ordering_key);
}

/* The checksum header at ``start`` and the MessageMetadata after it: 1 when they are of the
 * common kind (``m`` filled), 0 when not (``m`` holds nothing), -1 on an error (raised). With
 * ``texts`` 0, the producer name, partition key and ordering key are checked (strict UTF-8, as
 * decoding them would) but not made: ``m`` then holds no object, and the answer is the same. */
static int parse_metadata(const unsigned char *p, Py_ssize_t n, Py_ssize_t start, Metadata *m, int texts) {
    memset(m, 0, sizeof(*m));
    if (start < 0 || n - start < CHECKSUM_HEADER_BYTES) {
        return 0;
    }
    if ((((uint32_t)p[start] << 8) | p[start + 1]) != MAGIC_CRC32C) {
        return 0;
    }
    int matches = checksum_matches(p + start + 6, n - start - 6, be32(p + start + 2));
    if (matches <= 0) {
        return matches;
    }
    Py_ssize_t pos = start + CHECKSUM_HEADER_BYTES;
    uint64_t metadata_size = be32(p + start + 6);
    if (metadata_size > (uint64_t)(n - pos)) {
        return 0;
    }
    Py_ssize_t payload_start = pos + (Py_ssize_t)metadata_size;
    int have_sequence = 0, have_publish = 0, have_count = 0;
    uint64_t value = 0, length = 0;
    while (pos < payload_start) {
        unsigned char tag = p[pos];
        if (tag == 0x0A || tag == 0x32) { /* producer_name (1), partition_key (6): UTF-8 strings */
            pos += 1;
            if (!wire_read_varint(p, n, &pos, &length) || length > (uint64_t)(payload_start - pos)) {
                goto refuse;
            }
            if (!texts) {
                if (!utf8_valid(p + pos, (Py_ssize_t)length)) {
                    goto refuse;
                }
            } else {
                PyObject *text = PyUnicode_DecodeUTF8((const char *)p + pos, (Py_ssize_t)length, NULL);
                if (text == NULL) {
                    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                        goto fail;
                    }
                    PyErr_Clear();
                    goto refuse;
                }
                if (tag == 0x0A) {
                    Py_XSETREF(m->producer, text);
                } else {
                    Py_XSETREF(m->key, text);
                }
            }
            m->have_producer |= tag == 0x0A;
            pos += (Py_ssize_t)length;
        } else if (tag == 0x10 || tag == 0x18 || tag == 0x58 || tag == 0x40 || tag == 0x48 || tag == 0x60) {
            pos += 1;
            if (!wire_read_varint(p, n, &pos, &value)) {
                goto refuse;
            }
            switch (tag) {
            case 0x10: m->sequence_id = value; have_sequence = 1; break;
            case 0x18: have_publish = 1; break;
            case 0x58: m->count = value; have_count = 1; break;
            case 0x40:
                if (value != 0) {
                    goto refuse; /* compressed: decode_entry decompresses */
                }
                break;
            case 0x60: m->event_time = value; m->have_event = 1; break;
            default: break; /* uncompressed_size */
            }
        } else if (tag == 0x82 || tag == 0x92 || tag == 0x88 || tag == 0xC0 || tag == 0x98) {
            /* fields 16-19 and 24: a two-byte tag */
            if (pos + 1 >= n || p[pos + 1] != 0x01) {
                goto refuse;
            }
            pos += 2;
            if (!wire_read_varint(p, n, &pos, &value)) {
                goto refuse;
            }
            if (tag == 0x82 || tag == 0x92) { /* schema_version, ordering_key: bytes */
                if (value > (uint64_t)(payload_start - pos)) {
                    goto refuse;
                }
                if (tag == 0x92 && texts) {
                    PyObject *bytes = PyBytes_FromStringAndSize((const char *)p + pos, (Py_ssize_t)value);
                    if (bytes == NULL) {
                        goto fail;
                    }
                    Py_XSETREF(m->ordering_key, bytes);
                }
                pos += (Py_ssize_t)value;
            } else if (tag == 0x88) {
                m->key_b64 = value != 0;
            } else if (tag == 0x98) {
                m->deliver_at = value;
                m->have_deliver = 1;
            }
        } else {
            goto refuse; /* properties, encryption, chunks, transactions, markers, replication */
        }
    }
    m->lone = !have_count;
    if (m->lone) {
        m->count = 1;
    }
    if (pos != payload_start || !m->have_producer || !have_sequence || !have_publish || m->count == 0 ||
        m->count > INT32_MAX_VALUE) {
        goto refuse;
    }
    m->payload_start = payload_start;
    return 1;

refuse:
    metadata_clear(m);
    return 0;

fail:
    metadata_clear(m);
    return -1;
}

/* (delivery time or None, lone fields or None) as new references, or -1 on an error. */
static int metadata_extras(const Metadata *m, PyObject **deliver, PyObject **lone) {
    if (m->lone) {
        PyObject *event = m->have_event ? PyLong_FromUnsignedLongLong(m->event_time) : Py_NewRef(Py_None);
        if (event == NULL) {
            return -1;
        }
        *lone = PyTuple_Pack(4, m->key != NULL ? m->key : Py_None, event,
                             m->ordering_key != NULL ? m->ordering_key : Py_None, m->key_b64 ? Py_True : Py_False);
        Py_DECREF(event);
    } else {
        *lone = Py_NewRef(Py_None);
    }
    if (*lone == NULL) {
        return -1;
    }
    /* int64 on the wire: two's complement, as wire.py reads it */
    *deliver = m->have_deliver ? PyLong_FromLongLong((long long)m->deliver_at) : Py_NewRef(Py_None);
    if (*deliver == NULL) {
        Py_CLEAR(*lone);
        return -1;
    }
    return 0;
}

/* parse_metadata, with the delivery time and lone fields built when it is of the common kind
 * (both new references, and ``m`` to clear). */
static int parse_with_extras(const unsigned char *p, Py_ssize_t n, Py_ssize_t start, Metadata *m,
                             PyObject **deliver, PyObject **lone) {
    int parsed = parse_metadata(p, n, start, m, 1);
    if (parsed > 0 && metadata_extras(m, deliver, lone) < 0) {
        metadata_clear(m);
        return -1;
    }
    return parsed;
}

static int ready(PyObject *data) { /* crc32c_init ran: the module does not load without it */
    if (!PyBytes_CheckExact(data)) {
        PyErr_SetString(PyExc_TypeError, "_common_entry takes a bytes object");
        return 0;
    }
    return 1;
}

/* common_metadata(data, start): common_entry._parse_common_metadata. */
static PyObject *common_metadata(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "common_metadata takes a bytes object and a position");
        return NULL;
    }
    if (!ready(args[0])) {
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Metadata m;
    PyObject *deliver, *lone;
    int parsed = parse_with_extras((const unsigned char *)PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]),
                                   start, &m, &deliver, &lone);
    if (parsed <= 0) {
        return parsed < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *result = Py_BuildValue("(nKKNNO)", m.payload_start, (unsigned long long)m.count,
                                     (unsigned long long)m.sequence_id, deliver, lone, m.producer);
    metadata_clear(&m);
    return result;
}

/* The usual broker prefix: 0x0E02, its size, then broker timestamp (field 1) and index (field 2),
 * each once or more (the last wins), nothing else. The offset after it, or -1 for any other
 * bytes (then the Python parser says whether and how they are malformed). */
static Py_ssize_t parse_broker_prefix(const unsigned char *p, Py_ssize_t n, uint64_t *timestamp, uint64_t *index) {
    if (n < 6 || (((uint32_t)p[0] << 8) | p[1]) != MAGIC_BROKER_ENTRY_METADATA) {
        return -1;
    }
    Py_ssize_t end = 6 + (Py_ssize_t)be32(p + 2);
    if (end > n) {
        return -1;
    }
    Py_ssize_t pos = 6;
    int have_timestamp = 0, have_index = 0;
    uint64_t value = 0;
    while (pos < end) {
        unsigned char tag = p[pos++];
        if (tag != 0x08 && tag != 0x10) {
            return -1;
        }
        if (!wire_read_varint(p, n, &pos, &value)) {
            return -1;
        }
        if (tag == 0x08) {
            have_timestamp = 1;
            *timestamp = value;
        } else {
            have_index = 1;
            *index = value;
        }
    }
    return pos == end && have_timestamp && have_index ? end : -1;
}

/* broker_prefix(data): broker_metadata.split_prefix's usual case, (broker timestamp, index, offset
 * of the 0x0E01 part), or None. */
static PyObject *broker_prefix(PyObject *self, PyObject *data) {
    if (!ready(data)) {
        return NULL;
    }
    uint64_t timestamp, index;
    Py_ssize_t end = parse_broker_prefix((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data),
                                         &timestamp, &index);
    if (end < 0) {
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(KKn)", (unsigned long long)timestamp, (unsigned long long)index, end);
}

/* One slot of a slotted object set through its member descriptor; -1 on an error (raised). */
static int set_slot(PyObject *descriptor, PyObject *object, PyObject *value) {
    int failed = Py_TYPE(descriptor)->tp_descr_set(descriptor, object, value);
    Py_DECREF(value);
    return failed;
}

/* The member descriptor of a slot of ``type`` (a new reference), or NULL with TypeError. */
static PyObject *slot_descriptor(PyObject *type, const char *name) {
    PyObject *descriptor = PyObject_GetAttrString(type, name);
    if (descriptor != NULL && !Py_IS_TYPE(descriptor, &PyMemberDescr_Type)) {
        Py_DECREF(descriptor);
        PyErr_Format(PyExc_TypeError, "%s is not a slot", name);
        return NULL;
    }
    return descriptor;
}

/* stored_entries(payloads, ledger_id, first_entry_id, first_offset, entry_type, position_type):
 * managed_ledger_reads._read_run's loop: for consecutive stored entries of one ledger, each
 * ``entry_type(position_type(ledger_id, entry_id), data, first offset, index, broker timestamp)``
 * (entry_type a 5-field tuple type; position_type slotted, built as Position.of_stored does);
 * each entry's first offset is the one before's index + 1. Stops before the first payload that
 * is not bytes or has not the usual prefix (the Python loop reads it, or says how it is
 * malformed), so the list may be shorter than ``payloads``. */
static PyObject *stored_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyList_Check(args[0]) || !PyType_Check(args[4]) || !PyType_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError,
                        "stored_entries(payloads: list, ledger_id, first_entry_id, first_offset, entry_type, position_type)");
        return NULL;
    }
    PyObject *payloads = args[0];
    PyTypeObject *entry_type = (PyTypeObject *)args[4], *position_type = (PyTypeObject *)args[5];
    if (!PyType_IsSubtype(entry_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "entry_type must be a tuple type");
        return NULL;
    }
    long long ledger_id = PyLong_AsLongLong(args[1]);
    long long entry_id = PyLong_AsLongLong(args[2]);
    long long first_offset = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    PyObject *ledger_slot = slot_descriptor(args[5], "ledger_id");
    PyObject *entry_slot = ledger_slot == NULL ? NULL : slot_descriptor(args[5], "entry_id");
    PyObject *ledger = entry_slot == NULL ? NULL : PyLong_FromLongLong(ledger_id);
    PyObject *result = ledger == NULL ? NULL : PyList_New(0);
    if (result == NULL) {
        goto failed;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(payloads); i++, entry_id++) {
        PyObject *data = PyList_GET_ITEM(payloads, i);
        uint64_t timestamp, index;
        if (!PyBytes_CheckExact(data) ||
            parse_broker_prefix((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), &timestamp,
                                &index) < 0 ||
            index >= (uint64_t)LLONG_MAX) {
            break;
        }
        Py_INCREF(data); /* held from here: an allocation below may run a collection, and other code */
        PyObject *position = position_type->tp_alloc(position_type, 0);
        if (position == NULL) {
            Py_DECREF(data);
            goto failed;
        }
        PyObject *entry_number = PyLong_FromLongLong(entry_id); /* both slots set before the next object */
        if (entry_number == NULL || set_slot(ledger_slot, position, Py_NewRef(ledger)) < 0) {
            Py_XDECREF(entry_number);
            Py_DECREF(position);
            Py_DECREF(data);
            goto failed;
        }
        if (set_slot(entry_slot, position, entry_number) < 0) { /* set_slot takes the reference it is given */
            Py_DECREF(position);
            Py_DECREF(data);
            goto failed;
        }
        PyObject *entry = entry_type->tp_alloc(entry_type, 5);
        if (entry == NULL) {
            Py_DECREF(position);
            Py_DECREF(data);
            goto failed;
        }
        PyTuple_SET_ITEM(entry, 0, position); /* the entry owns what is set in it from here on */
        PyTuple_SET_ITEM(entry, 1, data);
        PyObject *first = PyLong_FromLongLong(first_offset);
        PyObject *last = first == NULL ? NULL : PyLong_FromUnsignedLongLong(index);
        PyObject *time = last == NULL ? NULL : PyLong_FromUnsignedLongLong(timestamp);
        PyTuple_SET_ITEM(entry, 2, first);
        PyTuple_SET_ITEM(entry, 3, last);
        PyTuple_SET_ITEM(entry, 4, time);
        if (time == NULL || PyList_Append(result, entry) < 0) {
            Py_DECREF(entry);
            goto failed;
        }
        Py_DECREF(entry);
        first_offset = (long long)index + 1;
    }
    Py_DECREF(ledger_slot);
    Py_DECREF(entry_slot);
    Py_DECREF(ledger);
    return result;
failed:
    Py_XDECREF(ledger_slot);
    Py_XDECREF(entry_slot);
    Py_XDECREF(ledger);
    Py_XDECREF(result);
    return NULL;
}

/* CommonEntryApi.common_batch_shape (``_common_entry_api.h``): common_batch's answer for a
 * batch, without its tuple. */
static int common_batch_shape(const unsigned char *p, Py_ssize_t n, Py_ssize_t *payload_start, uint64_t *count) {
    uint64_t timestamp, index;
    Py_ssize_t end = parse_broker_prefix(p, n, &timestamp, &index);
    if (end < 0) {
        return 0;
    }
    Metadata m;
    int parsed = parse_metadata(p, n, end, &m, 0);
    if (parsed <= 0) {
        return parsed;
    }
    if (m.lone || index < m.count - 1) { /* a lone message, or more messages than offsets up to the index */
        return 0;
    }
    *payload_start = m.payload_start;
    *count = m.count;
    return 1;
}

static const CommonEntryApi common_entry_api = {common_batch_shape};

/* common_batch(data): common_entry.common_batch. */
static PyObject *common_batch(PyObject *self, PyObject *data) {
    if (!ready(data)) {
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data);

    uint64_t timestamp, index;
    Py_ssize_t end = parse_broker_prefix(p, n, &timestamp, &index);
    if (end < 0) {
        Py_RETURN_NONE;
    }

    Metadata m;
    PyObject *deliver, *lone;
    int parsed = parse_with_extras(p, n, end, &m, &deliver, &lone);
    if (parsed <= 0) {
        return parsed < 0 ? NULL : Py_NewRef(Py_None);
    }
    if (index < m.count - 1) { /* more messages than offsets up to the index */
        Py_DECREF(deliver);
        Py_DECREF(lone);
        metadata_clear(&m);
        Py_RETURN_NONE;
    }
    PyObject *result = Py_BuildValue("(nKKKNN)", m.payload_start, (unsigned long long)m.count,
                                     (unsigned long long)(index - (m.count - 1)), (unsigned long long)m.sequence_id,
                                     deliver, lone);
    metadata_clear(&m);
    return result;
}

static PyObject *use_crc_instruction(PyObject *self, PyObject *flag);

static PyMethodDef methods[] = {
    {"use_crc_instruction", use_crc_instruction, METH_O,
     "Use the SSE 4.2 instruction for CRC32C when the processor has it (False: the crc32c package); whether it is."},
    {"broker_prefix", broker_prefix, METH_O,
     "broker_metadata.split_prefix's usual case of a bytes object: (broker timestamp, index, end), or None."},
    {"stored_entries", (PyCFunction)(void (*)(void))stored_entries, METH_FASTCALL,
     "managed_ledger_reads._read_run's loop over a list of stored entries' bytes: the entries it takes."},
    {"common_batch", common_batch, METH_O,
     "common_entry.common_batch of a bytes object: the common entry's fields, or None."},
    {"common_metadata", (PyCFunction)(void (*)(void))common_metadata, METH_FASTCALL,
     "common_entry._parse_common_metadata of a bytes object at a position: the metadata's fields, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_common_entry",
    "The fast path's reading of a common stored entry (see common_entry.py).", -1, methods,
};

/* use_crc_instruction(flag): see storage/_crc32c.h. */
static PyObject *use_crc_instruction(PyObject *self, PyObject *flag) {
    int wanted = PyObject_IsTrue(flag);
    if (wanted < 0) {
        return NULL;
    }
    return PyBool_FromLong(crc32c_use_instruction(wanted));
}

PyMODINIT_FUNC PyInit__common_entry(void) {
    if (crc32c_init() < 0) {
        return NULL;
    }
    PyObject *created = PyModule_Create(&module);
    PyObject *capsule = created == NULL ? NULL : PyCapsule_New((void *)&common_entry_api, COMMON_ENTRY_API_NAME, NULL);
    if (capsule == NULL || PyModule_AddObject(created, "_C_API", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_XDECREF(created);
        return NULL;
    }
    return created;
}
