# Magnetar in one image: the standalone broker (the default command), the Python client, the Spark
# source and sink, and the clickstream demo (see docker-compose.yml). The same image runs the
# cluster's bookies and broker (docker-compose.cluster.yml; /journal is a bookie's journal volume).
#
# Two stages. The builder compiles the project into a wheel, with the optional range-read columns
# in C (broker/entry_format/_range_columns.c, built by setup.py; about 20 times less broker CPU per
# row than the Python columns), and fails if they were not compiled. The runtime image installs
# that wheel and its dependencies, every version pinned by constraints.txt, plus a Java runtime
# for Spark: no compiler, no development tools (the dev extras: pytest, mypy, schemathesis, ...)
# and no sources but the demo's. Debian bookworm is the base because it still packages Java 17.

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

FROM python:3.11-slim-bookworm AS runtime

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY constraints.txt ./
COPY --from=builder /wheels /wheels
RUN pip install --upgrade pip \
    && pip install -c constraints.txt /wheels/magnetar-*.whl \
    && rm -rf /wheels
COPY demo ./demo

# An unprivileged user owning the directories the compose file mounts volumes on.
RUN useradd --create-home --uid 1000 magnetar \
    && mkdir -p /data /journal /checkpoints /output \
    && chown magnetar:magnetar /data /journal /checkpoints /output
USER magnetar

VOLUME ["/data"]
EXPOSE 8080 6650
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=5 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
CMD ["magnetar", "standalone", "--data-dir", "/data", "--host", "0.0.0.0", "--port", "8080"]
