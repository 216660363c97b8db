"""Plan GPUs bound to node devices (slots), and the plan cut per node. Pure functions, no I/O.

Binding plan GPUs to node devices
---------------------------------
The solver returns GPUs (`Plan.gpus`), not machines. Every device a node
reports is one *slot* `(node_id, device index, gpu_type)`; a CPU node is one
slot of the CPU "GPU type" (device 0, share = % of its cores). `bind_gpus`
gives each plan GPU one slot of its type, at most one GPU per slot:

1. stability first: the controller passes the applied plan to the solver as
   `current` with each GPU's `key` set to its slot ("node/device"); the solver
   carries the key over to the GPU that keeps those workloads, and that GPU
   goes back to the slot named by its key;
2. a GPU without a (usable) key goes to the slot that ran the most of its
   placements (workload#replica keys) in the previous plan, pairs taken in
   order of that overlap (greatest first), ties by slot order;
3. the other GPUs take the free slots of their type in (node_id, device) order;
4. a GPU left without a slot is bound to None (its workloads are reported
   pending: no free device of that type).

Together with the solver's `current=` argument (the `stoke` strategy keeps the
current placements that stay feasible) this keeps a GPU on the node it was on,
so an unrelated change does not reshuffle placements.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from controller.messages import REPLICA_SEPARATOR, ModelAssignment
from planner.solver import GpuPlan, Plan


@dataclass(frozen=True)
class Binding:
    """Where one plan GPU runs: a device slot of a node."""

    node_id: str
    device: int
    gpu_type: str
    #: "node/device" (`slot_key`) and the hash, made once: a re-plan at 10,000 workloads binds 5,000 GPUs,
    #: and the generated hash (a tuple of the fields) and the key's formatting were a third of that
    key: str = field(init=False, repr=False, compare=False)
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", f"{self.node_id}/{self.device}")
        object.__setattr__(self, "_hash", hash((self.node_id, self.device, self.gpu_type)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[Binding], tuple[str, int, str]]:
        # made afresh where it is loaded: a str's hash is another in another process
        return (Binding, (self.node_id, self.device, self.gpu_type))


def slot_key(slot: Binding) -> str:
    return slot.key


def placement_keys(gpu: GpuPlan) -> frozenset[str]:
    """Its replicas' keys, as `str(Replica(name, replica))` writes them (without making a Replica of each:
    a GPU opened at a re-plan reads every slot's keys, 11,000 at 10,000 workloads)."""
    return frozenset(f"{p.name}{REPLICA_SEPARATOR}{p.replica}" for p in gpu.placements)


def slot_order(slot: Binding) -> tuple[str, int, str]:
    return (slot.node_id, slot.device, slot.gpu_type)


def bind_gpus(
    plan: Plan,
    slots: Iterable[Binding],
    previous: Mapping[Binding, frozenset[str]]
    | Callable[[frozenset[str]], Mapping[Binding, frozenset[str]]]
    | None = None,
) -> tuple[Binding | None, ...]:
    """One slot (or None) per plan GPU; `previous` maps slots to the keys they ran before, or makes that
    map given the keys of the GPUs without a usable key (it is needed only for those: at least the slots
    that ran one of them, with those keys, e.g. `slot_keys(..., wanted=)`). Time linear in GPUs and slots."""
    slots = tuple(slots)
    by_key = {slot_key(s): s for s in slots}
    free: list[Binding] = []
    if len(by_key) < len(slots):  # a key twice: the last in slot order names it (sorted only then, and below)
        free = sorted(set(slots), key=slot_order)
        by_key = {slot_key(s): s for s in free}
    bound: list[Binding | None] = [None] * len(plan.gpus)
    taken: set[Binding] = set()
    for i, gpu in enumerate(plan.gpus):
        slot = by_key.get(getattr(gpu, "key", None) or "")
        if slot is not None and slot.gpu_type == gpu.gpu_type and slot not in taken:
            bound[i] = slot
            taken.add(slot)
    unbound = [i for i, b in enumerate(bound) if b is None]
    if unbound:
        wanted = frozenset().union(*(placement_keys(plan.gpus[i]) for i in unbound))
        ran = (previous(wanted) if callable(previous) else previous) or {}
        # only the slots not taken yet can be given (sorting the rest is work for nothing)
        free = free or sorted((s for s in set(slots) if s not in taken), key=slot_order)
        _bind_unbound(plan, free, ran, unbound, bound, taken)
    return tuple(bound)


def _bind_unbound(
    plan: Plan,
    free: list[Binding],
    ran: Mapping[Binding, frozenset[str]],
    unbound: list[int],
    bound: list[Binding | None],
    taken: set[Binding],
) -> None:
    """`bind_gpus` for the GPUs without a usable key: the free slot most of their replicas ran on, else the
    first free slot of their type (in slot order); fills `bound` and `taken`."""
    # count, per unbound GPU, its replicas that ran on each free slot (through an index: replica -> slots)
    healthy = set(free)
    where: dict[str, list[Binding]] = {}
    for slot, keys in ran.items():
        if slot in healthy and slot not in taken:
            for key in keys:
                where.setdefault(key, []).append(slot)
    pairs = []
    for i in unbound:
        gpu = plan.gpus[i]
        overlaps = Counter(slot for k in placement_keys(gpu) for slot in where.get(k, ()))
        pairs += [(-n, i, slot_order(slot), slot) for slot, n in overlaps.items() if slot.gpu_type == gpu.gpu_type]
    for _, i, _, slot in sorted(pairs):
        if bound[i] is None and slot not in taken:
            bound[i] = slot
            taken.add(slot)
    # the rest: the first free slot of their type, in slot order
    of_type: dict[str, Iterator[Binding]] = {}
    for i in unbound:
        if bound[i] is not None:
            continue
        gpu_type = plan.gpus[i].gpu_type
        cursor = of_type.get(gpu_type)
        if cursor is None:  # once per type (a setdefault built the list for every GPU: quadratic in a first plan)
            cursor = of_type[gpu_type] = iter([s for s in free if s.gpu_type == gpu_type])
        first = next((s for s in cursor if s not in taken), None)
        if first is not None:
            bound[i] = first
            taken.add(first)


def slot_keys(
    plan: Plan, bindings: Sequence[Binding | None], wanted: frozenset[str] | None = None
) -> dict[Binding, frozenset[str]]:
    """What each bound slot runs under `plan` (input to the next `bind_gpus`). With `wanted` (replica keys),
    only the slots that run one of them, with those keys: a re-plan opens a GPU or two, and writing
    every replica's key of a 10,000-workload plan for them took 20-30 ms."""
    if wanted is None:
        return {b: placement_keys(g) for g, b in zip(plan.gpus, bindings) if b is not None}
    names = {key.rpartition(REPLICA_SEPARATOR)[0] for key in wanted}
    out: dict[Binding, frozenset[str]] = {}
    for g, b in zip(plan.gpus, bindings):
        if b is not None and any(p.name in names for p in g.placements):
            keys = placement_keys(g) & wanted
            if keys:
                out[b] = keys
    return out


def node_assignments(plan: Plan, bindings: Sequence[Binding | None]) -> dict[str, tuple[ModelAssignment, ...]]:
    """The plan cut per node: {node_id: assignments sorted by key}."""
    out: dict[str, list[ModelAssignment]] = {}
    for gpu, slot in zip(plan.gpus, bindings):
        if slot is None:
            continue
        for p in gpu.placements:
            out.setdefault(slot.node_id, []).append(ModelAssignment.of(p, slot.device))
    return {node: tuple(sorted(items, key=lambda a: a.key)) for node, items in sorted(out.items())}


def without_slots(
    plan: Plan, bindings: Sequence[Binding | None], keep: Iterable[Binding]
) -> tuple[Plan, tuple[Binding, ...]]:
    """The plan restricted to GPUs bound to a slot in `keep` (e.g. the slots of healthy nodes),
    each GPU keyed by its slot ("node/device"): the `current` plan handed to the solver."""
    keep = set(keep)
    pairs = [
        (g if g.key == slot_key(b) else replace(g, key=slot_key(b)), b)
        for g, b in zip(plan.gpus, bindings)
        if b is not None and b in keep
    ]
    return (Plan(strategy=plan.strategy, gpus=tuple(g for g, _ in pairs), notes=plan.notes), tuple(b for _, b in pairs))
