"""Triton Inference Server on one node: processes, repository API, metrics scrape.

The one package that runs `tritonserver` and talks to it (`tritonclient`): `environment`, `ledger`,
`process`, `metrics` and `fleet`, in the order they build on each other.

- `find_tritonserver` / `prepare_backend_dir` / `triton_env`: the server binary
  shipped with `nvidia-pytriton`, a backend directory holding the Python
  backend plus the stub for the running interpreter, and PATH /
  LD_LIBRARY_PATH set so the stub uses this interpreter and its libpython
  (see docs: triton-on-cpu reference).
- `TritonProcess`: one server in explicit model-control mode on free loopback
  ports; start (wait for readiness, with a timeout), load / unload with a
  config override, scrape metrics, stop (SIGTERM, then SIGKILL).
- `TritonFleet`: all processes of a node. Each assignment gets its own
  process holding its resource share (CPU node: the child's core affinity,
  ceil(share/100 x cores) cores, at least one, and by default one model
  instance per core so the model can use them, each instance's math libraries
  held to its part of the cores, `math_threads_env`; GPU node:
  ``CUDA_VISIBLE_DEVICES`` and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, with the
  MPS daemon from `agents.mps`). `apply` makes the node serve exactly the
  given assignments:

  * nothing changed -> nothing done (``unchanged``); a process that died is
    started again (``started``);
  * batch / queue-delay change -> ``load_model(config=...)`` in the same
    process (``reloaded``); Triton keeps the old version serving until the new
    one is ready, so no request fails;
  * share / device / model change -> a new process with the new share, model
    loaded there and pre-warmed (a few requests at batch 1 and the max batch),
    endpoint switched, then the old process stopped gracefully (``moved``):
    with a `agents.router.Router`, once the calls in flight on it have
    answered; without one, after `drain_s`;
  * a failed load keeps the previous config (or process) serving, and the
    error is reported in ``ApplyReport.errors`` as an `AssignmentError` (key, message; rollback).
- Endpoints: each process listens on loopback. With a `Router` (the agent
  always has one) every workload gets stable gRPC/HTTP/metrics endpoints on
  the node's bind address that follow its processes (`serving_endpoints`).
- `parse_metrics` / `parse_statistics` / `observe_model`: Triton's Prometheus text and its
  statistics extension -> per-model counters -> the figures of one window (request rate,
  mean batch, queue / compute ms, per batch size executions and mean duration, pending).
- A base config may fix its CPU instance count with the parameter ``stoke_cpu_instances``
  (the demo's simulated accelerator uses the cores of its share itself).

What a fleet refuses (`TritonFleet.refusals`, asked by the agent before
every apply; nothing changes then, every assignment gets the error): a
workload or model name outside `foundation.names`'s rule, a model folder that
resolves outside the repository (``../x``, a symlink out), and assignments
that over-commit a device (`overcommit_problems`). So a controller cannot make
this node run code from outside its model repository, nor start processes it
has no room for. `apply` itself always refuses the names and paths.

Processes outlive a crash of the agent (each Triton is its own session, so
Ctrl-C of a CLI does not hit it, and a crash of the agent does not stop
serving). Each one is recorded in ``WORKDIR/pids/`` (pid, start time,
command), and a fleet opened on the same workdir first reaps what a previous,
crashed agent left there (`reap_orphans`: SIGTERM to the process group, then
SIGKILL), checking the start time and command line so a recycled pid is
never hit.
"""

from agents.triton.environment import (
    HOST,
    TritonError,
    cpu_cores_for_share,
    find_tritonserver,
    free_ports,
    overcommit_problems,
    prepare_backend_dir,
    triton_env,
)
from agents.triton.fleet import ApplyReport, TritonFleet
from agents.triton.ledger import LEDGER, reap_orphans
from agents.triton.metrics import ObservedModel, observe_model, parse_metrics, parse_statistics
from agents.triton.process import TritonProcess

__all__ = [
    "HOST",
    "LEDGER",
    "ApplyReport",
    "ObservedModel",
    "TritonError",
    "TritonFleet",
    "TritonProcess",
    "cpu_cores_for_share",
    "find_tritonserver",
    "free_ports",
    "observe_model",
    "overcommit_problems",
    "parse_metrics",
    "parse_statistics",
    "prepare_backend_dir",
    "reap_orphans",
    "triton_env",
]
