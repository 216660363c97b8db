"""Discrete-event simulator of PS push/pull during training iterations. Pure.

One worker, one PS, a full-duplex link of bandwidth B (each direction) with
a per-message overhead `latency_ms` (RPC round trip). An iteration is the
backward pass (gradients become ready at their profiled times), the pushes
and pulls it triggers, and the next forward pass, whose layer i starts only
when layer i's updated parameters are back. Every push is answered by a pull
of the same partitions (the PS applies the update at once), in push order.
Because the forward pass needs every parameter before the next backward
starts, no traffic crosses an iteration boundary: the steady state is one
such iteration, which is what `simulate` returns.

Schedulers (the order of pushes on the uplink):
- ``fifo``: whole gradients in the order they become ready, one message
  each (the framework default).
- ``priority``: gradients cut into `partition_bytes` pieces; whenever the
  uplink is free the highest-priority pending piece goes, one per message
  (P3 / ByteScheduler style, preemption at partition granularity).
- ``blocks``: the block planner (`training.blocks`): at each
  profiled step end one block of the highest-priority pending pieces that
  fits the compute gap (budget = gap x B, shrunk to what is left of the gap
  if the block starts late); after backward, priority order, `credit_bytes`
  per message.

Reports per scheduler: iteration time, GPU idle time (waiting for
parameters), uplink utilisation (payload time / iteration time) and the
number of messages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from training.blocks import GradientProfile, Partition, find_steps, partitions_of, take_block

SCHEDULERS = ("fifo", "priority", "blocks")


@dataclass(frozen=True)
class SimResult:
    scheduler: str
    iteration_ms: float
    compute_ms: float  # forward + backward with no waiting
    gpu_idle_ms: float
    link_utilisation: float  # uplink payload time / iteration time
    messages: int

    @property
    def comm_overhead_ms(self) -> float:
        return self.iteration_ms - self.compute_ms


class _Scheduler(Protocol):
    """Decides what the worker sends next: `admit` a gradient when it is ready, `next` (partitions to send now,
    time of the next decision)."""

    def admit(self, gradient: int) -> None: ...
    def next(self, now: float) -> tuple[list[Partition], float]: ...


class _Fifo:
    def __init__(self, profile: GradientProfile):
        self.profile = profile
        self.queue: list[int] = []

    def admit(self, gradient: int) -> None:
        self.queue.append(gradient)

    def next(self, now: float) -> tuple[list[Partition], float]:
        if not self.queue:
            return [], math.inf
        g = self.queue.pop(0)
        return [Partition(g, 0, self.profile.gradients[g].bytes)], math.inf


class _Priority:
    def __init__(self, profile: GradientProfile):
        self.profile = profile
        self.pending: list[Partition] = []

    def admit(self, gradient: int) -> None:
        self.pending.extend(partitions_of(self.profile, gradient))
        self.pending.sort(key=lambda p: (p.gradient, p.index))

    def next(self, now: float) -> tuple[list[Partition], float]:
        if not self.pending:
            return [], math.inf
        return [self.pending.pop(0)], math.inf


class _Blocks(_Priority):
    def __init__(self, profile: GradientProfile):
        super().__init__(profile)
        self.steps = find_steps([g.ready_ms for g in profile.gradients])
        self.used = 0  # steps whose block has been sent

    def next(self, now: float) -> tuple[list[Partition], float]:
        last = len(self.steps) - 1
        if now >= self.steps[last].end_ms - 1e-12:
            if not self.pending:
                return [], math.inf
            return take_block(self.pending, self.profile.credit_bytes), math.inf
        ended = [k for k in range(self.used, last) if self.steps[k].end_ms <= now + 1e-12]
        if not ended:
            return [], self.steps[self.used].end_ms if self.used <= last else math.inf
        k = ended[-1]
        self.used = k + 1
        if not self.pending:
            return [], self.steps[self.used].end_ms
        gap_left = self.steps[k].end_ms + self.steps[k].gap_ms - now
        budget = max(0.0, min(self.steps[k].gap_ms, gap_left)) * self.profile.bytes_per_ms
        return take_block(self.pending, budget, self.profile.min_piece_bytes), math.inf


def _scheduler(name: str, profile: GradientProfile) -> _Scheduler:
    if name == "fifo":
        return _Fifo(profile)
    if name == "priority":
        return _Priority(profile)
    if name == "blocks":
        return _Blocks(profile)
    raise ValueError(f"unknown scheduler {name!r}; choose one of {', '.join(SCHEDULERS)} or all")


def simulate(profile: GradientProfile, scheduler: str) -> SimResult:
    """Simulate one steady-state iteration under `scheduler` (see module doc)."""
    sched = _scheduler(scheduler, profile)
    grads = profile.gradients
    arrivals = sorted(range(len(grads)), key=lambda i: (grads[i].ready_ms, -i))
    remaining = [g.bytes for g in grads]
    param_ready = [0.0] * len(grads)
    rate = profile.bytes_per_ms
    now, down_free, payload_ms, messages, ai = 0.0, 0.0, 0.0, 0, 0
    while True:
        while ai < len(arrivals) and grads[arrivals[ai]].ready_ms <= now + 1e-12:
            sched.admit(arrivals[ai])
            ai += 1
        message, wake = sched.next(now)
        if message:
            size = sum(p.bytes for p in message)
            end = now + profile.latency_ms + size / rate
            pull_end = max(end, down_free) + profile.latency_ms + size / rate
            down_free = pull_end
            for p in message:
                param_ready[p.gradient] = max(param_ready[p.gradient], pull_end)
                remaining[p.gradient] -= p.bytes
            payload_ms += size / rate
            messages += 1
            now = end
            continue
        next_arrival = grads[arrivals[ai]].ready_ms if ai < len(arrivals) else math.inf
        upcoming = min(next_arrival, wake)
        if not math.isfinite(upcoming):
            break
        now = max(now, upcoming)
    if any(remaining):
        raise RuntimeError(f"scheduler {scheduler!r} left gradients unsent")  # a bug, not user input
    clock, idle = profile.backward_ms, 0.0
    for g in grads:
        start = max(clock, param_ready[g.priority])
        idle += start - clock
        clock = start + g.forward_ms
    compute = profile.backward_ms + profile.forward_ms
    return SimResult(
        scheduler=scheduler,
        iteration_ms=clock,
        compute_ms=compute,
        gpu_idle_ms=idle,
        link_utilisation=payload_ms / clock if clock > 0 else 0.0,
        messages=messages,
    )


def compare(profile: GradientProfile, schedulers: tuple[str, ...] = SCHEDULERS) -> list[SimResult]:
    return [simulate(profile, s) for s in schedulers]
