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
import time
from pathlib import Path
from typing import Callable

import numpy as np
import tritonclient.grpc as grpcclient

from agents.loadgen import build_inputs
from agents.triton import TritonFleet
from controller.assignment import ModelAssignment
from interference.profile_io import atomic_write_text
from interference.profiling import MeasurePoint, ProfileSession


def _assignment(point: MeasurePoint, copy: int) -> ModelAssignment:
    return ModelAssignment(workload=f"profile-{point.model}-{copy}", model=point.model, device=0,
                           share_pct=point.share_pct, batch=max(32, point.batch), queue_delay_ms=0.0,
                           slo_ms=1e6, rate_rps=1.0)


def _tensor_bytes(client: grpcclient.InferenceServerClient, model: str) -> tuple[int, int]:
    meta = client.get_model_metadata(model, as_json=True)
    size = {"FP32": 4, "FP16": 2, "INT64": 8, "INT32": 4, "FP64": 8, "INT8": 1, "UINT8": 1}

    def total(specs: list[dict]) -> int:
        return sum(int(np.prod([max(1, int(d)) for d in s["shape"][1:]])) * size.get(s["datatype"], 4) for s in specs)

    return total(meta["inputs"]), total(meta["outputs"])


def measure_latency_ms(client: grpcclient.InferenceServerClient, model: str, batch: int,
                       requests: int, warmup: int = 3) -> float:
    inputs = build_inputs(client, model, batch)
    for _ in range(warmup):
        client.infer(model, inputs)
    samples = []
    for _ in range(requests):
        started = time.perf_counter()
        client.infer(model, inputs)
        samples.append((time.perf_counter() - started) * 1000.0)
    return float(np.median(samples))


def run_session(session: ProfileSession, repository: str, checkpoint: str | Path, *, requests: int = 20,
                progress: Callable[[str], None] = print) -> ProfileSession:
    fleet = TritonFleet(repository, device_kind="cpu")
    try:
        while (point := session.ask()) is not None:
            copies = [_assignment(point, c) for c in range(1 + point.neighbours)]
            report = fleet.apply(copies)
            if report.errors:
                raise RuntimeError(f"cannot serve {point.model} at {point.share_pct:g}%: {'; '.join(report.errors)}")
            endpoints = fleet.endpoints()
            client = grpcclient.InferenceServerClient(endpoints[copies[0].key])
            stop = threading.Event()
            threads = [threading.Thread(target=_keep_busy, args=(endpoints[c.key], c.model, point.batch, stop),
                                        daemon=True) for c in copies[1:]]
            for t in threads:
                t.start()
            try:
                if point.model not in session.model_bytes:
                    session.model_bytes[point.model] = _tensor_bytes(client, point.model)
                latency = measure_latency_ms(client, point.model, point.batch, requests)
            finally:
                stop.set()
                for t in threads:
                    t.join(timeout=10)
                client.close()
            session.tell(point, latency)
            atomic_write_text(checkpoint, json.dumps(session.to_dict(), indent=1) + "\n")
            done, total = session.progress()
            progress(f"[{done}/{total}] {point.model} share {point.share_pct:g}% batch {point.batch}"
                     f"{' +%d busy neighbour(s)' % point.neighbours if point.neighbours else ''}: {latency:.2f} ms")
    finally:
        fleet.close()
    return session


def _keep_busy(url: str, model: str, batch: int, stop: threading.Event) -> None:
    client = grpcclient.InferenceServerClient(url)
    try:
        inputs = build_inputs(client, model, batch)
        while not stop.is_set():
            client.infer(model, inputs)
    finally:
        client.close()
