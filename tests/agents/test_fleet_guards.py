"""Issue 10 on the node: what a fleet refuses to run, and the processes a crashed agent leaves behind.

Real `TritonFleet` objects (no Triton started: every case is refused before a process would be), real
processes for the pid ledger (`sleep`, in their own session like Triton's)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from agents.triton import LEDGER, TritonFleet, reap_orphans
from agents.triton.ledger import process_start_time, record_process
from controller.messages import ModelAssignment
from controller.render import ModelConfig


def assignment(workload="web", model="mlp_small", share=50.0, device=0):
    return ModelAssignment(workload, model, device, share, 4, 1.0, 100.0, 10.0)


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    (root / "mlp_small").mkdir(parents=True)
    outside = tmp_path / "evilrel"
    outside.mkdir()
    (outside / "1").mkdir()
    (outside / "1" / "model.py").write_text("open('/tmp/pwned', 'w')\n")
    (root / "linked").symlink_to(outside)  # a folder inside that leads outside
    return root


def fleet(repo, tmp_path, **kw):
    return TritonFleet(
        str(repo),
        workdir=str(tmp_path / "work"),
        base_config=lambda m: ModelConfig(name=m, max_batch_size=8),
        **kw,
    )


@pytest.mark.parametrize("model", ["../evilrel", "linked", "..", "/etc", "a\x00b"])
def test_a_model_outside_the_repository_is_refused_and_nothing_starts(repo, tmp_path, model):
    f = fleet(repo, tmp_path)
    report = f.apply([assignment(model=model)])
    assert not report.started and f.running() == [] and report.errors
    assert "refused" in report.errors[0].message
    assert f.refusals([assignment(model=model)])


def test_assignments_that_over_commit_a_device_are_refused(repo, tmp_path):
    """The probe: an agent started 4 processes at 100% share on one device."""
    gpu = fleet(repo, tmp_path, device_kind="gpu", devices=1)
    four = [assignment(workload=f"w{i}", share=100.0) for i in range(4)]
    refused = gpu.refusals(four)
    assert [e.key for e in refused] == [a.key for a in four]
    assert "GPU 0 shares add up to 400%" in refused[0].message
    assert "this node has 1 GPU" in gpu.refusals([assignment(device=1)])[0].message
    assert gpu.refusals([assignment(share=60.0), assignment(workload="b", share=40.0)]) == []
    cpu = fleet(repo, tmp_path, cpu_cores=[0, 1])
    assert (
        "need 4 whole cores" in cpu.refusals([assignment(workload=f"w{i}", share=100.0) for i in range(2)])[0].message
    )


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([shutil.which("sleep"), "60"], start_new_session=True)


def test_processes_a_crashed_agent_left_are_reaped_by_the_next_fleet(repo, tmp_path):
    work = tmp_path / "work"
    orphan, stranger = sleeper(), sleeper()
    try:
        record_process(work, "triton-web-1", orphan.pid, [shutil.which("sleep"), "60"])
        # a record whose pid was recycled for another process since: never touched
        record_process(work, "triton-old-2", stranger.pid, [shutil.which("sleep"), "60"])
        entry = work / LEDGER / "triton-old-2.json"
        entry.write_text(json.dumps({**json.loads(entry.read_text()), "start": process_start_time(stranger.pid) - 1}))
        f = fleet(repo, tmp_path)  # the restarted agent's fleet, same workdir
        assert f.reaped == [orphan.pid]
        assert orphan.wait(timeout=10) == -signal.SIGTERM
        assert stranger.poll() is None and not list((work / LEDGER).glob("*.json"))
    finally:
        for p in (orphan, stranger):
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.slow
def test_an_orphan_that_ignores_sigterm_is_killed(tmp_path):
    stubborn = subprocess.Popen(
        ["/bin/sh", "-c", "trap '' TERM; sleep 60 & wait"], start_new_session=True, stdout=subprocess.DEVNULL
    )
    try:
        time.sleep(0.2)
        record_process(tmp_path, "triton-x-1", stubborn.pid, ["/bin/sh"])
        started = time.monotonic()
        assert reap_orphans(tmp_path, timeout_s=0.5) == [stubborn.pid]
        assert stubborn.wait(timeout=10) == -signal.SIGKILL and time.monotonic() - started < 5
    finally:
        if stubborn.poll() is None:
            os.killpg(stubborn.pid, signal.SIGKILL)
            stubborn.wait()


def test_a_corrupt_ledger_entry_is_dropped(tmp_path):
    (tmp_path / LEDGER).mkdir()
    (tmp_path / LEDGER / "x.json").write_text("{not json")
    assert reap_orphans(tmp_path) == [] and not (tmp_path / LEDGER / "x.json").exists()
    assert Path(tmp_path / LEDGER).is_dir()
