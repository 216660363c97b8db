"""Where tritonserver is and how it runs here: the binary, its backend folder and environment,
loopback ports, the CPU cores of a share, and what over-commits a device."""

from __future__ import annotations

import math
import os
import socket
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from pathlib import Path

from controller.messages import ModelAssignment
from foundation.errors import StokeError

HOST = "127.0.0.1"


class TritonError(StokeError, RuntimeError):
    """A Triton process failed to start, load a model or answer."""


# --------------------------------------------------------------------------- environment


def _pytriton_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonError(
            "nvidia-pytriton is not installed; it ships the tritonserver binary (pip install nvidia-pytriton)"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "tritonserver"


def find_tritonserver() -> Path:
    """The `tritonserver` binary: $STOKE_TRITONSERVER, else the one inside nvidia-pytriton."""
    override = os.environ.get("STOKE_TRITONSERVER")
    path = Path(override) if override else _pytriton_root() / "bin" / "tritonserver"
    if not os.access(path, os.X_OK):
        raise TritonError(
            f"{path}: tritonserver binary not found or not executable; install nvidia-pytriton "
            f"or set STOKE_TRITONSERVER"
        )
    return path


def prepare_backend_dir(workdir: str | os.PathLike[str]) -> Path:
    """`workdir/backends/python` with the Python backend and the stub of the running interpreter."""
    root = _pytriton_root()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    sources = {
        "libtriton_python.so": root / "backends" / "python" / "libtriton_python.so",
        "triton_python_backend_utils.py": root / "backends" / "python" / "triton_python_backend_utils.py",
        "triton_python_backend_stub": root / "python_backend_stubs" / version / "triton_python_backend_stub",
    }
    backends = Path(workdir) / "backends"
    target = backends / "python"
    target.mkdir(parents=True, exist_ok=True)
    for name, source in sources.items():
        if not source.exists():
            raise TritonError(f"{source}: missing from nvidia-pytriton (Python {version} backend stub)")
        link = target / name
        if link.is_symlink() and os.readlink(link) == str(source):
            continue
        tmp = target / f".{name}.tmp{os.getpid()}"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(source)
        os.replace(tmp, link)
    return backends


def triton_env(base: Mapping[str, str] | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """PATH starts with this interpreter's bin; LD_LIBRARY_PATH with its LIBDIR (libpython)."""
    env = dict(os.environ if base is None else base)
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = os.pathsep.join(p for p in (bindir, env.get("PATH", "")) if p)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p)
    env.update(extra or {})
    return env


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def cpu_cores_for_share(
    share_pct: float, cores: Sequence[int], used: Mapping[int, int] | None = None
) -> tuple[int, ...]:
    """ceil(share/100 x cores) cores (at least one), the least used first (ties: lowest index)."""
    cores = sorted(cores)
    count = min(len(cores), max(1, math.ceil(share_pct / 100.0 * len(cores) - 1e-9)))
    used = used or {}
    return tuple(sorted(sorted(cores, key=lambda c: (used.get(c, 0), c))[:count]))


#: The thread-count variables of the math libraries a CPU model's backend may use: OpenMP (PyTorch and
#: others), OpenBLAS (numpy's BLAS here) and MKL.
MATH_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def math_threads_env(cores: int, instances: int) -> dict[str, str]:
    """The math libraries' threads per model instance on a CPU share: its cores split between its instances.

    Left alone, each instance's BLAS starts one thread per core of the share, and its idle threads spin
    waiting for work: two mlp_small instances on a 2-core (100%) share burned 188% of a core at 48 req/s
    and the clients' p99 went from 4-4.5 ms to 27-35 ms; capped at one thread each, 6% of a core."""
    threads = str(max(1, cores // max(1, instances)))
    return dict.fromkeys(MATH_THREAD_VARIABLES, threads)


def overcommit_problems(
    assignments: Sequence[ModelAssignment], *, device_kind: str, devices: int, cores: Sequence[int]
) -> list[str]:
    """Why these assignments do not fit this node, one line each (empty when they fit).

    `TritonFleet` would place them anyway, pinning an assignment to cores (or
    a GPU) that another one already holds, so both run slower than planned.
    On a CPU node every assignment takes ceil(share x cores) whole cores of
    the one CPU device, whatever plan device it came from. On a GPU node each
    assignment's device must exist and a GPU's MPS shares add up to <= 100%.
    """
    if device_kind == "cpu":
        need = {a.key: len(cpu_cores_for_share(a.share_pct, cores)) for a in assignments}
        if sum(need.values()) <= len(cores):
            return []
        plan_devices = sorted({a.device for a in assignments})
        detail = ", ".join(f"{k}: {n}" for k, n in need.items())
        return [
            f"its {len(need)} assignment(s) on plan device(s) {', '.join(map(str, plan_devices))} need "
            f"{sum(need.values())} whole cores ({detail}) but this CPU node has {len(cores)}"
        ]
    problems = []
    missing = sorted({a.device for a in assignments if not 0 <= a.device < devices})
    if missing:
        names = ", ".join(a.key for a in assignments if a.device in missing)
        problems.append(f"it needs GPU(s) {', '.join(map(str, missing))} ({names}) but this node has {devices} GPU(s)")
    for device in sorted({a.device for a in assignments} - set(missing)):
        on_device = [a for a in assignments if a.device == device]
        total = sum(a.share_pct for a in on_device)
        if total > 100.0 + 1e-6:
            detail = ", ".join(f"{a.key}: {a.share_pct:g}%" for a in on_device)
            problems.append(f"GPU {device} shares add up to {total:g}% ({detail})")
    return problems
