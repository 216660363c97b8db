"""GPUs being filled during a solve: bins, a per-type index of open bins, an undo log.

Best fit needs "the fullest GPU that can still take this workload" fast:
each GPU type keeps its bins in a list sorted by load, so the candidates for
a workload of minimum share s are the bins with load <= 100 - s, fullest
first, found by bisection. Local search needs to try a move and take it
back: every change is logged, and `rollback` replays the log backwards.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice

from planner.solver.candidates import EPS, Item, PointCache, colocate


@dataclass
class Bin:
    id: int
    gpu_type: str
    items: list[Item]
    shares: list[float]
    key: str | None = None
    load: float = 0.0


@dataclass
class Packing:
    caches: dict[str, PointCache]
    limits: dict[str, int | None]
    #: Most co-location checks one best-fit lookup makes before giving up (opening a GPU).
    search_width: int = 160
    bins: dict[int, Bin] = field(default_factory=dict)
    evaluations: int = 0
    _index: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    _log: list[tuple[int, Bin | None]] | None = None
    _next_id: int = 0
    #: When set, each bin changed from now on, with the replicas it held before its first change ([] for a bin
    #: opened): a local re-plan's search, renumbering and plan visit only these.
    changed: dict[int, list[Item]] | None = None

    # -- changes (logged when a checkpoint is open) ------------------------------------------------

    def _remember(self, bin_id: int) -> None:
        if self._log is not None:
            old = self.bins.get(bin_id)
            self._log.append(
                (
                    bin_id,
                    None if old is None else Bin(old.id, old.gpu_type, old.items[:], old.shares[:], old.key, old.load),
                )
            )

    def _unindex(self, b: Bin) -> None:
        keys = self._index[b.gpu_type]
        keys.pop(bisect_right(keys, (b.load, b.id)) - 1)

    def opened(self, gpu_type: str) -> int:
        return len(self._index.get(gpu_type, ()))

    def open_bin(self, gpu_type: str, items: list[Item], shares: list[float], key: str | None = None) -> Bin:
        b = Bin(self._next_id, gpu_type, items, shares, key, sum(shares))
        self._next_id += 1
        if self.changed is not None:
            self.changed.setdefault(b.id, [])
        self._remember(b.id)
        self.bins[b.id] = b
        insort(self._index.setdefault(gpu_type, []), (b.load, b.id))
        return b

    def update(self, b: Bin, items: list[Item], shares: list[float]) -> None:
        if self.changed is not None:
            self.changed.setdefault(b.id, b.items)  # replaced, never changed in place
        self._remember(b.id)
        self._unindex(b)
        b.items, b.shares, b.load = items, shares, sum(shares)
        insort(self._index[b.gpu_type], (b.load, b.id))

    def close(self, b: Bin) -> None:
        if self.changed is not None:
            self.changed.setdefault(b.id, b.items)
        self._remember(b.id)
        self._unindex(b)
        del self.bins[b.id]

    def checkpoint(self) -> None:
        self._log = []

    def commit(self) -> None:
        self._log = None

    def rollback(self) -> None:
        """Undo every change since `checkpoint`. Bins that still exist are restored in place, so
        callers holding a `Bin` keep a live object."""
        log, self._log = self._log or [], None
        reopened = False
        for bin_id, old in reversed(log):
            current = self.bins.get(bin_id)
            if current is not None:
                self._unindex(current)
                if old is None:
                    del self.bins[bin_id]
                    continue
                current.items, current.shares, current.load, current.key = old.items, old.shares, old.load, old.key
            elif old is not None:
                current = self.bins[bin_id] = old
                reopened = True
            else:
                continue
            insort(self._index[current.gpu_type], (current.load, current.id))
        if reopened:  # dict order is creation order for bins that never left; restore it for the rest
            self.bins = dict(sorted(self.bins.items()))

    # -- queries -----------------------------------------------------------------------------------

    def candidates(self, gpu_type: str, size: float, exclude: Sequence[int] = ()) -> Iterator[Bin]:
        """Bins of `gpu_type` that have room for `size` by shares alone, fullest first (lazily: stop
        reading before changing the packing)."""
        keys = self._index.get(gpu_type, [])
        end = bisect_right(keys, (100.0 - size + EPS, float("inf")))
        # by index, not over a copy of the index: a lookup reads only the bins it yields (callers stop
        # after `search_width`), so its cost does not grow with the number of GPUs. Read it before
        # changing the packing (a change shifts the indices).
        for k in range(end - 1, -1, -1):
            bin_id = keys[k][1]
            if bin_id not in exclude:
                yield self.bins[bin_id]

    def try_add(self, b: Bin, item: Item) -> list[float] | None:
        """Shares of `b` with `item` added, after interference, or None if it does not fit."""
        self.evaluations += 1
        fitted = colocate(self.caches[b.gpu_type], b.items + [item], b.shares + [item.min_share])
        return None if fitted is None else fitted[0]

    def best_fit(self, item: Item, gpu_type: str, exclude: Sequence[int] = ()) -> tuple[Bin, list[float]] | None:
        """The fullest bin that takes `item`, found by bisection over the bins in fullest-first order.

        Whether a bin takes the item is close to monotone in its free room (interference only
        ever adds share), so the emptiest candidate is tried first (if it refuses, none is
        assumed to take it) and the boundary is then bisected: about log2(n) co-location checks
        instead of up to n.
        """
        bins = list(islice(self.candidates(gpu_type, item.min_share, exclude), self.search_width))
        if not bins:
            return None
        shares = self.try_add(bins[-1], item)
        if shares is None:
            return None
        best, lo, hi = (bins[-1], shares), 0, len(bins) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            shares = self.try_add(bins[mid], item)
            if shares is None:
                lo = mid + 1
            else:
                best, hi = (bins[mid], shares), mid
        return best

    def can_open(self, gpu_type: str) -> bool:
        limit = self.limits.get(gpu_type)
        return limit is None or self.opened(gpu_type) < limit
