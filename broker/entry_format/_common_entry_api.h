/*
 * broker/entry_format/_common_entry_api.h: what ``_common_entry.c`` offers other native modules
 * through the capsule ``broker.entry_format._common_entry._C_API`` (one parser of a common
 * stored entry, and one CRC32C state that ``use_crc_instruction`` switches).
 *
 * ``common_batch_shape(p, n, &payload_start, &count)``: 1 when ``p[0:n]`` is a common entry
 * whose ``MessageMetadata`` declares a batch (what ``common_batch`` returns a tuple for with no
 * lone fields), with its payload's start and message count; 0 for every other entry
 * (``common_batch`` returns None, or the lone fields of a message not batched); -1 on an error
 * (raised). It makes no Python object.
 */
#ifndef MAGNETAR_COMMON_ENTRY_API_H
#define MAGNETAR_COMMON_ENTRY_API_H

#include <Python.h>
#include <stdint.h>

#define COMMON_ENTRY_API_NAME "broker.entry_format._common_entry._C_API"

typedef struct {
    int (*common_batch_shape)(const unsigned char *p, Py_ssize_t n, Py_ssize_t *payload_start, uint64_t *count);
} CommonEntryApi;

#endif
