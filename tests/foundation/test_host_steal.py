"""The host's steal: read from /proc/stat's cpu line, as a share of the CPU time, over a run and its worst stretch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from foundation import host_steal
from foundation.host_steal import StealMeter, cpu_ticks, stolen_share

ROOT = Path(__file__).resolve().parents[2]


def cpu_line(steal: int, rest: int) -> str:
    # user nice system idle iowait irq softirq steal guest guest_nice: guest is inside user, not counted twice
    return f"cpu  {rest} 0 0 0 0 0 0 {steal} 500 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"


def test_ticks_are_read_from_the_cpu_line_without_guest_time(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    stat.write_text(cpu_line(steal=30, rest=70))
    monkeypatch.setattr(host_steal, "PROC_STAT", stat)
    assert cpu_ticks() == (30, 100)
    stat.write_text("cpu  1 2 3 4\n")  # an old kernel: no steal column
    assert cpu_ticks() == (0, 10)
    monkeypatch.setattr(host_steal, "PROC_STAT", tmp_path / "absent")
    assert cpu_ticks() == (0, 0)


def test_the_stolen_share_is_bounded_and_zero_without_time():
    assert stolen_share((10, 100), (40, 200)) == pytest.approx(0.3)
    assert stolen_share((10, 100), (10, 100)) == 0.0
    assert stolen_share((50, 100), (10, 200)) == 0.0  # counters that went back (another boot) are not negative
    assert stolen_share((0, 0), (500, 200)) == 1.0


def meter(samples: list[tuple[float, tuple[int, int]]]) -> StealMeter:
    m = StealMeter()
    m.samples = samples
    return m


def test_a_short_stall_shows_in_the_worst_window_not_in_the_mean():
    # 20 s at 2% steal, with 5 s at 40% in the middle (ticks: 100 per second)
    samples, steal, total = [], 0, 0
    for second in range(21):
        samples.append((float(second), (steal, total)))
        steal += 40 if 8 <= second < 13 else 2
        total += 100
    m = meter(samples)
    assert m.mean == pytest.approx((15 * 2 + 5 * 40) / 2000)
    assert m.worst(5.0) == pytest.approx(0.40)
    assert m.worst(100.0) == pytest.approx(m.mean)  # a run shorter than the window: its mean
    assert "over its worst 5 s" in (m.disturbance() or "")
    calm = meter([(float(s), (2 * s, 100 * s)) for s in range(21)])
    assert calm.disturbance() is None and calm.mean == pytest.approx(0.02)
    assert meter([]).mean == 0.0 and meter([]).disturbance() is None


def test_the_meter_samples_this_machine_and_stops_once():
    with StealMeter(interval_s=0.01) as m:
        deadline = time.monotonic() + 10.0
        while len(m.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    count = len(m.samples)
    m.stop()  # a second stop adds nothing
    assert len(m.samples) == count and 0.0 <= m.mean <= 1.0
    assert all(a[0] <= b[0] for a, b in zip(m.samples, m.samples[1:]))


def test_a_sleep_ends_early_once_the_worst_stretch_is_past_its_limit_and_not_before(monkeypatch):
    monkeypatch.setattr(host_steal, "WINDOW_S", 0.05)
    share = {"steal": 0.02}

    def ticks():  # 1,000 ticks a second, `share` of them stolen
        total = int(time.monotonic() * 1000)
        return int(total * share["steal"]), total

    monkeypatch.setattr(host_steal, "cpu_ticks", ticks)
    with StealMeter(interval_s=0.01) as m:
        assert m.sleep_unless_disturbed(0.3)  # calm: the whole sleep
        share["steal"] = 0.6
        started = time.monotonic()
        assert not m.sleep_unless_disturbed(30.0)  # the host takes 60%: over the 20% limit within a stretch
        assert time.monotonic() - started < 10.0
    assert m.disturbance() is not None  # what the run would have been judged at its end


def _held_for(seconds: float) -> None:
    """Hold the interpreter `seconds` at least in one call: builtin sum over a range runs in C without letting
    another thread in. Sized on this machine, so a fast one holds it as long."""
    started = time.perf_counter()
    sum(range(1_000_000))
    per_million = max(time.perf_counter() - started, 1e-6)
    sum(range(int(1_000_000 * seconds / per_million) + 1))


def test_a_pause_the_host_did_not_steal_is_reported_never_excused():
    with StealMeter(watch_pauses=True) as m:
        time.sleep(0.05)
        _held_for(host_steal.PAUSE_LIMIT_MS * 3 / 1000)
        time.sleep(0.05)
    assert m.pauses and max(p.late_ms for p in m.pauses) >= host_steal.PAUSE_LIMIT_MS, m.pauses
    for pause in m.pauses:  # each in one list or the other, by what the host stole of it
        assert (str(pause) in (m.disturbance() or "")) == pause.hosts
        assert (str(pause) in (m.other_pauses() or "")) == (not pause.hosts)


def test_a_stopped_process_notes_the_pause_without_excusing_it():
    # The child meters itself while this test stops it (SIGSTOP): late, but not the host's steal.
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from foundation.host_steal import StealMeter\n"
            "m = StealMeter(watch_pauses=True).start(); print('ready', flush=True)\n"
            "sys.stdin.readline(); m.stop()\n"
            "print(m.host_pauses(), m.other_pauses(), sep='|', flush=True)",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(host_steal.PAUSE_LIMIT_MS * 3 / 1000)
        os.kill(child.pid, signal.SIGCONT)
        time.sleep(0.2)
        out, _ = child.communicate("stop\n", timeout=15)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    hosts, other = out.strip().split("|")
    if hosts == "[]":  # (unless the host stole the CPUs just then)
        assert other.startswith("late wake-ups not stolen by the host"), out
        assert int(other.split(": ")[1].split(" ms")[0]) >= host_steal.PAUSE_LIMIT_MS, out


def test_only_a_pause_the_host_stole_disturbs_the_run_and_ends_its_sleep():
    assert host_steal.Pause(1.0, late_ms=300.0, stolen=0.6).hosts
    assert not host_steal.Pause(1.0, late_ms=300.0, stolen=0.1).hosts
    assert str(host_steal.Pause(1.0, late_ms=300.0, stolen=0.6)) == "300 ms at 1.0 s (60% stolen)"
    calm = meter([(float(s), (2 * s, 100 * s)) for s in range(21)])
    calm.pauses = [host_steal.Pause(3.0, 250.0, 0.1)]
    assert calm.disturbance() is None and "250 ms at 3.0 s" in (calm.other_pauses() or "")
    calm.pauses.append(host_steal.Pause(7.0, 400.0, 0.9))
    assert "the host stole the CPUs for 400 ms at 7.0 s" in (calm.disturbance() or "")
    assert "400 ms" not in (calm.other_pauses() or "")
    with calm:  # its samples start again; the pause above stays listed
        assert not calm.sleep_unless_disturbed(30.0)
