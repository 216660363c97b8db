"""Views that refresh (`stoke up`, `stoke status --watch`): in place on a terminal, plain lines when piped.

A view is a list of blocks: strings (lines of text) and `Tab` tables. The
same blocks give the plain text (`render_blocks`, what a pipe or a file gets,
every table through `stoke.table.render_table`) and the rich renderable a
terminal redraws in place (`LiveView`, rich's ``Live``). Piped, each refresh
is printed once after the one before: no escape codes, no screen clearing.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from stoke.table import is_terminal, render_table, rich_table


@dataclass(frozen=True)
class Tab:
    headers: Sequence[str]
    rows: Sequence[Sequence[Any]]


Block = str | Tab


def render_blocks(blocks: Sequence[Block]) -> str:
    return "\n".join(render_table(b.headers, b.rows) if isinstance(b, Tab) else b for b in blocks)


def rich_blocks(blocks: Sequence[Block]) -> Any:
    from rich.console import Group
    from rich.text import Text

    return Group(*(rich_table(b.headers, b.rows) if isinstance(b, Tab) else Text(b) for b in blocks))


class LiveView:
    """``with LiveView() as view: view.show(blocks)``: redrawn in place on a terminal, printed when piped."""

    def __init__(self, file: TextIO | None = None, *, separator: str = "") -> None:
        self.file = file or sys.stdout
        self.terminal = is_terminal(self.file)
        self.separator = separator  # printed between two plain frames
        self._live: Any = None
        self._frames = 0

    def __enter__(self) -> LiveView:
        if self.terminal:
            from rich.console import Console
            from rich.live import Live

            console = Console(file=self.file, markup=False, emoji=False, highlight=False)
            self._live = Live(console=console, auto_refresh=False, transient=False, redirect_stdout=True)
            self._live.__enter__()
        return self

    def show(self, blocks: Sequence[Block]) -> None:
        if self._live is not None:
            self._live.update(rich_blocks(blocks), refresh=True)
            return
        if self._frames and self.separator is not None:
            print(self.separator, file=self.file)
        print(render_blocks(blocks), file=self.file, flush=True)
        self._frames += 1

    def print(self, text: str) -> None:
        """A line above the view (on a terminal) or in the stream (piped)."""
        if self._live is not None:
            self._live.console.print(text)
        else:
            print(text, file=self.file, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None
