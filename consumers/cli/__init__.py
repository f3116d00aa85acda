"""The ``magnetar`` client commands: ``produce``, ``consume``, ``admin``, ``perf``, ``tokens``.

Role: command-line front ends of ``consumers.client`` in the shape of Pulsar's ``pulsar-client``,
``pulsar-admin``, ``pulsar-perf`` and ``pulsar tokens``; they reach a broker over the network
only, so they work against any running broker. ``magnetar standalone`` (the server) lives in
``api/cli.py``, which hands every other command here. One module per command family:
``messages.py`` (produce, consume), ``streams.py`` (read-stream), ``admin.py``, ``perf.py``,
``tokens.py``; ``options.py`` holds what they share.
"""

from __future__ import annotations

import argparse
from typing import Any

from consumers.cli.admin import add_admin_commands
from consumers.cli.messages import add_message_commands
from consumers.cli.options import add_connection_options, connection_parent, run_client_command
from consumers.cli.perf import add_perf_commands
from consumers.cli.streams import add_stream_commands
from consumers.cli.tokens import add_token_commands


def add_client_commands(parser: argparse.ArgumentParser, commands: Any) -> None:
    """Register produce, consume, read-stream, admin, perf and tokens on ``magnetar``'s subcommands."""
    add_connection_options(parser, top_level=True)
    connection = connection_parent()
    add_message_commands(commands, connection)
    add_stream_commands(commands, connection)
    add_admin_commands(commands, connection)
    add_perf_commands(commands, connection)
    add_token_commands(commands)


__all__ = ["add_client_commands", "run_client_command"]
