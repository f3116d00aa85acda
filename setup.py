"""Build configuration of the optional native accelerator; the project itself is in pyproject.toml.

``api/_range_columns.c`` (range reads: batch payloads to Arrow buffers) is built when a C
compiler is at hand. It is optional: without a compiler the install still succeeds and
``api/rest_read.py`` serves reads with its pure-Python columns (``NATIVE_COLUMNS`` is False).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("api._range_columns", sources=["api/_range_columns.c"], optional=True)])
