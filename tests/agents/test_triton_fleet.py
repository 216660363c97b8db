"""Real tritonserver 2.51 (from nvidia-pytriton) on loopback: serving, reloads, rollback, moves, health."""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time

import numpy as np
import pytest
from triton_helpers import DEMO_MODELS, DEMO_REPO, OUTPUT_SHAPES, infer

from agents.batching_check import process_tree
from agents.loadgen import LoadGenerator
from agents.triton import TritonFleet, TritonProcess, parse_metrics
from agents.triton.environment import MATH_THREAD_VARIABLES
from controller.messages import ModelAssignment
from controller.render import config_to_json, read_config, render_config

pytestmark = pytest.mark.triton


def echo(batch: int = 8, share: float = 50.0, delay: float = 1.0) -> ModelAssignment:
    return ModelAssignment(
        workload="echo",
        model="tiny_echo",
        device=0,
        share_pct=share,
        batch=batch,
        queue_delay_ms=delay,
        slo_ms=25.0,
        rate_rps=200.0,
    )


OTHERS = [
    ModelAssignment(
        workload=m.split("_")[0],
        model=m,
        device=0,
        share_pct=50.0,
        batch=16,
        queue_delay_ms=2.0,
        slo_ms=100.0,
        rate_rps=50.0,
    )
    for m in DEMO_MODELS
    if m != "tiny_echo"
]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = TritonFleet(str(DEMO_REPO), workdir=str(tmp_path_factory.mktemp("fleet")), ready_timeout_s=60)
    try:
        yield fleet
    finally:
        fleet.close()
    assert fleet.running() == []


def test_serves_each_demo_model(fleet):
    report = fleet.apply([echo(), *OTHERS])
    assert report.errors == ()
    assert sorted(report.started) == sorted(["echo#0", *(a.key for a in OTHERS)])
    endpoints = fleet.endpoints()
    assert len(set(endpoints.values())) == 4  # one process per assignment
    for a in [echo(), *OTHERS]:
        out = infer(endpoints[a.key], a.model, batch=3)
        assert out.shape == (3, *OUTPUT_SHAPES[a.model]) and out.dtype == np.float32 and np.isfinite(out).all()
        assert np.array_equal(out, infer(endpoints[a.key], a.model, batch=3))  # fixed seeded weights
    data = np.random.default_rng(0).random((2, 8)).astype(np.float32)
    assert np.allclose(infer(endpoints["echo#0"], "tiny_echo", batch=2), data * 2 + 1)
    cores = {key: state["cpu_cores"] for key, state in fleet.processes().items()}
    ncores = len(os.sched_getaffinity(0))
    assert all(len(c) == max(1, -(-ncores // 2)) for c in cores.values())  # 50% share = half the cores
    for state in fleet.processes().values():  # the real affinity of each server (set before exec)
        assert os.sched_getaffinity(state["pid"]) == set(state["cpu_cores"])


def test_nothing_changed_does_nothing(fleet):
    fleet.apply([echo(), *OTHERS])
    pids = {k: v["pid"] for k, v in fleet.processes().items()}
    report = fleet.apply([echo(), *OTHERS])
    assert report.unchanged == tuple(sorted(pids)) and not report.changed and report.errors == ()
    assert {k: v["pid"] for k, v in fleet.processes().items()} == pids


def test_batch_change_reloads_in_place_without_failures(fleet):
    fleet.apply([echo(batch=8), *OTHERS])
    before = fleet.processes()["echo#0"]
    results = {}
    with LoadGenerator(lambda: fleet.endpoint("echo#0"), "tiny_echo") as gen:
        gen.prepare()
        worker = threading.Thread(target=lambda: results.update(r=gen.run(100.0, 2.0)))
        worker.start()
        time.sleep(0.7)
        report = fleet.apply([echo(batch=16, delay=0.5), *OTHERS])
        worker.join()
    assert report.reloaded == ("echo#0",) and report.errors == ()
    served = fleet.served_config("echo#0")
    assert served.max_batch_size == 16
    assert list(served.dynamic_batching.preferred_batch_size) == [16]
    assert served.dynamic_batching.max_queue_delay_microseconds == 500
    assert fleet.processes()["echo#0"]["pid"] == before["pid"]  # same process
    assert results["r"].failed == 0 and results["r"].ok == 200


def test_failed_reload_rolls_back_and_old_config_keeps_serving(fleet):
    fleet.apply([echo(batch=16), *OTHERS])
    report = fleet.apply([echo(batch=256), *OTHERS])  # tiny_echo refuses max_batch_size > 128
    assert report.reloaded == () and len(report.errors) == 1
    assert report.errors[0].key == "echo#0" and "max_supported_batch" in report.errors[0].message
    assert fleet.served_config("echo#0").max_batch_size == 16
    assert infer(fleet.endpoint("echo#0"), "tiny_echo").shape == (2, 8)
    assert [a.batch for a in fleet.running() if a.key == "echo#0"] == [16]


def stub_environments(pid: int) -> list[dict[str, str]]:
    """The environment of each Python-backend stub a Triton process started (its descendants)."""
    out = []
    for stub in process_tree(pid)[1:]:
        try:
            with open(f"/proc/{stub}/environ", "rb") as environ:
                raw = environ.read().split(b"\0")
        except OSError:
            continue  # a process that ended while we looked
        out.append(dict(v.decode(errors="replace").split("=", 1) for v in raw if b"=" in v))
    return out


def test_share_change_moves_model_to_a_new_process(fleet):
    fleet.apply([echo(batch=16, share=50.0), *OTHERS])
    old = fleet.processes()["echo#0"]
    report = fleet.apply([echo(batch=16, share=100.0), *OTHERS])
    assert report.moved == ("echo#0",) and report.errors == ()
    new = fleet.processes()["echo#0"]
    assert new["pid"] != old["pid"] and new["grpc"] != old["grpc"]
    assert new["cpu_cores"] == sorted(os.sched_getaffinity(0))
    assert os.sched_getaffinity(new["pid"]) == set(new["cpu_cores"])  # the real affinity of the child
    with pytest.raises(ProcessLookupError):
        os.kill(old["pid"], 0)  # old process is gone
    served = fleet.served_config("echo#0")
    assert served.max_batch_size == 16
    assert served.instance_group[0].count == len(os.sched_getaffinity(0))  # one instance per core of the share
    assert infer(fleet.endpoint("echo#0"), "tiny_echo").shape == (2, 8)
    assert [a.share_pct for a in fleet.running() if a.key == "echo#0"] == [100.0]
    # one math-library thread per instance: the share's cores are its instances' (no spinning BLAS threads),
    # unless the environment the fleet runs in sets them
    stubs = stub_environments(new["pid"])
    assert len(stubs) == served.instance_group[0].count
    threads = {v: os.environ.get(v, "1") for v in MATH_THREAD_VARIABLES}
    assert all({v: env.get(v) for v in threads} == threads for env in stubs)


def test_failed_move_keeps_the_old_process_serving(fleet):
    fleet.apply([echo(batch=16, share=100.0), *OTHERS])
    old = fleet.processes()["echo#0"]
    report = fleet.apply([echo(batch=256, share=50.0), *OTHERS])  # new process cannot load the model
    assert report.moved == () and len(report.errors) == 1 and "old process keeps serving" in report.errors[0].message
    assert fleet.processes()["echo#0"]["pid"] == old["pid"] and fleet.endpoint("echo#0") == old["grpc"]
    assert infer(fleet.endpoint("echo#0"), "tiny_echo").shape == (2, 8)
    assert [(a.batch, a.share_pct) for a in fleet.running() if a.key == "echo#0"] == [(16, 100.0)]


def test_observe_reports_rate_batch_and_times(fleet):
    fleet.apply([echo(batch=16, share=100.0), *OTHERS])
    fleet.observe()  # start a window
    with LoadGenerator(fleet.endpoint("mlp#0"), "mlp_small") as gen:
        report = gen.run(150.0, 1.5)
    assert report.failed == 0
    by_key = {o.key: o for o in fleet.observe()}
    mlp = by_key["mlp#0"]
    assert mlp.model == "mlp_small" and mlp.endpoint == fleet.endpoint("mlp#0")
    assert mlp.success >= 225 and mlp.failures == 0
    assert 50.0 < mlp.request_rate_rps < 400.0
    assert mlp.mean_batch >= 1.0 and mlp.mean_compute_ms > 0.0 and mlp.mean_queue_ms >= 0.0
    assert by_key["conv#0"].request_rate_rps == 0.0


def test_removed_assignment_is_stopped(fleet):
    fleet.apply([echo(batch=16, share=100.0), *OTHERS])
    pid = fleet.processes()["embed#0"]["pid"]
    report = fleet.apply([echo(batch=16, share=100.0), *OTHERS[:2]])
    assert report.stopped == ("embed#0",)
    assert "embed#0" not in fleet.endpoints()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_check_health_restarts_a_crashed_process(fleet):
    fleet.apply([echo(batch=16, share=100.0), *OTHERS[:2]])
    pid = fleet.processes()["echo#0"]["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while fleet.processes()["echo#0"]["alive"] and time.monotonic() < deadline:
        time.sleep(0.05)
    events = fleet.check_health()
    assert len(events) == 1 and "echo#0" in events[0] and f"pid {pid}" in events[0] and "restarted" in events[0]
    assert fleet.processes()["echo#0"]["pid"] != pid
    assert fleet.served_config("echo#0").max_batch_size == 16  # same config as before the crash
    assert infer(fleet.endpoint("echo#0"), "tiny_echo").shape == (2, 8)
    assert fleet.check_health() == []
    pid = fleet.processes()["echo#0"]["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while fleet.processes()["echo#0"]["alive"] and time.monotonic() < deadline:
        time.sleep(0.05)
    report = fleet.apply([echo(batch=16, share=100.0), *OTHERS[:2]])  # apply also serves a dead one again
    assert report.started == ("echo#0",) and fleet.processes()["echo#0"]["pid"] != pid
    assert infer(fleet.endpoint("echo#0"), "tiny_echo").shape == (2, 8)


def test_a_hung_process_whose_restart_fails_is_restarted_at_the_next_check(fleet):
    fleet.apply([echo(batch=16, share=100.0), *OTHERS[:2]])
    pid = fleet.processes()["echo#0"]["pid"]
    os.kill(pid, signal.SIGSTOP)
    ready_timeout = fleet.ready_timeout_s
    fleet.ready_timeout_s = 0.01  # the replacement cannot come up in time: its restart fails
    try:
        events = fleet.check_health()
    finally:
        fleet.ready_timeout_s = ready_timeout
    assert len(events) == 1 and "hung" in events[0] and "restart failed" in events[0]
    assert "echo#0" in fleet.processes() and not fleet.processes()["echo#0"]["alive"]  # kept, killed
    events = fleet.check_health()  # retried, as for a crash
    assert len(events) == 1 and "restarted" in events[0], events
    assert fleet.processes()["echo#0"]["pid"] != pid
    assert infer(fleet.endpoint("echo#0"), "tiny_echo").shape == (2, 8)


@pytest.mark.parametrize("arrival, rate", [("constant", 200.0), ("poisson", 300.0)])
def test_loadgen_throughput_within_5_percent_of_rate(fleet, arrival, rate):
    fleet.apply([echo(batch=16, share=100.0), *OTHERS[:2]])
    with LoadGenerator(fleet.endpoint("echo#0"), "tiny_echo") as gen:
        report = gen.run(rate, 3.0, arrival=arrival, seed=1, slo_ms=1000.0)
    assert report.failed == 0 and report.ok == report.sent
    assert report.throughput_rps == pytest.approx(rate, rel=0.05)
    assert 0 < report.p50_ms <= report.p95_ms <= report.p99_ms <= report.max_ms
    assert report.over_slo_share == 0.0


def test_loadgen_counts_slo_misses_and_failures(fleet):
    fleet.apply([echo(batch=16, share=100.0), *OTHERS[:2]])
    with LoadGenerator(fleet.endpoint("conv#0"), "conv_medium") as gen:
        report = gen.run(50.0, 1.0, slo_ms=0.01)  # nothing answers in 10 us
    assert report.ok == 50 and report.over_slo_share == 1.0
    with LoadGenerator(fleet.endpoint("echo#0"), "no_such_model") as gen:
        with pytest.raises(Exception, match="no_such_model"):
            gen.run(10.0, 0.5)


def test_latency_histogram_with_slo_bucket(tmp_path):
    """Per-model `nv_inference_first_response_histogram_ms` with a bucket at the SLO.

    Triton 2.51 (nvidia-pytriton 0.7.0) predates `ModelConfig.model_metrics` and emits no
    first-response histogram for non-decoupled models; the test skips there and checks the
    series on a server that supports it.
    """
    a = echo(batch=4)
    process = TritonProcess(str(DEMO_REPO), workdir=tmp_path)
    process.start()
    try:
        config = render_config(
            read_config(DEMO_REPO / "tiny_echo" / "config.pbtxt"), a, device_kind="cpu", latency_histogram=True
        )
        try:
            process.client.load_model("tiny_echo", config=config_to_json(config))
        except Exception as err:  # noqa: BLE001 - the 2.51 refusal is the documented limitation
            pytest.skip(f"this Triton refuses model_metrics (needs >= 2.52): {str(err).splitlines()[0]}")
        infer(process.grpc_url, "tiny_echo")
        text = process.metrics_text()
        if "nv_inference_first_response_histogram_ms_bucket" not in text:
            pytest.skip("this Triton emits no first-response histogram for non-decoupled models")
        assert parse_metrics(text)["tiny_echo"][f"le:{a.slo_ms:g}"] >= 1
    finally:
        process.stop()


def test_cli_up_and_load(fleet, capsys):
    from stoke.commands import load
    from stoke.commands import triton as commands

    parser = argparse.ArgumentParser(prog="stoke")
    subparsers = parser.add_subparsers(dest="command", required=True)
    commands.register(subparsers)
    load.register(subparsers)

    fleet.apply([echo(batch=16, share=100.0)])
    args = parser.parse_args(
        [
            "load",
            "--url",
            fleet.endpoint("echo#0"),
            "--model",
            "tiny_echo",
            "--rate",
            "100",
            "--arrival",
            "constant",
            "--seconds",
            "1",
            "--slo-ms",
            "500",
            "--json",
        ]
    )
    assert args.run(args) == 0
    [report] = json.loads(capsys.readouterr().out)["steps"]
    assert report["sent"] == 100 and report["failed"] == 0 and report["over_slo_pct"] == 0.0

    args = parser.parse_args(
        ["triton", "up", "--repo", str(DEMO_REPO), "--models", "tiny_echo", "--seconds", "0.5", "--json"]
    )
    assert args.run(args) == 0
    shown = json.loads(capsys.readouterr().out)
    assert list(shown["endpoints"]) == ["tiny_echo#0"] and shown["errors"] == []
    pid = shown["processes"]["tiny_echo#0"]["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # stopped on exit


def test_cli_up_stops_every_triton_process_on_ctrl_c(tmp_path):
    import subprocess
    import sys

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stoke",
            "triton",
            "up",
            "--repo",
            str(DEMO_REPO),
            "--models",
            "tiny_echo",
            "--workdir",
            str(tmp_path),
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pid = None
    try:
        line = proc.stdout.readline()  # `up --json` prints one line, then serves
        assert line, proc.stderr.read()
        shown = json.loads(line)
        pid = shown["processes"]["tiny_echo#0"]["pid"]
        assert infer(shown["endpoints"]["tiny_echo#0"], "tiny_echo").shape == (2, 8)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pid is not None:  # never leave a Triton behind, even when the test fails
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_start_that_crashes_is_tried_again(tmp_path):
    """tritonserver 2.51 now and then aborts while it comes up on a busy machine; the next try serves."""
    from agents.triton import find_tritonserver

    marker = tmp_path / "crashed-once"
    wrapper = tmp_path / "tritonserver"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'if [ ! -e "{marker}" ]; then touch "{marker}"; kill -ABRT $$; fi\n'
        f'exec "{find_tritonserver()}" "$@"\n'
    )
    wrapper.chmod(0o755)
    process = TritonProcess(str(DEMO_REPO), workdir=tmp_path / "work", name="crashy", binary=wrapper, device_kind="cpu")
    try:
        process.start()
        assert marker.exists() and process.alive()
    finally:
        process.stop()


def test_load_sweeps_rate_and_concurrency_over_grpc_and_http_with_tritons_split(fleet, capsys, tmp_path):
    """`stoke load`: a concurrency sweep over gRPC and a rate sweep over HTTP against real Triton, each step with
    Triton's statistics split beside the client's latency; CSV written; a sweep stops at its p99 limit."""
    from stoke.cli import main

    fleet.apply([echo(batch=16, share=100.0)])
    endpoint = fleet.serving_endpoint("echo#0")
    table = tmp_path / "steps.csv"
    argv = ["load", "--url", endpoint.grpc, "--model", "tiny_echo", "--seconds", "1", "--csv", str(table)]
    assert main([*argv, "--sweep-concurrency", "1,2", "-o", "json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert [s["level"] for s in body["steps"]] == [1, 2] and body["stopped"] == "" and body["protocol"] == "grpc"
    for step in body["steps"]:
        assert step["failed"] == 0 and step["sent"] > 10 and step["throughput_rps"] > 10
        assert step["server_requests"] == step["sent"]  # Triton's figures cover the step's requests, each once
        assert step["server_compute_infer_ms"] > 0 and step["server_queue_ms"] >= 0
        # Triton's time is part of what the client saw (the rest: client and network)
        assert 0 < step["server_ms"] <= step["mean_ms"] * 1.05 + 0.05
    lines = table.read_text().splitlines()
    assert lines[0].split(",")[:3] == ["mode", "level", "throughput_rps"] and len(lines) == 3
    http = ["load", "--url", endpoint.http, "--protocol", "http", "--model", "tiny_echo", "--seconds", "1"]
    assert main([*http, "--sweep-rate", "20,40", "--arrival", "constant", "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)["steps"]
    assert [s["sent"] for s in steps] == [20, 40] and all(s["failed"] == 0 for s in steps)
    assert [s["server_requests"] for s in steps] == [20, 40]
    assert all(s["server_compute_infer_ms"] > 0 for s in steps)
    # the stop condition: p99 over the limit ends the sweep after that step, and says so
    assert main([*argv, "--sweep-concurrency", "1,2,4", "--stop-p99-ms", "0.001"]) == 0
    out = capsys.readouterr().out
    assert "stopped at concurrency 1: p99" in out and "is over 0.001 ms" in out
    assert len(table.read_text().splitlines()) == 2 and "queue_ms" in out and "c_infer_ms" in out
