"""When a recalibrated profile is worth a re-plan. Pure.

The estimator (`interference.recalibration`) proposes a corrected profile of one (model, GPU
type) every `interval_s`. It is published only when it changes what the plan predicts:

    max over placed replicas of that model on that GPU type of |p99_new - p99_active| / SLO > threshold

Both p99s come from the batching model (`interference.batching.latency_distribution`). Each takes
the replica's placement as it is (share, max batch, queue delay, rate, neighbours); p99_new uses
the candidate profile, p99_active the active one. The move is measured against the SLO, not
the p99 itself: near saturation a p99 of 20 ms may double for a 5% correction and still be far
within an 80 ms SLO, while 70 -> 78 ms matters. A replica whose queue turns unstable, or stable
again, always counts as a move.

The accuracy goal (`past_accuracy`, `recalibration.refresh_within_accuracy`): under a loose SLO the
threshold is many times the p99 (10% of a 160 ms SLO is 16 ms, against a p99 of 8-11 ms), so a new
serving term is also published when it moves a prediction by more than 20% of it or 2 ms, whichever is
wider, though under the threshold; a service-time correction alone still needs the threshold (one that
comes with such a serving term is published with it). Such a move puts no SLO at stake, so it is
confirmed only by pools that share no window with the ones it was first seen in, a raise too, and it
waits `min_interval_s` like a lowering.

Hysteresis: the comparison is with the active profile, the last one published, not with the
previous estimate. A slow drift accumulates until it crosses the threshold; noise that oscillates
around the truth stays within it, so it causes no re-plans. A move must also be seen by
`confirmations` consecutive estimates that agree with each other within half the threshold
(`Confirmation`): one stray estimate publishes nothing, and an estimate still moving towards a
new regime waits until it settles; a serving term learnt from pooled p99s, raised or lowered, is
confirmed only by pools that share no window with the ones it was first seen in (a pool of 100-400
requests has its p99 set by its 2nd to 5th largest: one stalled second sits in every pool that covers
it; a demo run learnt 19.4 ms from one such pool while its clients saw 12.8 ms over the run), and such
pools agree when they move the term the same way: the least of their moves stands. With no
placed replica of the model, the candidate is published when its factor moved by more than the threshold.

What the user experiences (`serving_estimate`). The estimator above corrects the service time from
Triton's compute figures; the p99 a client sees also holds the queue and the serving path outside
the batch (client, router, Triton's frontend). Each window's SLI p99 (the `stoke_request_latency_ms`
histogram the clients' load generator exports, read by the agent once a heartbeat) is compared with the
replica's predicted p99 without the serving terms: the difference (the residual) is what the serving
term must cover. On a loaded machine slow requests come in bursts: a stall that hits a few windows raises
the clients' p99 over all requests without moving the median of the windows' p99s. So each window also
carries, from the agent, the p99 of its last K windows' requests pooled (`SliWindow.pooled_p99_ms`, the
clients' p99 over those windows), and the term is learnt from it where it is there: it then holds what
clients see outside the batch, bursts included, and the version's `beyond_sli_p99_ms` is 0 (it would count
the bursts twice). From an old agent without pools, the median of the windows' p99s is what the term covers,
and `ModelProfile.beyond_sli_p99_ms`, measured by `stoke profile run`, is kept as it is and added to every
prediction on top, so recalibrating the serving term does not drop it. `interference.batching.end_to_end_p99_ms`
composes the p99 either way: batch + serving term + beyond. The residual's attribution uses Triton's
queue/compute split: the window's SLI p50 less Triton's mean queue + compute is the serving path
proper, Triton's mean queue time the queueing; the larger of the two names the residual. Both are
carried by the one additive term (`ModelProfile.serving_p99_ms`), and the reason says which it was.

- Never below the SLI: the term is a node's pooled residual (the largest over its replicas), else the
  `SERVING_QUANTILE` (the median) of its windows' residuals, so the corrected prediction matches the p99 its
  clients are seen to see (`sli_seen_ms`), and a lowered term is the largest
  over all nodes, so no correction predicts less than any node's SLI shows. A service-time correction
  that lowers a replica's prediction below its SLI while the serving term holds waits
  (`lowered_below_sli`).
- Agreement: each node running the model gets one vote, whatever its number of windows (windows
  weighted by node): a raise needs a strict majority of the nodes with evidence to show it, a
  lowering needs all of them. One node (or one flooding agent) cannot move the model alone.
  The service-time correction follows the same rule (`nodes_agree`): each node's median of its
  windows' observed/predicted execution time must lie on the side of the move.
- Evidence and hysteresis: at least `min_windows` windows with an SLI p99 (each with `guard.min_requests`
  requests), or a pool over at least `min_windows` windows, all of them at the plan (`controller.feedback`;
  the pool needs the requests, not each window, which at a low rate rarely holds them, nor the window that
  carries it: `SliWindow.counted`); a move smaller than
  `tolerance_ms` is no move. The loop hands over only windows that ran the placement at the load
  it was planned for (`controller.feedback`): an overloaded replica's p99 is a wrong rate, not a
  slow serving path.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from controller.demand import quantile
from controller.messages import Replica
from interference.batching import end_to_end_p99_ms, latency_distribution
from interference.profile import DeviceProfile
from planner.simulate import service_curve
from planner.solver import Placement, Plan


@dataclass(frozen=True)
class PlacedReplica:
    """One placed replica as the plan has it: the placements of its plan GPU and its index among them."""

    placements: tuple[Placement, ...]
    index: int

    @property
    def placement(self) -> Placement:
        return self.placements[self.index]

    @property
    def key(self) -> str:
        return str(Replica(self.placement.name, self.placement.replica))


@dataclass(frozen=True)
class Move:
    key: str
    before_ms: float
    after_ms: float
    slo_ms: float

    @property
    def relative(self) -> float:
        """|after - before| as a share of the SLO (inf when the queue turns unstable or stable again)."""
        if math.isinf(self.before_ms) or math.isinf(self.after_ms):
            return 0.0 if self.before_ms == self.after_ms else math.inf
        return abs(self.after_ms - self.before_ms) / self.slo_ms

    def __str__(self) -> str:
        return f"{self.key} p99 {self.before_ms:.1f} -> {self.after_ms:.1f} ms (SLO {self.slo_ms:g})"


def placed_replicas(plan: Plan, gpu_type: str, model: str) -> list[PlacedReplica]:
    """The replicas of `model` on plan GPUs of `gpu_type`."""
    return [
        PlacedReplica(gpu.placements, index)
        for gpu in plan.gpus
        if gpu.gpu_type == gpu_type
        for index, p in enumerate(gpu.placements)
        if p.model == model
    ]


def replica_p99_ms(profile: DeviceProfile, r: PlacedReplica, *, beyond_sli: bool = True) -> float:
    """The p99 of one replica end to end at its placement, with `profile` (NaN: a model it lacks): the
    batching model's p99 plus the model's serving path, the part the SLI windows show and what clients see beyond
    them (`interference.batching.end_to_end_p99_ms`). `beyond_sli=False`: what the SLI windows should show."""
    if any(p.model not in profile.models for p in r.placements):
        return math.nan
    p = r.placement
    curve = service_curve(profile, r.placements, r.index)
    batch_p99 = latency_distribution(p.rate_rps, p.batch, p.queue_delay_ms, p.arrivals, curve).p99_ms
    m = profile.model(p.model)
    return float(end_to_end_p99_ms(batch_p99, m.serving_p99_ms, m.beyond_sli_p99_ms if beyond_sli else 0.0))


def p99_moves(active: DeviceProfile, candidate: DeviceProfile, replicas: Sequence[PlacedReplica]) -> list[Move]:
    """Each replica's p99 with the active and with the candidate profile (replicas it cannot predict left out)."""
    moves = []
    for r in replicas:
        before, after = replica_p99_ms(active, r), replica_p99_ms(candidate, r)
        if not (math.isnan(before) or math.isnan(after)):
            moves.append(Move(r.key, before, after, r.placement.slo_ms))
    return moves


def crosses(moves: Sequence[Move], threshold: float, factor_move: float) -> tuple[bool, str]:
    """(does the candidate cross the threshold, the largest move in words)."""
    if not moves:
        return factor_move > threshold, f"no placed replica; factor moved {factor_move:.1%}"
    worst = max(moves, key=lambda m: m.relative)
    return (
        worst.relative > threshold,
        f"{worst}: {'unstable' if math.isinf(worst.relative) else f'{worst.relative:.1%} of the SLO'}",
    )


def accuracy_goal_ms(predicted_ms: float, share: float, floor_ms: float) -> float:
    """How far a prediction may be from what clients see and still count as right: `share` of it, or `floor_ms`,
    whichever is wider (the CPU demo's "within 20% or 2 ms")."""
    return max(share * predicted_ms, floor_ms)


def past_accuracy(moves: Sequence[Move], share: float, floor_ms: float) -> Move | None:
    """The first move larger than the accuracy goal of the prediction it arrives at (finite moves only): under a
    loose SLO the re-plan threshold lets a prediction stay far from what clients see (10% of a 160 ms SLO is
    16 ms, against a p99 of 8-11 ms on the CPU demo)."""
    for m in moves:
        if math.isfinite(m.before_ms) and math.isfinite(m.after_ms):
            if abs(m.after_ms - m.before_ms) > accuracy_goal_ms(m.after_ms, share, floor_ms):
                return m
    return None


#: Two serving terms agree within this share of the larger (or the absolute tolerance, whichever is wider):
#: a term learnt from a p99 is noisy, and a 5 ms SLO's half-threshold (0.25 ms) is below that noise.
SERVING_AGREEMENT = 0.25


@dataclass(frozen=True)
class Confirmation:
    """Consecutive estimates that crossed the threshold and agree with each other (within half the
    threshold: an estimate still on its way to a new regime confirms nothing), per (GPU type, model).
    Agreement holds for the factor and for the serving term (within `serving_tolerance_ms`)."""

    count: int = 0
    factor: float = 1.0  # the last crossing estimate's factor
    serving_ms: float = 0.0  # the last crossing estimate's serving term
    counted_pools: tuple[PoolSpan, ...] = ()  # the pools the last counted estimate's term was learnt from

    def next(
        self,
        crossed: bool,
        factor: float,
        threshold: float,
        serving_ms: float = 0.0,
        serving_tolerance_ms: float = math.inf,
        pools: Sequence[PoolSpan] = (),
        active_serving_ms: float | None = None,
    ) -> Confirmation:
        """`pools`: the pools of an estimate whose serving term was learnt from pooled p99s (empty otherwise;
        `controller.feedback`). Such an estimate confirms the last counted one only when no pool of one overlaps
        a pool of the other: two pools 5 s apart share half their windows, and one quiet stretch, or one stalled
        second, is not two. An agreeing estimate over overlapping pools changes nothing: it neither confirms nor
        contradicts; such an estimate after one that was none (a service-time move alone, a reading without
        pools) starts the count. A service-time move alone needs no such wait.

        With `active_serving_ms`, `serving_ms` and it are levels of what clients see (`controller.feedback`: the
        term plus the batch p99 at each estimate's own service time). Independent pools agree when they move the
        level the same way, and the least of their moves stands (`serving_ms`): a pool's p99 is set by its few
        largest requests, so two pools of one steady path differ by more than any fixed agreement, and the
        larger of two raises is the one a burst made (a lowering: the smaller; `controller.feedback` checks the
        term again at the service time it is published with). The service-time factor need not agree between
        them: it crosses nothing alone here (one that does is confirmed without pools, `controller.feedback`),
        and it moved by more than half the threshold between two estimates that agreed on the term in a traced
        40 s demo run, which restarted the count and refreshed nothing."""
        if not crossed:
            return Confirmation()
        if pools and active_serving_ms is not None:
            up = serving_ms > active_serving_ms
            same_way = self.count > 0 and bool(self.counted_pools) and (self.serving_ms > active_serving_ms) == up
            if not same_way:
                return Confirmation(1, factor, serving_ms, tuple(pools))
            if any(p.overlaps(q) for p in pools for q in self.counted_pools):
                return self  # not independent evidence
            least = min(self.serving_ms, serving_ms) if up else max(self.serving_ms, serving_ms)
            return Confirmation(self.count + 1, factor, least, tuple(pools))
        agrees = (
            self.count > 0
            and abs(factor / self.factor - 1.0) <= threshold / 2.0
            and abs(serving_ms - self.serving_ms)
            <= max(serving_tolerance_ms, SERVING_AGREEMENT * max(serving_ms, self.serving_ms))
        )
        if pools and not self.counted_pools:
            agrees = False  # a term from pools is confirmed by terms from pools only: it starts the count
        if agrees and any(p.overlaps(q) for p in pools for q in self.counted_pools):
            return self  # not independent evidence
        return Confirmation(self.count + 1 if agrees else 1, factor, serving_ms, tuple(pools))


def factor_move(active_factor: float, candidate_factor: float) -> float:
    return abs(candidate_factor / active_factor - 1.0) if active_factor > 0 else math.inf


# ---------------------------------------------------------------- the serving path, from the SLI

#: The quantile of a node's residuals the serving term covers: their median. A window's p99 is noisy and
#: biased high (with 30 requests it is their maximum, about the 98th percentile); the median over windows is
#: close to the p99 of all their requests, while a high quantile of the windows' p99s lies far in the tail and
#: made the bench's workload (p99 75 ms, SLO 80) look infeasible.
SERVING_QUANTILE = 0.5


@dataclass(frozen=True)
class SliWindow:
    """One window of one replica as the serving-path estimate needs it."""

    key: str  # the replica
    node_id: str
    p99_ms: float  # the SLI's p99 (the serving path's histogram, one heartbeat's window)
    p50_ms: float | None  # the SLI's p50
    queue_ms: float  # Triton's mean queue time per request
    compute_ms: float  # Triton's mean compute time per request
    #: The p99 of the replica's last `pooled_windows` windows' requests pooled, this one included (the agent's
    #: `Observation.pooled_p99_ms`): what its clients saw over them. None: an old agent, or a pool that reaches
    #: back to windows the loop does not use (`controller.feedback` hands over only pools of usable windows).
    pooled_p99_ms: float | None = None
    pooled_windows: int = 0
    pooled_count: int = 0
    seq: int = 0  # the window's number (the agent's); its pool covers windows seq - pooled_windows + 1 .. seq
    #: Its own p99 is read (the window holds `guard.min_requests` requests). False: a window of few requests
    #: handed over only for its pool; its own p99 is evidence nowhere (its p50 and Triton's figures still
    #: name what a move is attributed to, and show a compute shift).
    counted: bool = True


@dataclass(frozen=True)
class PoolSpan:
    """The windows one pool covers: replica `key`'s windows `first` .. `last`."""

    key: str
    first: int
    last: int

    def overlaps(self, other: PoolSpan) -> bool:
        return self.key == other.key and self.first <= other.last and other.first <= self.last


def newest_pools(windows: Sequence[SliWindow], min_windows: int = 1) -> dict[str, SliWindow]:
    """Per replica, its newest window that carries a pooled p99 over at least `min_windows` windows (`windows`
    are oldest first); the pool of the newest window covers the replica's recent windows."""
    out: dict[str, SliWindow] = {}
    for w in windows:
        if w.pooled_p99_ms is not None and w.pooled_windows >= min_windows:
            out[w.key] = w
    return out


@dataclass(frozen=True)
class ServingEstimate:
    """The serving term the SLI asks for, or the current one with the reason it stands; `beyond_sli_p99_ms` is
    the term beyond the SLI that goes with it (0 once the term was learnt from pooled p99s: they hold it)."""

    serving_p99_ms: float
    changed: bool
    windows: int
    nodes: int
    agreeing: int
    attribution: str  # "serving path" | "queueing" | "" (no change)
    text: str
    beyond_sli_p99_ms: float = 0.0
    pooled: bool = False  # learnt from pooled p99s
    pools: tuple[PoolSpan, ...] = ()  # the pools it was learnt from


def serving_estimate(
    profile: DeviceProfile,
    model: str,
    replicas: Sequence[PlacedReplica],
    windows: Sequence[SliWindow],
    *,
    min_windows: int,
    tolerance_ms: float,
) -> ServingEstimate:
    """The serving term of `model` that makes its placed replicas' predicted p99 cover the SLI; `profile` is the
    candidate (service time corrected). From what, how it composes with `beyond_sli_p99_ms`, and the safeguards
    (on term + beyond, so pooled and windowed nodes compare): the module docstring, "What the user experiences"."""
    m = profile.model(model)
    current, beyond = m.serving_p99_ms, m.beyond_sli_p99_ms
    without = with_serving(profile, model, 0.0, beyond_sli_ms=0.0)
    batch_p99 = {r.key: replica_p99_ms(without, r) for r in replicas}
    usable = [w for w in windows if w.key in batch_p99 and math.isfinite(batch_p99[w.key]) and w.p99_ms > 0]
    pools = newest_pools(usable, min_windows)  # a pool covers min_windows windows: evidence enough on its own
    nodes = sorted({w.node_id for w in pools.values()} | {w.node_id for w in usable if w.counted})
    read = _windows_read(usable, pools)

    def stays(why: str) -> ServingEstimate:
        return ServingEstimate(current, False, read, len(nodes), 0, "", why, beyond)

    if unread := _unreadable(usable, pools, min_windows, current):
        return stays(unread)
    pooled = bool(pools)
    # what each node says the term should be; with pools, in what clients see outside the batch (term + beyond)
    offset = beyond if pooled else 0.0
    per_node = _per_node_terms(nodes, usable, pools, batch_p99, offset)
    current_seen = current + offset
    source = _source(pools)
    vote = _vote(per_node, current_seen, tolerance_ms)
    if vote is None:
        return stays(
            f"serving path {current:.2f} ms holds: residuals {', '.join(f'{n} {v:.2f}' for n, v in per_node.items())} "
            f"ms from {source} (a raise needs most nodes, a lowering all, beyond +-{tolerance_ms:.2f} ms)"
        )
    new, agreeing = vote
    if abs(new - current_seen) <= tolerance_ms:
        return stays(f"serving path {current:.2f} ms holds (within +-{tolerance_ms:.2f} ms)")
    attribution, router_ms, queue_ms = _attribution(usable)
    was = f"{current:.2f} + {beyond:.2f} beyond the SLI" if pooled else f"{current:.2f}"
    text = (
        f"serving path {was} -> {new:.2f} ms p99 from {source}, attributed to {attribution} (SLI p50 less "
        f"Triton's queue + compute {router_ms:.2f} ms; Triton queue {queue_ms:.2f} ms per request); "
        f"{read} window(s) from {agreeing}/{len(nodes)} node(s) agreeing"
    )
    counts = (read, len(nodes), agreeing)
    return ServingEstimate(new, True, *counts, attribution, text, 0.0 if pooled else beyond, pooled, _spans(pools))


def _windows_read(usable: Sequence[SliWindow], pools: Mapping[str, SliWindow]) -> int:
    """The windows an estimate reads: those its pools cover, and the counted windows of replicas without one."""
    return sum(w.pooled_windows for w in pools.values()) + sum(w.counted for w in usable if w.key not in pools)


def _spans(pools: Mapping[str, SliWindow]) -> tuple[PoolSpan, ...]:
    return tuple(PoolSpan(w.key, w.seq - w.pooled_windows + 1, w.seq) for w in pools.values())


def _unreadable(usable: Sequence[SliWindow], pools: Mapping[str, SliWindow], min_windows: int, current: float) -> str:
    """Why the serving term cannot be read from these windows now, or "" when it can."""
    counted = sum(w.counted for w in usable)
    if not pools and counted < min_windows:
        return f"serving path {current:.2f} ms: {counted} SLI window(s), needs {min_windows}"
    moved = compute_shift(usable)
    if moved is not None:
        return (
            f"serving path {current:.2f} ms holds: Triton's compute per request moved x{moved:.2f} within these "
            "windows; until the service time settles, what clients see beyond it is not the serving path"
        )
    return ""


#: Triton's compute per request moving by more than this factor between the older and the newer half of a
#: replica's windows: the service time is changing, and the serving term is not read from them.
COMPUTE_SHIFT = 1.3


def compute_shift(windows: Sequence[SliWindow]) -> float | None:
    """The largest move (newer half's median compute over the older half's, or its inverse) past `COMPUTE_SHIFT`
    among the replicas of `windows` (oldest first), or None.

    A pool's p99 less the batch p99 at the profile's service time is the serving path only when that service
    time is the pool's. Right after the model slowed 2x, a pool holds slowed windows while the service-time
    correction still rests mostly on earlier ones: the slowdown was learnt as 80 ms of serving path, the plan
    went best effort, and the correction stayed at x1.0 (the closed-loop test's slowdown, on a busy host)."""
    by_replica: dict[str, list[float]] = {}
    for w in windows:
        if w.compute_ms > 0:
            by_replica.setdefault(w.key, []).append(w.compute_ms)
    worst: float | None = None
    for values in by_replica.values():
        if len(values) < 4:
            continue
        half = len(values) // 2
        older, newer = statistics.median(values[:half]), statistics.median(values[-half:])
        ratio = max(newer / older, older / newer)
        if ratio > COMPUTE_SHIFT and (worst is None or ratio > worst):
            worst = ratio
    return worst


def _source(pools: Mapping[str, SliWindow]) -> str:
    if not pools:
        return "the median of the windows' p99s"
    each = ", ".join(f"{w.key} {w.pooled_windows} windows/{w.pooled_count} requests" for w in pools.values())
    return f"pooled p99s ({each})"


def _per_node_terms(
    nodes: Sequence[str],
    usable: Sequence[SliWindow],
    pools: Mapping[str, SliWindow],
    batch_p99: Mapping[str, float],
    offset: float,
) -> dict[str, float]:
    """What each node says clients see outside the batch: its pooled residual (the largest over its replicas),
    else the `SERVING_QUANTILE` of its counted windows' residuals plus `offset` (`nodes`: those with a pool or a
    counted window; a window of few requests is evidence only in its pool)."""
    per_node: dict[str, float] = {}
    for n in nodes:
        node_pools = [w for w in pools.values() if w.node_id == n]
        if node_pools:
            per_node[n] = max(w.pooled_p99_ms - batch_p99[w.key] for w in node_pools if w.pooled_p99_ms is not None)
        else:
            residuals = [w.p99_ms - batch_p99[w.key] for w in usable if w.node_id == n and w.counted]
            per_node[n] = quantile(residuals, SERVING_QUANTILE) + offset
    return per_node


def _vote(per_node: Mapping[str, float], current_seen: float, tolerance_ms: float) -> tuple[float, int] | None:
    """(new term, nodes agreeing): a raise by most nodes (to the largest of theirs), a lowering by all (to the
    largest: below no node's SLI); None when neither."""
    up = [n for n, v in per_node.items() if v > current_seen + tolerance_ms]
    down = [n for n, v in per_node.items() if v < current_seen - tolerance_ms]
    if len(up) * 2 > len(per_node):
        return max(0.0, max(per_node[n] for n in up)), len(up)
    if down and len(down) == len(per_node):
        return max(0.0, max(per_node.values())), len(down)
    return None


def _attribution(usable: Sequence[SliWindow]) -> tuple[str, float, float]:
    """(what the residual is attributed to, the router's share, Triton's queue): the window's SLI p50 less
    Triton's queue + compute is the serving path proper, Triton's mean queue the queueing; the larger names it."""
    path = [w.p50_ms - (w.queue_ms + w.compute_ms) for w in usable if w.p50_ms is not None]
    router_ms = max(0.0, statistics.median(path)) if path else 0.0
    queue_ms = statistics.median(w.queue_ms for w in usable)
    return ("queueing" if queue_ms > router_ms else "serving path"), router_ms, queue_ms


def lowered_below_sli(
    moves: Sequence[Move], windows: Sequence[SliWindow], tolerance_ms: float, beyond_sli_ms: float = 0.0
) -> Move | None:
    """A replica whose predicted p99 the candidate lowers below what its clients are seen to see
    (`sli_seen_ms`, beyond `tolerance_ms`), or None. A service-time correction lowers the prediction
    while the serving term holds (too few SLI windows, nodes that disagree): such a candidate waits.
    `beyond_sli_ms` is the candidate's part the windows do not show (a pooled p99 shows it)."""
    for m in moves:
        seen = sli_seen_ms(windows, m.key, beyond_sli_ms)
        if m.after_ms < m.before_ms and seen is not None and seen > m.after_ms + tolerance_ms:
            return m
    return None


def sli_p99_ms(windows: Sequence[SliWindow], key: str) -> float | None:
    """What replica `key`'s SLI windows show: the `SERVING_QUANTILE` of their p99s (None: no counted window)."""
    seen = [w.p99_ms for w in windows if w.key == key and w.counted]
    return quantile(seen, SERVING_QUANTILE) if seen else None


def sli_seen_ms(windows: Sequence[SliWindow], key: str, beyond_sli_ms: float) -> float | None:
    """What replica `key`'s clients are seen to see, comparable with its whole predicted p99: its newest pooled
    p99 (bursts included), else the median of its windows' p99s plus `beyond_sli_ms`, the part of the
    prediction the windows do not show (None: no window)."""
    pool = newest_pools([w for w in windows if w.key == key]).get(key)
    if pool is not None and pool.pooled_p99_ms is not None:
        return pool.pooled_p99_ms
    seen = sli_p99_ms(windows, key)
    return None if seen is None else seen + beyond_sli_ms


def with_serving(
    profile: DeviceProfile, model: str, serving_ms: float, *, beyond_sli_ms: float | None = None
) -> DeviceProfile:
    """`profile` with `model`'s serving term replaced (and the term beyond the SLI, when given)."""
    m = profile.model(model)
    beyond = m.beyond_sli_p99_ms if beyond_sli_ms is None else beyond_sli_ms
    return DeviceProfile(
        profile.gpu, {**profile.models, model: replace(m, serving_p99_ms=serving_ms, beyond_sli_p99_ms=beyond)}
    )


def nodes_agree(ratios: Mapping[str, Sequence[float]], current: float, proposed: float) -> tuple[int, int, bool]:
    """(agreeing nodes, nodes, accepted) for a service-time factor moving from `current` to `proposed`:
    each node's median observed/predicted ratio of one execution (against the active profile, so 1 is
    `current`) votes once; a raise needs a strict majority of the nodes, a lowering all of them."""
    medians = {n: statistics.median(v) for n, v in ratios.items() if v}
    if not medians:
        return 0, 0, True  # no per-node evidence (windows without Triton's batch figures): the estimate stands
    up = proposed > current
    agreeing = sum(1 for m in medians.values() if (m > 1.0) == up and m != 1.0)
    accepted = agreeing * 2 > len(medians) if up else agreeing == len(medians)
    return agreeing, len(medians), accepted
