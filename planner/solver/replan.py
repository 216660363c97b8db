"""A re-plan after a small change that visits only the GPUs the change reaches.

Given the plan that runs (`current`), a stoke solve re-seeds every GPU of it, places what is
left, searches the GPUs that changed, numbers the replicas and writes the plan. At 10,000
workloads (5,870 GPUs) each of those is a pass over the whole fleet, and a one-rate change cost
240-330 ms though it touched two or three GPUs. So `SolveMemo.last` keeps the previous solve's
final packing (`LastSolve`), and when `current` is that solve's answer, GPU for GPU, and only a
few workloads changed, `replan_locally` takes the same steps on the GPUs they reach:

1. the GPUs that held a changed workload, and those a full seed might not give back exactly as
   they are (`LastSolve.fresh`: changed by the last solve), are seeded again from their
   placements, as `_seed_from` does;
2. what they no longer hold, and the changed workloads' new replicas, are placed by best fit
   (`place_all`) in the order a full solve places them;
3. the local search tries to empty the GPUs that changed (`_local_search`; a full solve's search
   has nothing to do elsewhere: every other GPU holds what it held);
4. the replicas of the workloads on changed GPUs are numbered again, and only those GPUs are
   written (`gpu_plan`); the bound's note is kept up to date from the shares that changed.

Every GPU left alone is one a full solve would seed, keep and write again as it is, so the answer
is the plan a full solve returns from the same `current`: tests compare the two, change after
change. Anything else (a GPU lost, many changes, a lower count limit) is a full solve, which
leaves a new `LastSolve`; so is the solve after one that spilled a replica onto another GPU type
(such a replica is no workload's choice, and every solve places it afresh).
"""

from __future__ import annotations

from bisect import insort
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from planner.solver.candidates import Item
from planner.solver.packing import Bin, Packing
from planner.solver.problem import GpuPlan, Placement, Plan, Problem, Workload
from planner.solver.stoke import (
    SEARCH_EVALUATIONS,
    FinalPacking,
    SolveMemo,
    StokeOptions,
    _local_search,
    bound_note,
    choose_all,
    gpu_plan,
    numbered_as,
    place_all,
    placed_as,
    seed_candidates,
    solve_stoke_packing,
)

#: More workloads changed than this: a full solve (the local steps would gain little).
MAX_LOCAL_CHANGES = 64


@dataclass
class LastSolve:
    """A stoke solve's final state, for the next one to change locally."""

    workloads: tuple[Workload, ...]
    index: dict[str, int]  # workload name -> its position in `workloads` (the order replicas are placed in)
    plan: Plan
    packing: Packing  # its bins hold the replicas as chosen; `numbered`: as the plan numbers them
    order: list[int]  # bin ids in plan order (ascending)
    numbered: dict[int, list[Item]]
    where: dict[str, list[int]]  # workload name -> ids of the bins that hold its replicas (ascending)
    #: bins a new seed from their placements might not give back as they are (changed by the solve)
    fresh: set[int]
    shares: Counter[float]  # the replicas' minimum shares, counted (the bound's note)
    types: Counter[str]  # bins per GPU type


def solve_remembering(problem: Problem, current: Plan | None, options: StokeOptions, memo: SolveMemo) -> Plan:
    """The stoke solve with a memo (`planner.solver.solve` with `memo=`): a local re-plan when it answers, else a
    full solve, whose final packing the memo keeps for the next."""
    memo.open(problem, options)
    # the last packing is handed on by a solve that succeeds: a failure on the way leaves no half-changed one
    last, memo.last = memo.last, None
    if last is not None and current is not None:
        local = replan_locally(problem, current, options, memo, last)
        if local is not None:
            return local
    plan, final = solve_stoke_packing(problem, current, options, memo)
    if final is not None:
        memo.last = remember_solve(problem, plan, final)
    return plan


def remember_solve(problem: Problem, plan: Plan, final: FinalPacking) -> LastSolve:
    """What a full solve leaves for the next."""
    packing, numbered, origins = final.packing, final.numbered, final.origins
    bins = list(packing.bins.values())
    where: dict[str, list[int]] = {}
    for b in bins:
        for name in dict.fromkeys(i.workload.name for i in b.items):
            where.setdefault(name, []).append(b.id)
    fresh = {
        b.id for b, gpu in zip(bins, plan.gpus) if b.id not in origins or gpu.placements is not origins[b.id].placements
    }
    return LastSolve(
        workloads=problem.workloads,
        index={w.name: k for k, w in enumerate(problem.workloads)},
        plan=plan,
        packing=packing,
        order=[b.id for b in bins],
        numbered={b.id: items for b, items in zip(bins, numbered)},
        where=where,
        fresh=fresh,
        shares=Counter(i.min_share for b in bins for i in b.items),
        types=Counter(b.gpu_type for b in bins),
    )


def replan_locally(
    problem: Problem, current: Plan, options: StokeOptions, memo: SolveMemo, last: LastSolve
) -> Plan | None:
    """The plan a full stoke solve returns for `problem` from `current`, or None when this is not a small change
    of the last solve (then the caller solves in full). Changes `last` into this solve's."""
    packing = last.packing
    limits = {g.name: g.max_count for g in problem.inventory}
    if set(last.types) - set(limits) or any(limit is not None and last.types[t] > limit for t, limit in limits.items()):
        return None
    found = _changes(last, problem)
    if found is None:
        return None
    changed, same_order = found
    given = _given(current, last, changed)
    if given is None:
        return None
    index = last.index if same_order else {w.name: k for k, w in enumerate(problem.workloads)}
    packing.limits, packing.evaluations, packing.changed = limits, 0, None
    for bin_id, gpu in given.items():
        packing.bins[bin_id].key = gpu.key
    new = [w for w in problem.workloads if w.name in changed] if changed else []
    memos = dict(memo.replicas)
    choices = dict(zip((w.name for w in new), choose_all(new, problem, packing, options, memo, memos)))
    step = _Step(problem, last, memo, changed, choices, given, index)
    step.seed()
    packing.changed = {}  # from here on, each bin changed is recorded with what it held
    spilled = place_all(packing, sorted(step.left, key=step.placing_order), problem, options, memos)
    _local_search(packing, SEARCH_EVALUATIONS, keep=step.kept, among=step.searched)
    plan = step.finish()
    if spilled:  # a spilled replica is no workload's choice: every solve places it afresh, so the next is full
        memo.last = None
    return plan


def _changes(last: LastSolve, problem: Problem) -> tuple[dict[str, Workload | None], bool] | None:
    """({name: its new value, None when it left} for the workloads that changed, whether the names are as they
    were, in order), or None past the bound."""
    old, new = last.workloads, problem.workloads
    changed: dict[str, Workload | None] = {}
    if len(old) == len(new):
        for a, b in zip(old, new):
            if a is not b and a != b:
                if a.name != b.name:
                    break
                changed[b.name] = b
                if len(changed) > MAX_LOCAL_CHANGES:
                    return None
        else:
            return changed, True
        changed = {}
    after = {w.name: w for w in new}
    for w in old:
        if w.name not in after:
            changed[w.name] = None
    for w in new:
        k = last.index.get(w.name)
        if k is None or (old[k] is not w and old[k] != w):
            changed[w.name] = w
    return (changed, False) if len(changed) <= MAX_LOCAL_CHANGES else None


def _given(current: Plan, last: LastSolve, changed: dict[str, Workload | None]) -> dict[int, GpuPlan] | None:
    """{bin id: the GPU of `current` there} where it is not the last answer's object (a key set, an equal copy,
    a workload that left taken out), or None when `current` is not the last answer GPU for GPU. A GPU that held
    only workloads that left may be missing."""
    gone = {name for name, w in changed.items() if w is None}
    given: dict[int, GpuPlan] = {}
    gpus, j = current.gpus, 0
    for bin_id, answered in zip(last.order, last.plan.gpus):
        gpu = gpus[j] if j < len(gpus) else None
        if gpu is answered:
            j += 1
            continue
        if gpu is not None and gpu.gpu_type == answered.gpu_type and gpu.price_per_hour == answered.price_per_hour:
            expected = answered.placements
            if gone and any(p.name in gone for p in expected):
                expected = tuple(p for p in expected if p.name not in gone)
            if gpu.placements == expected:
                given[bin_id] = gpu
                j += 1
                continue
        if gone and all(p.name in gone for p in answered.placements):
            continue  # emptied by workloads that left: `current` leaves it out
        return None
    return given if j == len(gpus) else None


class _Step:
    """One local re-plan's state (`replan_locally`)."""

    def __init__(
        self,
        problem: Problem,
        last: LastSolve,
        memo: SolveMemo,
        changed: dict[str, Workload | None],
        choices: dict[str, tuple[str, tuple[Item, ...]]],
        given: dict[int, GpuPlan],
        index: dict[str, int],
    ) -> None:
        self.problem, self.last, self.packing, self.memo = problem, last, last.packing, memo
        self.changed, self.choices, self.given, self.index = changed, choices, given, index
        self.first_new = self.packing._next_id
        #: the bins seeded again: their replicas and type before, the placements seeded from, and their count
        #: after when they kept every placement
        self.before: dict[int, list[Item]] = {}
        self.types: dict[int, str] = {}
        self.seeded_from: dict[int, tuple[Placement, ...]] = {}
        self.kept_all: dict[int, int] = {}
        self.left: list[tuple[Item, str]] = []  # replicas to place
        self.later: dict[int, list[Item]] = {}  # bins changed after seeding (`Packing.changed`)

    # -- 1. seeding ----------------------------------------------------------------------------------

    def seed(self) -> None:
        """As `_seed_from`, over the GPUs that held a changed workload and those the last solve changed."""
        last, packing, memo = self.last, self.packing, self.memo
        reseed = set(last.fresh)
        for name in self.changed:
            reseed.update(last.where.get(name, ()))
        position = {bin_id: k for k, bin_id in enumerate(last.order)} if reseed else {}
        # the changed workloads' new replicas, free until a placement takes one (`_seed_from`'s `pick`)
        free: dict[tuple[str, int], tuple[Item, str]] = {}
        for gpu_type, items in self.choices.values():
            for item in items:
                free[item.key] = (item, gpu_type)
        taken: set[tuple[str, int]] = set()
        for bin_id in sorted(reseed):
            answered = last.plan.gpus[position[bin_id]]
            gpu = self.given.get(bin_id, answered)  # the placements of those that left taken out
            b = packing.bins[bin_id]
            held = {n.key: i for n, i in zip(last.numbered[bin_id], b.items)}
            candidates = []
            for p in answered.placements:
                if p.name not in self.changed:
                    candidates.append(held[(p.name, p.replica)])
                    continue
                key = _pick(p, free, taken, self.choices.get(p.name))
                if key is not None and free[key][1] == b.gpu_type:
                    taken.add(key)
                    candidates.append(free[key][0])
            kept = seed_candidates(packing, b.gpu_type, tuple(candidates), memo)
            self.before[bin_id], self.types[bin_id], self.seeded_from[bin_id] = b.items, b.gpu_type, gpu.placements
            if len(kept[0]) == len(gpu.placements):
                self.kept_all[bin_id] = len(kept[0])
                # as `_seed_gpu` records it, for a later full solve's `_seed_from`
                memo.reseeded[id(gpu.placements)] = (gpu, kept[0], kept, tuple(i.key for i in kept[0]))
            self.left += [(i, b.gpu_type) for i in candidates if not any(i is k for k in kept[0])]
            if not kept[0]:
                packing.close(b)
            elif not (_same(kept[0], b.items) and list(kept[1]) == b.shares):
                packing.update(b, list(kept[0]), list(kept[1]))
        self.left += [pair for key, pair in free.items() if key not in taken]

    def placing_order(self, pair: tuple[Item, str]) -> tuple[float, int, int]:
        """A full solve's: by decreasing share, then as the problem lists the workloads and their replicas."""
        item = pair[0]
        return (-item.min_share, self.index[item.workload.name], item.replica)

    # -- 3. the search ---------------------------------------------------------------------------------

    def kept(self, b: Bin) -> bool:
        """A full solve's `keep`: the bin holds as many replicas as its seed gave it, every placement kept."""
        if b.id >= self.first_new:
            return False
        if b.id in self.before:
            return self.kept_all.get(b.id) == len(b.items)
        later = self.packing.changed or {}
        return len(later.get(b.id, b.items)) == len(b.items)

    def searched(self) -> Iterator[Bin]:
        """The bins `kept` may be false for: those seeded again or changed since."""
        bins = self.packing.bins
        for bin_id in {*self.before, *(self.packing.changed or {})}:
            b = bins.get(bin_id)
            if b is not None:
                yield b

    # -- 4. numbering and the plan -----------------------------------------------------------------------

    def finish(self) -> Plan:
        last, packing = self.last, self.packing
        bins = packing.bins
        self.later, packing.changed = packing.changed or {}, None
        originally = {**self.later, **self.before}  # a seeded bin: what it held before its seed
        names: set[str] = set(self.changed)
        for bin_id, items in originally.items():
            now = bins[bin_id].items if bin_id in bins else []
            old_names = {i.workload.name for i in items}
            new_names = {i.workload.name for i in now}
            names |= old_names | new_names
            for name in old_names - new_names:
                last.where[name].remove(bin_id)
                if not last.where[name]:
                    del last.where[name]
            for name in new_names - old_names:
                insort(last.where.setdefault(name, []), bin_id)
            last.shares.subtract(i.min_share for i in items)
            last.shares.update(i.min_share for i in now)
            if not items and bin_id in bins:  # opened
                last.types[bins[bin_id].gpu_type] += 1
            elif items and bin_id not in bins:  # closed
                last.types[self.types.get(bin_id) or self._type_of(bin_id)] -= 1
        last.types, last.shares = +last.types, +last.shares
        renumbered = self._renumber(names, originally)
        return self._plan({bin_id for bin_id in {*originally, *renumbered} if bin_id in bins})

    def _type_of(self, bin_id: int) -> str:
        """The type of a bin of the last plan (one the search closed: a few per re-plan)."""
        return self.last.plan.gpus[self.last.order.index(bin_id)].gpu_type

    def _renumber(self, names: set[str], originally: dict[int, list[Item]]) -> set[int]:
        """Numbers the replicas of `names` again (as `_renumber` does over all bins); the bins whose numbering
        changed."""
        last, bins = self.last, self.packing.bins
        assigned: dict[tuple[int, int], Item] = {}
        holding: set[int] = set()
        for name in names:
            spots = [
                (bin_id, k, item)
                for bin_id in last.where.get(name, ())
                for k, item in enumerate(bins[bin_id].items)
                if item.workload.name == name
            ]
            count = len(spots)
            for n, (bin_id, k, item) in enumerate(spots):
                holding.add(bin_id)
                same = item.replica == n and item.replicas == count
                assigned[(bin_id, k)] = item if same else numbered_as(item, n, count, self.memo)
        changed: set[int] = set()
        for bin_id in holding | {b for b in originally if b in bins}:
            items = bins[bin_id].items
            old = last.numbered.get(bin_id)
            if bin_id in originally or old is None:  # every replica of a changed bin is numbered above
                numbered = [assigned[(bin_id, k)] for k in range(len(items))]
            else:
                numbered = [assigned.get((bin_id, k)) or old[k] for k in range(len(items))]
            if bin_id in originally or old is None or not _same(numbered, old):
                last.numbered[bin_id] = numbered
                changed.add(bin_id)
        for bin_id in originally:
            if bin_id not in bins:
                last.numbered.pop(bin_id, None)
        return changed

    def _plan(self, replot: set[int]) -> Plan:
        last, packing, bins, memo = self.last, self.packing, self.packing.bins, self.memo
        prices = {g.name: g.price_per_hour for g in self.problem.inventory}
        gpus: list[GpuPlan] = []
        order: list[int] = []
        fresh: set[int] = set()
        for bin_id, answered in zip(last.order, last.plan.gpus):
            b = bins.get(bin_id)
            if b is None:
                continue
            order.append(bin_id)
            if bin_id in replot:
                gpu = gpu_plan(packing.caches, b, last.numbered[bin_id], prices[b.gpu_type], memo)
                if not self._canonical(bin_id, gpu, answered):
                    fresh.add(bin_id)
            else:
                gpu = self.given.get(bin_id, answered)
            gpus.append(gpu)
        for bin_id in range(self.first_new, packing._next_id):
            b = bins.get(bin_id)
            if b is not None:
                order.append(bin_id)
                gpus.append(gpu_plan(packing.caches, b, last.numbered[bin_id], prices[b.gpu_type], memo))
                fresh.add(bin_id)
        notes = (bound_note(last.shares, len(gpus)),) if len(last.types) == 1 and gpus else ()
        plan = Plan(strategy="stoke", gpus=tuple(gpus), notes=notes)
        last.workloads, last.index, last.plan, last.order, last.fresh = (
            self.problem.workloads,
            self.index,
            plan,
            order,
            fresh,
        )
        memo.last = last
        return plan

    def _canonical(self, bin_id: int, gpu: GpuPlan, answered: GpuPlan) -> bool:
        """Whether a new seed from `gpu`'s placements gives the bin back as it is: it was seeded from placements
        equal to them (renumbered only: from the last plan's) and has not changed since."""
        if bin_id in self.later:
            return False
        seeded_from = self.seeded_from.get(bin_id, answered.placements)
        return gpu.placements is seeded_from or gpu.placements == seeded_from


def _pick(
    p: Placement,
    free: dict[tuple[str, int], tuple[Item, str]],
    taken: set[tuple[str, int]],
    choice: tuple[str, tuple[Item, ...]] | None,
) -> tuple[str, int] | None:
    """The key of the changed workload's new replica that placement `p` takes, as `_seed_from`'s `pick`: its own
    number with the same batch and rate, else the first free one with them, else its own number if free."""
    own = (p.name, p.replica)
    found = free.get(own)
    own_free = found is not None and own not in taken
    if found is not None and own_free and placed_as(found[0], p):
        return own
    for item in choice[1] if choice is not None else ():
        if item.key not in taken and placed_as(item, p):
            return item.key
    return own if own_free else None


def _same(a: tuple[Item, ...] | list[Item], b: list[Item]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))
