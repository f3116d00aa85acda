"""The cluster commands of ``magnetar``: ``bookie`` and ``broker``.

``magnetar bookie --data-dir D [--journal-dir J] --port P --metadata-store zk:HOST:PORT[/chroot]``
serves one storage over the network and registers it in ZooKeeper (``storage/bookie_process.py``).

``magnetar broker --metadata-store zk:HOST:PORT[/chroot] --port P [--config FILE]`` serves the
same HTTP and WebSocket API as ``magnetar standalone`` (HTTPS and WSS too, on ``--tls-port``,
with the TLS keys of ``--config``) with no local data: metadata in
ZooKeeper, ledgers on the registered bookies (default quorum E=2 Qw=2 Qa=2, per namespace
through the ``persistence`` policy), and a re-replication worker (``--no-autorecovery`` turns
it off). ``--config`` reads the same Pulsar keys as standalone (authentication, auto-creation).
Any number of brokers may share the ZooKeeper and the bookies: each owns namespace bundles
(``--default-bundles`` per namespace without a bundles policy, Pulsar's
``defaultNumberOfNamespaceBundles``) and sends clients to the owner of a topic it does not
serve; it is known to the others as ``--advertised-address`` (default: ``advertisedAddress``
of ``--config``, else the listen host, or 127.0.0.1 when that is 0.0.0.0) and its port.

Like Pulsar's brokers, each also speaks Pulsar's binary protocol on ``--pulsar-port`` (6650 by
default, ``brokerServicePort``; 0 = off; ``pulsar+ssl://`` too when the TLS keys are
configured): its ``pulsar://advertised-address:port`` URL is in its ownership nodes and load
reports, so any broker answers a binary LOOKUP for a topic another one serves with a Redirect to
the owner's URL (``api/pulsar/lookups.py``). Brokers sharing one host need a port each. With
Pulsar's ``advertisedListeners`` in ``--config``, the internal listener's URLs are the ones
published, together with every listener: a client naming a listener is answered that
listener's URLs of whichever broker owns its topic (``api/pulsar/listeners.py``).

Both shut down gracefully on SIGTERM or Ctrl-C. Server imports are loaded only when a command
runs, so the client commands keep starting quickly.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
from typing import Any

CLUSTER_COMMANDS = ("bookie", "broker")
LOG_LEVELS = ["critical", "error", "warning", "info", "debug"]


def add_cluster_commands(commands: Any) -> None:
    bookie = commands.add_parser("bookie", help="serve one storage to the cluster's brokers")
    bookie.add_argument("--data-dir", required=True, help="entry logs and index")
    bookie.add_argument("--journal-dir", help="journal (default DATA_DIR/journal; another disk is better)")
    bookie.add_argument("--host", default="0.0.0.0", help="listen address (default 0.0.0.0)")
    bookie.add_argument("--port", type=int, default=3181, help="listen port (default 3181)")
    bookie.add_argument("--advertised-address", help="host name brokers use to reach this bookie")
    bookie.add_argument("--metadata-store", required=True, help="zk:HOST:PORT[/chroot]")
    bookie.add_argument("--zk-session-timeout-s", type=float, default=10.0)
    bookie.add_argument("--log-level", default="info", choices=LOG_LEVELS)

    broker = commands.add_parser("broker", help="serve topics from the cluster's bookies (no local data)")
    broker.add_argument("--metadata-store", required=True, help="zk:HOST:PORT[/chroot]")
    broker.add_argument("--config", help="a broker configuration file (Pulsar's keys; see api/config.py)")
    broker.add_argument("--host", help="listen address (default 0.0.0.0)")
    broker.add_argument("--port", type=int, help="HTTP and WebSocket port (default 8080; 0 = off; webServicePort)")
    broker.add_argument("--tls-port", type=int,
                        help="HTTPS and WSS port (default 8443 with the TLS keys configured; 0 = off; "
                             "webServicePortTls)")
    broker.add_argument("--pulsar-port", type=int,
                        help="Pulsar binary protocol port (default 6650, Pulsar's brokerServicePort; 0 = off)")
    broker.add_argument("--advertised-address",
                        help="host name other brokers and clients use to reach this one (advertisedAddress)")
    broker.add_argument("--default-bundles", type=int, default=4,
                        help="bundles of a namespace without a bundles policy (defaultNumberOfNamespaceBundles, 4)")
    broker.add_argument("--load-report-interval-ms", type=int, default=2000)
    broker.add_argument("--ensemble-size", type=int, default=2, help="default bookkeeperEnsemble (2)")
    broker.add_argument("--write-quorum", type=int, default=2, help="default bookkeeperWriteQuorum (2)")
    broker.add_argument("--ack-quorum", type=int, default=2, help="default bookkeeperAckQuorum (2)")
    broker.add_argument("--no-autorecovery", action="store_true", help="run no re-replication worker here")
    broker.add_argument("--autorecovery-interval-ms", type=int, default=1000)
    broker.add_argument("--audit-interval-ms", type=int, default=60_000)
    broker.add_argument("--bookie-timeout-ms", type=int, default=5000, help="deadline of a bookie request")
    broker.add_argument("--zk-session-timeout-s", type=float, default=10.0)
    broker.add_argument("--log-level", default="info", choices=LOG_LEVELS)


def run_cluster_command(args: argparse.Namespace) -> int:
    return run_bookie(args) if args.command == "bookie" else run_broker(args)


def run_bookie(args: argparse.Namespace) -> int:
    from api.server_process import configure_logging
    from api.startup_checks import DataDirLock, Port, StartupError, check_ports_free, check_writable
    from broker.cluster import BookieProcessConfig, run_bookie

    configure_logging(args.log_level)
    try:  # one line and exit 2, before anything is opened, as magnetar standalone does
        check_ports_free(args.host, [Port(args.port, "bookiePort", "--port")])
        lock = DataDirLock(args.data_dir)  # held until the process ends
        if args.journal_dir is not None:
            check_writable(args.journal_dir, "journal directory", "--journal-dir")
    except StartupError as exc:
        print(f"magnetar bookie: {exc}", file=sys.stderr)
        return 2
    try:
        return run_bookie(BookieProcessConfig(
            data_dir=args.data_dir, metadata_store=args.metadata_store, port=args.port, journal_dir=args.journal_dir,
            host=args.host, advertised_address=args.advertised_address, session_timeout_s=args.zk_session_timeout_s))
    finally:
        lock.release()


def _broker_address(broker_id: str, web_url: str, host: str, pulsar: Any) -> Any:
    """How other brokers name this one (``BrokerAddress``): with ``advertisedListeners``, the
    internal listener's URLs and every listener (a lookup naming one answers its URLs), else
    the advertised host's."""
    from broker import BrokerAddress

    listeners = pulsar.advertised_listeners
    internal = next((one for one in listeners if one.name == pulsar.internal_listener_name), None)
    if internal is not None:
        return BrokerAddress(broker_id, web_url, internal.service_url, internal.service_url_tls, listeners)
    return BrokerAddress(broker_id, web_url, f"pulsar://{host}:{pulsar.port}" if pulsar.port else "",
                         f"pulsar+ssl://{host}:{pulsar.tls_port}" if pulsar.tls_enabled else "")


def run_broker(args: argparse.Namespace) -> int:
    import logging

    from api.app import create_app
    from api.config import ConfigError, StandaloneConfig
    from api.connection_guard import raise_file_limit
    from api.server_process import exit_cleanly, tune_runtime
    from api.startup_checks import Port, StartupError, check_ports_free
    from api.web_server import serve
    from broker import BrokerService, QuorumConfig
    from broker.cluster import AutoRecoveryConfig, BookieNetworkConfig, ClusterConfig, ClusterStorage, OwnershipConfig

    overrides = {key: str(value) for key, value in (("bindAddress", args.host), ("webServicePort", args.port),
                                                    ("webServicePortTls", args.tls_port),
                                                    ("brokerServicePort", args.pulsar_port))
                 if value is not None}
    try:
        config = StandaloneConfig.load(args.config, overrides)
        quorum = QuorumConfig(args.ensemble_size, args.write_quorum, args.ack_quorum)
        check_ports_free(config.host, [
            Port(config.port, "webServicePort", "--port"), Port(config.tls_port, "webServicePortTls", "--tls-port"),
            Port(config.pulsar.port, "brokerServicePort", "--pulsar-port"),
            Port(config.pulsar.tls_port, "brokerServicePortTls", "brokerServicePortTls in the config")])
    except (ConfigError, OSError, ValueError, StartupError) as exc:
        print(f"magnetar broker: {exc}", file=sys.stderr)
        return 2
    broker_config = dataclasses.replace(
        config.broker, managed_ledger=dataclasses.replace(config.broker.managed_ledger, quorum=quorum))
    autorecovery = None if args.no_autorecovery else AutoRecoveryConfig(
        interval_ms=args.autorecovery_interval_ms, audit_interval_ms=args.audit_interval_ms)
    host = args.advertised_address or config.pulsar.advertised_host or \
        ("127.0.0.1" if config.host in ("0.0.0.0", "::", "") else config.host)
    web_scheme, web_port = ("http", config.port) if config.port else ("https", config.tls_port)
    broker_id = f"{host}:{web_port}"
    if not 1 <= args.default_bundles <= 1024:
        print("magnetar broker: --default-bundles must be in 1..1024", file=sys.stderr)
        return 2
    # the binary listeners are named by the advertised host, in Connect answers and in the
    # Redirects other brokers give (through the ownership nodes and load reports)
    pulsar = dataclasses.replace(config.pulsar, advertised_host=host)
    address = _broker_address(broker_id, f"{web_scheme}://{broker_id}", host, pulsar)
    ownership = OwnershipConfig(address, default_bundles=args.default_bundles,
                                load_report_interval_ms=args.load_report_interval_ms)
    cluster = ClusterStorage(ClusterConfig(
        args.metadata_store, network=BookieNetworkConfig(request_timeout_ms=args.bookie_timeout_ms),
        autorecovery=autorecovery, session_timeout_s=args.zk_session_timeout_s,
        identifier=broker_id, ownership=ownership))
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    raise_file_limit()
    app = create_app(BrokerService(None, broker_config, cluster=cluster), auth=config.auth,
                     limits=config.limits, pulsar=pulsar)
    tune_runtime()
    signal.signal(signal.SIGTERM, exit_cleanly)
    serve(app, config, args.log_level)
    return 0
