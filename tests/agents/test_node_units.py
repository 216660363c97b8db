"""Sealed unit tests: metrics parsing, core shares, arrivals, local store, MPS command construction."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from agents.loadgen import arrival_offsets, arrival_stream, percentile
from agents.mps import MpsControl, MpsError, parse_pids
from agents.repo_store import (
    LocalStore,
    StoreError,
    delete_order,
    parse_s3_url,
    scan_local,
    triton_s3_url,
    upload_order,
)
from agents.triton import cpu_cores_for_share, observe_model, parse_metrics, prepare_backend_dir, triton_env

METRICS = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="mlp_small",version="1"} 120
nv_inference_request_success{model="mlp_small",version="2"} 80
nv_inference_request_success{model="tiny_echo",version="1"} 5
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="mlp_small",reason="BACKEND",version="1"} 3
nv_inference_request_failure{model="mlp_small",reason="REJECTED",version="1"} 1
# TYPE nv_inference_count counter
nv_inference_count{model="mlp_small",version="1"} 200
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{model="mlp_small",version="1"} 50
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="mlp_small",version="1"} 400000
# TYPE nv_inference_compute_infer_duration_us counter
nv_inference_compute_infer_duration_us{model="mlp_small",version="1"} 300000
# TYPE nv_inference_compute_input_duration_us counter
nv_inference_compute_input_duration_us{model="mlp_small",version="1"} 50000
# TYPE nv_inference_compute_output_duration_us counter
nv_inference_compute_output_duration_us{model="mlp_small",version="1"} 50000
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="mlp_small",version="1"} 2
# TYPE nv_cpu_utilization gauge
nv_cpu_utilization 0.5
# TYPE nv_inference_first_response_histogram_ms histogram
nv_inference_first_response_histogram_ms_bucket{model="mlp_small",version="1",le="10"} 150
nv_inference_first_response_histogram_ms_bucket{model="mlp_small",version="1",le="25"} 199
nv_inference_first_response_histogram_ms_bucket{model="mlp_small",version="1",le="+Inf"} 200
nv_inference_first_response_histogram_ms_sum{model="mlp_small",version="1"} 1000
nv_inference_first_response_histogram_ms_count{model="mlp_small",version="1"} 200
"""


def test_parse_metrics_sums_versions_and_reasons():
    parsed = parse_metrics(METRICS)
    assert parsed["mlp_small"]["success"] == 200
    assert parsed["mlp_small"]["failure"] == 4
    assert parsed["mlp_small"]["inferences"] == 200 and parsed["mlp_small"]["executions"] == 50
    assert parsed["mlp_small"]["le:25"] == 199
    assert parsed["tiny_echo"] == {"success": 5.0}
    assert "nv_cpu_utilization" not in str(parsed)


def test_observe_model_turns_counter_deltas_into_figures():
    current = parse_metrics(METRICS)["mlp_small"]
    previous = {
        "success": 100.0,
        "inferences": 100.0,
        "executions": 40.0,
        "queue_us": 200000.0,
        "compute_infer_us": 200000.0,
        "le:10": 100.0,
        "le:25": 100.0,
        "le:+Inf": 100.0,
    }
    obs = observe_model("mlp_small", "web#0", "127.0.0.1:1", previous, current, window_s=10.0)
    assert obs.request_rate_rps == pytest.approx(10.0)  # 100 more successes in 10 s
    assert obs.mean_batch == pytest.approx(10.0)  # 100 inferences / 10 executions
    assert obs.mean_queue_ms == pytest.approx(2.0)  # 200 ms of queueing over 100 requests
    assert obs.mean_compute_ms == pytest.approx(2.0)  # (100 + 50 + 50) ms over 100 requests
    assert obs.failures == 4 and obs.success == 200
    assert obs.latency_p99_ms == 25.0  # 99 of 100 new requests under 25 ms
    first = observe_model("mlp_small", "web#0", "e", {}, current, window_s=20.0)
    assert first.request_rate_rps == pytest.approx(10.0) and first.mean_batch == pytest.approx(4.0)
    reset = observe_model("mlp_small", "web#0", "e", {"success": 1000.0}, current, window_s=20.0)
    assert reset.request_rate_rps == pytest.approx(10.0)  # counter reset (reload): counts from zero


@pytest.mark.parametrize(
    "share, cores, used, expected",
    [
        (50.0, [0, 1], {}, (0,)),
        (50.0, [0, 1], {0: 1}, (1,)),
        (100.0, [0, 1], {}, (0, 1)),
        (1.0, [0, 1, 2, 3], {}, (0,)),
        (26.0, [0, 1, 2, 3], {0: 1, 1: 1}, (2, 3)),
        (25.0, [4, 5, 6, 7], {}, (4,)),
        (200.0, [0, 1], {}, (0, 1)),
    ],
)
def test_cpu_cores_for_share(share, cores, used, expected):
    assert cpu_cores_for_share(share, cores, used) == expected


def test_triton_env_puts_interpreter_first(tmp_path):
    import sysconfig

    env = triton_env({"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/x"}, {"EXTRA": "1"})
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    assert env["LD_LIBRARY_PATH"].split(os.pathsep) == [sysconfig.get_config_var("LIBDIR"), "/x"]
    assert env["EXTRA"] == "1"
    backends = prepare_backend_dir(tmp_path)
    names = sorted(p.name for p in (backends / "python").iterdir())
    assert names == ["libtriton_python.so", "triton_python_backend_stub", "triton_python_backend_utils.py"]
    assert all((backends / "python" / n).exists() for n in names)
    assert prepare_backend_dir(tmp_path) == backends  # idempotent


def test_arrivals_constant_and_poisson():
    constant = arrival_offsets(100.0, 2.0, "constant")
    assert len(constant) == 200 and constant[1] == pytest.approx(0.01) and constant[-1] < 2.0
    poisson = arrival_offsets(500.0, 20.0, "poisson", seed=3)
    assert abs(len(poisson) - 10000) < 400 and np.all(np.diff(poisson) > 0) and poisson[-1] < 20.0
    gaps = np.diff(poisson)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # exponential gaps
    assert np.array_equal(poisson, arrival_offsets(500.0, 20.0, "poisson", seed=3))
    with pytest.raises(ValueError):
        arrival_offsets(10.0, 1.0, "bursty")
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)


def test_upload_and_delete_order_keep_models_whole():
    paths = ["m/config.pbtxt", "m/1/model.py", "a/config.pbtxt", "a/1/w.bin"]
    up = upload_order(paths)
    assert up.index("m/1/model.py") < up.index("m/config.pbtxt") and up.index("a/1/w.bin") < up.index("a/config.pbtxt")
    down = delete_order(paths)
    assert down.index("m/config.pbtxt") < down.index("m/1/model.py")


def test_local_store_sync_by_checksum(tmp_path, demo_repo_copy):
    dest = LocalStore(tmp_path / "dest", create=True)
    first = dest.sync(demo_repo_copy)
    assert set(first.uploaded) == set(scan_local(demo_repo_copy)) and not first.deleted
    assert dest.listing() == scan_local(demo_repo_copy)
    again = dest.sync(demo_repo_copy)
    assert again.uploaded == () and again.deleted == () and len(again.unchanged) == len(first.uploaded)
    (demo_repo_copy / "tiny_echo" / "config.pbtxt").write_text('name: "tiny_echo"\nmax_batch_size: 4\n')
    (demo_repo_copy / "extra").mkdir()
    (demo_repo_copy / "extra" / "config.pbtxt").write_text('name: "extra"\n')
    for p in (demo_repo_copy / "embed_large").rglob("*"):
        if p.is_file():
            p.unlink()
    third = dest.sync(demo_repo_copy)
    assert set(third.uploaded) == {"tiny_echo/config.pbtxt", "extra/config.pbtxt"}
    assert third.deleted[0] == "embed_large/config.pbtxt" and set(third.deleted) == {
        "embed_large/config.pbtxt",
        "embed_large/1/model.py",
    }
    assert not (tmp_path / "dest" / "embed_large").exists()  # emptied directories removed
    assert (tmp_path / "dest" / "tiny_echo" / "config.pbtxt").read_text().endswith("max_batch_size: 4\n")
    with pytest.raises(StoreError, match="relative"):
        dest.write_bytes("../escape", b"x")


def test_s3_urls():
    assert parse_s3_url("s3://bucket/models/v1") == ("bucket", "models/v1", os.environ.get("AWS_ENDPOINT_URL"))
    assert parse_s3_url("s3://127.0.0.1:9000/bucket/repo") == ("bucket", "repo", "http://127.0.0.1:9000")
    assert triton_s3_url("bucket", "repo", "http://127.0.0.1:9000") == "s3://127.0.0.1:9000/bucket/repo"
    assert triton_s3_url("bucket", "", None) == "s3://bucket"
    with pytest.raises(StoreError, match="lowercase"):
        parse_s3_url("s3://Bucket/x")
    with pytest.raises(StoreError, match="not an S3 URL"):
        parse_s3_url("gs://b/x")


@pytest.fixture
def fake_mps(tmp_path, monkeypatch):
    """A fake nvidia-cuda-mps-control on PATH: records argv + stdin, answers like the real one."""
    log = tmp_path / "calls.log"
    script = tmp_path / "bin" / "nvidia-cuda-mps-control"
    script.parent.mkdir()
    script.write_text(f"""#!/bin/sh
input=$(cat)
echo "ARGS=$* STDIN=$input PIPE=$CUDA_MPS_PIPE_DIRECTORY" >> {log}
case "$input" in
  get_server_list) printf '4242\\n4343\\n' ;;
  "get_client_list 4242") printf '100\\n101\\n' ;;
  "get_client_list 4343") printf '' ;;
  "set_active_thread_percentage 9999 50") echo "Server 9999 not found" >&2; exit 1 ;;
esac
exit 0
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    return log


def test_mps_control_commands(fake_mps, tmp_path):
    mps = MpsControl(pipe_dir=str(tmp_path / "pipe"), log_dir=str(tmp_path / "log"))
    mps.start()
    assert mps.list_servers() == [4242, 4343]
    assert mps.list_clients() == {4242: [100, 101], 4343: []}
    mps.set_active_thread_percentage(30)
    mps.set_active_thread_percentage(50.4, server_pid=4242)
    with pytest.raises(MpsError, match="not found"):
        mps.set_active_thread_percentage(50, server_pid=9999)
    with pytest.raises(MpsError, match="1..100"):
        mps.set_active_thread_percentage(0)
    mps.quit()
    calls = Path(fake_mps).read_text().splitlines()
    pipe = str(tmp_path / "pipe")
    assert calls[0] == f"ARGS=-d STDIN= PIPE={pipe}"
    assert f"ARGS= STDIN=set_default_active_thread_percentage 30 PIPE={pipe}" in calls
    assert f"ARGS= STDIN=set_active_thread_percentage 4242 50 PIPE={pipe}" in calls
    assert calls[-1] == f"ARGS= STDIN=quit PIPE={pipe}"
    assert mps.client_env(25) == {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PIPE_DIRECTORY": pipe,
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "log"),
    }
    assert parse_pids("Server 12 not found\n7\n 8 \n") == [7, 8]


def test_mps_missing_binary_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MpsError, match="not found on PATH"):
        MpsControl().start()


def test_gpu_fleet_process_environment(tmp_path, fake_mps, monkeypatch):
    from agents.triton.environment import MATH_THREAD_VARIABLES

    for variable in MATH_THREAD_VARIABLES:
        monkeypatch.delenv(variable, raising=False)  # what the agent's environment sets is kept (checked below)
    from agents.triton import TritonFleet
    from controller.messages import ModelAssignment
    from controller.render import ModelConfig

    mps = MpsControl(pipe_dir=str(tmp_path / "pipe"))
    fleet = TritonFleet(
        str(tmp_path),
        device_kind="gpu",
        workdir=str(tmp_path / "w"),
        mps=mps,
        base_config=lambda model: ModelConfig(name=model, max_batch_size=32),
    )
    a = ModelAssignment(
        "web", "mlp_small", device=3, share_pct=37.4, batch=8, queue_delay_ms=2.0, slo_ms=20.0, rate_rps=100.0
    )
    cores, env = fleet.resources(a, instances=1)
    assert cores is None
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "37"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "pipe")
    config = fleet.render(a)
    assert config.instance_group[0].kind == config.instance_group[0].KIND_GPU
    assert list(config.instance_group[0].gpus) == [0]  # the only GPU the process sees
    cpu = TritonFleet(
        str(tmp_path),
        workdir=str(tmp_path / "c"),
        cpu_cores=[0, 1, 2, 3],
        base_config=lambda model: ModelConfig(name=model, max_batch_size=32),
    )
    cores, env = cpu.resources(a, instances=2)
    assert cores == (0, 1) and "CUDA_VISIBLE_DEVICES" not in env
    assert cpu.render(a).instance_group[0].count == 2  # one instance per core of the share
    # the math libraries' threads: the share's cores split between its instances, unless the fleet sets them
    assert {env[v] for v in MATH_THREAD_VARIABLES} == {"1"}
    assert cpu.resources(a, instances=1)[1]["OPENBLAS_NUM_THREADS"] == "2"
    assert "OMP_NUM_THREADS" not in fleet.resources(a, instances=1)[1]  # a GPU node's share is not its CPU threads
    own = TritonFleet(str(tmp_path), workdir=str(tmp_path / "o"), cpu_cores=[0, 1, 2, 3], env={"OMP_NUM_THREADS": "4"})
    assert own.resources(a, instances=2)[1]["OMP_NUM_THREADS"] == "4"
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")  # exported to the agent: Triton inherits it as it is
    assert "OPENBLAS_NUM_THREADS" not in cpu.resources(a, instances=2)[1]


def test_mps_daemon_already_running_is_reused_but_never_quit():
    calls = []

    def runner(argv, stdin, env):
        calls.append((tuple(argv[1:]), stdin.strip()))
        if argv[1:] == ["-d"]:
            return 1, "", "An instance of this daemon is already running"
        return 0, "", ""

    mps = MpsControl(runner=runner, binary="/usr/bin/nvidia-cuda-mps-control")  # a path: not looked up
    mps.start()
    assert mps.started and not mps.owned
    mps.quit()  # someone else's daemon: left alone
    assert ((), "quit") not in calls and not mps.started


def test_one_continuous_arrival_schedule_not_the_same_window_again():
    """`stoke up` used to send the same seeded 2-second window over and over (17.9 req/s offered as 20)."""
    stream = arrival_stream(20.0, "poisson", seed=0)
    times = np.array([t for t, _ in zip(stream, range(20 * 600))])  # ten minutes' worth
    assert np.all(np.diff(times) > 0)
    windows = [np.sort(times[(times >= s) & (times < s + 2)] - s) for s in range(0, 40, 2)]
    assert len({tuple(np.round(w, 9)) for w in windows}) == len(windows)  # no window repeats
    rate = len(times) / times[-1]
    assert 19.0 < rate < 21.0  # offered at the asked rate over a long run
    constant = arrival_stream(4.0, "constant")
    assert [next(constant) for _ in range(5)] == [0.0, 0.25, 0.5, 0.75, 1.0]
    with pytest.raises(ValueError):
        arrival_stream(0.0, "poisson")


def test_client_latencies_over_a_window_and_the_whole_run():
    from agents.latency_metrics import ClientLatencies

    now = [0.0]
    figures = ClientLatencies(slo_ms=10.0, window_s=5.0, clock=lambda: now[0])
    for i in range(100):
        now[0] = i * 0.1  # 10 s of requests: the first half fast, then slow and one failure
        figures.record(2.0 if i < 50 else 20.0, ok=i != 99)
    recent = figures.window()
    # the last 5 s: one fast request (at 4.9 s), 49 slow ones answered, one failed (late by definition)
    assert (recent.requests, recent.failed, recent.p99_ms) == (51, 1, 20.0)
    assert recent.over_slo == pytest.approx(50 / 51)
    total = figures.total()
    assert (total.requests, total.failed) == (100, 1) and total.over_slo == pytest.approx(0.5)
    assert (total.p50_ms, total.p99_ms) == (2.0, 20.0)  # over the 99 answered requests
    assert ClientLatencies(10.0).window().p99_ms is None
