"""The README's newcomer path, run as written: the "Your first hour" section and the Spark example.

The commands and code are read from README.md itself, so the README and this test cannot drift:

- the Spark example, saved as a file and run with the project's interpreter
  (``.venv/bin/python clicks.py``) with no ``PYSPARK_*`` variable and no virtualenv on ``PATH``
  (Spark's default ``python3`` is then not the project's), streams the three clicks into
  ``clicks-upper``, upper-cased;
- "Your first hour" runs block by block in bash: the ``make run PORT=… PULSAR_PORT=…
  DATA_DIR=…`` line starts the broker (on free ports and a temporary directory instead of 8081,
  6660 and ``/tmp/magnetar-first-hour``, the only substitutions; its log names both listeners),
  the commands of the next blocks run in one shell each, the broker is stopped as Ctrl-C stops
  it (SIGINT to its process group) and started again, and the last block runs with the variables
  the earlier ones exported (``HOME`` is a temporary directory holding the Spark example as
  ``clicks.py``, where the README says to save it). A comment line right after a command is its
  expected output (``...`` stands for anything) and must appear in what the command printed;
- the table of REST pull parameters under "REST consumers" names every query parameter a pull
  takes, with the defaults and bounds the broker applies (a new subscription at Latest, an
  Exclusive one, a 60 s negative-ack delay, ...);
- the filesystem driver's example under "Tiered storage" ("On one machine, without an object
  store"): its ``tiered.conf``, ``magnetar standalone`` with it, then its session (produce,
  offload, status SUCCESS, the objects in the directory, a consumer from earliest), and the
  topic read back whole once the bookie's copies are deleted.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from api.limits import PULL_MESSAGES_MAX, PULL_WAIT_MS_MAX
from api.rest_consume import ConsumerSettings, PullParams
from tests.integration.server import running_server
from tests.standalone import REPO_ROOT, free_port, read_all, standalone_process, wait_healthy
from tests.tls_material import write_rsa_key_pair

README = REPO_ROOT / "README.md"
FIRST_HOUR_PORT = "8081"
FIRST_HOUR_PULSAR_PORT = "6660"
FIRST_HOUR_DATA_DIR = "/tmp/magnetar-first-hour"
SPARK_RUN_TIMEOUT_S = 300
COMMAND_TIMEOUT_S = 600
STOP_TIMEOUT_S = 60


# --- reading the README -----------------------------------------------------------------------
def section(heading: str) -> str:
    """The README text under ``heading`` (a ``##`` or ``###`` line), up to the next heading of
    the same or a higher level outside a code block."""
    lines = README.read_text().splitlines(keepends=True)
    start = lines.index(f"{heading}\n") + 1
    level = len(heading.split(" ", 1)[0])
    fenced = False
    for end in range(start, len(lines)):
        fenced ^= lines[end].startswith("```")
        marks = len(lines[end]) - len(lines[end].lstrip("#"))
        if not fenced and 0 < marks <= level and lines[end][marks:marks + 1] == " ":
            return "".join(lines[start:end])
    return "".join(lines[start:])


def code_blocks(markdown: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", markdown, flags=re.MULTILINE | re.DOTALL)


def spark_example() -> str:
    blocks = code_blocks(section("### Spark Structured Streaming"), "python")
    assert len(blocks) == 1, "the Spark section should hold exactly one Python example"
    return blocks[0]


def rest_pull_table() -> dict[str, tuple[str, str]]:
    """The README's table of REST pull parameters: each parameter named in a row's first cell,
    with that row's default and note."""
    rows = re.findall(r"^\| (`[^|]+) \| ([^|]+) \| ([^|]*) \|$", section("### REST consumers"), flags=re.MULTILINE)
    return {name: (default, note) for names, default, note in rows for name in re.findall(r"`(\w+)`", names)}


def number(text: str) -> int:
    """The first number in ``text``, thousands separators and all (``60,000 ms``: 60000)."""
    found = re.search(r"\d[\d,]*", text)
    assert found is not None, text
    return int(found.group().replace(",", ""))


def commands_with_expected_output(block: str) -> list[tuple[str, str | None]]:
    """Each command line of a shell block with the comment line that follows it (its expected
    output), if any."""
    lines = [line for line in block.splitlines() if line.strip()]
    pairs: list[tuple[str, str | None]] = []
    for line in lines:
        if line.startswith("#"):
            assert pairs and pairs[-1][1] is None, f"a comment that follows no command: {line}"
            pairs[-1] = (pairs[-1][0], line.removeprefix("#").strip())
        else:
            pairs.append((line, None))
    return pairs


def expected_pattern(expected: str) -> str:
    return ".*".join(re.escape(part) for part in expected.split("..."))


# --- running it -----------------------------------------------------------------------------
def plain_environment(**extra: str) -> dict[str, str]:
    """This process's environment as a newcomer's shell would have it: no ``PYSPARK_*`` (the
    Spark tests set them in this process), no activated virtualenv, plus ``extra``."""
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    kept = {k: v for k, v in os.environ.items()
            if not k.startswith("PYSPARK_") and k not in ("VIRTUAL_ENV", "MAGNETAR_SERVICE_URL", "MAGNETAR_TOKEN")}
    return {**kept, "PATH": path, **extra}


def run(command: list[str], *, cwd: Path, env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run to the end (killed by PID after ``timeout_s``); the outcome with its output."""
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def run_block(pairs: list[tuple[str, str | None]], setup: list[str], env: dict[str, str]) -> None:
    """The commands in one bash (``set -e``) after ``setup``; each command's expected output
    must appear in what it printed."""
    script = ["set -euo pipefail", *setup]
    for index, (command, _) in enumerate(pairs):
        script += [f"printf '\\n::command {index}::\\n'", command]  # curl's answers end without a newline
    done = run(["bash", "-c", "\n".join(script)], cwd=REPO_ROOT, env=env, timeout_s=COMMAND_TIMEOUT_S)
    outputs = re.split(r"\n::command \d+::\n", done.stdout)[1:]
    assert done.returncode == 0 and len(outputs) == len(pairs), \
        f"exit {done.returncode} after {len(outputs)} of {len(pairs)} commands\n{done.stdout}\n{done.stderr[-4000:]}"
    for (command, expected), output in zip(pairs, outputs, strict=True):
        if expected is not None:
            assert re.search(expected_pattern(expected), output, flags=re.DOTALL), \
                f"{command}\nexpected: {expected}\nprinted: {output}"


@contextmanager
def started_as_written(line: str, env: dict[str, str], url: str, log: Path) -> Iterator[None]:
    """The ``make run`` line in its own process group; stopped as Ctrl-C stops it, by the
    group's id (the make process's PID), and killed if it has not ended in time."""
    with log.open("ab") as output:
        proc = subprocess.Popen(["bash", "-c", line], cwd=REPO_ROOT, env=env, stdout=output,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(f"{url}/healthz", proc)
        yield
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# --- the tests --------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_spark_example_streams_when_run_as_a_file_without_environment(tmp_path: Path) -> None:
    job = tmp_path / "clicks.py"
    job.write_text(spark_example())
    with standalone_process(tmp_path / "data") as (url, _):
        done = run([sys.executable, str(job)], cwd=tmp_path, env=plain_environment(MAGNETAR_SERVICE_URL=url),
                   timeout_s=SPARK_RUN_TIMEOUT_S)
        assert done.returncode == 0, done.stderr[-4000:]
        assert "3 clicks streamed into clicks-upper" in done.stdout
        copied = read_all(url, "/topics/persistent/public/default/clicks-upper")
    assert sorted((m["key"], m["payload"]) for m in copied) == [("u1", b"HOME"), ("u1", b"HOME"), ("u2", b"CART")]


@pytest.mark.slow
def test_the_first_hour_runs_as_written(tmp_path: Path) -> None:
    stale = subprocess.run(["make", "-q", ".venv/.installed-stamp"], cwd=REPO_ROOT, check=False)
    if stale.returncode != 0:
        pytest.fail("the virtualenv is older than pyproject.toml or constraints.txt: run make first")
    start, *sessions = code_blocks(section("## Your first hour"), "sh")
    assert len(sessions) == 3, "Your first hour: the make run line, the session, REST, after the restart"
    port, pulsar_port, data_dir = str(free_port()), str(free_port()), tmp_path / "first-hour-data"

    def as_here(text: str) -> str:
        return (text.replace(FIRST_HOUR_PORT, port).replace(FIRST_HOUR_PULSAR_PORT, pulsar_port)
                .replace(FIRST_HOUR_DATA_DIR, str(data_dir)))

    assert start.strip() == (f"make run PORT={FIRST_HOUR_PORT} PULSAR_PORT={FIRST_HOUR_PULSAR_PORT} "
                             f"DATA_DIR={FIRST_HOUR_DATA_DIR}")
    home = tmp_path / "home"
    home.mkdir()
    (home / "clicks.py").write_text(spark_example())
    env, url, log = plain_environment(HOME=str(home)), f"http://127.0.0.1:{port}", tmp_path / "broker.log"
    before_restart = [pair for block in sessions[:2] for pair in commands_with_expected_output(as_here(block))]
    variables = [command for command, _ in before_restart if re.match(r"(export )?\w+=", command)]
    with started_as_written(as_here(start), env, url, log):
        run_block(before_restart, [], env)
    with started_as_written(as_here(start), env, url, log):
        run_block(commands_with_expected_output(as_here(sessions[2])), variables, env)
    assert f"Magnetar's web service listening on http://0.0.0.0:{port} (console: http://localhost:{port}/console)" \
        in log.read_text()  # a wildcard address is no URL to open
    assert f"Pulsar's binary protocol listening on pulsar://0.0.0.0:{pulsar_port}" in log.read_text()
    assert "Shutting down" in log.read_text()  # Ctrl-C stopped it gracefully, twice
    assert log.read_text().count("Application shutdown complete") == 2


def test_the_readme_states_the_rest_pull_defaults_the_broker_applies(tmp_path: Path) -> None:
    table = rest_pull_table()
    assert sorted(table) == sorted(PullParams.model_json_schema(by_alias=True)["properties"])  # all, no others
    params = PullParams.model_validate({})
    config = ConsumerSettings.of(params).consumer_config("sub", 1)
    assert (number(table["maxMessages"][0]), number(table["maxMessages"][1])) == (params.max_messages,
                                                                                  PULL_MESSAGES_MAX)
    assert (number(table["waitTimeMs"][0]), number(table["waitTimeMs"][1])) == (params.wait_time_ms, PULL_WAIT_MS_MAX)
    assert table["subscriptionInitialPosition"][0] == f"`{params.initial_position}`"
    assert number(table["ackTimeoutMillis"][0]) == config.ack_timeout_ms
    assert number(table["negativeAckRedeliveryDelay"][0]) == config.negative_ack_redelivery_delay_ms
    assert table["maxRedeliverCount"][0].startswith("off") and config.max_redeliver_count == 0
    topic = "/topics/persistent/public/default/pull-defaults"
    with running_server(str(tmp_path / "data")) as (url, _), httpx.Client(base_url=url, timeout=30) as client:
        assert client.post(topic, json={"messages": [{"payload": "before"}]}).status_code == 200
        first = client.post(f"{topic}/subscription/newcomer/pull")  # no body, no parameters
        assert first.status_code == 200 and first.json()["messages"] == []  # created at Latest
        stats = client.get("/admin/v2/persistent/public/default/pull-defaults/stats").json()
    assert f"`{stats['subscriptions']['newcomer']['type']}`" == table["subscriptionType"][0]


def run_python_example(heading: str, script: Path, url: str, runs: int) -> list[list[str]]:
    """The one Python block under ``heading``, saved as ``script`` with the broker's URL put in
    (the only substitution) and run ``runs`` times with the project's interpreter: each run's
    output lines (every run must succeed)."""
    blocks = code_blocks(section(heading), "python")
    assert len(blocks) == 1, f"{heading} should hold exactly one Python example"
    script.write_text(blocks[0].replace("http://localhost:8080", url))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    outputs = []
    for _ in range(runs):
        done = subprocess.run([sys.executable, str(script)], check=False, cwd=script.parent, capture_output=True,
                              text=True, timeout=COMMAND_TIMEOUT_S, env=env)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.splitlines())
    return outputs


def test_the_event_stream_example_runs_as_written(tmp_path: Path) -> None:
    """The Python block of "Event sourcing: streams per key", run twice against a broker: it
    rebuilds the balance from the stream, appends against the version it read, and reads that
    append back from a stream reader; the second run finds the first's events and versions go on."""
    with standalone_process(tmp_path / "data") as (url, _):
        outputs = run_python_example("## Event sourcing: streams per key", tmp_path / "account.py", url, 2)
    assert outputs[0] == ["balance 15 at version 1", "2 b'withdrew 3'"], outputs[0]
    assert outputs[1] == ["balance 27 at version 4", "5 b'withdrew 3'"], outputs[1]


def test_the_eventsourcing_example_runs_as_written(tmp_path: Path) -> None:
    """The "Event sourcing with the eventsourcing library" example, saved as a file and run with
    the project's interpreter against a broker (its URL the only substitution)."""
    with standalone_process(tmp_path / "data") as (url, _):
        # and again: a second run appends to the same topic
        run_python_example("## Event sourcing with the eventsourcing library", tmp_path / "dogs.py", url, 2)
        events = read_all(url, "/topics/persistent/public/default/dogschool-events")
        assert [m["properties"]["es-version"] for m in events] == ["1", "2", "3"] * 2


def test_the_dcb_section_runs_in_its_order(tmp_path: Path) -> None:
    """"Event sourcing: dynamic consistency boundaries" top to bottom on a new broker: each
    ``curl`` prints what the comment after it shows (``...`` standing for anything), then the
    Python block subscribes student-3, and run again finds the course full."""
    text = section("## Event sourcing: dynamic consistency boundaries")
    (shell,) = code_blocks(text, "sh")
    steps = re.findall(r"^(curl .*?)\n# (.*?)$", shell, flags=re.MULTILINE | re.DOTALL)
    assert len(steps) == 3, "the DCB section's shell block: three curl commands, each with its answer"
    with standalone_process(tmp_path / "data") as (url, _):
        for command, answer in steps:
            done = run(["bash", "-c", command.replace("localhost:8080", url)], cwd=tmp_path, env=plain_environment(),
                       timeout_s=COMMAND_TIMEOUT_S)
            pattern = ".*".join(re.escape(part) for part in answer.split("..."))
            assert done.returncode == 0 and re.fullmatch(pattern, done.stdout.strip()), (answer, done.stdout)
        outputs = run_python_example("## Event sourcing: dynamic consistency boundaries", tmp_path / "course.py",
                                     url, 2)
    assert outputs == [["student-3 subscribed at position 3"], ["course-7 is full"]], outputs


def test_the_cli_examples_run_as_written(tmp_path: Path) -> None:
    """The CLI block under "REST consumers", in one bash against a standalone broker, its URL in
    ``MAGNETAR_SERVICE_URL`` (the only substitution) and ``HOME`` a temporary directory: every
    command succeeds, perf's messages all arrive, and the secret key is written where the block
    says, not into the working tree."""
    blocks = [b for b in code_blocks(section("### REST consumers"), "sh") if b.startswith("source .venv/bin/activate")]
    assert len(blocks) == 1, "the CLI example should be one block that starts by activating the virtualenv"
    with standalone_process(tmp_path / "data") as (url, _):
        run_block(commands_with_expected_output(blocks[0]), [],
                  plain_environment(HOME=str(tmp_path), MAGNETAR_SERVICE_URL=url))
        stats = httpx.get(f"{url}/admin/v2/persistent/public/default/orders/stats", timeout=30).json()
    assert stats["msgInCounter"] == 20_000, stats  # perf's; the unload before it started the counters again
    assert (tmp_path / "magnetar-secret.key").stat().st_size == 32
    assert not (REPO_ROOT / "secret.key").exists()


def test_the_event_stream_section_runs_in_its_order(tmp_path: Path) -> None:
    """"Event sourcing: streams per key" top to bottom on a new broker, as a newcomer reads it:
    the ``curl`` append (its result as the comment shows it), the Python block (which rebuilds
    the events the ``curl`` wrote too), then the CLI block (its expected version is the one the
    two left; ``--follow`` is left out, it waits for new events until stopped): every step
    succeeds and the stream holds what they wrote, in order."""
    text = section("## Event sourcing: streams per key")
    shell = code_blocks(text, "sh")
    curl = shell[0].split("\n#", 1)[0]  # the command; the comments after it are its answers
    with standalone_process(tmp_path / "data") as (url, _):
        appended = run(["bash", "-c", curl.replace("localhost:8080", url)], cwd=tmp_path, env=plain_environment(),
                       timeout_s=COMMAND_TIMEOUT_S)
        assert appended.returncode == 0 and '"keyVersion":1' in appended.stdout, appended.stdout + appended.stderr
        outputs = run_python_example("## Event sourcing: streams per key", tmp_path / "account.py", url, 1)
        assert outputs[0] == ["balance 25 at version 3", "4 b'withdrew 3'"], outputs[0]
        cli = [line.split("  #")[0] for line in shell[1].splitlines() if line.strip() and "--follow" not in line]
        run_block([(line, None) for line in cli], ["source .venv/bin/activate"],
                  plain_environment(HOME=str(tmp_path), MAGNETAR_SERVICE_URL=url))
        events = httpx.get(f"{url}/topics/persistent/public/default/accounts/keys/acct-7/messages", timeout=30).json()
    assert [base64.b64decode(m["payload"]) for m in events["messages"]] == [
        b"deposited 0", b"deposited 10", b"deposited 10", b"deposited 5", b"withdrew 3", b"withdrew 2"]


# --- the cluster section --------------------------------------------------------------------------
def command_lines(block: str) -> list[str]:
    """A shell block's commands: a line ending in ``\\`` or ``|`` joined with the next, comment
    lines left out (a comment after a command stays: bash ignores it)."""
    joined = re.sub(r"\|\n\s*", "| ", block.replace("\\\n", " "))
    return [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def cluster_blocks() -> tuple[list[str], list[str], str]:
    """The cluster section's two shell blocks (as command lines, a ``\\`` continuation joined)
    and its Python block."""
    text = section("## A cluster: bookies and ZooKeeper")
    shell = [command_lines(b) for b in code_blocks(text, "sh")]
    python = code_blocks(text, "python")
    assert len(shell) == 2 and len(python) == 1, "the cluster section: two shell blocks and one Python block"
    return shell[0], shell[1], python[0]


@contextmanager
def background(command: str, env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``command`` (a server) running in bash until the block ends, stopped by its group's id."""
    with log.open("ab") as output:
        proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=REPO_ROOT, env=env, stdout=output,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_bookies(url: str, count: int) -> None:
    deadline = time.monotonic() + COMMAND_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if len(httpx.get(f"{url}/admin/v2/bookies/all", timeout=10).json()["bookies"]) >= count:
                return
        time.sleep(0.2)
    raise AssertionError(f"{url} did not see {count} bookies")


@pytest.mark.slow
def test_the_cluster_section_runs_with_debians_zookeeper(tmp_path: Path) -> None:
    """"A cluster: bookies and ZooKeeper" as written, on this machine: Debian's ZooKeeper started
    by the section's ``zkServer.sh`` command (with a copy of the package's ``zoo.cfg`` on a free
    port and a temporary ``dataDir``), three bookies and a broker as its lines start them, the
    persistence policy it sets, then the two brokers of "Many brokers", its lookup, redirect,
    brokers list and bundle unload, and its Python client. The only substitutions: ports (free
    ones), paths (temporary), the host names (127.0.0.1; the second broker on ports of its own, as
    brokers sharing a host need), and the ZooKeeper configuration file given to ``zkServer.sh``."""
    first, many, python = cluster_blocks()
    zk_port, ports = free_port(), {name: free_port() for name in ("3181", "3182", "3183", "a", "b", "pa", "pb")}
    conf = tmp_path / "zookeeper"
    (conf / "data").mkdir(parents=True)
    (conf / "zoo.cfg").write_text(re.sub(r"(?m)^(dataDir|clientPort)=.*$", "", Path(
        "/etc/zookeeper/conf/zoo.cfg").read_text()) + f"dataDir={conf / 'data'}\nclientPort={zk_port}\n")
    a, b = f"127.0.0.1:{ports['a']}", f"127.0.0.1:{ports['b']}"

    def here(line: str) -> str:
        line = line.replace("zk:127.0.0.1:2181", f"zk:127.0.0.1:{zk_port}")
        line = line.replace("/disk1/", f"{tmp_path}/disk1/").replace("/disk2/", f"{tmp_path}/disk2/")
        for bookie in ("3181", "3182", "3183"):
            line = line.replace(f"--port {bookie}", f"--port {ports[bookie]}")
        if "--advertised-address host-b" in line:
            line = line.replace("--port 8080", f"--port {ports['b']} --pulsar-port {ports['pb']}")
        line = line.replace("--port 8080", f"--port {ports['a']} --pulsar-port {ports['pa']}")
        line = re.sub(r"--advertised-address host-[ab]", "--advertised-address 127.0.0.1", line)
        return line.replace("localhost:8080", a).replace("host-a:8080", a).replace("host-b:8080", b)

    env = plain_environment(ZOO_LOG_DIR=str(conf), HOME=str(tmp_path))
    env["PATH"] = f"{REPO_ROOT / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"  # the section's magnetar
    zk_start = next(line for line in first if "zkServer.sh start" in line).split("  #")[0]
    started = run(["bash", "-c", here(zk_start) + f" {conf / 'zoo.cfg'}"], cwd=tmp_path, env=env,
                  timeout_s=COMMAND_TIMEOUT_S)
    assert started.returncode == 0 and "STARTED" in started.stdout, started.stdout + started.stderr
    try:
        with contextlib.ExitStack() as bookies:
            for line in first:
                if line.startswith("magnetar bookie"):
                    bookies.enter_context(background(here(line), env, tmp_path / "bookies.log"))
            broker_line = next(line for line in first if line.startswith("magnetar broker"))
            with background(here(broker_line), env, tmp_path / "broker.log") as broker:
                wait_healthy(f"http://{a}/healthz", broker)
                wait_bookies(f"http://{a}", 3)
                run_block([(here(line), None) for line in first if line.startswith("curl ")], [], env)
            with contextlib.ExitStack() as servers:
                brokers = [servers.enter_context(background(here(line), env, tmp_path / "brokers.log"))
                           for line in many if line.startswith("magnetar broker")]
                for url, proc in zip((a, b), brokers, strict=True):
                    wait_healthy(f"http://{url}/healthz", proc)
                run_block([(here(line), None) for line in many if not line.startswith("magnetar broker")], [], env)
                script = tmp_path / "clicks_client.py"
                script.write_text("import pulsar\n" + python.replace("pulsar://host-a:6650",
                                                                     f"pulsar://127.0.0.1:{ports['pa']}")
                                  + "client.close()\n")
                sent = run([sys.executable, str(script)], cwd=tmp_path, env=env, timeout_s=COMMAND_TIMEOUT_S)
                assert sent.returncode == 0, sent.stderr
                stats = httpx.get(f"http://{a}/admin/v2/persistent/public/default/clicks/stats", timeout=30,
                                  follow_redirects=True).json()
                assert stats["msgInCounter"] >= 1, stats  # the Python client's, on the broker serving clicks
    finally:
        run(["bash", "-c", here(zk_start).replace(" start", " stop") + f" {conf / 'zoo.cfg'}"], cwd=tmp_path,
            env=env, timeout_s=COMMAND_TIMEOUT_S)


# --- "Producing and consuming", top to bottom -------------------------------------------------------
CLIENT_LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ (INFO|WARN|ERROR|DEBUG) ")
"""A line the official client logs to stdout (its default logger), not one the example prints."""


def printed_expectations(block: str) -> list[str]:
    """The comment after each ``print(...)`` line of a Python block: what that line prints."""
    return [line.split("  # ", 1)[1].strip() for line in block.splitlines()
            if line.lstrip().startswith("print(") and "  # " in line]


def test_producing_and_consuming_runs_in_its_order(tmp_path: Path) -> None:
    """Every block of "Producing and consuming" (and its "REST consumers" part) in README order,
    but the CLI and Spark ones (tested above)
    on a new broker: each Python block saved as a file and run with the project's interpreter,
    the shell block in bash: each succeeds and prints what its comments say (``...``: anything).
    The substitutions: the broker's URLs, and the key pair the encryption example reads from
    ``public.pem`` and ``private.pem`` written where it runs."""
    text = section("## Producing and consuming")
    blocks = re.findall(r"^```(python|sh)\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    assert [kind for kind, _ in blocks] == ["python", "python", "sh", "python", "python", "sh", "python"], \
        "the section's blocks: official client, encryption, REST produce, WebSocket, Python client, CLI, Spark"
    write_rsa_key_pair(tmp_path)  # the key pair the encryption example reads
    port = free_port()
    with standalone_process(tmp_path / "data", "--pulsar-port", str(port)) as (url, _):
        host = url.split("://", 1)[1]

        def here(code: str) -> str:
            return code.replace("pulsar://localhost:6650", f"pulsar://127.0.0.1:{port}").replace(
                "localhost:8080", host)

        for index, (kind, block) in enumerate(blocks[:5]):  # the CLI and Spark blocks have tests of their own
            if kind == "sh":
                run_block([(here(c), e) for c, e in commands_with_expected_output(block.replace("\\\n", " "))],
                          [], plain_environment())
                continue
            script = tmp_path / f"block_{index}.py"
            script.write_text(here(block))
            done = run([sys.executable, str(script)], cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout_s=COMMAND_TIMEOUT_S)
            assert done.returncode == 0, f"block {index}:\n{block}\n{done.stderr[-3000:]}"
            expected = printed_expectations(block)
            printed = [line for line in done.stdout.splitlines() if not CLIENT_LOG_LINE.match(line)]
            assert len(printed) == len(expected), (block, printed)
            for wanted, line in zip(expected, printed, strict=True):
                assert re.fullmatch(expected_pattern(wanted), line), f"expected {wanted!r}, printed {line!r}"


def test_the_storage_example_runs_as_written(tmp_path: Path) -> None:
    """"Using the storage directly", saved as a file and run in an empty directory (its
    ``./data/bookie`` is made there), with each expression's value printed: the values its
    comments give."""
    blocks = code_blocks(section("## Using the storage directly"), "python")
    assert len(blocks) == 1
    lines = blocks[0].splitlines()
    shown = [re.sub(r"^(\s+)(st\.get_entry\(1, -?\d\)|st\.get_last_add_confirmed\(1\))", r"\1print(repr(\2))", line)
             for line in lines]
    (tmp_path / "storage_example.py").write_text("\n".join(shown) + "\n")
    done = run([sys.executable, "storage_example.py"], cwd=tmp_path,
               env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout_s=COMMAND_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["b'hello'", "b'hello'", "0"]


# --- "Tiered storage": the filesystem driver on one machine ----------------------------------------
TIERED_OFFLOAD_DIR = "/tmp/magnetar-offload"
TIERED_DATA_DIR = "/tmp/magnetar-tiered"


def tiered_blocks() -> tuple[str, str, str]:
    """The filesystem example: its ``tiered.conf``, the line that starts the broker, the session."""
    text = section("### On one machine, without an object store")
    conf, shell = code_blocks(text, "properties"), code_blocks(text, "sh")
    assert len(conf) == 1 and len(shell) == 2, "tiered.conf, the standalone line, the session"
    return conf[0], shell[0].strip(), shell[1]


def test_the_filesystem_offload_example_runs_as_written(tmp_path: Path) -> None:
    """"On one machine, without an object store" as written: its lines saved as ``tiered.conf``,
    ``magnetar standalone`` started with it, the session's commands in one bash, each printing
    what its comment says (the offload ends in SUCCESS, the directory holds the ledgers'
    objects, a consumer from earliest gets every message). Then the bookie's copies of the
    offloaded ledgers are gone (a deletion lag of 0) and the topic still reads back whole, in
    order, from the directory. The substitutions: the two /tmp paths (temporary ones), the
    config file's path, and free ports for the broker's listeners (its URL in
    ``MAGNETAR_SERVICE_URL``)."""
    conf, start, session = tiered_blocks()
    offload_dir, data_dir = tmp_path / "offload", tmp_path / "data"

    def here(text: str) -> str:
        return text.replace(TIERED_OFFLOAD_DIR, str(offload_dir)).replace(TIERED_DATA_DIR, str(data_dir))

    (tmp_path / "tiered.conf").write_text(here(conf))
    port, pulsar_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    assert start == f"magnetar standalone --config tiered.conf --data-dir {TIERED_DATA_DIR}"
    line = here(start).replace("tiered.conf", str(tmp_path / "tiered.conf"))
    env = plain_environment(HOME=str(tmp_path), MAGNETAR_SERVICE_URL=url)
    env["PATH"] = f"{REPO_ROOT / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"  # the section's magnetar
    with background(f"{line} --port {port} --pulsar-port {pulsar_port}", env, tmp_path / "broker.log") as broker:
        wait_healthy(f"{url}/healthz", broker)
        run_block([(here(c), e) for c, e in commands_with_expected_output(session)], [], env)
        offloaded = wait_bookie_copies_deleted(f"{url}/admin/v2/persistent/public/default/clicks/internalStats")
        assert len(offloaded) >= 2, offloaded
        assert sorted(p.name.split("-")[0] for p in offload_dir.rglob("*-index")) == [str(i) for i in offloaded]
        clicks = read_all(url, "/topics/persistent/public/default/clicks")
    assert [(m["offset"], m["payload"]) for m in clicks] == [(i, b"click") for i in range(300)]


def wait_bookie_copies_deleted(stats_url: str) -> list[int]:
    """The offloaded ledgers' ids, once every one of them is ``bookkeeperDeleted``."""
    deadline = time.monotonic() + COMMAND_TIMEOUT_S
    while time.monotonic() < deadline:
        ledgers = httpx.get(stats_url, timeout=30).json()["ledgers"]
        offloaded = [ledger for ledger in ledgers if ledger["offloaded"]]
        if offloaded and all(ledger["bookkeeperDeleted"] for ledger in offloaded):
            return [ledger["ledgerId"] for ledger in offloaded]
        time.sleep(0.2)
    raise AssertionError(f"the bookie kept offloaded ledgers: {ledgers}")
