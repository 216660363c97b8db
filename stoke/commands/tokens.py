"""`stoke token agent NODE [--file FILE]`: mint the credential of one node's agent (see README "Security model")."""

from __future__ import annotations

import argparse
import sys

from foundation.errors import UserError
from foundation.files import write_private_text
from stoke.client_options import add_client_options
from stoke.commands.control import _call
from stoke.output import output_path


def register(subparsers: argparse._SubParsersAction) -> None:
    t = subparsers.add_parser("token", help="mint agent credentials on a running controller")
    ts = t.add_subparsers(dest="token_command", metavar="COMMAND", required=True)
    p = ts.add_parser(
        "agent",
        help="mint the token of one node's agent (the node's previous token stops working)",
        description="Mint the token `stoke agent --token-file` needs on node NODE. It lets that agent "
        "register and heartbeat as NODE and nothing else; minting again revokes the previous one. "
        "Needs the user token (--token-file / $STOKE_TOKEN).",
    )
    p.add_argument("node_id", metavar="NODE", help="the node id the agent will use (its --node-id)")
    # checked before minting: a token minted revokes the previous one, and one that cannot be written is lost
    p.add_argument(
        "--file", metavar="FILE", type=output_path(), help="write the token to FILE (mode 0600) instead of stdout"
    )
    add_client_options(p)
    p.set_defaults(run=run_token_agent)


def run_token_agent(args: argparse.Namespace) -> int:
    reply = _call(args, lambda c: c.mint_agent_token(args.node_id))
    if not args.file:
        print(reply.token)
        return 0
    try:
        write_private_text(args.file, reply.token + "\n")
    except OSError as err:
        raise UserError(f"--file {args.file}: cannot write the token ({err.strerror})") from None
    print(
        f"token of node {reply.node_id} (generation {reply.generation}) written to {args.file}; "
        f"start its agent with --token-file {args.file}",
        file=sys.stderr,
    )
    return 0
