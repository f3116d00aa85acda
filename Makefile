# Magnetar: `make run` starts the standalone broker, `make test` runs the whole suite.
# Both set up everything first: a virtualenv in .venv with pinned dependencies.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DATA_DIR ?= ./data
PORT ?= 8080
PULSAR_PORT ?= 6650

.PHONY: run test lint unit crash bench check-java check-chromium check-zookeeper check-postgresql check-azurite clean demo soak-cluster

# setup.py builds the optional native accelerators (broker/entry_format/*.c, storage/*.c,
# consumers/eventsourcing/*.c; skipped without a C compiler).
$(STAMP): pyproject.toml constraints.txt setup.py $(wildcard broker/entry_format/*.c broker/entry_format/*.h storage/*.c storage/*.h consumers/eventsourcing/*.c)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,spark]'
	touch $(STAMP)

check-java:
	@command -v java >/dev/null 2>&1 || { echo "Spark needs Java 17+: install it with 'apt-get install openjdk-17-jre-headless'"; exit 1; }
	@v=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	  [ "$${v:-0}" -ge 17 ] || { echo "Spark needs Java 17+, found $$v: install 'openjdk-17-jre-headless'"; exit 1; }

# The web console's tests drive Debian's Chromium through chromium-driver (tests/e2e/test_console.py).
CHROMIUM_PACKAGES := chromium chromium-driver
check-chromium:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then exit 0; fi; \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "Installing $(CHROMIUM_PACKAGES) for the web console's tests"; \
	    (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(CHROMIUM_PACKAGES)) \
	      || { echo "apt-get could not install $(CHROMIUM_PACKAGES): install them to run the web console's tests"; exit 1; }; \
	  else \
	    echo "The web console's tests need Debian's $(CHROMIUM_PACKAGES): install them ('apt-get install $(CHROMIUM_PACKAGES)' as root)"; exit 1; \
	  fi

# The cluster tests run Debian's ZooKeeper (java + /usr/share/java/zookeeper.jar); installed when missing.
check-zookeeper: check-java
	@[ -f /usr/share/java/zookeeper.jar ] || { echo "installing Debian's zookeeper package for the cluster tests"; \
	  apt-get update -qq >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zookeeper >/dev/null 2>&1; true; }
	@[ -f /usr/share/java/zookeeper.jar ] || { echo "The cluster tests need ZooKeeper: install it with 'apt-get install zookeeper'"; exit 1; }

check-postgresql:
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || { echo "installing Debian's postgresql package for the eventsourcing benchmark"; \
	  apt-get update -qq >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null 2>&1; true; }
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || { echo "The eventsourcing benchmark needs PostgreSQL: install it with 'apt-get install postgresql'"; exit 1; }

# The azureblob offload tests run Azurite, Microsoft's Azure Storage emulator (Node.js), pinned by
# tools/azurite/package-lock.json and installed under .venv/azurite; Node.js and npm are installed when missing.
AZURITE := $(VENV)/azurite/node_modules/.bin/azurite-blob
check-azurite: $(STAMP)
	@[ -x $(AZURITE) ] && exit 0; \
	  command -v npm >/dev/null 2>&1 || { echo "installing Debian's nodejs and npm packages for the azureblob offload tests"; \
	    apt-get update -qq >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null 2>&1; true; }; \
	  command -v npm >/dev/null 2>&1 || { echo "The azureblob offload tests need Node.js and npm: install them with 'apt-get install nodejs npm'"; exit 1; }; \
	  echo "installing Azurite (tools/azurite/package-lock.json) for the azureblob offload tests"; \
	  mkdir -p $(VENV)/azurite && cp tools/azurite/package.json tools/azurite/package-lock.json $(VENV)/azurite/ && \
	  npm ci --silent --no-audit --no-fund --prefix $(VENV)/azurite >/dev/null \
	    || { echo "npm could not install Azurite (tools/azurite): the azureblob offload tests need it"; exit 1; }

run: $(STAMP)
	$(BIN)/magnetar standalone --data-dir $(DATA_DIR) --port $(PORT) --pulsar-port $(PULSAR_PORT)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

test: $(STAMP) check-java check-chromium check-zookeeper check-azurite lint
	$(BIN)/pytest -q

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

demo: $(STAMP) check-java
	$(BIN)/python -m demo.run_demo

crash: $(STAMP) check-zookeeper
	MAGNETAR_CRASH_ROUNDS=$${MAGNETAR_CRASH_ROUNDS:-300} $(BIN)/pytest -q tests/crash

# A longer seeded cluster simulation (bookie crashes, slow bookies, partitions, session expiry).
soak-cluster: $(STAMP)
	MAGNETAR_CLUSTER_SIM_ROUNDS=$${MAGNETAR_CLUSTER_SIM_ROUNDS:-200} $(BIN)/pytest -q tests/simulation/test_cluster_simulation.py

bench: $(STAMP) check-zookeeper check-postgresql
	$(BIN)/python bench/storage_bench.py --out bench/RESULTS.md
	$(BIN)/python bench/managed_ledger_bench.py --out bench/RESULTS.md
	$(BIN)/python bench/e2e_bench.py --out bench/RESULTS.md
	$(BIN)/python bench/spark_bench.py --out bench/RESULTS.md
	$(BIN)/python bench/cluster_bench.py --out bench/RESULTS.md
	$(BIN)/python bench/event_bench.py --out bench/RESULTS.md
	$(BIN)/python bench/binary_bench.py --out bench/RESULTS.md
	$(BIN)/python bench/ws_edge_floor.py --out bench/RESULTS.md
	$(BIN)/python bench/eventsourcing_bench.py --out bench/RESULTS.md
	$(BIN)/python bench/tiered_bench.py --out bench/RESULTS.md

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
