"""The solver under a time and memory budget: it runs in a worker process that the controller can kill.

A solve is a pure function, but not a cheap one in every case: a pathological
workload could keep it busy, and a Python thread cannot be stopped. So the
controller runs the solver in one long-lived worker process
(``python -m controller.reconcile.budget``) and waits at most ``budget_s``
for each answer. Past the budget the worker is killed (SIGKILL) and the call
raises `BudgetExceeded` (a `ProblemError`), which the planning step turns
into "pending, with the reason" for the workload(s) that caused it while the
rest is planned (`controller.reconcile.planning.solve_with_fallback`). The
worker also runs under a memory limit (``RLIMIT_DATA``), so a solve that
would eat the machine fails with `BudgetExceeded` instead. The next call
starts a new worker.

The protocol is length-prefixed pickles over the worker's stdin/stdout
(it is the controller's own child: nothing else writes there). The solver is
sent by reference, so it must be a module-level function (`planner.solver.solve`
or a test's). Any exception inside a solve comes back as a `ProblemError`
naming it, so one workload that trips a solver bug is pending instead of
blocking every plan. One worker serves the whole process (calls are
serialised), started on first use and stopped by `close_worker()` or when
the process exits (its stdin closes). A new worker says it is ready (its
imports done) before the first solve is sent, so the budget times the solve,
not Python's start on a busy machine.
"""

from __future__ import annotations

import atexit
import gc
import inspect
import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from controller.reconcile.planning import BudgetExceeded
from controller.reconcile.wire import linked
from planner.solver import Plan, Problem, ProblemError

log = logging.getLogger("stoke.planner.solver")
_HEADER = struct.Struct("!Q")


#: Largest message either side accepts (a problem of 10,000 workloads is a few MB).
MAX_MESSAGE = 256 * 1024 * 1024
#: The solver worker looks at every object for garbage once in this many solves (see `_serve`).
FULL_COLLECTION_EVERY = 50
#: Longest wait for a new worker to import the solver and say it is ready (not part of any solve's budget).
START_TIMEOUT_S = 60.0


class _Dead(Exception):
    """The worker went away (crashed, killed) before answering."""


def _read_exact(stream: BinaryIO, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _write(stream: BinaryIO, obj: Any) -> None:
    _write_bytes(stream, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _write_bytes(stream: BinaryIO, data: bytes) -> None:
    stream.write(_HEADER.pack(len(data)))
    stream.write(data)
    stream.flush()


class SolverWorker:
    """One worker process; `run` sends it one solve and waits at most the budget."""

    def __init__(self, memory_mib: int = 4096) -> None:
        self.memory_mib = memory_mib
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self.started = 0  # worker processes started (a new one after each kill)
        self.exit_code: int | None = None  # of the last worker that ended
        # what the worker already holds travels as its number (`wire`); both ends start afresh with a worker
        self._requests, self._answers = linked()

    def _ensure(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._requests, self._answers = linked()
        env = dict(os.environ)
        # the child imports the solver (and a test's solver) from the same places as this process
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        proc = self._proc = subprocess.Popen(
            [sys.executable, "-m", "controller.reconcile.budget", str(self.memory_mib)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        self.started += 1
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            (size,) = _HEADER.unpack(self._read(proc, _HEADER.size, deadline, START_TIMEOUT_S))
            ready = pickle.loads(self._read(proc, size, deadline, START_TIMEOUT_S)) if size <= 64 else None
        except BudgetExceeded:
            raise BudgetExceeded(f"the solver process did not start within {START_TIMEOUT_S:g} s") from None
        if ready != ("ready", None):
            self._kill()
            raise _Dead
        return proc

    def run(self, solver: Callable[..., Plan], budget_s: float, *args: Any, **kwargs: Any) -> Plan:
        """`solver(*args, **kwargs)` in the worker; `BudgetExceeded` after `budget_s` seconds."""
        with self._lock:
            for attempt in range(2):
                try:
                    return self._call(self._ensure(), budget_s, (solver, args, kwargs))
                except _Dead:
                    self._kill()
                    if attempt:
                        raise BudgetExceeded(
                            f"the solver process died (exit code {self.exit_code}) before answering; "
                            f"its memory budget is {self.memory_mib} MiB (solver_memory_mib)"
                        ) from None
            raise AssertionError("unreachable")

    def _call(self, proc: subprocess.Popen[bytes], budget_s: float, request: Any) -> Plan:
        assert proc.stdin is not None and proc.stdout is not None
        deadline = time.monotonic() + budget_s
        try:
            _write_bytes(proc.stdin, self._requests.dumps(request))  # type: ignore[arg-type]
        except (BrokenPipeError, OSError):
            raise _Dead from None
        header = self._read(proc, _HEADER.size, deadline, budget_s)
        (size,) = _HEADER.unpack(header)
        if size > MAX_MESSAGE:
            self._kill()
            raise BudgetExceeded(f"the solver answered with {size} bytes, more than {MAX_MESSAGE}")
        try:
            kind, value = self._answers.loads(self._read(proc, size, deadline, budget_s))
        except pickle.UnpicklingError:  # the two ends' tables disagree: a new worker starts both afresh
            self._kill()
            raise _Dead from None
        if kind == "ok":
            return value  # type: ignore[no-any-return]
        if kind == "budget":
            raise BudgetExceeded(value)
        raise ProblemError(value[0], value[1])

    def _read(self, proc: subprocess.Popen[bytes], size: int, deadline: float, budget_s: float) -> bytes:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        data = bytearray()
        while len(data) < size:
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(0.0, left))[0] if left > 0 else []
            if not ready:
                self._kill()
                raise BudgetExceeded(f"the solver did not finish within its budget of {budget_s:g} s (solver_budget_s)")
            chunk = os.read(fd, min(size - len(data), 1 << 20))
            if not chunk:
                raise _Dead
            data += chunk
        return bytes(data)

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        self.exit_code = proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass

    def close(self) -> None:
        with self._lock:
            self._kill()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None


_shared: SolverWorker | None = None
_shared_lock = threading.Lock()


def shared_worker(memory_mib: int) -> SolverWorker:
    """The process's solver worker (created on first use; a new memory limit replaces it)."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared.memory_mib != memory_mib:
            if _shared is not None:
                _shared.close()
            _shared = SolverWorker(memory_mib)
        return _shared


def close_worker() -> None:
    global _shared
    with _shared_lock:
        if _shared is not None:
            _shared.close()
            _shared = None


atexit.register(close_worker)


def remembering(solver: Callable[..., Plan]) -> Callable[..., Plan]:
    """`solver` given one `SolveMemo` for all its calls when it takes `memo=` (the stoke strategy
    re-plans a large fleet after a small change in a fraction of the time), else `solver` itself.
    Calls are serialised: the memo is one solve's at a time."""
    try:
        takes_memo = "memo" in inspect.signature(solver).parameters
    except (TypeError, ValueError):  # a callable without a signature: no memo
        takes_memo = False
    if not takes_memo:
        return solver
    from planner.solver.stoke import SolveMemo

    memo, lock = SolveMemo(), threading.Lock()

    def run(*args: Any, **kwargs: Any) -> Plan:
        with lock:
            return solver(*args, memo=memo, **kwargs)

    return run


def budgeted(solver: Callable[..., Plan], budget_s: float, memory_mib: int) -> Callable[..., Plan]:
    """`solver` with the same signature, run in the shared worker under the budget (0 = in this process,
    `remembering`)."""
    if budget_s <= 0:
        return remembering(solver)

    def run(problem: Problem, strategy: str = "stoke", *, current: Plan | None = None) -> Plan:
        return shared_worker(memory_mib).run(solver, budget_s, problem, strategy, current=current)

    return run


# ---------------------------------------------------------------- the worker side


def _serve(memory_mib: int) -> None:
    import resource

    limit = memory_mib * 1024 * 1024
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    except (ValueError, OSError):  # a lower hard limit already: keep it
        pass
    # the protocol owns the real stdout; anything the solver prints goes to stderr
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    source = sys.stdin.buffer
    solvers: dict[Any, Callable[..., Plan]] = {}  # each solver `remembering` across the worker's solves
    answers, requests = linked()
    # Garbage is collected between solves, while the controller reads the answer, not during one: at
    # 10,000 workloads a full collection over the memo took 70-150 ms, half a re-plan's time. What
    # survives is frozen (left out of later collections), so the collection after the next solve looks
    # at that solve's objects only and is over before the next request comes; every
    # `FULL_COLLECTION_EVERY` solves everything is looked at again, so a cycle dropped later is freed too.
    gc.disable()
    solves = 0
    import planner.solver.stoke  # noqa: F401 - the strategies load on first use elsewhere; here before "ready"

    _write(out, ("ready", None))  # the imports are done: the controller starts the budget's clock now
    while True:
        try:
            (size,) = _HEADER.unpack(_read_exact(source, _HEADER.size))
            solver, args, kwargs = requests.loads(_read_exact(source, size))
        except EOFError:
            return  # the controller closed the pipe (or exited)
        try:
            if solver not in solvers:
                solvers[solver] = remembering(solver)
            answer: tuple[str, Any] = ("ok", solvers[solver](*args, **kwargs))
        except ProblemError as err:
            answer = ("problem", (str(err), err.field))
        except MemoryError:
            answer = ("budget", f"the solver ran out of its memory budget of {memory_mib} MiB (solver_memory_mib)")
        except Exception as err:  # noqa: BLE001 - a solver bug becomes this solve's error, not the controller's
            answer = ("problem", (f"the solver failed: {type(err).__name__}: {err}", ""))
        _write_bytes(out, answers.dumps(answer))
        solves += 1
        if solves % FULL_COLLECTION_EVERY == 0:
            gc.unfreeze()
        gc.collect()
        gc.freeze()


if __name__ == "__main__":
    _serve(int(sys.argv[1]) if len(sys.argv) > 1 else 4096)
