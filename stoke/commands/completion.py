"""`stoke completion bash|zsh|tcsh`: a shell completion script for every command and option.

The script is generated from stoke's own argparse parser by shtab and is
static: pressing TAB runs no Python (stoke's imports take about a second),
so regenerate it after upgrading stoke. Install it, e.g.:

    stoke completion bash > ~/.local/share/bash-completion/completions/stoke
    stoke completion zsh > "${fpath[1]}/_stoke"
"""

from __future__ import annotations

import argparse

SHELLS = ("bash", "zsh", "tcsh")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh, tcsh)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    p.set_defaults(run=run_completion)


def run_completion(args: argparse.Namespace) -> int:
    import shtab

    from stoke.cli import build_parser

    print(shtab.complete(build_parser(), shell=args.shell), end="")
    return 0
