/*
 * broker/entry_format/_wire.h: protobuf's wire primitives shared by the native readers.
 *
 * Role: the varint reader of _batch_decoder.c and _common_entry.c, which must agree with
 * wire.py's Python reader byte for byte: at most ten bytes, no value above 2^64 - 1.
 */

#ifndef MAGNETAR_WIRE_H
#define MAGNETAR_WIRE_H

#include <Python.h>
#include <stdint.h>

/* The varint at *pos, before end: 1 and the value with *pos past it, or 0 for one that runs
 * past end, is longer than ten bytes or wider than 64 bits (wire.py's reader raises for those). */
static inline int wire_read_varint(const unsigned char *p, Py_ssize_t end, Py_ssize_t *pos, uint64_t *out) {
    uint64_t value = 0;
    int shift = 0;
    Py_ssize_t i = *pos;
    while (i < end && shift <= 63) {
        unsigned char b = p[i++];
        if (shift == 63 && (b & 0x7F) > 1) {
            return 0;
        }
        value |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *pos = i;
            *out = value;
            return 1;
        }
        shift += 7;
    }
    return 0;
}

#endif
