"""The solver worker's pipe: pickles in which an object the other end already holds travels as its number.

A re-plan at fleet scale sends the worker what the last one sent, bar a workload or two: 10,000
workloads and the plan that runs (11,000 placements), about 3.5 MB, and gets back a plan of the
same size. Pickling all of it both ways took longer than the re-plan itself. A `Channel` is one
direction of the pipe. The sender numbers each workload, placement, GPU of a plan and profile the
first time it sends it (the value travels, with its number) and sends only the number afterwards;
the receiver keeps what it was given under that number. An object is found by identity (the
controller keeps its workloads and profiles, and hands back the placements it received) or, for
the hashable types, by value. A problem's workloads and a plan's GPUs travel as one list of numbers
(and the objects not sent before), not one pickling call each.

An object handed back travels as the number its first sender gave it (an *echo*): the controller
sends back the plan the worker answered, and the worker answers GPUs of the plan it was given. Each
process links its two channels (`linked`): its sending end echoes what its receiving end was given,
and its receiving end resolves an echo to the object its sending end sent. The GPUs a re-plan leaves
alone then go both ways as numbers and arrive as the receiver's own objects, with no value compared
or hashed (after a full solve that was 12,000 lookups by value, a third of the next re-plan).

Both ends start empty with each worker process. The sender bounds what it keeps: past
`MAX_HELD` objects (or four times what one message holds) it starts afresh and tells the receiver
to, in the message's first byte. The pipe is the controller's own child's stdin and stdout, so a
number always names what its sender sent; `loads` refuses a number it does not hold and a type
outside the shared ones rather than guess.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import types
from typing import Any

from interference.profile import DeviceProfile
from planner.solver import GpuPlan, Placement, Plan, Problem, Workload

#: Types sent once: frozen, plain data the solver is given or gives back again and again.
SHARED_TYPES: tuple[type, ...] = (Workload, Placement, GpuPlan, DeviceProfile)
#: Of those, the ones also found by value (a profile holds arrays: by identity only).
_BY_VALUE = (Workload, Placement, GpuPlan)
_NAMES = {(t.__module__, t.__qualname__): t for t in SHARED_TYPES}
#: Containers of many shared objects, and the field that holds them: the field travels as one list of numbers
#: (the objects already sent) and objects, instead of one call per object (10,000 workloads, 5,000 GPUs).
_CONTAINERS: dict[type, str] = {Problem: "workloads", Plan: "gpus"}
#: Objects a sender keeps numbered at most (beyond four times the last message's).
MAX_HELD = 200_000


def _read_only(data: dict[Any, Any]) -> types.MappingProxyType[Any, Any]:
    return types.MappingProxyType(data)


# profiles freeze their models in a read-only mapping: it travels as the dict it wraps
copyreg.pickle(types.MappingProxyType, lambda m: (_read_only, (dict(m),)))


def _held(number: int) -> Any:
    """Placeholder for pickles' sake: a receiving `Channel` resolves this name to its own table."""
    raise pickle.UnpicklingError("a shared object outside a Channel")


def _first(number: int, cls: type, state: dict[str, Any]) -> Any:
    """Placeholder, as `_held`."""
    raise pickle.UnpicklingError("a shared object outside a Channel")


def _container(cls: type, field: str, state: dict[str, Any]) -> Any:
    """Placeholder, as `_held`."""
    raise pickle.UnpicklingError("a shared object outside a Channel")


def _echo(number: int) -> Any:
    """Placeholder, as `_held`: the object the receiver's own sending end sent as `number`."""
    raise pickle.UnpicklingError("a shared object outside a Channel")


def linked() -> tuple[Channel, Channel]:
    """(sending end, receiving end) of one process, linked for echoes (see the module docstring)."""
    sending, receiving = Channel(), Channel()
    sending._back, receiving._back = receiving, sending
    return sending, receiving


class Channel:
    """One direction of the pipe; `dumps` on the sending end, `loads` on the receiving end."""

    def __init__(self) -> None:
        # sending end: number by identity (the objects held, so an id is never another's) and by value
        self._by_id: dict[int, int] = {}
        self._by_value: dict[Any, int] = {}
        self._held: list[Any] = []
        self._by_number: dict[int, Any] = {}  # the object each number was first given to (for echoes)
        self._next = 0
        self._last_message = 0
        # receiving end
        self._table: dict[int, Any] = {}
        self._received: dict[int, int] = {}  # id -> number of each object received (for echoes)
        #: the other direction's channel in this process (`linked`), or None: no echoes
        self._back: Channel | None = None

    # ---------------------------------------------------------------- sending

    def dumps(self, obj: Any) -> bytes:
        reset = len(self._held) > MAX_HELD + 4 * self._last_message
        if reset:
            self._by_id, self._by_value, self._held, self._next, self._by_number = {}, {}, [], 0, {}
        buffer = io.BytesIO()
        buffer.write(b"\x01" if reset else b"\x00")
        pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        table = dict(copyreg.dispatch_table)
        table.update({t: self._reduce for t in SHARED_TYPES})
        table.update({t: self._reduce_container for t in _CONTAINERS})
        pickler.dispatch_table = table  # type: ignore[misc]  # the documented per-pickler override
        self._count = 0
        pickler.dump(obj)
        self._last_message = self._count
        return buffer.getvalue()

    def _reduce(self, obj: Any) -> tuple[Any, ...]:
        self._count += 1
        number = self._by_id.get(id(obj))
        if number is not None:
            return (_held, (number,))
        if self._back is not None:
            echo = self._back._received.get(id(obj))
            if echo is not None:
                return (_echo, (echo,))
        self._held.append(obj)  # held: its id is never another object's while it names a number here
        if isinstance(obj, _BY_VALUE):
            number = self._by_value.get(obj)  # NaN fields never compare equal: such a value is sent again
        if number is not None:
            self._by_id[id(obj)] = number  # an equal copy: found by identity from now on
            return (_held, (number,))
        number = self._next
        self._next += 1
        self._by_id[id(obj)] = number
        self._by_number[number] = obj
        if isinstance(obj, _BY_VALUE):
            self._by_value.setdefault(obj, number)
        # the fields travel through this pickler, so a GPU's known placements go as their numbers too
        return (_first, (number, type(obj), dict(vars(obj))))

    def _reduce_container(self, obj: Any) -> tuple[Any, ...]:
        field = _CONTAINERS[type(obj)]
        state = dict(vars(obj))
        by_id = self._by_id
        received = self._back._received if self._back is not None else {}
        # a number for each object already sent (an int is never one of the shared types), -1 - the number of
        # one received, the object itself for the rest (then `_reduce` numbers it, or finds it by value)
        state[field] = [
            n if (n := by_id.get(id(x))) is not None else (x if (e := received.get(id(x))) is None else -1 - e)
            for x in state[field]
        ]
        self._count += len(state[field])
        return (_container, (type(obj), field, state))

    # ---------------------------------------------------------------- receiving

    def loads(self, data: bytes | memoryview) -> Any:
        view = memoryview(data)
        if view[:1] == b"\x01":
            self._table, self._received = {}, {}
        return _Unpickler(io.BytesIO(view[1:]), self).load()

    def _lookup(self, number: int) -> Any:
        try:
            return self._table[number]
        except KeyError:
            raise pickle.UnpicklingError(f"shared object {number} was never sent") from None

    def _echoed(self, number: int) -> Any:
        sent = self._back._by_number if self._back is not None else {}
        try:
            return sent[number]
        except KeyError:
            raise pickle.UnpicklingError(f"echo of shared object {number}, which this end never sent") from None

    def _define(self, number: int, cls: type, state: dict[str, Any]) -> Any:
        if cls not in SHARED_TYPES:
            raise pickle.UnpicklingError(f"{cls!r} is not a shared type")
        obj: Any = object.__new__(cls)
        obj.__dict__.update(state)  # as pickle itself restores a dataclass: no __init__, no re-validation
        self._table[number] = obj
        self._received[id(obj)] = number  # held by the table: the id stays its own
        return obj

    def _define_container(self, cls: type, field: str, state: dict[str, Any]) -> Any:
        if _CONTAINERS.get(cls) != field:
            raise pickle.UnpicklingError(f"{cls!r} is not a container of shared objects")
        table = self._table
        try:
            state[field] = tuple(
                (table[x] if x >= 0 else self._echoed(-1 - x)) if type(x) is int else x for x in state[field]
            )
        except KeyError as err:
            raise pickle.UnpicklingError(f"shared object {err.args[0]} was never sent") from None
        obj: Any = object.__new__(cls)
        obj.__dict__.update(state)
        return obj


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, channel: Channel) -> None:
        super().__init__(file)
        self._channel = channel

    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name == "_held":
            return self._channel._lookup
        if module == __name__ and name == "_first":
            return self._channel._define
        if module == __name__ and name == "_container":
            return self._channel._define_container
        if module == __name__ and name == "_echo":
            return self._channel._echoed
        return super().find_class(module, name)
