"""What changes on each node from one plan cut to the next. Pure functions, no I/O.

`diff_assignments` classifies each assignment key per node the same way the
agent's Triton fleet acts on it: new key -> start; same device, share and
model but another batch or queue delay -> reload; another device, share or
model -> move (new Triton process); key gone -> stop; else unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from controller.messages import ModelAssignment


@dataclass(frozen=True)
class NodeChange:
    node_id: str
    start: tuple[str, ...] = ()
    reload: tuple[str, ...] = ()
    move: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = field(default=(), compare=False)

    @property
    def empty(self) -> bool:
        return not (self.start or self.reload or self.move or self.stop)


def classify(old: ModelAssignment | None, new: ModelAssignment | None) -> str:
    """'start' | 'stop' | 'move' | 'reload' | 'unchanged' for one assignment key on one node."""
    if old is None and new is None:
        return "unchanged"
    if old is None:
        return "start"
    if new is None:
        return "stop"
    if (old.model, old.device, old.share_pct) != (new.model, new.device, new.share_pct):
        return "move"
    if (old.batch, old.queue_delay_ms) != (new.batch, new.queue_delay_ms):
        return "reload"
    return "unchanged"


def diff_assignments(
    old: Mapping[str, Sequence[ModelAssignment]], new: Mapping[str, Sequence[ModelAssignment]]
) -> list[NodeChange]:
    """Per node, what moves from `old` to `new` (nodes with no change included only if they run something)."""
    changes = []
    for node in sorted(set(old) | set(new)):
        before = {a.key: a for a in old.get(node, ())}
        after = {a.key: a for a in new.get(node, ())}
        buckets: dict[str, list[str]] = {"start": [], "reload": [], "move": [], "stop": [], "unchanged": []}
        for key in sorted(set(before) | set(after)):
            buckets[classify(before.get(key), after.get(key))].append(key)
        changes.append(NodeChange(node, *(tuple(buckets[k]) for k in ("start", "reload", "move", "stop", "unchanged"))))
    return changes
