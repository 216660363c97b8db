"""Gradient block planner (Prophet shape) and the gradient profile type. Pure.

A profiled backward pass gives, per gradient (one per layer, listed from the
input layer, so the list index is the priority: 0 is needed first by the
next forward pass), its size and the time it becomes ready. Gradients arrive
in steps separated by compute gaps.

Steps. Sort the ready times; a step boundary lies where the gap to the next
arrival exceeds `gap_factor` (2) x the mean gap. Step k ends at the last
arrival of its group; its gap dt_k is the time to the first arrival of step
k+1 (the last step has none: backward ends there).

Blocks. At the end of step k the planner sends one block: the
highest-priority pending partitions (gradients cut into `partition_bytes`
pieces) whose bytes fit budget_k = dt_k * B (at least one partition, so the
link never idles while work is pending; the next partition is cut to fill
the budget exactly, down to `min_piece_bytes`). Blocks go one by one, so the link
stays busy through the gap and a lower-priority partition never delays a
higher-priority one once both are pending. After the last step, what remains
goes in priority order, `credit_bytes` per message.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from foundation import validate as check
from training.models import TrainingError


@dataclass(frozen=True)
class Gradient:
    name: str
    priority: int  # distance from the input layer (0 first)
    bytes: int
    ready_ms: float  # from the start of backward
    forward_ms: float  # forward compute of this layer in the next iteration


@dataclass(frozen=True)
class GradientProfile:
    name: str
    bandwidth_mb_s: float  # measured link bandwidth (each direction)
    latency_ms: float  # per-message overhead (RPC round trip) on each direction
    partition_bytes: int
    credit_bytes: int
    backward_ms: float
    gradients: tuple[Gradient, ...]
    min_piece_bytes: int = 65536  # smallest cut the block planner makes to fill a budget

    @property
    def bytes_per_ms(self) -> float:
        return self.bandwidth_mb_s * 1e6 / 1000.0

    @property
    def forward_ms(self) -> float:
        return sum(g.forward_ms for g in self.gradients)


@dataclass(frozen=True)
class Partition:
    gradient: int  # index (= priority) of its gradient
    index: int  # piece number within the gradient
    bytes: int


@dataclass(frozen=True)
class Step:
    end_ms: float  # last arrival of the step
    gap_ms: float  # compute gap to the next step (0 for the last)
    gradients: tuple[int, ...]


@dataclass(frozen=True)
class Block:
    send_ms: float  # planned send time (end of its step)
    budget_bytes: float
    partitions: tuple[Partition, ...]

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.partitions)


def gradient_profile_from_dict(data: Any, source: str = "PROFILE.yaml") -> GradientProfile:
    """Validate a parsed gradient profile (see the bundled resnet50.yaml for the layout)."""
    if not isinstance(data, Mapping):
        raise TrainingError(f"{source}: a gradient profile must be a mapping with 'layers'")

    def num(obj: Mapping[str, Any], key: str, where: str, default: Any = None, allow_zero: bool = False) -> float:
        value = obj.get(key, default)
        if value is None:
            raise TrainingError(f"{source}: {where} lacks field {key!r}", key)
        if allow_zero:
            return check.non_negative(value, f"{where}.{key}", where=source, error=TrainingError)
        return check.positive(value, f"{where}.{key}", where=source, error=TrainingError)

    layers = data.get("layers")
    if not isinstance(layers, list) or not layers:
        raise TrainingError(
            f"{source}: 'layers' must list the layers from the input layer (name, bytes, forward_ms, ready_ms)"
        )
    gradients = []
    for i, layer in enumerate(layers):
        if not isinstance(layer, Mapping):
            raise TrainingError(f"{source}: layers[{i}] must be a mapping")
        gradients.append(
            Gradient(
                name=str(layer.get("name", f"layer{i}")),
                priority=i,
                bytes=int(num(layer, "bytes", f"layers[{i}]")),
                ready_ms=num(layer, "ready_ms", f"layers[{i}]", allow_zero=True),
                forward_ms=num(layer, "forward_ms", f"layers[{i}]", allow_zero=True),
            )
        )
    backward = num(data, "backward_ms", "profile", default=max(g.ready_ms for g in gradients))
    if backward < max(g.ready_ms for g in gradients) - 1e-9:
        raise TrainingError(f"{source}: backward_ms {backward} is before the last gradient is ready; raise it")
    return GradientProfile(
        name=str(data.get("name", source)),
        bandwidth_mb_s=num(data, "bandwidth_mb_s", "profile"),
        latency_ms=num(data, "latency_ms", "profile", default=0.0, allow_zero=True),
        partition_bytes=int(num(data, "partition_bytes", "profile", default=4096000)),
        credit_bytes=int(num(data, "credit_bytes", "profile", default=4 * 4096000)),
        backward_ms=backward,
        gradients=tuple(gradients),
        min_piece_bytes=int(num(data, "min_piece_bytes", "profile", default=65536, allow_zero=True)),
    )


def partitions_of(profile: GradientProfile, gradient: int) -> list[Partition]:
    g = profile.gradients[gradient]
    size = profile.partition_bytes
    pieces = max(1, math.ceil(g.bytes / size))
    return [Partition(gradient, k, min(size, g.bytes - k * size)) for k in range(pieces)]


def find_steps(ready_ms: Sequence[float], gap_factor: float = 2.0) -> list[Step]:
    """Group arrivals into steps: a boundary where the gap exceeds gap_factor x the mean gap."""
    order = sorted(range(len(ready_ms)), key=lambda i: (ready_ms[i], -i))
    times = [ready_ms[i] for i in order]
    gaps = [b - a for a, b in zip(times, times[1:])]
    mean_gap = (sum(gaps) / len(gaps)) if gaps else 0.0
    steps, current = [], [order[0]]
    for pos in range(1, len(order)):
        if gaps[pos - 1] > gap_factor * mean_gap:
            steps.append((current, times[pos - 1], gaps[pos - 1]))
            current = []
        current.append(order[pos])
    steps.append((current, times[-1], 0.0))
    return [Step(end_ms=end, gap_ms=gap, gradients=tuple(members)) for members, end, gap in steps]


def take_block(pending: list[Partition], budget_bytes: float, min_piece: int = 0) -> list[Partition]:
    """Remove and return the highest-priority pending partitions fitting the budget (at least one).

    `pending` must be sorted by (gradient, index); it is consumed in order,
    so a lower-priority piece is never sent ahead of a higher-priority one.
    With `min_piece` > 0, a partition that does not fit whole is cut so the
    block fills the budget exactly (the tail stays first in `pending`),
    provided the head is at least `min_piece` bytes.
    """
    block: list[Partition] = []
    used = 0
    budget = int(budget_bytes)
    if pending and min_piece > 0 and pending[0].bytes > budget >= min_piece:
        # even the first partition is larger than the gap: cut it to the budget rather than overrun it
        head = pending[0]
        pending[0] = Partition(head.gradient, head.index, head.bytes - budget)
        return [Partition(head.gradient, head.index, budget)]
    while pending and (not block or used + pending[0].bytes <= budget_bytes):
        part = pending.pop(0)
        block.append(part)
        used += part.bytes
    room = int(budget_bytes - used)
    if pending and min_piece > 0 and room >= min_piece:
        head = pending[0]
        block.append(Partition(head.gradient, head.index, room))
        pending[0] = Partition(head.gradient, head.index, head.bytes - room)
    return block


def plan_blocks(profile: GradientProfile, gap_factor: float = 2.0) -> list[Block]:
    """The blocks the planner sends for the profiled backward pass (as profiled, link free at each step end).

    This is the planner's own prediction; the simulator replays it against
    the link, where a block may start later than planned.
    """
    steps = find_steps([g.ready_ms for g in profile.gradients], gap_factor)
    pending: list[Partition] = []
    blocks = []
    for k, step in enumerate(steps):
        for gi in step.gradients:
            pending.extend(partitions_of(profile, gi))
        pending.sort(key=lambda p: (p.gradient, p.index))
        if k < len(steps) - 1:
            budget = step.gap_ms * profile.bytes_per_ms
            blocks.append(
                Block(
                    send_ms=step.end_ms,
                    budget_bytes=budget,
                    partitions=tuple(take_block(pending, budget, profile.min_piece_bytes)),
                )
            )
    while pending:
        blocks.append(
            Block(
                send_ms=steps[-1].end_ms,
                budget_bytes=profile.credit_bytes,
                partitions=tuple(take_block(pending, profile.credit_bytes)),
            )
        )
    return blocks
