"""The pid ledger: each Triton process a fleet starts is recorded in its workdir, so the next
agent reaps what a crashed one left running."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

# --------------------------------------------------------------------------- the pid ledger

LEDGER = "pids"


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else int(fields[19])


def record_process(workdir: Path, name: str, pid: int, command: Sequence[str]) -> Path:
    folder = workdir / LEDGER
    folder.mkdir(parents=True, exist_ok=True)
    entry = folder / f"{name}.json"
    entry.write_text(json.dumps({"pid": pid, "start": process_start_time(pid), "binary": command[0], "name": name}))
    return entry


def reap_orphans(workdir: str | os.PathLike[str], timeout_s: float = 5.0) -> list[int]:
    """Stop the Triton processes a previous agent recorded in `workdir` and left running; returns their pids.

    A record counts only when its pid still runs with the recorded start time and binary, so a pid the
    kernel gave to another process since is left alone. Each is stopped with its process group (its Python
    backend stubs): SIGTERM, then SIGKILL after `timeout_s`."""
    folder = Path(workdir) / LEDGER
    victims = []
    for entry in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            info = json.loads(entry.read_text())
            pid, start, binary = int(info["pid"]), info["start"], str(info["binary"])
        except (OSError, ValueError, KeyError, TypeError):
            entry.unlink(missing_ok=True)
            continue
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            argv0 = ""
        if start is not None and process_start_time(pid) == start and argv0 == binary:
            victims.append(pid)
        else:
            entry.unlink(missing_ok=True)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in victims:
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(process_start_time(p) is not None for p in victims):
            time.sleep(0.05)
    for entry in folder.glob("*.json") if folder.is_dir() else []:
        entry.unlink(missing_ok=True)
    return victims
