"""The output format option every command shares: ``-o table|wide|json|yaml`` (``--json`` = ``-o json``).

`add_output_option(parser)` adds it, and parsing sets ``args.output_format``,
``args.json`` (true for json and yaml: "print data, not a table") and
``args.wide``, so a command branches on those and prints its data with
`emit(args, data)`, which writes JSON or YAML as asked. Commands whose ``-o``
already names the file they write (``profile fit``, ``profile run``, ``train
plan``, ``train fit-loss``, ``train render``) take the same choice as
``--format``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

FORMATS = ("table", "wide", "json", "yaml")


class _Format(argparse.Action):
    """Stores the format and what follows from it: ``json`` (data, not a table: json or yaml) and ``wide``."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None) -> None:
        fmt = self.const if self.const is not None else values
        namespace.output_format = fmt
        namespace.json = fmt in ("json", "yaml")
        namespace.wide = fmt == "wide"


def add_output_option(
    p: argparse.ArgumentParser, *, flags: tuple[str, ...] = ("-o", "--output"), wide: str = ""
) -> None:
    """`-o FORMAT` (or `flags`) and `--json`. `wide` says what the wide table adds (empty: same as table)."""
    p.add_argument(
        *flags,
        dest="output_format",
        action=_Format,
        choices=FORMATS,
        metavar="FORMAT",
        help="output format: table (default), wide"
        + (f" ({wide})" if wide else " (same as table here)")
        + ", json or yaml",
    )
    # "same as" names this command's format flag: where -o is the output file (profile fit, train plan), --format
    p.add_argument(
        "--json", dest="output_format", action=_Format, nargs=0, const="json", help=f"same as {flags[0]} json"
    )
    p.set_defaults(output_format="table", json=False, wide=False)


def emit(args: argparse.Namespace, data: Any, *, file: Any = None) -> None:
    """Print `data` as JSON (indented) or YAML, as ``-o`` asked."""
    file = file or sys.stdout
    if getattr(args, "output_format", "json") == "yaml":
        import yaml

        print(yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip("\n"), file=file, flush=True)
    else:
        print(json.dumps(data, indent=2), file=file, flush=True)
