"""The ``magnetar`` command line.

``magnetar standalone [--data-dir DIR] [--host HOST] [--port PORT]`` runs the broker with its
embedded storage and the HTTP API in one process (``make run`` uses ``./data`` and :8080).
SIGTERM or Ctrl-C shut it down gracefully: flush, checkpoint, close.
"""

from __future__ import annotations

import argparse
import signal
import sys

import uvicorn

from api.app import SERVER_OPTIONS, create_app
from broker.service import BrokerService


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="magnetar", description="Magnetar message broker")
    commands = parser.add_subparsers(dest="command", required=True)
    standalone = commands.add_parser("standalone", help="run broker + embedded storage + HTTP API")
    standalone.add_argument("--data-dir", default="./data", help="data directory (default ./data)")
    standalone.add_argument("--host", default="0.0.0.0", help="listen address (default 0.0.0.0)")
    standalone.add_argument("--port", type=int, default=8080, help="listen port (default 8080)")
    standalone.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return parser


def _exit_cleanly(signum: int, _frame: object) -> None:
    raise SystemExit(0)


def run_standalone(args: argparse.Namespace) -> int:
    app = create_app(BrokerService(args.data_dir))
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal to the handler that
    # was installed before it: exit 0 after a graceful shutdown rather than die by the signal.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, **SERVER_OPTIONS)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "standalone":
        return run_standalone(args)
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
