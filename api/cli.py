"""The ``magnetar`` command line.

``magnetar standalone [--config FILE] [--data-dir DIR] [--host HOST] [--port PORT]`` runs the
broker with its embedded storage and the HTTP API in one process (``make run`` uses ``./data``
and :8080). ``--config`` reads Pulsar's ``standalone.conf`` keys (authentication, token keys,
superusers, auto-creation; see ``api/config.py``); the flags override it. SIGTERM or Ctrl-C shut
it down gracefully: flush, checkpoint, close. The client commands (``produce``, ``consume``,
``read-stream``, ``admin``, ``perf``, ``tokens``) live with the clients, in ``consumers/cli/``; the cluster's
``bookie`` and ``broker`` in ``api/cli_cluster.py``. The server's imports are loaded only by the
server commands so that client commands start quickly. ``--journal-dir`` puts the embedded
bookie's journal on another disk (Pulsar's ``journalDirectory``). ``--pulsar-port`` is where
Pulsar's binary protocol listens (``pulsar://``, 6650 by default, 0 = off; ``pulsar+ssl://`` on
6651 when ``tlsCertificateFilePath`` and ``tlsKeyFilePath`` are configured). With those keys the
web service also serves HTTPS and WSS on ``--tls-port`` (8443, ``webServicePortTls``); ``--port
0`` turns plain HTTP off (``api/web_server.py`` runs the listeners). Before anything starts, the
data directory is locked for the process and the ports are checked (``api/startup_checks.py``):
a problem there is one line on stderr and exit code 2. ``magnetar --version`` prints the version.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import signal
import sys

from api.cli_cluster import CLUSTER_COMMANDS, add_cluster_commands, run_cluster_command
from consumers.cli import add_client_commands, run_client_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="magnetar", description="Magnetar message broker")
    parser.add_argument("--version", action="version", version=f"magnetar {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    standalone = commands.add_parser("standalone", help="run broker + embedded storage + HTTP API")
    standalone.add_argument("--config", help="a standalone.conf file (Pulsar's keys; see api/config.py)")
    standalone.add_argument("--data-dir", help="data directory (default ./data)")
    standalone.add_argument("--journal-dir", help="journal directory (default DATA_DIR/bookie/journal)")
    standalone.add_argument("--host", help="listen address (default 0.0.0.0)")
    standalone.add_argument("--port", type=int, help="HTTP and WebSocket port (default 8080; 0 = off; webServicePort)")
    standalone.add_argument("--tls-port", type=int,
                            help="HTTPS and WSS port (default 8443 with the TLS keys configured; 0 = off; "
                                 "webServicePortTls)")
    standalone.add_argument("--pulsar-port", type=int,
                            help="Pulsar binary protocol port (default 6650; 0 = off; brokerServicePort)")
    standalone.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    add_client_commands(parser, commands)
    add_cluster_commands(commands)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("magnetar")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def run_standalone(args: argparse.Namespace) -> int:
    from api.app import create_app
    from api.config import ConfigError, StandaloneConfig
    from api.connection_guard import raise_file_limit
    from api.server_process import configure_logging, exit_cleanly, tune_runtime
    from api.startup_checks import DataDirLock, Port, StartupError, check_ports_free, check_writable
    from api.web_server import serve
    from broker import BrokerService

    configure_logging(args.log_level)
    overrides = {key: str(value) for key, value in
                 (("dataDir", args.data_dir), ("bindAddress", args.host), ("webServicePort", args.port),
                  ("webServicePortTls", args.tls_port), ("journalDirectory", args.journal_dir),
                  ("brokerServicePort", args.pulsar_port))
                 if value is not None}
    try:
        config = StandaloneConfig.load(args.config, overrides)
        check_ports_free(config.host, [  # first: a refused start leaves no data directory behind
            Port(config.port, "webServicePort", "--port (make run: PORT=)"),
            Port(config.tls_port, "webServicePortTls", "--tls-port"),
            Port(config.pulsar.port, "brokerServicePort", "--pulsar-port (make run: PULSAR_PORT=)"),
            Port(config.pulsar.tls_port, "brokerServicePortTls", "brokerServicePortTls in the config")])
        data_dir_lock = DataDirLock(config.data_dir)  # held until the process ends
        if config.journal_dir is not None:
            check_writable(config.journal_dir, "journal directory", "--journal-dir (or journalDirectory)")
    except (ConfigError, OSError, StartupError) as exc:
        print(f"magnetar standalone: {exc}", file=sys.stderr)
        return 2
    raise_file_limit()  # before the app sizes its connection bound under the descriptor limit
    app = create_app(BrokerService(config.data_dir, config.broker, journal_dir=config.journal_dir),
                     auth=config.auth, limits=config.limits, pulsar=config.pulsar)
    tune_runtime()
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal to the handler that
    # was installed before it: exit 0 after a graceful shutdown rather than die by the signal.
    signal.signal(signal.SIGTERM, exit_cleanly)
    serve(app, config, args.log_level)
    data_dir_lock.release()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "standalone":
        return run_standalone(args)
    if args.command in CLUSTER_COMMANDS:
        return run_cluster_command(args)
    return run_client_command(args)


if __name__ == "__main__":
    sys.exit(main())
