/*
 * broker/entry_format/_utf8.h: strict UTF-8, as ``bytes.decode()`` accepts it (no overlong
 * forms, no surrogates, nothing above U+10FFFF), for the native accelerators that check text
 * without making a ``str`` of it (``_range_columns.c``, ``_common_entry.c``).
 */
#ifndef MAGNETAR_UTF8_H
#define MAGNETAR_UTF8_H

#include <Python.h>
#include <stdint.h>

static int utf8_valid(const uint8_t *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        uint8_t b = s[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        Py_ssize_t extra;
        uint8_t low = 0x80, high = 0xBF; /* range of the second byte */
        if (b >= 0xC2 && b <= 0xDF) {
            extra = 1;
        } else if (b >= 0xE0 && b <= 0xEF) {
            extra = 2;
            if (b == 0xE0) {
                low = 0xA0; /* no overlong forms */
            } else if (b == 0xED) {
                high = 0x9F; /* no surrogates */
            }
        } else if (b >= 0xF0 && b <= 0xF4) {
            extra = 3;
            if (b == 0xF0) {
                low = 0x90; /* no overlong forms */
            } else if (b == 0xF4) {
                high = 0x8F; /* nothing above U+10FFFF */
            }
        } else {
            return 0;
        }
        if (extra > n - i - 1 || s[i + 1] < low || s[i + 1] > high) {
            return 0;
        }
        for (Py_ssize_t k = 2; k <= extra; k++) {
            if ((s[i + k] & 0xC0) != 0x80) {
                return 0;
            }
        }
        i += extra + 1;
    }
    return 1;
}

#endif
