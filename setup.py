"""Build configuration of the optional native accelerator; the project itself is in pyproject.toml.

``broker/entry_format/_range_columns.c`` (range reads: batch payloads to Arrow buffers) is built
when a C compiler is at hand. It is optional: without a compiler the install still succeeds and
``broker/entry_format/columns.py`` builds the columns in Python (``NATIVE_COLUMNS`` is False).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("broker.entry_format._range_columns", sources=["broker/entry_format/_range_columns.c"],
                             optional=True)])
