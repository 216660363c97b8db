"""The options of every command that talks to a controller, defined once.

``--controller HOST:PORT``  default ``$STOKE_CONTROLLER``, else 127.0.0.1:50051
``--token-file FILE``       default: the token in ``$STOKE_TOKEN`` (none: no auth)
``--tls-ca FILE``           TLS, trusting this CA certificate
``--tls``                   TLS with the system's trusted roots

The environment is read when the command runs (not when the parser is
built), so ``STOKE_CONTROLLER=host:port stoke plan --remote`` works like
every other client command. `connect(args)` opens the client.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from foundation import validate as check
from foundation.errors import UserError

DEFAULT_CONTROLLER = "127.0.0.1:50051"
ENV_CONTROLLER = "STOKE_CONTROLLER"
ENV_TOKEN = "STOKE_TOKEN"


def add_client_options(p: argparse.ArgumentParser, *, group_title: str = "controller connection") -> None:
    g = p.add_argument_group(group_title)
    g.add_argument(
        "--controller",
        metavar="HOST:PORT",
        default=None,
        help=f"controller address (default ${ENV_CONTROLLER}, else {DEFAULT_CONTROLLER})",
    )
    g.add_argument("--token-file", metavar="FILE", help=f"bearer token file (default: the token in ${ENV_TOKEN})")
    g.add_argument("--tls-ca", metavar="FILE", help="use TLS, trusting this CA certificate")
    g.add_argument("--tls", action="store_true", help="use TLS with the system's trusted roots")


def controller_address(args: argparse.Namespace) -> str:
    """--controller, else $STOKE_CONTROLLER, else the default; also stored back in ``args.controller``.

    Checked up front (HOST:PORT, a port from 1 to 65535): gRPC would take "localhost" or "host:99999" and only
    say later that nothing listens there."""
    given = getattr(args, "controller", None)
    address = given or os.environ.get(ENV_CONTROLLER) or DEFAULT_CONTROLLER
    check.address(
        address,
        "--controller" if given else f"${ENV_CONTROLLER}",
        error=UserError,
        fix=f"the controller listens on port {DEFAULT_CONTROLLER.rsplit(':', 1)[1]} unless its listen says otherwise",
    )
    args.controller = address
    return address


def connect(args: argparse.Namespace) -> Any:
    """A `ControllerClient` for the client options of `args`."""
    from controller.api.auth import read_token
    from controller.api.client import ControllerClient

    token = read_token(getattr(args, "token_file", None))
    return ControllerClient(
        controller_address(args),
        token=token,
        tls_ca=getattr(args, "tls_ca", None),
        tls=bool(getattr(args, "tls", False)),
    )
