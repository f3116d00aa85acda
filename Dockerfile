# Magnetar's images, as targets of one Dockerfile:
#   broker  (the default target) the servers: `magnetar standalone` (the default command), and the
#           cluster's `magnetar bookie` and `magnetar broker` (docker-compose.cluster.yml; with
#           tiered storage on MinIO: docker-compose.tiered.yml); the Python client and the CLI.
#           No Java, no Spark.
#   spark   the demo's clients (see docker-compose.yml): the clickstream producer and the Spark job,
#           with a Java runtime and PySpark (the project's `spark` extra) added to the same install.
# `docker build --target spark -t magnetar-spark:dev .` builds the second (the compose files give its
# commands); the compose files build both.
#
# The builder compiles the project into a wheel, with the optional range-read columns in C
# (broker/entry_format/_range_columns.c, built by setup.py; about 20 times less broker CPU per row
# than the Python columns), and fails if they were not compiled. The base stage installs that
# wheel and its dependencies, every version pinned by constraints.txt: no compiler, no development
# tools (the dev extras: pytest, mypy, schemathesis, ...) and no sources. Both images run as the
# unprivileged user magnetar (uid 1000), which owns every directory the compose files mount a
# volume on (a fresh named volume takes the owner of the directory it is mounted on): /data and
# /journal in both, /checkpoints and /output in spark. Debian bookworm is the base because it
# still packages Java 17.

FROM python:3.11-slim-bookworm AS builder

ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY storage ./storage
COPY broker ./broker
COPY api ./api
COPY consumers ./consumers
RUN pip wheel --no-deps --wheel-dir /wheels . \
    && { python -m zipfile -l /wheels/magnetar-*.whl | grep -q "broker/entry_format/_range_columns\..*\.so" \
         || { echo "the C range-read columns were not compiled into the wheel" >&2; exit 1; }; }

FROM python:3.11-slim-bookworm AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY constraints.txt ./
COPY --from=builder /wheels /wheels
RUN pip install --upgrade pip \
    && pip install -c constraints.txt /wheels/magnetar-*.whl \
    && rm -rf /wheels
RUN useradd --create-home --uid 1000 magnetar \
    && mkdir -p /data /journal \
    && chown magnetar:magnetar /data /journal

FROM base AS spark

RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
RUN pip install -c constraints.txt "magnetar[spark]" \
    && mkdir -p /checkpoints /output \
    && chown magnetar:magnetar /checkpoints /output
COPY demo ./demo
USER magnetar

FROM base AS broker

USER magnetar
VOLUME ["/data"]
EXPOSE 8080 6650
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=5 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
CMD ["magnetar", "standalone", "--data-dir", "/data", "--host", "0.0.0.0", "--port", "8080", "--pulsar-port", "6650"]
