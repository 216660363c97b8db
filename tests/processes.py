"""Stopping a process a test started, by its PID alone (never its tree: what it started is its own to stop)."""

from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGTERM, wait up to `timeout_s`, then SIGKILL and reap: nothing left running, and no zombie."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
