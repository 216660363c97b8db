"""Runs a `ProfileSession` against real Triton processes on this node.

For each point the session asks for, the runner makes the fleet serve the
model at the point's share (one Triton process per share, as in
production), sends sequential requests of the point's batch size over gRPC
and tells the session the median latency. With neighbours, copies of the
model at the same share are kept busy by closed-loop threads meanwhile.
After every point the session is written (atomically) to the checkpoint
file, so an interrupted profile resumes where it stopped.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Callable

from agents.loadgen import LoadError, keep_busy, sequential_latency_ms, tensor_bytes
from agents.triton import TritonError, TritonFleet
from controller.messages import ModelAssignment
from stoke.files import atomic_write_text
from interference.profiling import MeasurePoint, ProfileSession
from stoke.errors import StokeError


class ProfilingError(StokeError, RuntimeError):
    """A measurement could not be taken (Triton would not serve, requests failed, a neighbour died)."""


def _assignment(point: MeasurePoint, copy: int) -> ModelAssignment:
    return ModelAssignment(workload=f"profile-{point.model}-{copy}", model=point.model, device=0,
                           share_pct=point.share_pct, batch=max(32, point.batch), queue_delay_ms=0.0,
                           slo_ms=1e6, rate_rps=1.0)


def run_session(session: ProfileSession, repository: str, checkpoint: str | Path, *, requests: int = 20,
                progress: Callable[[str], None] = print) -> ProfileSession:
    """Measure every point the session still asks for; ProfilingError when one cannot be measured."""
    try:
        fleet = TritonFleet(repository, device_kind="cpu")
    except TritonError as err:
        raise ProfilingError(str(err)) from None
    try:
        while (point := session.ask()) is not None:
            copies = [_assignment(point, c) for c in range(1 + point.neighbours)]
            report = fleet.apply(copies)
            if report.errors:
                raise ProfilingError(f"cannot serve {point.model} at {point.share_pct:g}%: "
                                     f"{'; '.join(map(str, report.errors))}")
            endpoints = fleet.endpoints()
            stop = threading.Event()
            threads = [threading.Thread(target=keep_busy, args=(endpoints[c.key], c.model, point.batch, stop),
                                        daemon=True) for c in copies[1:]]
            for t in threads:
                t.start()
            try:
                if point.model not in session.model_bytes:
                    session.model_bytes[point.model] = tensor_bytes(endpoints[copies[0].key], point.model)
                latency = sequential_latency_ms(endpoints[copies[0].key], point.model, point.batch, requests)
                if not all(t.is_alive() for t in threads):
                    raise ProfilingError(f"{point.key}: a busy neighbour stopped during the measurement")
            except LoadError as err:
                raise ProfilingError(f"{point.key}: {err}") from None
            finally:
                stop.set()
                for t in threads:
                    t.join(timeout=10)
            session.tell(point, latency)
            atomic_write_text(checkpoint, json.dumps(session.to_dict(), indent=1) + "\n")
            done, total = session.progress()
            progress(f"[{done}/{total}] {point.model} share {point.share_pct:g}% batch {point.batch}"
                     f"{' +%d busy neighbour(s)' % point.neighbours if point.neighbours else ''}: {latency:.2f} ms")
    finally:
        fleet.close()
    return session
