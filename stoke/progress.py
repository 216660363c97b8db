"""Progress with an ETA for long work (benchmarks, `stoke train watch`; `stoke profile run` has its own bar).

``with Progress("simulating", total=12) as bar: ... bar.advance()``

On a terminal: a rich progress bar (done/total, elapsed, ETA), written to
stderr so the figures on stdout stay clean. Piped: one plain line per step,
``simulating: 3/12 (25%), 4.1 s elapsed, ETA 12 s``, at most one every
`min_interval_s` (the last step always prints).

The ETA is the time per step so far times the steps left, unless the
caller knows better (`update(..., eta_s=...)`, e.g. a training job's
predicted end).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from stoke.table import is_terminal


def format_duration(seconds: float) -> str:
    """``42 s``, ``3m 05s``, ``2h 07m``; ``?`` when unknown."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m {int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h {int(seconds % 3600 // 60):02d}m"


def _number(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) or abs(value) >= 100 else f"{value:.1f}"


class Progress:
    def __init__(
        self,
        label: str,
        total: float,
        *,
        file: TextIO | None = None,
        min_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        unit: str = "",
    ) -> None:
        self.label = label
        self.total = float(total)
        self.file = file or sys.stderr
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.unit = unit  # e.g. " s" when done/total are seconds
        self.done = 0.0
        self.started = clock()
        self._last_line = -math.inf
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        if is_terminal(self.file):
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[note]}"),
                console=Console(file=self.file),
                transient=False,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=self.total, note="")
        return self

    def eta_s(self) -> float:
        """Seconds left at the pace so far (inf before the first step)."""
        if self.done <= 0:
            return math.inf
        return (self.clock() - self.started) / self.done * max(0.0, self.total - self.done)

    def line(self, note: str = "", eta_s: float | None = None) -> str:
        eta = self.eta_s() if eta_s is None else eta_s
        share = f" ({100 * self.done / self.total:.0f}%)" if self.total > 0 else ""
        return (
            f"{self.label}: {_number(self.done)}/{_number(self.total)}{self.unit}{share}, "
            f"{format_duration(self.clock() - self.started)} elapsed, ETA {format_duration(eta)}"
            + (f"; {note}" if note else "")
        )

    def update(self, done: float, note: str = "", *, eta_s: float | None = None) -> None:
        self.done = min(float(done), self.total) if self.total > 0 else float(done)
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, note=note)
            return
        now = self.clock()
        if now - self._last_line >= self.min_interval_s or self.done >= self.total:
            print(self.line(note, eta_s), file=self.file, flush=True)
            self._last_line = now

    def advance(self, steps: float = 1.0, note: str = "") -> None:
        self.update(self.done + steps, note)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None
