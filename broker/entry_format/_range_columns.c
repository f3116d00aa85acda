/*
 * broker/entry_format/_range_columns.c: the optional native accelerator of range reads (columns.py).
 *
 * What it does: turns the uncompressed batch payload of stored entries (Pulsar's batch format:
 * for each message [size u32 big-endian][SingleMessageMetadata][message bytes]; see
 * broker/entry_format.py) straight into the Arrow column buffers of a range read: value
 * offsets and bytes; key validity, offsets and bytes; publish and event times (int64
 * milliseconds, event times with a validity bitmap); properties as map offsets plus name and
 * value strings; each message's base64 MessageIdData; the offset column. Python wraps the
 * buffers with pyarrow.Array.from_buffers (no copy) and keeps the once-per-entry work:
 * checksum, MessageMetadata, decompression, the message-id prefix. add_entries runs
 * collect_entries' loop here; it checks each entry through _common_entry.c's capsule
 * (_common_entry_api.h: the same parser, no Python object made) when that module loads, else
 * through the common_batch callable it is given.
 *
 * Invariants:
 * - The SingleMessageMetadata parser accepts exactly what broker/entry_format.py's
 *   _decode_batch_items accepts: the same dispatch on a field's first byte (a multi-byte or
 *   unknown tag is skipped by its wire type; groups and wire types 6 and 7 are refused), the
 *   same varints (at most 10 bytes, no value above 2^64-1), the same short-property fast path
 *   and general KeyValue rules, last-wins fields, strict UTF-8 for keys and properties, every
 *   message of the batch checked (also those outside the requested window), a payload_size on
 *   every message and the batch consumed exactly. Anything else raises MalformedBatch (a
 *   ValueError; the Python wrapper raises CorruptEntry from it).
 * - Output equals the pure-Python path's. Where the reference's rules are intricate,
 *   add_batch returns False and appends nothing: a key marked base64 that is not canonical
 *   base64 (the reference decodes leniently), an event time above 2^63-1, a message with more
 *   than PROPERTIES_PER_MESSAGE_MAX distinct properties. The caller then decodes that entry in
 *   Python and appends its rows with add_row.
 * - A call that fails or falls back leaves the columns as they were before it (every buffer
 *   is cut back to its earlier length).
 * - Buffers are in the host's byte order, as pyarrow.Array.from_buffers takes them. Every call
 *   runs holding the GIL; one RangeColumns serves one read (it is not shared between threads).
 *
 * Bounds: every read of the payload is checked against the end of its field, of the message's
 * metadata or of the batch before it happens, by comparing a length with the bytes that
 * remain (never by forming a pointer past the end). Every buffer stays below 2^31 bytes
 * (Arrow's int32 offsets): growing past that raises OverflowError. Per-message scratch is a
 * fixed array of PROPERTIES_PER_MESSAGE_MAX properties; a message id is at most
 * ID_RAW_BYTES_MAX bytes before base64.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "structmember.h"

#include "_common_entry_api.h"
#include "_utf8.h"

#define BUFFER_BYTES_MIN 256
#define BITS_PER_BYTE 8
#define BUFFER_BYTES_MAX INT32_MAX /* Arrow int32 offsets */
#define PROPERTIES_PER_MESSAGE_MAX 64
#define VARINT_BYTES_MAX 10
#define MESSAGE_BYTES_MIN 6 /* [size u32] + the shortest metadata, payload_size (2 bytes) */
#define SIZE_PREFIX_BYTES 4
#define ID_PREFIX_BYTES_MAX 64
#define BATCH_INDEX_TAG 0x20 /* MessageIdData field 4 (batch_index), varint */
#define ID_RAW_BYTES_MAX (ID_PREFIX_BYTES_MAX + 1 + VARINT_BYTES_MAX)
#define ID_BASE64_BYTES_MAX (((ID_RAW_BYTES_MAX + 2) / 3) * 4)
#define VARINT_CONTINUE 0x80
#define VARINT_PAYLOAD 0x7F
#define VARINT_LAST_BYTE_MAX 1 /* the 10th byte carries bit 63 only */

/* SingleMessageMetadata fields the reference dispatches on (a field's whole first byte). */
#define TAG_PROPERTY 0x0A
#define TAG_PARTITION_KEY 0x12
#define TAG_PAYLOAD_SIZE 0x18
#define TAG_COMPACTED_OUT 0x20
#define TAG_EVENT_TIME 0x28
#define TAG_KEY_B64_ENCODED 0x30
#define TAG_ORDERING_KEY 0x3A
#define TAG_SEQUENCE_ID 0x40
#define TAG_NULL_VALUE 0x48
#define TAG_NULL_PARTITION_KEY 0x50
/* KeyValue fields (compared as decoded tag values, as the reference's general path does). */
#define TAG_KV_KEY 0x0A
#define TAG_KV_VALUE 0x12

#define WIRE_VARINT 0
#define WIRE_FIXED64 1
#define WIRE_LENGTH_DELIMITED 2
#define WIRE_FIXED32 5
#define WIRE_TYPE_MASK 7
#define FIXED64_BYTES 8
#define FIXED32_BYTES 4

/* Outcome of parsing or appending. */
#define STATUS_OK 0
#define STATUS_ERROR (-1)    /* a Python exception is set */
#define STATUS_FALLBACK (-2) /* the entry needs the Python decoder */

static PyObject *MalformedBatch;

/* ------------------------------------------------------------------------------------------
 * Growable buffers backed by bytes objects (handed to Python without a copy)
 * ---------------------------------------------------------------------------------------- */

typedef struct {
    PyObject *bytes; /* its size is the capacity; NULL until first used */
    Py_ssize_t len;
} Buffer;

/* Room for `extra` more bytes; afterwards the buffer exists (buffer_end is valid), even for 0. */
static int buffer_reserve(Buffer *b, Py_ssize_t extra) {
    Py_ssize_t capacity = b->bytes == NULL ? 0 : PyBytes_GET_SIZE(b->bytes);
    if (b->bytes != NULL && extra <= capacity - b->len) {
        return 0;
    }
    if (extra > BUFFER_BYTES_MAX - b->len) {
        PyErr_SetString(PyExc_OverflowError, "a range read column would exceed 2 GiB");
        return -1;
    }
    Py_ssize_t needed = b->len + extra;
    Py_ssize_t doubled = capacity <= BUFFER_BYTES_MAX / 2 ? capacity * 2 : BUFFER_BYTES_MAX;
    Py_ssize_t size = needed > doubled ? needed : doubled;
    if (size < BUFFER_BYTES_MIN) {
        size = BUFFER_BYTES_MIN;
    }
    if (b->bytes == NULL) {
        b->bytes = PyBytes_FromStringAndSize(NULL, size);
        return b->bytes == NULL ? -1 : 0;
    }
    if (_PyBytes_Resize(&b->bytes, size) < 0) {
        b->len = 0; /* the old object is gone */
        return -1;
    }
    return 0;
}

static inline uint8_t *buffer_end(Buffer *b) {
    return (uint8_t *)PyBytes_AS_STRING(b->bytes) + b->len;
}

static int buffer_append(Buffer *b, const void *data, Py_ssize_t size) {
    if (buffer_reserve(b, size) < 0) {
        return -1;
    }
    if (size > 0) {
        memcpy(buffer_end(b), data, (size_t)size);
        b->len += size;
    }
    return 0;
}

static int buffer_append_int32(Buffer *b, int32_t value) {
    return buffer_append(b, &value, sizeof value);
}

static int buffer_append_int64(Buffer *b, int64_t value) {
    return buffer_append(b, &value, sizeof value);
}

/* The bytes written so far as an exact-size bytes object; the buffer is left empty. */
static PyObject *buffer_take(Buffer *b) {
    if (b->bytes == NULL) {
        return PyBytes_FromStringAndSize(NULL, 0);
    }
    PyObject *out = b->bytes;
    b->bytes = NULL;
    Py_ssize_t len = b->len;
    b->len = 0;
    if (_PyBytes_Resize(&out, len) < 0) {
        return NULL;
    }
    return out;
}

/* ------------------------------------------------------------------------------------------
 * The columns
 * ---------------------------------------------------------------------------------------- */

/* Every buffer, by role; BUFFER_NAMES are the keys of finish()'s result. */
enum {
    KEY_VALIDITY,
    KEY_OFFSETS,
    KEY_DATA,
    VALUE_OFFSETS,
    VALUE_DATA,
    OFFSETS,
    ID_OFFSETS,
    ID_DATA,
    PUBLISH_TIMES_MS,
    EVENT_TIME_VALIDITY,
    EVENT_TIMES_MS,
    PROPERTY_OFFSETS,
    PROPERTY_NAME_OFFSETS,
    PROPERTY_NAME_DATA,
    PROPERTY_VALUE_OFFSETS,
    PROPERTY_VALUE_DATA,
    BUFFER_COUNT
};

static const char *const BUFFER_NAMES[BUFFER_COUNT] = {
    "key_validity",          "key_offsets",         "key_data",
    "value_offsets",         "value_data",          "offsets",
    "message_id_offsets",    "message_id_data",     "publish_times_ms",
    "event_time_validity",   "event_times_ms",      "property_offsets",
    "property_name_offsets", "property_name_data",  "property_value_offsets",
    "property_value_data",
};

/* The offset buffers of string and binary columns: they start with one 0 before any row. */
static const int OFFSET_BUFFERS[] = {KEY_OFFSETS, VALUE_OFFSETS, ID_OFFSETS, PROPERTY_OFFSETS,
                                     PROPERTY_NAME_OFFSETS, PROPERTY_VALUE_OFFSETS};

typedef struct {
    PyObject_HEAD
    long long first_offset;
    Py_ssize_t rows;
    Py_ssize_t property_count;
    Py_ssize_t key_null_count;
    Py_ssize_t event_time_null_count;
    int ready;    /* __init__ ran: the offset buffers hold their leading 0 */
    int finished; /* finish() ran, or a failed allocation lost a buffer */
    Buffer buffers[BUFFER_COUNT];
} RangeColumns;

/* Lengths and counts before an append, to undo it. */
typedef struct {
    Py_ssize_t lens[BUFFER_COUNT];
    Py_ssize_t rows;
    Py_ssize_t property_count;
    Py_ssize_t key_null_count;
    Py_ssize_t event_time_null_count;
} Mark;

static void columns_mark(const RangeColumns *c, Mark *m) {
    for (int i = 0; i < BUFFER_COUNT; i++) {
        m->lens[i] = c->buffers[i].len;
    }
    m->rows = c->rows;
    m->property_count = c->property_count;
    m->key_null_count = c->key_null_count;
    m->event_time_null_count = c->event_time_null_count;
}

static void columns_rollback(RangeColumns *c, const Mark *m) {
    for (int i = 0; i < BUFFER_COUNT; i++) {
        if (c->buffers[i].bytes == NULL && m->lens[i] > 0) {
            c->finished = 1; /* a failed resize freed it: these columns cannot be finished */
        } else if (c->buffers[i].len > m->lens[i]) {
            c->buffers[i].len = m->lens[i];
        }
    }
    c->rows = m->rows;
    c->property_count = m->property_count;
    c->key_null_count = m->key_null_count;
    c->event_time_null_count = m->event_time_null_count;
}

static int append_validity(RangeColumns *c, int which, int valid) {
    Buffer *bits = &c->buffers[which];
    Py_ssize_t byte = c->rows / BITS_PER_BYTE;
    if (byte >= bits->len) {
        uint8_t zero = 0;
        if (buffer_append(bits, &zero, 1) < 0) {
            return -1;
        }
    }
    uint8_t mask = (uint8_t)(1u << (c->rows % BITS_PER_BYTE));
    uint8_t *at = (uint8_t *)PyBytes_AS_STRING(bits->bytes) + byte;
    if (valid) {
        *at |= mask;
    } else {
        *at &= (uint8_t)~mask;
    }
    return 0;
}

/* One value of a string or binary column: its bytes, then its end offset. */
static int append_var(RangeColumns *c, int offsets, int data, const void *bytes, Py_ssize_t size) {
    if (buffer_append(&c->buffers[data], bytes, size) < 0) {
        return -1;
    }
    return buffer_append_int32(&c->buffers[offsets], (int32_t)c->buffers[data].len);
}

/* A row's end in a column whose value was written straight into the data buffer. */
static int close_var(RangeColumns *c, int offsets, int data) {
    return buffer_append_int32(&c->buffers[offsets], (int32_t)c->buffers[data].len);
}

/* ------------------------------------------------------------------------------------------
 * Text: strict UTF-8 (what bytes.decode() accepts) and base64
 * ---------------------------------------------------------------------------------------- */

static const char BASE64_ALPHABET[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
#define BASE64_PAD '='
#define BASE64_INVALID 0xFF
#define BASE64_BITS 6
#define BASE64_MASK 63
static uint8_t base64_values[256];

static void base64_init(void) {
    memset(base64_values, BASE64_INVALID, sizeof base64_values);
    for (int i = 0; i < 64; i++) {
        base64_values[(uint8_t)BASE64_ALPHABET[i]] = (uint8_t)i;
    }
}

/* Standard base64 with padding of raw[0..n) into out (room for 4 * ceil(n / 3)); the length. */
static Py_ssize_t base64_encode(const uint8_t *raw, Py_ssize_t n, uint8_t *out) {
    Py_ssize_t o = 0, i = 0;
    for (; n - i >= 3; i += 3) {
        uint32_t v = ((uint32_t)raw[i] << 16) | ((uint32_t)raw[i + 1] << 8) | raw[i + 2];
        out[o++] = (uint8_t)BASE64_ALPHABET[(v >> 18) & BASE64_MASK];
        out[o++] = (uint8_t)BASE64_ALPHABET[(v >> 12) & BASE64_MASK];
        out[o++] = (uint8_t)BASE64_ALPHABET[(v >> 6) & BASE64_MASK];
        out[o++] = (uint8_t)BASE64_ALPHABET[v & BASE64_MASK];
    }
    if (n - i > 0) {
        uint32_t v = (uint32_t)raw[i] << 16;
        if (n - i == 2) {
            v |= (uint32_t)raw[i + 1] << 8;
        }
        out[o++] = (uint8_t)BASE64_ALPHABET[(v >> 18) & BASE64_MASK];
        out[o++] = (uint8_t)BASE64_ALPHABET[(v >> 12) & BASE64_MASK];
        out[o++] = n - i == 2 ? (uint8_t)BASE64_ALPHABET[(v >> 6) & BASE64_MASK] : BASE64_PAD;
        out[o++] = BASE64_PAD;
    }
    return o;
}

/* The padding length of canonical base64 text (length a multiple of 4, alphabet characters
 * only, one or two '=' at the very end), or -1 when the text is not canonical. */
static Py_ssize_t base64_canonical_padding(const uint8_t *text, Py_ssize_t n) {
    if (n % 4 != 0) {
        return -1;
    }
    Py_ssize_t pads = 0;
    if (n > 0 && text[n - 1] == BASE64_PAD) {
        pads = text[n - 2] == BASE64_PAD ? 2 : 1;
    }
    for (Py_ssize_t i = 0; i < n - pads; i++) {
        if (base64_values[text[i]] == BASE64_INVALID) {
            return -1;
        }
    }
    return pads;
}

/* Canonical base64 (see base64_canonical_padding) decoded onto the end of a buffer. */
static int base64_decode_append(Buffer *out, const uint8_t *text, Py_ssize_t n, Py_ssize_t pads) {
    Py_ssize_t size = n / 4 * 3 - pads;
    if (buffer_reserve(out, size) < 0) {
        return -1;
    }
    uint8_t *dst = buffer_end(out);
    Py_ssize_t o = 0;
    for (Py_ssize_t i = 0; i < n; i += 4) {
        uint32_t v = 0;
        for (int k = 0; k < 4; k++) {
            uint8_t ch = text[i + k];
            v = (v << BASE64_BITS) | (ch == BASE64_PAD ? 0 : base64_values[ch]);
        }
        const uint8_t group[3] = {(uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
        for (int k = 0; k < 3 && o < size; k++) {
            dst[o++] = group[k];
        }
    }
    out->len += size;
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * SingleMessageMetadata, every read bounded by a limit
 * ---------------------------------------------------------------------------------------- */

static int malformed(const char *what, Py_ssize_t index) {
    PyErr_Format(MalformedBatch, "malformed batch payload: %s (message %zd)", what, index);
    return STATUS_ERROR;
}

/* A varint at *pos below `limit` (at most 10 bytes, no value above 2^64-1); advances *pos. */
static int read_varint(const uint8_t *buf, Py_ssize_t limit, Py_ssize_t *pos, uint64_t *out, Py_ssize_t index) {
    Py_ssize_t p = *pos;
    uint64_t value = 0;
    for (int k = 0; k < VARINT_BYTES_MAX; k++) {
        if (p >= limit) {
            return malformed("truncated varint", index);
        }
        uint8_t byte = buf[p++];
        if (k == VARINT_BYTES_MAX - 1 && byte > VARINT_LAST_BYTE_MAX) {
            return malformed("varint wider than 64 bits", index);
        }
        value |= (uint64_t)(byte & VARINT_PAYLOAD) << (7 * k);
        if (byte < VARINT_CONTINUE) {
            *pos = p;
            *out = value;
            return STATUS_OK;
        }
    }
    return malformed("varint longer than 10 bytes", index); /* not reached: the 10th byte ends it */
}

/* `length` more bytes at *pos, within `limit`. */
static int advance(Py_ssize_t limit, Py_ssize_t *pos, uint64_t length, Py_ssize_t index) {
    if (length > (uint64_t)(limit - *pos)) {
        return malformed("field runs past its SingleMessageMetadata", index);
    }
    *pos += (Py_ssize_t)length;
    return STATUS_OK;
}

/* Skip the value of a field of wire type `wire` at *pos. */
static int skip_field(const uint8_t *buf, Py_ssize_t limit, Py_ssize_t *pos, uint64_t wire, Py_ssize_t index) {
    uint64_t length;
    switch (wire) {
    case WIRE_VARINT:
        return read_varint(buf, limit, pos, &length, index);
    case WIRE_FIXED64:
        return advance(limit, pos, FIXED64_BYTES, index);
    case WIRE_FIXED32:
        return advance(limit, pos, FIXED32_BYTES, index);
    case WIRE_LENGTH_DELIMITED:
        if (read_varint(buf, limit, pos, &length, index) < 0) {
            return STATUS_ERROR;
        }
        return advance(limit, pos, length, index);
    default:
        return malformed("unsupported protobuf wire type", index);
    }
}

typedef struct {
    Py_ssize_t start;
    Py_ssize_t size;
} Span;

/* A length prefix at *pos and that many bytes after it, within `limit`. */
static int read_span(const uint8_t *buf, Py_ssize_t limit, Py_ssize_t *pos, Span *out, Py_ssize_t index) {
    uint64_t length;
    if (read_varint(buf, limit, pos, &length, index) < 0) {
        return STATUS_ERROR;
    }
    out->start = *pos;
    if (advance(limit, pos, length, index) < 0) {
        return STATUS_ERROR;
    }
    out->size = *pos - out->start;
    return STATUS_OK;
}

typedef struct {
    Span name;
    Span value;
} Property;

/* One message as the reference decodes it (spans into the payload). */
typedef struct {
    int has_key;
    int key_b64;
    Span key;
    int has_event_time;
    uint64_t event_time_ms;
    int has_payload_size;
    uint64_t payload_size;
    Span payload;
    int property_count;
    int too_many_properties;
    Property properties[PROPERTIES_PER_MESSAGE_MAX];
} Message;

static int text_or_malformed(const uint8_t *buf, Span text, Py_ssize_t index) {
    if (!utf8_valid(buf + text.start, text.size)) {
        return malformed("key or property is not valid UTF-8", index);
    }
    return STATUS_OK;
}

/* A KeyValue's name and value by the reference's general rules (_parse_key_value). */
static int parse_key_value(const uint8_t *buf, Py_ssize_t pos, Py_ssize_t stop, Property *out, Py_ssize_t index) {
    int has_name = 0, has_value = 0;
    while (pos < stop) {
        uint64_t tag;
        if (read_varint(buf, stop, &pos, &tag, index) < 0) {
            return STATUS_ERROR;
        }
        if (tag != TAG_KV_KEY && tag != TAG_KV_VALUE) {
            if (skip_field(buf, stop, &pos, tag & WIRE_TYPE_MASK, index) < 0) {
                return STATUS_ERROR;
            }
            continue;
        }
        Span text;
        if (read_span(buf, stop, &pos, &text, index) < 0 || text_or_malformed(buf, text, index) < 0) {
            return STATUS_ERROR;
        }
        if (tag == TAG_KV_KEY) {
            out->name = text;
            has_name = 1;
        } else {
            out->value = text;
            has_value = 1;
        }
    }
    if (!has_name || !has_value) {
        return malformed("malformed property (KeyValue) in SingleMessageMetadata", index);
    }
    return STATUS_OK;
}

/* A KeyValue in [pos, stop): the reference's fast path for `0a len name 12 len value` (one
 * length byte each, the value's taken as is), else the general rules. */
static int parse_property(const uint8_t *buf, Py_ssize_t pos, Py_ssize_t stop, Property *out, Py_ssize_t index) {
    if (stop - pos >= 2 && buf[pos] == TAG_KV_KEY && buf[pos + 1] < VARINT_CONTINUE) {
        Py_ssize_t split = pos + 2 + buf[pos + 1];
        if (split <= stop - 2 && buf[split] == TAG_KV_VALUE && buf[split + 1] == stop - split - 2) {
            out->name = (Span){pos + 2, split - pos - 2};
            out->value = (Span){split + 2, stop - split - 2};
            if (text_or_malformed(buf, out->name, index) < 0 || text_or_malformed(buf, out->value, index) < 0) {
                return STATUS_ERROR;
            }
            return STATUS_OK;
        }
    }
    return parse_key_value(buf, pos, stop, out, index);
}

/* Keep a property with dict semantics: a repeated name keeps its place and takes the new value. */
static void keep_property(const uint8_t *buf, Message *m, const Property *p) {
    for (int i = 0; i < m->property_count; i++) {
        Span seen = m->properties[i].name;
        if (seen.size == p->name.size && memcmp(buf + seen.start, buf + p->name.start, (size_t)seen.size) == 0) {
            m->properties[i].value = p->value;
            return;
        }
    }
    if (m->property_count == PROPERTIES_PER_MESSAGE_MAX) {
        m->too_many_properties = 1;
        return;
    }
    m->properties[m->property_count++] = *p;
}

/* partition_key, property or ordering_key at *pos (its tag byte). */
static int parse_delimited(const uint8_t *buf, Py_ssize_t end, Py_ssize_t *pos, Message *m, int keep,
                           Py_ssize_t index) {
    uint8_t tag = buf[*pos];
    Span span;
    *pos += 1;
    if (read_span(buf, end, pos, &span, index) < 0) {
        return STATUS_ERROR;
    }
    if (tag == TAG_PARTITION_KEY) {
        if (text_or_malformed(buf, span, index) < 0) {
            return STATUS_ERROR;
        }
        m->has_key = 1;
        m->key = span;
    } else if (tag == TAG_PROPERTY) {
        Property property;
        if (parse_property(buf, span.start, span.start + span.size, &property, index) < 0) {
            return STATUS_ERROR;
        }
        if (keep) {
            keep_property(buf, m, &property);
        }
    }
    return STATUS_OK;
}

/* One field at *pos, dispatched on its first byte as the reference does. */
static int parse_field(const uint8_t *buf, Py_ssize_t end, Py_ssize_t *pos, Message *m, int keep, Py_ssize_t index) {
    uint8_t tag = buf[*pos];
    uint64_t value;
    switch (tag) {
    case TAG_PARTITION_KEY:
    case TAG_PROPERTY:
    case TAG_ORDERING_KEY:
        return parse_delimited(buf, end, pos, m, keep, index);
    case TAG_PAYLOAD_SIZE:
    case TAG_EVENT_TIME:
    case TAG_KEY_B64_ENCODED:
    case TAG_SEQUENCE_ID:
    case TAG_COMPACTED_OUT:
    case TAG_NULL_VALUE:
    case TAG_NULL_PARTITION_KEY:
        *pos += 1;
        if (read_varint(buf, end, pos, &value, index) < 0) {
            return STATUS_ERROR;
        }
        break;
    default: /* unknown, or a multi-byte tag: skipped by wire type */
        if (read_varint(buf, end, pos, &value, index) < 0) {
            return STATUS_ERROR;
        }
        return skip_field(buf, end, pos, value & WIRE_TYPE_MASK, index);
    }
    if (tag == TAG_PAYLOAD_SIZE) {
        m->has_payload_size = 1;
        m->payload_size = value;
    } else if (tag == TAG_EVENT_TIME) {
        m->has_event_time = 1;
        m->event_time_ms = value;
    } else if (tag == TAG_KEY_B64_ENCODED) {
        m->key_b64 = value != 0;
    }
    return STATUS_OK;
}

/* Message `index` at *pos: its size, SingleMessageMetadata and payload; *pos moves past them. */
static int parse_message(const uint8_t *buf, Py_ssize_t total, Py_ssize_t *pos, Message *m, int keep,
                         Py_ssize_t index) {
    Py_ssize_t p = *pos;
    if (total - p < SIZE_PREFIX_BYTES) {
        return malformed("truncated SingleMessageMetadata size", index);
    }
    uint32_t meta_size = ((uint32_t)buf[p] << 24) | ((uint32_t)buf[p + 1] << 16) | ((uint32_t)buf[p + 2] << 8) |
                         (uint32_t)buf[p + 3];
    p += SIZE_PREFIX_BYTES;
    if ((uint64_t)meta_size > (uint64_t)(total - p)) {
        return malformed("SingleMessageMetadata runs past the batch", index);
    }
    Py_ssize_t end = p + (Py_ssize_t)meta_size;
    m->has_key = m->key_b64 = m->has_event_time = m->has_payload_size = 0;
    m->property_count = m->too_many_properties = 0;
    while (p < end) {
        if (parse_field(buf, end, &p, m, keep, index) < 0) {
            return STATUS_ERROR;
        }
    }
    if (!m->has_payload_size || m->payload_size > (uint64_t)INT64_MAX) {
        return malformed("no valid payload_size", index);
    }
    if (m->payload_size > (uint64_t)(total - p)) {
        return malformed("payload runs past the batch", index);
    }
    m->payload = (Span){p, (Py_ssize_t)m->payload_size};
    *pos = p + m->payload.size;
    return STATUS_OK;
}

/* ------------------------------------------------------------------------------------------
 * Rows
 * ---------------------------------------------------------------------------------------- */

/* Whether a parsed message is beyond this module's rules (the entry goes to the Python path). */
static int needs_fallback(const uint8_t *buf, const Message *m) {
    if (m->too_many_properties || (m->has_event_time && m->event_time_ms > (uint64_t)INT64_MAX)) {
        return 1;
    }
    return m->has_key && m->key_b64 && base64_canonical_padding(buf + m->key.start, m->key.size) < 0;
}

static int append_key(RangeColumns *c, const uint8_t *buf, const Message *m) {
    if (append_validity(c, KEY_VALIDITY, m->has_key) < 0) {
        return -1;
    }
    if (!m->has_key) {
        c->key_null_count++;
        return close_var(c, KEY_OFFSETS, KEY_DATA);
    }
    const uint8_t *text = buf + m->key.start;
    if (!m->key_b64) {
        return append_var(c, KEY_OFFSETS, KEY_DATA, text, m->key.size);
    }
    Py_ssize_t pads = base64_canonical_padding(text, m->key.size);
    if (base64_decode_append(&c->buffers[KEY_DATA], text, m->key.size, pads) < 0) {
        return -1;
    }
    return close_var(c, KEY_OFFSETS, KEY_DATA);
}

static int append_event_time(RangeColumns *c, int present, int64_t event_time_ms) {
    if (append_validity(c, EVENT_TIME_VALIDITY, present) < 0) {
        return -1;
    }
    if (!present) {
        c->event_time_null_count++;
    }
    return buffer_append_int64(&c->buffers[EVENT_TIMES_MS], present ? event_time_ms : 0);
}

static int append_property(RangeColumns *c, const void *name, Py_ssize_t name_size, const void *value,
                           Py_ssize_t value_size) {
    if (append_var(c, PROPERTY_NAME_OFFSETS, PROPERTY_NAME_DATA, name, name_size) < 0 ||
        append_var(c, PROPERTY_VALUE_OFFSETS, PROPERTY_VALUE_DATA, value, value_size) < 0) {
        return -1;
    }
    c->property_count++;
    return 0;
}

/* Base64 of prefix + (batch_index field when the entry holds more than one message). */
static int append_message_id(RangeColumns *c, const uint8_t *prefix, Py_ssize_t prefix_size, int batched,
                             uint64_t batch_index) {
    uint8_t raw[ID_RAW_BYTES_MAX];
    uint8_t text[ID_BASE64_BYTES_MAX];
    memcpy(raw, prefix, (size_t)prefix_size);
    Py_ssize_t n = prefix_size;
    if (batched) {
        raw[n++] = BATCH_INDEX_TAG;
        while (batch_index >= VARINT_CONTINUE) {
            raw[n++] = (uint8_t)((batch_index & VARINT_PAYLOAD) | VARINT_CONTINUE);
            batch_index >>= 7;
        }
        raw[n++] = (uint8_t)batch_index;
    }
    return append_var(c, ID_OFFSETS, ID_DATA, text, base64_encode(raw, n, text));
}

/* The per-entry values every row of a batch shares. */
typedef struct {
    const uint8_t *id_prefix;
    Py_ssize_t id_prefix_size;
    int batched;
    int64_t publish_time_ms;
} EntryContext;

static int append_message(RangeColumns *c, const uint8_t *buf, const Message *m, const EntryContext *e,
                          Py_ssize_t index) {
    if (append_key(c, buf, m) < 0 ||
        append_var(c, VALUE_OFFSETS, VALUE_DATA, buf + m->payload.start, m->payload.size) < 0 ||
        append_message_id(c, e->id_prefix, e->id_prefix_size, e->batched, (uint64_t)index) < 0 ||
        buffer_append_int64(&c->buffers[PUBLISH_TIMES_MS], e->publish_time_ms) < 0 ||
        append_event_time(c, m->has_event_time, (int64_t)m->event_time_ms) < 0) {
        return -1;
    }
    for (int i = 0; i < m->property_count; i++) {
        const Property *p = &m->properties[i];
        if (append_property(c, buf + p->name.start, p->name.size, buf + p->value.start, p->value.size) < 0) {
            return -1;
        }
    }
    if (buffer_append_int32(&c->buffers[PROPERTY_OFFSETS], (int32_t)c->property_count) < 0) {
        return -1;
    }
    c->rows++;
    return 0;
}

/* Every message of the batch checked; those in [skip, skip + take) appended. */
static int append_batch(RangeColumns *c, const uint8_t *buf, Py_ssize_t total, Py_ssize_t count, Py_ssize_t skip,
                        Py_ssize_t take, const EntryContext *e) {
    Message *m = PyMem_Malloc(sizeof(Message));
    if (m == NULL) {
        PyErr_NoMemory();
        return STATUS_ERROR;
    }
    int status = STATUS_OK;
    Py_ssize_t pos = 0;
    for (Py_ssize_t index = 0; index < count && status == STATUS_OK; index++) {
        int keep = index >= skip && index - skip < take;
        status = parse_message(buf, total, &pos, m, keep, index);
        if (status == STATUS_OK && keep) {
            if (needs_fallback(buf, m)) {
                status = STATUS_FALLBACK;
            } else if (append_message(c, buf, m, e, index) < 0) {
                status = STATUS_ERROR;
            }
        }
    }
    if (status == STATUS_OK && pos != total) {
        PyErr_Format(MalformedBatch, "batch payload has %zd trailing bytes after %zd messages", total - pos, count);
        status = STATUS_ERROR;
    }
    PyMem_Free(m);
    return status;
}

/* Whether a batch payload of `payload_size` bytes can hold `count` messages (else MalformedBatch
 * is raised). */
static int batch_can_hold(Py_ssize_t payload_size, Py_ssize_t count) {
    if (count <= 0 || count > payload_size / MESSAGE_BYTES_MIN) {
        PyErr_Format(MalformedBatch, "batch of %zd bytes cannot hold %zd messages", payload_size, count);
        return 0;
    }
    return 1;
}

/* A batch payload appended all or nothing: STATUS_OK, STATUS_FALLBACK (nothing appended) or
 * STATUS_ERROR; unless it succeeds, every buffer is cut back to its length before the call. */
static int append_batch_whole(RangeColumns *c, const uint8_t *payload, Py_ssize_t payload_size, Py_ssize_t count,
                              Py_ssize_t skip, Py_ssize_t take, const EntryContext *e) {
    Mark mark;
    columns_mark(c, &mark);
    int status = append_batch(c, payload, payload_size, count, skip, take, e);
    if (status != STATUS_OK) {
        columns_rollback(c, &mark);
    }
    return status;
}

/* ------------------------------------------------------------------------------------------
 * The Python type
 * ---------------------------------------------------------------------------------------- */

static int columns_usable(RangeColumns *c) {
    if (!c->ready || c->finished) {
        PyErr_SetString(PyExc_RuntimeError, "the columns are not initialized, or already finished");
        return 0;
    }
    return 1;
}

static int RangeColumns_init(RangeColumns *self, PyObject *args, PyObject *kwds) {
    static char *keywords[] = {"first_offset", NULL};
    long long first_offset;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "L", keywords, &first_offset)) {
        return -1;
    }
    if (self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "RangeColumns cannot be initialized twice");
        return -1;
    }
    self->first_offset = first_offset;
    for (size_t i = 0; i < sizeof OFFSET_BUFFERS / sizeof OFFSET_BUFFERS[0]; i++) {
        if (buffer_append_int32(&self->buffers[OFFSET_BUFFERS[i]], 0) < 0) {
            return -1;
        }
    }
    self->ready = 1;
    return 0;
}

static void RangeColumns_dealloc(RangeColumns *self) {
    for (int i = 0; i < BUFFER_COUNT; i++) {
        Py_CLEAR(self->buffers[i].bytes);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *RangeColumns_add_batch(RangeColumns *self, PyObject *args, PyObject *kwds) {
    static char *keywords[] = {"payload", "count", "skip", "take", "publish_time_ms", "id_prefix", NULL};
    Py_buffer payload, prefix;
    Py_ssize_t count, skip, take;
    long long publish_time_ms;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*nnnLy*", keywords, &payload, &count, &skip, &take,
                                     &publish_time_ms, &prefix)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (!columns_usable(self)) {
        goto done;
    }
    if (!batch_can_hold(payload.len, count)) {
        goto done;
    }
    if (skip < 0 || take < 0 || skip > count || take > count - skip) {
        PyErr_SetString(PyExc_ValueError, "skip and take must select messages of the batch");
        goto done;
    }
    if (prefix.len > ID_PREFIX_BYTES_MAX) {
        PyErr_Format(PyExc_ValueError, "id_prefix is longer than %d bytes", ID_PREFIX_BYTES_MAX);
        goto done;
    }
    EntryContext entry = {prefix.buf, prefix.len, count > 1, publish_time_ms};
    int status = append_batch_whole(self, payload.buf, payload.len, count, skip, take, &entry);
    if (status != STATUS_ERROR) {
        result = PyBool_FromLong(status == STATUS_OK);
    }
done:
    PyBuffer_Release(&payload);
    PyBuffer_Release(&prefix);
    return result;
}

/* ------------------------------------------------------------------------------------------
 * add_entries: collect_entries' loop over the entries of a read
 * ---------------------------------------------------------------------------------------- */

static const CommonEntryApi *common_entry_api = NULL;
/* ``_common_entry.c``'s check, when that module was built and loads (else each entry's check is
 * the ``common_batch`` callable add_entries is given). */

static PyObject *name_data, *name_last_offset, *name_first_offset, *name_publish_time_ms, *name_position,
    *name_ledger_id, *name_entry_id;

static int attribute_long_long(PyObject *object, PyObject *name, long long *out) {
    PyObject *value = PyObject_GetAttr(object, name);
    if (value == NULL) {
        return -1;
    }
    *out = PyLong_AsLongLong(value);
    Py_DECREF(value);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* An entry's message count, last_offset - first_offset + 1 (its ``message_count``); -1 with
 * OverflowError past a 64-bit integer, as reading that property as one would raise. */
static int message_count_of(long long first_offset, long long last_offset, long long *count) {
    if (__builtin_sub_overflow(last_offset, first_offset, count) || __builtin_add_overflow(*count, 1, count)) {
        PyErr_SetString(PyExc_OverflowError, "an entry's message count does not fit in 64 bits");
        return -1;
    }
    return 0;
}

static Py_ssize_t put_varint(uint8_t *out, uint64_t value) {
    Py_ssize_t n = 0;
    while (value >= VARINT_CONTINUE) {
        out[n++] = (uint8_t)((value & VARINT_PAYLOAD) | VARINT_CONTINUE);
        value >>= 7;
    }
    out[n++] = (uint8_t)value;
    return n;
}

/* message_id.message_id_bytes(ledger_id, entry_id, partition): MessageIdData fields 1-3. */
static Py_ssize_t put_id_prefix(uint8_t *out, long long ledger_id, long long entry_id, long long partition) {
    Py_ssize_t n = 0;
    out[n++] = 0x08;
    n += put_varint(out + n, (uint64_t)ledger_id); /* a negative value as its two's complement, as Python's */
    out[n++] = 0x10;
    n += put_varint(out + n, (uint64_t)entry_id);
    if (partition >= 0) {
        out[n++] = 0x18;
        n += put_varint(out + n, (uint64_t)partition);
    }
    return n;
}

/* One entry appended natively: STATUS_OK, STATUS_FALLBACK (nothing appended: Python takes the
 * entry) or STATUS_ERROR. */
static int add_stored_entry(RangeColumns *c, PyObject *entry, PyObject *data, PyObject *common_batch,
                            long long partition, long long skip, long long take) {
    if (!PyBytes_CheckExact(data)) {
        return STATUS_FALLBACK;
    }
    Py_ssize_t start, count;
    if (common_entry_api != NULL) { /* the same check in C, no tuple made */
        uint64_t declared;
        int shape = common_entry_api->common_batch_shape((const unsigned char *)PyBytes_AS_STRING(data),
                                                         PyBytes_GET_SIZE(data), &start, &declared);
        if (shape <= 0) { /* not a common entry, or not batched: the Python decoder's */
            return shape < 0 ? STATUS_ERROR : STATUS_FALLBACK;
        }
        count = (Py_ssize_t)declared; /* at most 2^31 - 1: the parser refuses more */
    } else {
        PyObject *common = PyObject_CallOneArg(common_batch, data);
        if (common == NULL) {
            return STATUS_ERROR;
        }
        if (!PyTuple_Check(common) || PyTuple_GET_SIZE(common) < 6 || PyTuple_GET_ITEM(common, 5) != Py_None) {
            Py_DECREF(common); /* None (not a common entry) or not batched: the Python decoder's */
            return STATUS_FALLBACK;
        }
        start = PyLong_AsSsize_t(PyTuple_GET_ITEM(common, 0));
        count = PyLong_AsSsize_t(PyTuple_GET_ITEM(common, 1));
        Py_DECREF(common);
        if ((start == -1 || count == -1) && PyErr_Occurred()) {
            return STATUS_ERROR;
        }
    }
    Py_ssize_t total = PyBytes_GET_SIZE(data);
    if (start < 0 || start > total) {
        return STATUS_FALLBACK;
    }
    skip = skip < count ? skip : count;
    take = take < count - skip ? take : count - skip;
    if (take < 0) {
        return STATUS_FALLBACK; /* the Python path says what is wrong */
    }
    if (!batch_can_hold(total - start, count)) {
        return STATUS_ERROR;
    }
    long long ledger_id, entry_id;
    PyObject *position = PyObject_GetAttr(entry, name_position);
    if (position == NULL) {
        return STATUS_ERROR;
    }
    int failed = attribute_long_long(position, name_ledger_id, &ledger_id) < 0 ||
                 attribute_long_long(position, name_entry_id, &entry_id) < 0;
    Py_DECREF(position);
    long long publish_time_ms;
    if (failed || attribute_long_long(entry, name_publish_time_ms, &publish_time_ms) < 0) {
        return STATUS_ERROR;
    }
    uint8_t prefix[3 + 3 * VARINT_BYTES_MAX];
    EntryContext context = {prefix, put_id_prefix(prefix, ledger_id, entry_id, partition), count > 1,
                            publish_time_ms};
    return append_batch_whole(c, (const uint8_t *)PyBytes_AS_STRING(data) + start, total - start, count,
                              (Py_ssize_t)skip, (Py_ssize_t)take, &context);
}

/* add_entries(entries, offset, partition, max_messages, max_bytes, message_overhead_bytes,
 * common_batch): columns.collect_entries' loop, natively, for as long as each entry is one the
 * columns take natively. None when the read is done (the entries ran out or a bound was
 * reached); (entry, skip, take) for an entry the caller appends in Python before it decides
 * whether to go on and call again. Bounds are 64-bit integers and the overhead 0..2^31-1
 * (collect_entries cuts larger bounds, which no read reaches, and leaves other overheads to
 * its Python loop); others raise. */
static PyObject *RangeColumns_add_entries(RangeColumns *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "add_entries takes 7 arguments");
        return NULL;
    }
    long long bounds[5]; /* offset, partition, max_messages, max_bytes, overhead */
    for (int i = 0; i < 5; i++) {
        bounds[i] = PyLong_AsLongLong(args[i + 1]);
        if (bounds[i] == -1 && PyErr_Occurred()) {
            return NULL;
        }
    }
    long long offset = bounds[0], partition = bounds[1], max_messages = bounds[2], max_bytes = bounds[3],
              overhead = bounds[4];
    if (overhead < 0 || overhead > BUFFER_BYTES_MAX) {
        PyErr_SetString(PyExc_ValueError, "message_overhead_bytes must be between 0 and 2^31-1");
        return NULL;
    }
    if (!columns_usable(self)) {
        return NULL;
    }
    PyObject *iterator = args[0], *common_batch = args[6];
    for (;;) {
        PyObject *entry = PyIter_Next(iterator);
        if (entry == NULL) {
            return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
        }
        long long count, first_offset, last_offset;
        PyObject *data = PyObject_GetAttr(entry, name_data);
        if (data == NULL || attribute_long_long(entry, name_last_offset, &last_offset) < 0 ||
            attribute_long_long(entry, name_first_offset, &first_offset) < 0 ||
            message_count_of(first_offset, last_offset, &count) < 0) {
            Py_XDECREF(data);
            Py_DECREF(entry);
            return NULL;
        }
        /* the rows and bytes the columns hold, as collect_entries counts them */
        long long rows = self->rows, used = self->buffers[VALUE_DATA].len + rows * overhead;
        long long skip = offset - first_offset > 0 ? offset - first_offset : 0;
        Py_ssize_t data_bytes = PyObject_Length(data);
        if (data_bytes < 0) {
            Py_DECREF(data);
            Py_DECREF(entry);
            return NULL;
        }
        long long per_message = (long long)data_bytes / (count ? count : 1) + overhead;
        long long affordable = (max_bytes - used) / (per_message ? per_message : 1);
        long long take = count - skip;
        take = take < max_messages - rows ? take : max_messages - rows;
        take = take < (affordable > 1 ? affordable : 1) ? take : (affordable > 1 ? affordable : 1);
        int status = add_stored_entry(self, entry, data, common_batch, partition, skip, take);
        Py_DECREF(data);
        if (status == STATUS_ERROR) {
            Py_DECREF(entry);
            return NULL;
        }
        if (status == STATUS_FALLBACK) {
            return Py_BuildValue("(NLL)", entry, skip, take);
        }
        Py_DECREF(entry);
        rows = self->rows;
        used = self->buffers[VALUE_DATA].len + rows * overhead;
        if (rows >= max_messages || used >= max_bytes || take < count - skip) {
            Py_RETURN_NONE;
        }
    }
}

/* The properties of add_row: a dict of str to str, appended in its order. */
static int append_property_dict(RangeColumns *c, PyObject *properties) {
    if (!PyDict_Check(properties)) {
        PyErr_SetString(PyExc_TypeError, "properties must be a dict of str to str");
        return -1;
    }
    Py_ssize_t at = 0;
    PyObject *name, *value;
    while (PyDict_Next(properties, &at, &name, &value)) {
        Py_ssize_t name_size, value_size;
        const char *name_text = PyUnicode_Check(name) ? PyUnicode_AsUTF8AndSize(name, &name_size) : NULL;
        const char *value_text = PyUnicode_Check(value) ? PyUnicode_AsUTF8AndSize(value, &value_size) : NULL;
        if (name_text == NULL || value_text == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "properties must be a dict of str to str");
            }
            return -1;
        }
        if (append_property(c, name_text, name_size, value_text, value_size) < 0) {
            return -1;
        }
    }
    return buffer_append_int32(&c->buffers[PROPERTY_OFFSETS], (int32_t)c->property_count);
}

static int append_row(RangeColumns *c, PyObject *key, Py_buffer *value, long long publish_time_ms,
                      PyObject *event_time, PyObject *properties, Py_buffer *message_id) {
    int has_event_time = event_time != Py_None;
    long long event_time_ms = has_event_time ? PyLong_AsLongLong(event_time) : 0;
    if (event_time_ms == -1 && PyErr_Occurred()) {
        return -1;
    }
    int has_key = key != Py_None;
    if (has_key && !PyBytes_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "key must be bytes or None");
        return -1;
    }
    if (append_validity(c, KEY_VALIDITY, has_key) < 0 ||
        append_var(c, KEY_OFFSETS, KEY_DATA, has_key ? PyBytes_AS_STRING(key) : "",
                   has_key ? PyBytes_GET_SIZE(key) : 0) < 0 ||
        append_var(c, VALUE_OFFSETS, VALUE_DATA, value->buf, value->len) < 0 ||
        append_var(c, ID_OFFSETS, ID_DATA, message_id->buf, message_id->len) < 0 ||
        buffer_append_int64(&c->buffers[PUBLISH_TIMES_MS], publish_time_ms) < 0 ||
        append_event_time(c, has_event_time, event_time_ms) < 0 || append_property_dict(c, properties) < 0) {
        return -1;
    }
    c->key_null_count += !has_key;
    c->rows++;
    return 0;
}

static PyObject *RangeColumns_add_row(RangeColumns *self, PyObject *args, PyObject *kwds) {
    static char *keywords[] = {"key", "value", "publish_time_ms", "event_time_ms", "properties", "message_id", NULL};
    PyObject *key, *event_time, *properties;
    Py_buffer value, message_id;
    long long publish_time_ms;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Oy*LOOy*", keywords, &key, &value, &publish_time_ms, &event_time,
                                     &properties, &message_id)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (columns_usable(self)) {
        Mark mark;
        columns_mark(self, &mark);
        if (append_row(self, key, &value, publish_time_ms, event_time, properties, &message_id) < 0) {
            columns_rollback(self, &mark);
        } else {
            result = Py_NewRef(Py_None);
        }
    }
    PyBuffer_Release(&value);
    PyBuffer_Release(&message_id);
    return result;
}

/* The offset column: first_offset, first_offset + 1, ... (offsets have no gaps). */
static int fill_offsets(RangeColumns *c) {
    Buffer *b = &c->buffers[OFFSETS];
    if (c->rows > (BUFFER_BYTES_MAX - b->len) / (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_OverflowError, "a range read column would exceed 2 GiB");
        return -1;
    }
    if (buffer_reserve(b, c->rows * (Py_ssize_t)sizeof(int64_t)) < 0) {
        return -1;
    }
    int64_t *out = (int64_t *)buffer_end(b);
    for (Py_ssize_t i = 0; i < c->rows; i++) {
        out[i] = (int64_t)(c->first_offset + i);
    }
    b->len += c->rows * (Py_ssize_t)sizeof(int64_t);
    return 0;
}

static PyObject *RangeColumns_finish(RangeColumns *self, PyObject *Py_UNUSED(ignored)) {
    if (!columns_usable(self) || fill_offsets(self) < 0) {
        return NULL;
    }
    self->finished = 1;
    PyObject *out = PyDict_New();
    if (out == NULL) {
        return NULL;
    }
    for (int i = 0; i < BUFFER_COUNT; i++) {
        int empty_validity = (i == KEY_VALIDITY && self->key_null_count == 0) ||
                             (i == EVENT_TIME_VALIDITY && self->event_time_null_count == 0);
        PyObject *bytes = empty_validity ? Py_NewRef(Py_None) : buffer_take(&self->buffers[i]);
        if (bytes == NULL || PyDict_SetItemString(out, BUFFER_NAMES[i], bytes) < 0) {
            Py_XDECREF(bytes);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(bytes);
    }
    return out;
}

static PyMethodDef RangeColumns_methods[] = {
    {"add_batch", (PyCFunction)(void (*)(void))RangeColumns_add_batch, METH_VARARGS | METH_KEYWORDS,
     "Append messages [skip, skip + take) of an uncompressed batch payload of `count` messages; False "
     "(nothing appended) when the entry needs the Python decoder. Raises MalformedBatch."},
    {"add_entries", (PyCFunction)(void (*)(void))RangeColumns_add_entries, METH_FASTCALL,
     "collect_entries' loop over an iterator of stored entries, for as long as each is taken natively: None "
     "when the read is done, else (entry, skip, take) for the caller to append. Raises MalformedBatch."},
    {"add_row", (PyCFunction)(void (*)(void))RangeColumns_add_row, METH_VARARGS | METH_KEYWORDS,
     "Append one row decoded elsewhere."},
    {"finish", (PyCFunction)RangeColumns_finish, METH_NOARGS,
     "The column buffers by name (validity None when nothing is null); the columns are then closed."},
    {NULL, NULL, 0, NULL},
};

static PyObject *RangeColumns_value_bytes(RangeColumns *self, void *Py_UNUSED(closure)) {
    return PyLong_FromSsize_t(self->buffers[VALUE_DATA].len);
}

static PyGetSetDef RangeColumns_getset[] = {
    {"value_bytes", (getter)RangeColumns_value_bytes, NULL, "Bytes of the values appended so far.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef RangeColumns_members[] = {
    {"rows", T_PYSSIZET, offsetof(RangeColumns, rows), READONLY, "Rows appended so far."},
    {"property_count", T_PYSSIZET, offsetof(RangeColumns, property_count), READONLY, "Properties of all rows."},
    {"key_null_count", T_PYSSIZET, offsetof(RangeColumns, key_null_count), READONLY, "Rows without a key."},
    {"event_time_null_count", T_PYSSIZET, offsetof(RangeColumns, event_time_null_count), READONLY,
     "Rows without an event time."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject RangeColumnsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "broker.entry_format._range_columns.RangeColumns",
    .tp_basicsize = sizeof(RangeColumns),
    .tp_dealloc = (destructor)RangeColumns_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Range-read columns built from batch payloads (see api/rest_read.py).",
    .tp_methods = RangeColumns_methods,
    .tp_members = RangeColumns_members,
    .tp_getset = RangeColumns_getset,
    .tp_init = (initproc)RangeColumns_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "broker.entry_format._range_columns",
    .m_doc = "Native range-read columns: batch payloads to Arrow buffers (optional accelerator).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__range_columns(void) {
    base64_init();
    PyObject *common_entry = PyImport_ImportModule("broker.entry_format._common_entry");
    if (common_entry == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ImportError)) {
            return NULL;
        }
        PyErr_Clear(); /* not built: the callable checks each entry */
    } else {
        Py_DECREF(common_entry);
        common_entry_api = (const CommonEntryApi *)PyCapsule_Import(COMMON_ENTRY_API_NAME, 0);
        if (common_entry_api == NULL) {
            return NULL; /* the module loaded without its capsule: a build of another version */
        }
    }
    PyObject **names[] = {&name_data, &name_last_offset, &name_first_offset, &name_publish_time_ms,
                          &name_position, &name_ledger_id, &name_entry_id};
    const char *texts[] = {"data", "last_offset", "first_offset", "publish_time_ms", "position", "ledger_id",
                           "entry_id"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i] = PyUnicode_InternFromString(texts[i]);
        if (*names[i] == NULL) {
            return NULL;
        }
    }
    if (PyType_Ready(&RangeColumnsType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    MalformedBatch = PyErr_NewExceptionWithDoc("broker.entry_format._range_columns.MalformedBatch",
                                               "The batch payload is not what the entry format allows.",
                                               PyExc_ValueError, NULL);
    if (MalformedBatch == NULL || PyModule_AddObjectRef(m, "MalformedBatch", MalformedBatch) < 0 ||
        PyModule_AddObjectRef(m, "RangeColumns", (PyObject *)&RangeColumnsType) < 0 ||
        PyModule_AddIntConstant(m, "PROPERTIES_PER_MESSAGE_MAX", PROPERTIES_PER_MESSAGE_MAX) < 0 ||
        PyModule_AddObjectRef(m, "COMMON_ENTRY_API", common_entry_api != NULL ? Py_True : Py_False) < 0) {
        Py_XDECREF(MalformedBatch);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
