"""Which Python interpreter Spark's Python workers run: this one, unless told otherwise.

Role: Spark runs the data source's Python code (planning, reading, writing) in worker processes
it starts with ``PYSPARK_PYTHON`` or, when that is unset, ``python3`` from ``PATH``. A job run as
``.venv/bin/python job.py`` without an activated virtualenv then gets the system's ``python3``,
which cannot import this package (``ModuleNotFoundError: No module named 'consumers'`` inside an
``AnalysisException``). So importing ``consumers.spark`` calls :func:`use_this_interpreter`, and
registering the data source calls :func:`check_worker_interpreter`.

Invariants:
- An unset ``PYSPARK_PYTHON`` becomes ``sys.executable``, for SparkContexts started later and for
  one already running that was left at Spark's default; a set one is never changed.
- A data source is registered only if the interpreter the workers will run can import
  ``consumers.spark``; otherwise registration fails with a message naming the interpreter and
  what to set. The check starts that interpreter once (bounded by ``CHECK_TIMEOUT_S``) and
  remembers the answer.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

from pyspark import SparkContext

PYSPARK_PYTHON = "PYSPARK_PYTHON"
SPARK_DEFAULT_PYTHON = "python3"
"""What Spark runs when ``PYSPARK_PYTHON`` is unset (``SparkContext.pythonExec``)."""
CHECK_TIMEOUT_S = 60.0
_FIND_PACKAGE = "import importlib.util, sys; sys.exit(importlib.util.find_spec('consumers.spark') is None)"


class WorkerInterpreterError(RuntimeError):
    """Spark's Python workers would run an interpreter that cannot import ``consumers.spark``."""


def use_this_interpreter() -> None:
    """Make Spark's Python workers run ``sys.executable`` unless ``PYSPARK_PYTHON`` names one."""
    if os.environ.get(PYSPARK_PYTHON):
        return
    os.environ[PYSPARK_PYTHON] = sys.executable
    running = SparkContext._active_spark_context
    if running is not None and running.pythonExec == SPARK_DEFAULT_PYTHON:
        running.pythonExec = sys.executable


def check_worker_interpreter() -> None:
    """On the driver (where a SparkContext runs): fail with what to set if the workers'
    interpreter cannot import ``consumers.spark``; elsewhere (a worker) do nothing."""
    running = SparkContext._active_spark_context
    if running is not None:
        _check(running.pythonExec)


@functools.cache
def _check(python: str) -> None:
    try:
        found = subprocess.run([python, "-c", _FIND_PACKAGE], capture_output=True, timeout=CHECK_TIMEOUT_S,
                               cwd=os.path.abspath(os.sep), check=False).returncode == 0  # a worker's cwd is not ours
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WorkerInterpreterError(f"Spark's Python workers would run {python!r}, which cannot be started "
                                     f"({exc}): set {PYSPARK_PYTHON} to {sys.executable}") from None
    if not found:
        raise WorkerInterpreterError(
            f"Spark's Python workers would run {python!r}, which cannot import consumers.spark: set "
            f"{PYSPARK_PYTHON} to an interpreter where magnetar is installed, such as {sys.executable}, "
            "before the SparkSession starts (or leave it unset: importing consumers.spark then sets it)")
