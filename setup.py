"""Build configuration of the optional native accelerators; the project itself is in pyproject.toml.

``broker/entry_format/_range_columns.c`` (range reads: batch payloads to Arrow buffers),
``broker/entry_format/_varint.c`` (protobuf varints), ``broker/entry_format/_batch_encoder.c``
(batch payloads on the write path), ``broker/entry_format/_batch_decoder.c`` (batch payloads
split on every read), ``broker/entry_format/_common_entry.c`` (the check of a common stored
entry on every read) and ``storage/_entry_records.c`` (an entry log's records, read ahead) and
``consumers/eventsourcing/_notifications.c`` (a recorder's notifications and their UUIDs) are
built when a C compiler is at hand. They are optional: without a compiler the install still
succeeds, ``columns.py`` builds the columns in Python (``NATIVE_COLUMNS`` is False),
``wire.py`` reads and writes varints in Python (``NATIVE_VARINT`` is False), ``batch.py``
encodes and splits batches in Python (``NATIVE_BATCH_ENCODER`` and ``NATIVE_BATCH_DECODER``
are False), ``common_entry.py`` checks common entries in Python (``NATIVE_COMMON_ENTRY`` is
False) and ``entry_log.py`` reads records in Python (``NATIVE_RECORDS`` is False) and ``records.py`` makes
notifications in Python (``NATIVE_NOTIFICATIONS`` is False).
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("broker.entry_format._range_columns", sources=["broker/entry_format/_range_columns.c"],
              depends=["broker/entry_format/_common_entry_api.h", "broker/entry_format/_utf8.h"], optional=True),
    Extension("broker.entry_format._varint", sources=["broker/entry_format/_varint.c"], optional=True),
    Extension("broker.entry_format._batch_encoder", sources=["broker/entry_format/_batch_encoder.c"], optional=True),
    Extension("broker.entry_format._batch_decoder", sources=["broker/entry_format/_batch_decoder.c"],
              depends=["broker/entry_format/_wire.h"], optional=True),
    Extension("broker.entry_format._common_entry", sources=["broker/entry_format/_common_entry.c"],
              depends=["broker/entry_format/_wire.h", "broker/entry_format/_common_entry_api.h",
                       "broker/entry_format/_utf8.h", "storage/_crc32c.h"], include_dirs=["storage"], optional=True),
    Extension("storage._entry_records", sources=["storage/_entry_records.c"], depends=["storage/_crc32c.h"],
              optional=True),
    Extension("consumers.eventsourcing._notifications", sources=["consumers/eventsourcing/_notifications.c"],
              optional=True),
])
