"""The one table renderer of every command (built on rich).

`render_table(headers, rows)` gives plain text: a header, a line of dashes,
then one line per row; columns two spaces apart; numeric columns right
aligned, text left aligned; no trailing spaces, no colour. That is what a
command prints when its output is piped or captured, and what scripts and
tests read. `print_table(...)` prints the same table; on a terminal it draws
it with rich (bold header, a rule under it, ok/MISS-style words coloured).

Cells are formatted once, here, for every command:
- ``None`` -> ``-`` (not known / not applicable);
- ``bool`` -> ``yes`` / ``no``;
- ``int`` -> as is (``12``, ``-1``);
- ``float`` -> two decimals with thousands separators (``1,163.88``), whole
  numbers from a million up (``1,234,568``); NaN -> ``-``;
- anything else -> ``str(value)``.

A column is numeric (right aligned) when every known cell in it is a number
or a string that reads as one (``12.5``, ``+3.1``, ``45%``, ``1,200``); ``-``,
``?`` and ``unstable`` are not known.
"""

from __future__ import annotations

import io
import math
import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO

#: Cells that stand for a number not known or not finite ("unstable": a queue without bound); a numeric
#: column holding some stays right aligned.
_PLACEHOLDERS = ("-", "?", "unstable")
_NUMBER = re.compile(r"^[+-]?(\d{1,3}(,\d{3})+|\d+)?(\.\d+)?([eE][+-]?\d+)?%?$")

#: Words coloured on a terminal (never in plain text).
_GOOD = {"ok", "serving", "ready", "yes", "written", "created", "passed", "upload"}
_BAD = {"MISS", "FAILED", "failing", "lost", "degraded", "error", "no", "failed", "delete"}
_WARN = {"pending", "starting", "waiting", "updated", "unstable"}


def format_cell(value: Any) -> str:
    """A value as every table shows it (see the module docstring)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:,.2f}" if abs(value) < 1e6 else f"{value:,.0f}"
    return str(value)


def _numeric(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    return isinstance(value, str) and bool(value) and value not in ("-", "+", "%") and bool(_NUMBER.match(value))


def numeric_columns(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[bool]:
    """Per column: right aligned (every known cell is a number) or not."""
    out = []
    for i in range(len(headers)):
        known = [row[i] for row in rows if i < len(row) and row[i] is not None and row[i] not in _PLACEHOLDERS]
        out.append(bool(known) and all(_numeric(v) for v in known))
    return out


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, plain: bool) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    numeric = numeric_columns(headers, rows)
    if plain:
        table = Table(box=None, show_header=True, header_style="", pad_edge=False, padding=(0, 1), show_edge=False)
    else:
        table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False, padding=(0, 1))
    for header, num in zip(headers, numeric):
        # on a narrow terminal rich shrinks columns: text folds onto more lines, a number is never cut
        table.add_column(header, justify="right" if num else "left", no_wrap=plain or num, overflow="fold")
    cells = [[format_cell(row[i] if i < len(row) else None) for i in range(len(headers))] for row in rows]
    if plain:
        widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
        table.add_row(*("-" * w for w in widths))
    for row in cells:
        table.add_row(*(Text(c) if plain else _styled(c) for c in row))
    return table


def _styled(cell: str) -> Any:
    from rich.text import Text

    style = "green" if cell in _GOOD else "red" if cell in _BAD else "yellow" if cell in _WARN else ""
    return Text(cell, style=style)


def _plain_ascii(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str | None:
    """The plain table laid out here, as rich lays it out, when every cell is one line of printable ASCII (each
    character one column wide); None otherwise. Loading rich takes longer than a short command's whole work."""
    cells = [[format_cell(row[i] if i < len(row) else None) for i in range(len(headers))] for row in rows]
    if not all(c.isascii() and c.isprintable() for c in (*headers, *(c for row in cells for c in row))):
        return None
    numeric = numeric_columns(headers, rows)
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = []
    for row in (list(headers), ["-" * w for w in widths], *cells):
        # rich strips a right-aligned cell's trailing spaces before it aligns it
        line = "  ".join(c.rstrip().rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric))
        lines.append(line.rstrip())
    return "\n".join(lines)


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """The table as plain text (see the module docstring)."""
    plain = _plain_ascii(headers, rows)
    if plain is not None:
        return plain
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(
        file=buffer, width=100_000, color_system=None, force_terminal=False, markup=False, emoji=False, highlight=False
    )
    console.print(_table(headers, rows, plain=True), crop=False)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())


def rich_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> Any:
    """The same table as a rich renderable (for live views on a terminal)."""
    return _table(headers, rows, plain=False)


def is_terminal(file: TextIO | None = None) -> bool:
    file = file or sys.stdout
    try:
        return file.isatty()
    except (AttributeError, ValueError):
        return False


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, file: TextIO | None = None) -> None:
    """Print the table: drawn with rich on a terminal, plain text (`render_table`) otherwise."""
    file = file or sys.stdout
    if not is_terminal(file):
        print(render_table(headers, rows), file=file, flush=True)
        return
    from rich.console import Console

    console = Console(file=file, markup=False, emoji=False, highlight=False)
    plain = render_table(headers, rows)
    if max(map(len, plain.splitlines()), default=0) + 2 * len(headers) > console.width:
        print(plain, file=file, flush=True)  # wider than the terminal: every cell whole, lines wrapped by it
        return
    console.print(rich_table(headers, rows))
