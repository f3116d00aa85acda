"""Spark's Python workers run an interpreter that can import the data source, or registration says
what to set (``consumers/spark/interpreter.py``).

Checks, against the tier's real SparkSession: an unset ``PYSPARK_PYTHON`` becomes this
interpreter, for the environment and for a running SparkContext left at Spark's default
``python3``, and a set one is kept; registering the data source while the context's workers would
run an interpreter that cannot import ``consumers.spark`` (this one, isolated from its
site-packages) fails with a message naming it and ``PYSPARK_PYTHON``. (Running the README's
example without any of this set is ``tests/e2e/test_readme.py``.)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from consumers.spark import MagnetarDataSource, WorkerInterpreterError
from consumers.spark.interpreter import PYSPARK_PYTHON, SPARK_DEFAULT_PYTHON, use_this_interpreter


def test_an_unset_pyspark_python_becomes_this_interpreter(spark: SparkSession,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PYSPARK_PYTHON, raising=False)
    monkeypatch.setattr(spark.sparkContext, "pythonExec", SPARK_DEFAULT_PYTHON)
    use_this_interpreter()
    assert spark.sparkContext.pythonExec == sys.executable
    assert os.environ[PYSPARK_PYTHON] == sys.executable


def test_a_set_pyspark_python_is_kept(spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PYSPARK_PYTHON, "/opt/chosen/python")
    monkeypatch.setattr(spark.sparkContext, "pythonExec", "/opt/chosen/python")
    use_this_interpreter()
    assert spark.sparkContext.pythonExec == "/opt/chosen/python"


def test_registering_fails_with_what_to_set_when_the_workers_cannot_import_the_source(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    isolated = tmp_path / "python-without-magnetar"
    isolated.write_text(f'#!/bin/sh\nexec "{sys.executable}" -I -S "$@"\n')  # no site-packages, no cwd
    isolated.chmod(0o755)
    monkeypatch.setattr(spark.sparkContext, "pythonExec", str(isolated))
    with pytest.raises(WorkerInterpreterError) as refused:
        spark.dataSource.register(MagnetarDataSource)
    message = str(refused.value)
    assert str(isolated) in message and "cannot import consumers.spark" in message
    assert f"set PYSPARK_PYTHON to an interpreter where magnetar is installed, such as {sys.executable}" in message
    monkeypatch.undo()
    spark.dataSource.register(MagnetarDataSource)  # this interpreter can: registered again, no error
