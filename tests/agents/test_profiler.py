"""`stoke profile run` against real Triton processes: measure, checkpoint, resume, fit."""

import json
import os
import re
from pathlib import Path

import pytest

from interference.fit import fit_measured_profile
from interference.profiling import ProfileSession
from stoke.cli import main

pytestmark = pytest.mark.triton
REPO = str(Path(__file__).resolve().parents[2] / "triton_repo")


@pytest.fixture
def two_cores():
    """This process, and the Triton processes it starts, pinned to two of its cores: `profile run` measures
    every share (whole cores) x batch, so on 64 cores it would run 129 measurements instead of 5."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip(f"profiling shares and co-location needs 2 usable cores, this process has {len(cores)}")
    os.sched_setaffinity(0, cores[:2])
    try:
        yield
    finally:
        os.sched_setaffinity(0, cores)


def test_profile_run_measures_resumes_and_fits(tmp_path, capsys, two_cores):
    out = tmp_path / "m.json"
    argv = [
        "profile",
        "run",
        "--repo",
        REPO,
        "--models",
        "mlp_small",
        "--batches",
        "1,8",
        "--requests",
        "3",
        "--sli-window",
        "1",
        "-o",
        str(out),
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    lines = [line for line in text.splitlines() if line.startswith("[")]
    session = ProfileSession.from_dict(json.loads(out.read_text()))
    # 2 shares x 2 batches + co-location, and each re-measurement of a non-monotone point (a busy machine)
    retries = sum(session.retries.values())
    assert session.cores == 2 and len(session.points()) == 5
    assert len(lines) == len(session.points()) + retries and all(" windows, spread " in line for line in lines)
    assert all(", ETA " in line for line in lines) and lines[-1].endswith("ETA 0s")
    assert (f"re-measured {len(session.retries)} non-monotone point(s)" in text) == bool(retries)
    for key in session.rejected():
        assert f"rejected {key}: " in text
    assert session.done and all(v > 0 for v in session.results.values())
    assert set(session.spreads) == set(session.results)
    assert session.model_bytes["mlp_small"] == (64 * 4, 16 * 4)
    # the serving path outside the batch, measured once per model through the router over gRPC, open-loop
    # (client less Triton's own time)
    assert set(session.serving_p99_ms) == {"mlp_small"} and 0 < session.serving_p99_ms["mlp_small"] < 1000
    assert text.count("mlp_small: serving path p99 ") == 1 and "through the router at 20 req/s" in text
    # split into what the loop's SLI windows show and what clients see beyond them, in the same windows
    assert set(session.beyond_sli_p99_ms) == {"mlp_small"} and 0 <= session.beyond_sli_p99_ms["mlp_small"] < 1000
    assert "ms seen by the SLI's 1 s windows, " in text and " ms beyond them)" in text
    # every solo point recorded the serving process's resident memory; the fit turns it into a line
    solo = [p.key for p in session.points() if p.neighbours == 0]
    assert set(session.memory_mib) == set(solo) and all(10 < v < 65536 for v in session.memory_mib.values())
    assert 10 < fit_measured_profile(session).model("mlp_small").weights_mib < 65536
    capsys.readouterr()
    assert main(argv) == 0  # resuming a finished profile measures nothing again
    assert "[" not in capsys.readouterr().out.split("resuming")[1].split("measurements written")[0]
    # a measurements file from before the serving term gets it on resume, and nothing else is measured again
    data = json.loads(out.read_text())
    data.pop("beyond_sli_p99_ms")  # from before the split: measured again, both terms
    out.write_text(json.dumps(data))
    assert main([*argv, "--serving-rate", "40"]) == 0
    resumed = capsys.readouterr().out
    assert "through the router at 40 req/s" in resumed and "[" not in resumed.split("resuming")[1]
    again = ProfileSession.from_dict(json.loads(out.read_text()))
    assert again.results == session.results and 0 < again.serving_p99_ms["mlp_small"] < 1000
    assert "mlp_small" in again.beyond_sli_p99_ms
    profile = fit_measured_profile(session)
    assert set(profile.models) == {"mlp_small"}
    assert profile.models["mlp_small"].serving_p99_ms == session.serving_p99_ms["mlp_small"]
    assert profile.models["mlp_small"].beyond_sli_p99_ms == session.beyond_sli_p99_ms["mlp_small"]
    # real measurements on a shared machine may or may not fit well: the report is printed either way, and
    # --force writes the profile unless its active time leaves the range every reader checks (then exit 1)
    code = main(["profile", "fit", str(out), "-o", str(tmp_path / "p.json"), "--force"])
    captured = capsys.readouterr()
    assert "MAPE_%" in captured.out and code in (0, 1)
    assert (tmp_path / "p.json").exists() == (code == 0)
    assert ("not written, not even with --force" in captured.err) == (code == 1)


def test_profile_run_names_a_missing_model(tmp_path, capsys):
    assert main(["profile", "run", "--repo", REPO, "--models", "nope", "-o", str(tmp_path / "m.json")]) == 2
    assert "no model 'nope'" in capsys.readouterr().err
    argv = ["profile", "run", "--repo", REPO, "--models", "mlp_small", "-o", str(tmp_path / "m.json")]
    assert main([*argv, "--serving-rate", "0"]) == 2
    assert "--serving-rate must be a rate in (0, 1000] req/s, got 0" in capsys.readouterr().err
    assert main([*argv, "--sli-window", "0"]) == 2
    assert "--sli-window must be a heartbeat interval in [0.1, 3600] s, got 0; pass the agents'" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "m.json").exists()


def test_profile_verify_measures_a_cpu_plan_on_real_triton(tmp_path, capsys):
    profile = Path(__file__).resolve().parents[2] / "interference" / "data" / "cpu-2core-profile.json"
    (tmp_path / "w.yaml").write_text(
        "gpu_types:\n"
        f"  - {{name: CPU, price_per_hour: 0.1, profile: {profile}}}\n"
        "workloads:\n"
        "  - {name: small, model: mlp_small, slo_ms: 40, rate_rps: 40}\n"
    )
    assert main(["plan", str(tmp_path / "w.yaml"), "--json"]) == 0
    (tmp_path / "plan.json").write_text(capsys.readouterr().out)
    argv = ["profile", "verify", str(tmp_path / "plan.json"), "--device", "cpu", "--repo", REPO, "--requests", "3"]
    argv += ["--profile-out", str(tmp_path / "verified.json")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "measured mlp_small batch" in out and "round 1: measured 1 point(s)" in out and "holds on measured" in out
    measured = json.loads((tmp_path / "verified.json").read_text())["models"]["mlp_small"]["measured"]
    # a point measured slower than the fit moves the re-plan to another, measured in a later round
    per_round = [int(n) for n in re.findall(r"round \d+: measured (\d+) point", out)]
    assert len(measured) == sum(per_round) and all(point[2] > 0 for point in measured), out


def test_the_agents_measurer_measures_a_requested_point_on_real_triton(tmp_path):
    """Verify before serving on a CPU node: the agent's measurer serves the point alone and times it, its
    processes recorded under the agent's workdir (a killed agent's are reaped by the next one there)."""
    from agents.profiler import AgentMeasurer
    from agents.triton import LEDGER

    lines: list[str] = []
    measurer = AgentMeasurer(REPO, workdir=str(tmp_path / "measure"), progress=lines.append)
    try:
        first = measurer("mlp_small", 0, 50.0, 2, 3)
        assert list((tmp_path / "measure" / LEDGER).glob("*.json"))  # its running process, on record there
        again = measurer("mlp_small", 0, 50.0, 1, 3)  # the same Triton process, another batch size
    finally:
        measurer.close()
    assert 0 < first < 1000 and 0 < again < 1000
    assert len(lines) == 2 and "measured mlp_small batch 2 share 50%" in lines[0]
