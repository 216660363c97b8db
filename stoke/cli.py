"""The `stoke` command line: a thin layer over every package below it.

Each command group lives in `stoke.commands.<group>` and exposes
`register(subparsers)`, which adds its sub-commands with `set_defaults(run=fn)`;
`fn(args) -> int` returns the exit code. A `foundation.errors.StokeError` raised
anywhere below is printed here as one line (exit code 2).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from foundation.errors import StokeError
from stoke import __version__

#: Command-group modules, in the order `stoke --help` lists them.
COMMAND_MODULES = (
    "stoke.commands.core",
    "stoke.commands.triton",
    "stoke.commands.load",
    "stoke.commands.daemons",
    "stoke.commands.control",
    "stoke.commands.tokens",
    "stoke.commands.demo",
    "stoke.commands.alerts",
    "stoke.commands.report",
    "stoke.commands.device",
    "stoke.commands.train",
    "stoke.commands.k8s",
    "stoke.commands.completion",
)

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stoke",
        description="Interference-aware provisioning of GPU inference (NVIDIA Triton) and distributed training.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"stoke {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def quiet_grpc_core() -> None:
    """gRPC's C core writes its own log lines to stderr (a failed TLS handshake: an INFO line of
    ssl_transport_security.cc before stoke's message says the same in plain words): keep its errors only, unless
    the user set GRPC_VERBOSITY. Read when grpc is first imported, so before any command runs."""
    if not os.environ.get("GRPC_VERBOSITY"):
        os.environ["GRPC_VERBOSITY"] = "ERROR"


def main(argv: Sequence[str] | None = None) -> int:
    quiet_grpc_core()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except StokeError as err:  # the one place stoke's errors become a message and an exit code
        print(f"stoke: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("stoke: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and closed early: not an error
        sys.stderr.close()
        return 0
