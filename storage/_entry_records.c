/*
 * storage/_entry_records.c: the optional native reader of an entry log's records (entry_log.py).
 *
 * Role: a read of an entry from an entry log reads ahead the records of the same ledger that
 * follow it in the log (one pread), and checks each one's CRC32C before handing it out. In
 * Python that costs a struct unpack, two crc32c calls, a pack and a copy per record, a large
 * share of a sequential read of small entries. ``parse_records`` does the same walk here.
 *
 * Invariants: ``parse_records(chunk, pos, ledger_id, limit)`` returns exactly what
 * ``EntryLogger._parse_ahead`` returns for the same arguments within the ranges entry_log.py
 * passes (a position >= 0, a ledger id of 64 bits, a limit below 2^63; others raise), property-
 * tested against it, with corruption: the records ``[size u32][ledger u64][entry u64][crc32c u32][data]`` (big-endian)
 * from ``pos`` on, as ``(entry id, data)``, at most ``limit`` of them, stopping before the
 * first record that is cut short by the chunk's end, belongs to another ledger, or whose CRC
 * (over ledger, entry and data) does not match. The CRC is CRC32C (the ``crc32c`` package's):
 * computed by ``_crc32c.h``.
 *
 * Bounds: every record header and body is checked against the chunk's end before it is read;
 * the result holds at most ``limit`` records, each a copy of its data.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_crc32c.h"

#define RECORD_HEADER_BYTES 24 /* size u32, ledger u64, entry u64, crc u32 */
#define IDS_BYTES 16

static uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static uint64_t be64(const uint8_t *p) {
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

/* parse_records(chunk, pos, ledger_id, limit): EntryLogger._parse_ahead. */
static PyObject *parse_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "parse_records takes a bytes chunk, a position, a ledger id and a limit");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred()) {
        return NULL;
    }
    unsigned long long ledger_id = PyLong_AsUnsignedLongLong(args[2]);
    if (ledger_id == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[3]);
    if (limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (pos < 0) {
        PyErr_SetString(PyExc_ValueError, "parse_records: the position must not be negative");
        return NULL;
    }
    const uint8_t *chunk = (const uint8_t *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t length = PyBytes_GET_SIZE(args[0]);
    PyObject *records = PyList_New(0);
    if (records == NULL) {
        return NULL;
    }
    while (PyList_GET_SIZE(records) < limit && pos <= length - RECORD_HEADER_BYTES) {
        const uint8_t *header = chunk + pos;
        uint32_t size = be32(header);
        uint64_t record_ledger = be64(header + 4);
        uint64_t record_entry = be64(header + 12);
        uint32_t crc = be32(header + 20);
        if (record_ledger != ledger_id || (Py_ssize_t)size > length - pos - RECORD_HEADER_BYTES) {
            break;
        }
        const uint8_t *data = header + RECORD_HEADER_BYTES;
        uint32_t ids_crc, record_crc;
        if (crc32c_of(0, header + 4, IDS_BYTES, &ids_crc) < 0 || crc32c_of(ids_crc, data, size, &record_crc) < 0) {
            Py_DECREF(records);
            return NULL;
        }
        if (record_crc != crc) {
            break;
        }
        PyObject *record = Py_BuildValue("(Ky#)", (unsigned long long)record_entry, (const char *)data,
                                         (Py_ssize_t)size);
        if (record == NULL || PyList_Append(records, record) < 0) {
            Py_XDECREF(record);
            Py_DECREF(records);
            return NULL;
        }
        Py_DECREF(record);
        pos += RECORD_HEADER_BYTES + (Py_ssize_t)size;
    }
    return records;
}

static PyObject *crc_instruction_used(PyObject *self, PyObject *Py_UNUSED(ignored)) {
    return PyBool_FromLong(crc32c_instruction_used);
}

/* use_crc_instruction(flag): turn the instruction off (or back on where the processor has it),
 * so the path through the crc32c package is tested on machines that have the instruction. */
static PyObject *use_crc_instruction(PyObject *self, PyObject *flag) {
    int wanted = PyObject_IsTrue(flag);
    if (wanted < 0) {
        return NULL;
    }
    return PyBool_FromLong(crc32c_use_instruction(wanted));
}

static PyMethodDef methods[] = {
    {"parse_records", (PyCFunction)(void (*)(void))parse_records, METH_FASTCALL,
     "EntryLogger._parse_ahead: the verified records of one ledger from a position of a chunk, as (entry id, data)."},
    {"use_crc_instruction", use_crc_instruction, METH_O,
     "Use the SSE 4.2 instruction for CRC32C when the processor has it (False: the crc32c package); whether it is."},
    {"crc_instruction_used", crc_instruction_used, METH_NOARGS,
     "Whether CRC32C is computed with the processor's SSE 4.2 instruction (else through the crc32c package)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_entry_records", "The entry log's records, read natively (see entry_log.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__entry_records(void) {
    if (crc32c_init() < 0) {
        return NULL;
    }
    return PyModule_Create(&module);
}
