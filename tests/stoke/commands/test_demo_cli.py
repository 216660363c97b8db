"""`stoke up`: what it checks and cleans up before any server starts (no Triton needed)."""

from __future__ import annotations

import argparse
import stat
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from triton_helpers import DEMO_REPO

from foundation.errors import UserError
from stoke.cli import main
from stoke.commands import demo


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """mkdtemp's folder, so a test sees every stoke-up-* directory the command leaves behind."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_negative_seconds_is_refused(capsys, private_tmp):
    code, _, err = run(capsys, "up", "--repo", str(DEMO_REPO), "--seconds", "-5")
    assert code == 2 and "--seconds must be >= 0 (0 runs until Ctrl-C), got -5" in err
    assert not list(private_tmp.glob("stoke-up-*"))


def test_a_file_given_as_the_repository_is_said_to_be_no_directory(capsys, private_tmp):
    plan = private_tmp / "plan.json"
    plan.write_text("{}")
    code, _, err = run(capsys, "up", "--repo", str(plan), "--seconds", "1")
    assert code == 2 and f"--repo {plan}: is a file, not a directory" in err and "run from the stoke checkout" in err
    code, _, err = run(capsys, "up", "--repo", str(private_tmp / "nope"), "--seconds", "1")
    assert code == 2 and "nope: model repository not found; run from the stoke checkout" in err


@pytest.mark.parametrize("flag", ["--workloads", "--profile"])
def test_a_failed_start_leaves_no_temporary_directory(capsys, private_tmp, flag):
    code, _, err = run(capsys, "up", "--repo", str(DEMO_REPO), flag, str(private_tmp / "nope.yaml"))
    assert code == 2 and "nope.yaml" in err
    assert not list(private_tmp.glob("stoke-up-*"))


@pytest.mark.slow
def test_the_token_file_is_private_from_the_start(capsys, private_tmp, monkeypatch):
    seen = {}

    class Refuse:  # stands in for the controller: records the token file the demo wrote, then stops the run
        def __init__(self, config):
            seen["mode"] = stat.S_IMODE(Path(config.token_file).stat().st_mode)

        def start(self):
            raise UserError("stop here")

    monkeypatch.setattr("controller.server.ControllerServer", Refuse)
    monkeypatch.setattr(demo, "until_signal", lambda seconds: threading.Event())  # keep pytest's SIGINT handler
    code, _, err = run(capsys, "up", "--repo", str(DEMO_REPO), "--seconds", "1")
    assert code == 2 and "stop here" in err
    assert seen["mode"] == 0o600
    assert not list(private_tmp.glob("stoke-up-*"))


@pytest.mark.parametrize(
    "fmt, stream", [("table", "stdout"), ("wide", "stdout"), ("json", "stderr"), ("yaml", "stderr")]
)
def test_progress_lines_keep_off_stdout_when_it_carries_data(fmt, stream):
    args = argparse.Namespace(json=fmt in ("json", "yaml"), output_format=fmt)
    assert demo.progress_stream(args) is getattr(sys, stream)


def test_stoke_up_finds_the_bundled_cpu_profile_outside_the_model_repository(tmp_path, capsys):
    from interference.profile_io import BUNDLED_CPU_PROFILE, bundled_data_dir

    assert demo.find_cpu_profile("triton_repo", None, tmp_path) == str(bundled_data_dir() / BUNDLED_CPU_PROFILE)
    assert "placeholder" not in capsys.readouterr().out and list(tmp_path.iterdir()) == []
