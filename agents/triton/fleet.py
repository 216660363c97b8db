"""All Triton processes of a node: `TritonFleet.apply` makes the node serve exactly the given
assignments (see the package docstring)."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tritonclient.utils import InferenceServerException

from agents.router import Backend, RouterError
from agents.triton.environment import (
    HOST,
    TritonError,
    cpu_cores_for_share,
    find_tritonserver,
    math_threads_env,
    overcommit_problems,
    prepare_backend_dir,
)
from agents.triton.ledger import reap_orphans
from agents.triton.metrics import ObservedModel, observe_model, parse_metrics, parse_statistics
from agents.triton.process import TritonProcess
from controller.limits import REFUSED_KEY
from controller.messages import AssignmentError, ModelAssignment, ServingEndpoint
from controller.render import (
    CONFIG_NAME,
    MAX_CONFIG_BYTES,
    ModelConfig,
    config_from_bytes,
    config_to_text,
    read_config,
    render_config,
)
from foundation.names import name_problem

log = logging.getLogger("stoke.triton")
#: Requests per batch size that pre-warm a new process before a move switches traffic to it.
WARM_UP_REQUESTS = 2
#: How long a warm-up waits for Triton to count its requests (it counts after replying).
WARM_UP_COUNT_WAIT_S = 2.0

# --------------------------------------------------------------------------- the fleet


@dataclass(frozen=True)
class ApplyReport:
    started: tuple[str, ...] = ()
    reloaded: tuple[str, ...] = ()
    moved: tuple[str, ...] = ()
    stopped: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    errors: tuple[AssignmentError, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.started or self.reloaded or self.moved or self.stopped)


@dataclass
class _Slot:
    assignment: ModelAssignment
    process: TritonProcess
    config: ModelConfig
    cores: tuple[int, ...] | None
    last_metrics: dict[str, float] = field(default_factory=dict)
    last_scrape: float = 0.0
    windows: int = 0  # windows observed so far (`ObservedModel.seq`)


#: A base-config parameter: this many model instances on a CPU node, whatever the share (the model uses the
#: cores of its share itself); without it, one instance per core of the share.
FIXED_CPU_INSTANCES = "stoke_cpu_instances"


def _instances(config: ModelConfig) -> int:
    return max(1, sum(int(g.count) or 1 for g in config.instance_group)) if config.instance_group else 1


def _placement(a: ModelAssignment) -> tuple[str, int, float]:
    """What a process embodies: changing it means a new process."""
    return (a.model, a.device, round(float(a.share_pct), 6))


#: How long `TritonFleet.close` may take, whatever is loading: the agent's whole shutdown stays within 30 s
#: (under systemd's default 90 s stop timeout), see `agents.agent.SHUTDOWN_S`.
SHUTDOWN_S = 20.0


class TritonFleet:
    """All Triton processes of one node; makes the node serve exactly the given assignments."""

    def __init__(
        self,
        repository: str,
        *,
        device_kind: str = "cpu",
        workdir: str | None = None,
        ready_timeout_s: float = 30.0,
        base_config: Callable[[str], ModelConfig] | None = None,
        env: Mapping[str, str] | None = None,
        mps: object | None = None,
        cpu_cores: Sequence[int] | None = None,
        latency_histogram: bool = False,
        exit_timeout_s: int = 5,
        cpu_instance_per_core: bool = True,
        drain_s: float = 0.2,
        devices: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        router: Any = None,
        drain_timeout_s: float = 30.0,
        probe_deadline_s: float = 2.0,
    ) -> None:
        """`router`: an `agents.router.Router` giving each workload stable endpoints (closed with the fleet).
        `probe_deadline_s`: a running Triton that does not answer its readiness probe within it is hung: it
        is killed and replaced (`check_health`)."""
        if device_kind not in ("cpu", "gpu"):
            raise ValueError(f"device_kind must be 'cpu' or 'gpu', got {device_kind!r}")
        self.repository = repository
        self.device_kind = device_kind
        self.devices = devices  # GPUs of the node (None: not checked); a CPU node is one device
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="stoke-triton-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        #: Triton processes a crashed agent left in this workdir, stopped before anything starts
        self.reaped = reap_orphans(self.workdir)
        self.ready_timeout_s = ready_timeout_s
        self.env = dict(env or {})
        self.mps: Any = mps
        self.cpu_cores = tuple(sorted(cpu_cores if cpu_cores else os.sched_getaffinity(0)))
        self.latency_histogram = latency_histogram
        self.exit_timeout_s = exit_timeout_s
        self.cpu_instance_per_core = cpu_instance_per_core
        self.drain_s = drain_s
        self.router: Any = router
        self.drain_timeout_s = drain_timeout_s
        self.probe_deadline_s = probe_deadline_s
        self._clock = clock
        self._base_config = base_config or self._default_base_config
        self._binary = find_tritonserver()
        self._backend_dir = prepare_backend_dir(self.workdir)
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.RLock()
        #: every process spawned and maybe alive (a start or a load in progress included): what `close` kills
        #: when its deadline passes, without the fleet lock a long load may hold
        self._spawned: list[TritonProcess] = []
        self._spawned_lock = threading.Lock()
        self._closing = threading.Event()
        self._counter = 0
        self._mps_started = False
        self._store: Any = None  # the S3 store of a remote repository, opened on first use

    # -- what this node refuses to run
    def refusals(self, assignments: Sequence[ModelAssignment]) -> list[AssignmentError]:
        """Why a controller's assignments must not run here (see the module docstring); empty when they may.

        The agent asks before every apply. `apply` itself refuses only the names and paths: `stoke
        triton up` without a plan serves every model on the whole machine on purpose."""
        errors = self._path_refusals(assignments)
        if errors:
            return errors
        problems = overcommit_problems(
            assignments,
            device_kind=self.device_kind,
            devices=self.devices if self.devices is not None else 1 + max((a.device for a in assignments), default=0),
            cores=self.cpu_cores,
        )
        if problems:
            text = f"refused: the assignments over-commit this node, nothing changed: {'; '.join(problems)}"
            return [AssignmentError(a.key, text) for a in assignments]
        return []

    def _path_refusals(self, assignments: Sequence[ModelAssignment]) -> list[AssignmentError]:
        errors = []
        for a in assignments:
            problem = name_problem(a.workload) or name_problem(a.model)
            if problem:
                key = REFUSED_KEY if name_problem(a.workload) else a.key
                errors.append(AssignmentError(key, f"refused: a workload or model name {problem}"))
            elif "://" not in self.repository and not self._inside_repository(a.model):
                errors.append(
                    AssignmentError(a.key, f"refused: model folder {a.model!r} resolves outside the repository")
                )
        return errors

    def _inside_repository(self, model: str) -> bool:
        root = Path(self.repository).resolve()
        return (root / model).resolve().is_relative_to(root) and (root / model).resolve() != root

    # -- base configs
    def _default_base_config(self, model: str) -> ModelConfig:
        if "://" in self.repository:
            if self._store is None:
                from agents.repo_store import open_store  # the S3 wrapper; imported only for remote repositories

                self._store = open_store(self.repository)
            store = self._store
            # the same cap as a local file's: a huge config.pbtxt is never downloaded whole
            data = store.read_bytes(f"{model}/{CONFIG_NAME}", MAX_CONFIG_BYTES + 1)
            return config_from_bytes(data, f"{self.repository}/{model}/{CONFIG_NAME}")
        return read_config(Path(self.repository) / model / CONFIG_NAME)

    def render(self, a: ModelAssignment) -> ModelConfig:
        """The config this fleet loads for `a` (base config + plan fields + this node's kind)."""
        config = render_config(
            self._base_config(a.model),
            a,
            device_kind=self.device_kind,
            gpu_index=0 if self.device_kind == "gpu" else None,
            latency_histogram=self.latency_histogram,
        )
        fixed = config.parameters[FIXED_CPU_INSTANCES].string_value if FIXED_CPU_INSTANCES in config.parameters else ""
        if self.device_kind == "cpu" and self.cpu_instance_per_core and not fixed.strip().isdigit():
            # a CPU share is a set of cores; one model instance per core lets the model use them all
            config.instance_group[0].count = len(cpu_cores_for_share(a.share_pct, self.cpu_cores))
        elif self.device_kind == "cpu" and fixed.strip().isdigit():
            # the model uses the cores of its share itself (e.g. the demo's simulated accelerator)
            config.instance_group[0].count = max(1, min(int(fixed), len(self.cpu_cores)))
        return config

    # -- processes
    def _cores_in_use(self, exclude: str | None = None) -> dict[int, int]:
        used: dict[int, int] = {}
        for key, slot in self._slots.items():
            if key != exclude and slot.cores:
                for c in slot.cores:
                    used[c] = used.get(c, 0) + 1
        return used

    def resources(
        self, a: ModelAssignment, exclude: str | None = None, *, instances: int
    ) -> tuple[tuple[int, ...] | None, dict[str, str]]:
        """(CPU cores, extra environment) of the process that serves `a` (the same code path on both kinds).

        On a CPU node the math libraries' threads per instance are the share's cores over its `instances`
        (`math_threads_env`), unless the operator set them: in the agent's environment or the fleet's `env`."""
        if self.device_kind == "cpu":
            cores = cpu_cores_for_share(a.share_pct, self.cpu_cores, self._cores_in_use(exclude))
            threads = {k: v for k, v in math_threads_env(len(cores), instances).items() if k not in os.environ}
            return cores, {**threads, **self.env}
        env = dict(self.env)
        env["CUDA_VISIBLE_DEVICES"] = str(a.device)
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, min(100, int(round(a.share_pct)))))
        client_env = getattr(self.mps, "client_env", None)
        if client_env is not None:
            env.update(client_env(a.share_pct))  # pipe / log directories of the daemon
        return None, env

    def _spawn(self, a: ModelAssignment, config: ModelConfig, exclude: str | None = None, warm: bool = False) -> _Slot:
        if self.device_kind == "gpu":
            self._ensure_mps()
        cores, env = self.resources(a, exclude, instances=_instances(config))
        self._counter += 1
        if self._closing.is_set():
            raise TritonError("the fleet is shutting down")
        process = TritonProcess(
            self.repository,
            workdir=self.workdir,
            name=f"triton-{_safe(a.key)}-{self._counter}",
            binary=self._binary,
            backend_dir=self._backend_dir,
            cpu_cores=cores,
            env=env,
            device_kind=self.device_kind,
            ready_timeout_s=self.ready_timeout_s,
            exit_timeout_s=self.exit_timeout_s,
        )
        with self._spawned_lock:
            self._spawned = [p for p in self._spawned if p.proc is None or p.alive()] + [process]
        process.start()
        try:
            process.load(a.model, config)
        except TritonError:
            process.stop(timeout_s=5)
            raise
        slot = _Slot(assignment=a, process=process, config=config, cores=cores, last_scrape=self._clock())
        if warm:
            self._warm_up(slot)
        return slot

    def _warm_up(self, slot: _Slot) -> None:
        """Pre-warm a new process before traffic switches to it: a few requests at batch 1 and at the max
        batch (first calls pay lazy initialisation), then its counters start from there."""
        from agents.loadgen import LoadError, build_inputs  # the load generator's input builder

        model = slot.assignment.model
        sent = 0
        try:
            for batch in sorted({1, max(1, int(slot.config.max_batch_size))}):
                inputs = build_inputs(slot.process.client, model, batch)
                for _ in range(WARM_UP_REQUESTS):
                    slot.process.client.infer(model, inputs, client_timeout=self.ready_timeout_s)
                    sent += 1
        except (LoadError, InferenceServerException):
            return  # a model that cannot be warmed up still serves; its first requests are slower
        # Triton counts a request a moment after its reply reaches the client: wait (briefly) until the
        # counters hold every warm-up request, or the first window would count the last ones as traffic.
        deadline = time.monotonic() + WARM_UP_COUNT_WAIT_S
        while True:
            counters = self._scrape(slot) or {}
            if counters.get("success", 0.0) >= sent or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        slot.last_metrics = counters
        slot.last_scrape = self._clock()

    def _ensure_mps(self) -> None:
        if self.mps is not None and not self._mps_started:
            start = getattr(self.mps, "ensure_started", None) or self.mps.start
            start()
            self._mps_started = True

    # -- the interface
    def apply(self, assignments: Sequence[ModelAssignment]) -> ApplyReport:
        desired: dict[str, ModelAssignment] = {}
        errors: list[AssignmentError] = []
        for a in assignments:
            if a.key in desired:
                errors.append(AssignmentError(a.key, "duplicate assignment key; kept the first"))
                continue
            desired[a.key] = a
        refused = self._path_refusals(list(desired.values()))
        if refused:
            with self._lock:
                return ApplyReport(unchanged=tuple(sorted(self._slots)), errors=tuple(errors + refused))
        started, reloaded, moved, stopped, unchanged = [], [], [], [], []
        with self._lock:
            for key in sorted(set(self._slots) - set(desired)):
                gone = self._slots.pop(key)
                self._route(gone.assignment.workload)
                self._drain(gone)
                gone.process.unload_and_stop([gone.assignment.model])
                stopped.append(key)
            for key in sorted(desired):
                a = desired[key]
                slot = self._slots.get(key)
                if slot is not None and not slot.process.alive():
                    slot.process.stop()  # crashed: serve it again from scratch ("started")
                    del self._slots[key]
                    slot = None
                try:
                    config = self.render(a)
                except Exception as err:  # noqa: BLE001 - a bad base config is reported, others go on
                    errors.append(AssignmentError(key, f"cannot render the config of {a.model!r}: {err}"))
                    if slot is not None:
                        unchanged.append(key)
                    continue
                if slot is None:
                    try:
                        self._slots[key] = self._spawn(a, config)
                        self._route(a.workload)
                        started.append(key)
                    except (RuntimeError, OSError) as err:  # TritonError, MpsError
                        errors.append(AssignmentError(key, f"start failed: {err}"))
                    continue
                if _placement(slot.assignment) != _placement(a):
                    try:
                        new = self._spawn(a, config, exclude=key, warm=True)
                    except (RuntimeError, OSError) as err:  # TritonError, MpsError
                        errors.append(
                            AssignmentError(
                                key,
                                f"move to share {a.share_pct:g}% / device {a.device} "
                                f"failed, the old process keeps serving: {err}",
                            )
                        )
                        continue
                    old, self._slots[key] = slot, new
                    self._route(a.workload)  # new calls go to the new process from here on
                    self._drain(old)
                    # unload (in-flight requests finish first), then SIGTERM
                    old.process.unload_and_stop([old.assignment.model])
                    moved.append(key)
                    continue
                if config_to_text(config) == config_to_text(slot.config):
                    slot.assignment = a  # e.g. a new rate: nothing to do on the server
                    unchanged.append(key)
                    continue
                try:
                    slot.process.load(a.model, config)
                    slot.config, slot.assignment = config, a
                    reloaded.append(key)
                except TritonError as err:
                    errors.append(AssignmentError(key, f"reload failed, previous config keeps serving: {err}"))
                    self._rollback(slot)
            for key in sorted(desired):  # every served workload has its endpoints (a failed port bind is retried)
                if key in self._slots and (problem := self._route(desired[key].workload)):
                    errors.append(AssignmentError(key, f"no stable endpoint: {problem}"))
        return ApplyReport(
            tuple(started), tuple(reloaded), tuple(moved), tuple(stopped), tuple(unchanged), tuple(errors)
        )

    # -- stable endpoints (the router)
    def _route(self, workload: str, keep: bool = False) -> str:
        """Point the workload's stable endpoints at its processes (close them when none is left, unless `keep`:
        a replacement is coming); "" or the error."""
        if self.router is None:
            return ""
        backends = [
            Backend(
                key=k,
                grpc=s.process.grpc_url,
                http=f"{HOST}:{s.process.http_port}",
                metrics=f"{HOST}:{s.process.metrics_port}",
            )
            for k, s in self._slots.items()
            if s.assignment.workload == workload
        ]
        try:
            if backends or keep:
                self.router.set_backends(workload, backends)
            else:
                self.router.remove(workload)
        except RouterError as err:
            return str(err)
        return ""

    def _drain(self, old: _Slot) -> None:
        """Before stopping a process: with a router, wait until its calls in flight have answered."""
        if self.router is None:
            time.sleep(self.drain_s)  # clients that read the old endpoint have sent by now
        elif not self.router.drain(old.process.grpc_url, self.drain_timeout_s):
            log.warning(
                "%s: stopping %s after %gs with %d call(s) still in flight",
                old.assignment.key,
                old.process.name,
                self.drain_timeout_s,
                self.router.in_flight(old.process.grpc_url),
            )

    def serving_problems(self) -> list[str]:
        """Why this node's stable endpoints cannot serve ([] without a router, or when they can)."""
        return self.router.problems() if self.router is not None else []

    def serving_endpoint(self, key: str) -> ServingEndpoint:
        """Where clients reach one assignment: the router's stable endpoints, else the process's own."""
        with self._lock:
            return self._serving_endpoint(key, self.router.endpoints() if self.router is not None else {})

    def serving_endpoints(self) -> dict[str, ServingEndpoint]:
        with self._lock:
            routes = self.router.endpoints() if self.router is not None else {}  # once, not once per slot
            return {key: self._serving_endpoint(key, routes) for key in sorted(self._slots)}

    def _serving_endpoint(self, key: str, routes: Mapping[str, Any]) -> ServingEndpoint:
        slot = self._slots[key]
        process = slot.process
        route = routes.get(slot.assignment.workload)
        if route is None:
            return ServingEndpoint(key, process.grpc_url, process.http_url, process.metrics_url, process.grpc_url)
        return ServingEndpoint(key, route.grpc, route.http, route.metrics, process.grpc_url)

    def _rollback(self, slot: _Slot) -> None:
        """Triton keeps the old version after a failed reload; make sure, else load the old config."""
        model = slot.assignment.model
        try:
            if (
                slot.process.model_ready(model)
                and slot.process.model_config(model).max_batch_size == slot.config.max_batch_size
            ):
                return
            slot.process.load(model, slot.config)
        except TritonError:
            pass  # check_health restarts it with the old config

    def check_health(self) -> list[str]:
        """Replace crashed and hung Triton processes (re-loading their models); returns events.

        Hung: alive, but its readiness probe does not answer within `probe_deadline_s` (a stopped or wedged
        server). It is killed (SIGKILL: a stopped process cannot act on SIGTERM) and its workload's calls are
        held at the router (up to the replacement's start timeout) instead of failing, then a new process
        takes them. Bound, from the hang to traffic moving off it: one fleet step (the agent's heartbeat
        interval, 2 s by default) + `probe_deadline_s`; served again once the replacement is ready (Triton's
        start and the model's load; see the README, "Hung Triton")."""
        events: list[str] = []
        if self._closing.is_set():
            return events
        with self._lock:
            for key in sorted(self._slots):
                slot = self._slots[key]
                model = slot.assignment.model
                if slot.process.alive() and not slot.process.server_ready(self.probe_deadline_s):
                    events.append(self._replace_hung(key, slot))
                    continue
                if slot.process.alive():
                    if slot.process.model_ready(model, self.probe_deadline_s):
                        continue
                    try:
                        slot.process.load(model, slot.config)
                        events.append(f"{key}: model {model} was not ready on {slot.process.grpc_url}; reloaded")
                    except TritonError as err:
                        events.append(f"{key}: model {model} not ready and reload failed: {err}")
                    continue
                code, pid = slot.process.returncode(), slot.process.pid
                slot.process.stop()
                try:
                    new = self._spawn(slot.assignment, slot.config, exclude=key)
                    self._slots[key] = new
                    self._route(slot.assignment.workload)
                    events.append(
                        f"{key}: Triton pid {pid} exited with code {code}; restarted as pid "
                        f"{new.process.pid} on {new.process.grpc_url}"
                    )
                except (RuntimeError, OSError) as err:  # TritonError, MpsError
                    events.append(f"{key}: Triton pid {pid} exited with code {code}; restart failed: {err}")
        return events

    def _replace_hung(self, key: str, slot: _Slot) -> str:
        pid, workload = slot.process.pid, slot.assignment.workload
        slot.process.kill()
        del self._slots[key]
        if self.router is not None:
            self.router.hold(workload, self.ready_timeout_s + 30.0)  # calls wait for the replacement
            self._route(workload, keep=True)
        what = f"{key}: Triton pid {pid} did not answer its readiness probe within {self.probe_deadline_s:g}s (hung)"
        try:
            new = self._spawn(slot.assignment, slot.config, exclude=key)
        except (RuntimeError, OSError) as err:  # TritonError, MpsError
            # kept with its killed process, like a crashed one: the next check retries the restart (dropped,
            # the replica would stay gone until the next plan revision, since the agent applies only changes)
            self._slots[key] = slot
            self._release_hold(workload)
            return f"{what}; killed; restart failed (retried at the next check): {err}"
        self._slots[key] = new
        self._release_hold(workload)
        return f"{what}; killed and restarted as pid {new.process.pid} on {new.process.grpc_url}"

    def _release_hold(self, workload: str) -> None:
        self._route(workload)
        if self.router is not None:
            self.router.hold(workload, 0.0)

    def observe(self) -> list[ObservedModel]:
        """Per-assignment figures since the previous `observe` (or since the model was loaded)."""
        out: list[ObservedModel] = []
        with self._lock:
            for key in sorted(self._slots):
                slot = self._slots[key]
                current = self._scrape(slot)
                if current is None:
                    continue
                now = self._clock()
                slot.windows += 1
                observed = observe_model(
                    slot.assignment.model,
                    key,
                    slot.process.grpc_url,
                    slot.last_metrics,
                    current,
                    now - slot.last_scrape,
                )
                out.append(replace(observed, instances=_instances(slot.config), seq=slot.windows))
                slot.last_metrics, slot.last_scrape = current, now
        return out

    @staticmethod
    def _scrape(slot: _Slot) -> dict[str, float] | None:
        """The model's counters: Triton's metrics, plus per batch size from its statistics (when it answers)."""
        try:
            current = parse_metrics(slot.process.metrics_text()).get(slot.assignment.model, {})
        except TritonError:
            return None
        try:
            current.update(parse_statistics(slot.process.statistics(slot.assignment.model), slot.assignment.model))
        except TritonError:
            pass  # the window still has Triton's metrics
        return current

    def endpoints(self) -> dict[str, str]:
        with self._lock:
            return {key: slot.process.grpc_url for key, slot in sorted(self._slots.items())}

    def endpoint(self, key: str) -> str:
        """The current endpoint of one assignment (a load generator follows it across moves)."""
        return self._slots[key].process.grpc_url

    def running(self) -> list[ModelAssignment]:
        with self._lock:
            return [slot.assignment for _, slot in sorted(self._slots.items()) if slot.process.alive()]

    def processes(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {key: slot.process.state() for key, slot in sorted(self._slots.items())}

    def metrics_text(self, key: str) -> str:
        """The Prometheus text of one assignment's process (`TritonProcess.metrics_text`)."""
        return self._slots[key].process.metrics_text()

    def served_config(self, key: str) -> ModelConfig:
        """What the server reports for the assignment's model (`get_model_config`)."""
        slot = self._slots[key]
        return slot.process.model_config(slot.assignment.model)

    def close(self, deadline_s: float = SHUTDOWN_S) -> None:
        """Stop every process (graceful, then forceful), in parallel, within `deadline_s` whatever runs.

        A start or a model load in progress holds the fleet lock (a load may take minutes): after half the
        deadline close stops waiting for it; at the deadline every process still alive, that one included,
        is killed (SIGKILL of its process group)."""
        end = time.monotonic() + deadline_s
        self._closing.set()
        if self.router is not None:
            self.router.close()  # stop taking calls first
        locked = self._lock.acquire(timeout=deadline_s / 2)
        try:
            slots, self._slots = list(self._slots.values()), {}
        finally:
            if locked:
                self._lock.release()
        threads = [
            threading.Thread(target=s.process.unload_and_stop, args=([s.assignment.model],), daemon=True) for s in slots
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=max(0.0, end - time.monotonic() - 1.0))
        with self._spawned_lock:
            left = [p for p in self._spawned if p.proc is not None and p.alive()]
        for p in left:
            log.warning("%s: still running at shutdown (a start or load in progress); killed", p.name)
            p.kill()
        if self.mps is not None and self._mps_started:
            try:
                self.mps.quit()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass
            self._mps_started = False
        if self._own_workdir:  # a temporary directory of ours: logs and backend links go with the fleet
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> TritonFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _safe(key: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
