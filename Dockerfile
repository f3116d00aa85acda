# Magnetar in one image: the standalone broker (the default command), the Python client, the Spark
# source and sink, and the clickstream demo (see docker-compose.yml). The same image runs the
# cluster's bookies and broker (docker-compose.cluster.yml; /journal is a bookie's journal volume).
#
# It installs what `make run` installs, nothing else: the project with the same extras as the
# Makefile's virtualenv, every version pinned by constraints.txt, plus a Java runtime for Spark.
# Debian bookworm is the base because it still packages Java 17.
#
# The optional range-read accelerator (broker/entry_format/_range_columns.c, built by setup.py when a C compiler is
# present) is not built here: setup.py is not copied and the slim image has no compiler, so range
# reads use their pure-Python columns (the same answers, about 20 times the broker CPU per row). To
# build it, copy setup.py with pyproject.toml and install gcc before the pip install (or build the
# wheel in a stage that has one).
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY storage ./storage
COPY broker ./broker
COPY api ./api
COPY consumers ./consumers
RUN pip install --upgrade pip \
    && pip install -c constraints.txt '.[dev]'
COPY demo ./demo

# An unprivileged user owning the directories the compose file mounts volumes on.
RUN useradd --create-home --uid 1000 magnetar \
    && mkdir -p /data /journal /checkpoints /output \
    && chown magnetar:magnetar /data /journal /checkpoints /output
USER magnetar

VOLUME ["/data"]
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=5 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
CMD ["magnetar", "standalone", "--data-dir", "/data", "--host", "0.0.0.0", "--port", "8080"]
