"""The output format option every command shares: ``-o table|wide|json|yaml`` (``--json`` = ``-o json``).

`add_output_option(parser)` adds it, and parsing sets ``args.output_format``,
``args.json`` (true for json and yaml: "print data, not a table") and
``args.wide``, so a command branches on those and prints its data with
`emit(args, data)`, which writes JSON or YAML as asked. Commands whose ``-o``
already names the file they write (``profile fit``, ``profile run``, ``train
plan``, ``train fit-loss``, ``train render``) take the same choice as
``--format``, and their ``-o`` (`add_output_file_option`) still reads a bare
format name the kubectl way: ``train plan -o json`` prints JSON, it does not
write a file named ``json`` (``-o ./json`` does).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from foundation.errors import UserError

FORMATS = ("table", "wide", "json", "yaml")


class _Format(argparse.Action):
    """Stores the format and what follows from it: ``json`` (data, not a table: json or yaml) and ``wide``."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None) -> None:
        fmt = self.const if self.const is not None else values
        _choose_format(parser, namespace, fmt, option_string if self.const is not None else f"{option_string} {fmt}")


def _choose_format(parser: Any, namespace: argparse.Namespace, fmt: str, flag: str) -> None:
    """Set the format `flag` asks for; a second, different one is refused (the last won silently: `--json -o
    yaml`, and `train plan -o yaml --json` where -o may also name the file)."""
    given = getattr(namespace, "_format_given", None)
    if given is not None and given[1] != fmt:
        parser.error(f"{given[0]} and {flag} ask for two output formats; give one")
    namespace._format_given = (flag, fmt)
    _set_format(namespace, fmt)


def _set_format(namespace: argparse.Namespace, fmt: str) -> None:
    namespace.output_format = fmt
    namespace.json = fmt in ("json", "yaml")
    namespace.wide = fmt == "wide"


def add_output_option(
    p: argparse.ArgumentParser, *, flags: tuple[str, ...] = ("-o", "--output"), wide: str = ""
) -> None:
    """`-o FORMAT` (or `flags`) and `--json`. `wide` says what the wide table adds; without it the command
    has no wide table, and `-o wide` is refused (argparse names the formats it takes) rather than accepted
    to print the same table."""
    p.add_argument(
        *flags,
        dest="output_format",
        action=_Format,
        choices=FORMATS if wide else tuple(f for f in FORMATS if f != "wide"),
        metavar="FORMAT",
        help="output format: table (default), " + (f"wide ({wide}), " if wide else "") + "json or yaml",
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


class _FileOrFormat(argparse.Action):
    """``-o FILE``, where a bare format name (``json``, ``yaml``, ...) means the format, as everywhere else.

    Where the command needs a file (`required`), a format name is refused with the fix instead."""

    def __init__(self, *args: Any, formats: tuple[str, ...] = FORMATS, file_required: bool = False, **kw: Any):
        self.formats = formats
        self.file_required = file_required
        super().__init__(*args, **kw)

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None) -> None:
        if values in self.formats:
            if self.file_required:
                parser.error(
                    f"{option_string} {values}: here {option_string} names the file to write, and {values!r} is "
                    f"an output format; give the file (e.g. {option_string} {self.metavar or 'FILE'}, or "
                    f"{option_string} ./{values} for a file named {values})"
                )
            _choose_format(parser, namespace, values, f"{option_string} {values}")
            setattr(namespace, self.dest, None)
            return
        try:  # checked here, not as the option's type: `-o json` is the format even beside a folder named json
            setattr(namespace, self.dest, output_path()(values))
        except argparse.ArgumentTypeError as err:
            parser.error(f"argument {option_string}: {err}")


def add_output_file_option(
    p: argparse.ArgumentParser,
    *,
    help: str,
    metavar: str = "FILE",
    required: bool = False,
    formats: tuple[str, ...] = FORMATS,
) -> None:
    """``-o/--output FILE`` of a command that writes a file; ``-o json`` (a format name) means the format."""
    names = ", ".join(formats)
    p.add_argument(
        "-o",
        "--output",
        action=_FileOrFormat,
        formats=formats,
        file_required=required,
        required=required,
        metavar=metavar,
        help=help
        + (
            f" (a bare format name is refused: {names} are formats; ./NAME for such a file)"
            if required
            else f" ({names} alone mean the format, as --format does; ./NAME for a file of that name)"
        ),
    )


#: What `--plot` can write (matplotlib draws each by the file's suffix).
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def output_path(suffixes: tuple[str, ...] = ()) -> Callable[[str], str]:
    """An argparse ``type`` for a file a command will write: checked before any work is done, so a long
    verification or fit is not lost at the end to a path that cannot be written.

    Refused: an empty or unprintable name, an existing directory or other non-regular file (a write goes
    through a temporary file and a rename, which would replace a device such as /dev/null), a folder that
    does not exist (it is not created: a typo would scatter files) or is not writable, and, when `suffixes`
    are given, any other suffix. What the check cannot see (an immutable folder, a full disk) still fails
    at the write, which the commands report in one line.
    """

    def check(value: str) -> str:
        if not value or not value.isprintable():
            raise argparse.ArgumentTypeError(f"{value!r} is not a file name; give a path of printable characters")
        target = Path(value)
        if target.is_dir():
            example = target / ("out" + (suffixes[0] if suffixes else ""))
            raise argparse.ArgumentTypeError(f"{value} is a directory; give a file inside it, e.g. {example}")
        if target.exists() and not target.is_file():  # a device or a FIFO: a write would replace it
            raise argparse.ArgumentTypeError(f"{value} is not a regular file; give a file path")
        folder = target.parent
        if not folder.is_dir():
            raise argparse.ArgumentTypeError(f"{value}: folder {folder} does not exist; create it first")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"{value}: folder {folder} is not writable; pick another path")
        if suffixes and target.suffix.lower() not in suffixes:
            raise argparse.ArgumentTypeError(
                f"{value}: the file must end in {', '.join(suffixes)} (that is the format written)"
            )
        return value

    return check


@contextmanager
def writing(path: str, what: str) -> Iterator[None]:
    """Around the write of a file the user named: an OSError the parse-time check could not foresee (an
    immutable folder, a full disk) becomes one line naming the file, instead of a traceback."""
    try:
        yield
    except OSError as err:
        raise UserError(f"{path}: cannot write the {what} ({err.strerror or err}); pick another path") from None
