"""Generated files get the mode a plain open() gives (umask applied; an existing file keeps its mode).

Triton, Prometheus and Grafana often run as another user and must be able to read
config.pbtxt, rule files, dashboards and profiles; a temp file from mkstemp is 0600.
"""

from __future__ import annotations

import os
import stat
from contextlib import contextmanager
from pathlib import Path

import pytest

from agents.repo_store import LocalStore
from foundation.files import atomic_write_bytes, atomic_write_text
from stoke.cli import main


@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def plain_open_mode(tmp_path: Path, mask: int) -> int:
    probe = tmp_path / f"probe-{mask:o}"
    with umask(mask):
        with open(probe, "w") as handle:
            handle.write("x")
    return mode(probe)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o027, 0o077])
def test_new_files_get_the_mode_open_would_give(tmp_path: Path, mask: int):
    expected = plain_open_mode(tmp_path, mask)
    assert expected == 0o666 & ~mask
    with umask(mask):
        assert atomic_write_text(tmp_path / "a" / "config.pbtxt", "max_batch_size: 8\n")
        atomic_write_bytes(tmp_path / "b.bin", b"\0\1")
        LocalStore(tmp_path / "store", create=True).write_bytes("m/1/model.py", b"print(1)\n")
    assert mode(tmp_path / "a" / "config.pbtxt") == expected
    assert mode(tmp_path / "b.bin") == expected
    assert mode(tmp_path / "store" / "m" / "1" / "model.py") == expected


@pytest.mark.parametrize("existing", [0o600, 0o640, 0o664, 0o755])
def test_an_existing_file_keeps_its_mode(tmp_path: Path, existing: int):
    target = tmp_path / "rules.yml"
    target.write_text("old\n")
    target.chmod(existing)
    with umask(0o077):  # the umask must not matter for an existing file
        assert atomic_write_text(target, "new\n")
        LocalStore(tmp_path).write_bytes("rules.yml", b"newer\n")
    assert target.read_text() == "newer\n" and mode(target) == existing


def test_no_temp_file_is_left_behind_and_unchanged_files_are_not_rewritten(tmp_path: Path):
    target = tmp_path / "p.json"
    assert atomic_write_text(target, "{}\n")
    inode = target.stat().st_ino
    assert not atomic_write_text(target, "{}\n") and target.stat().st_ino == inode
    with pytest.raises(TypeError):
        atomic_write_bytes(target, "not bytes")  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]


def test_cli_generated_files_are_readable_by_others(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    with umask(0o022):
        assert main(["alerts", "render", "--out", str(tmp_path / "alerts")]) == 0
        assert main(["train", "render", "-o", str(tmp_path / "train.yaml")]) == 0
    capsys.readouterr()
    written = [*(tmp_path / "alerts").iterdir(), tmp_path / "train.yaml"]
    assert len(written) == 5
    assert {p.name: mode(p) for p in written} == {p.name: 0o644 for p in written}
