"""`stoke profile run` against real Triton processes: measure, checkpoint, resume, fit."""

import json
from pathlib import Path

import pytest

from interference.fit import fit_measured_profile
from interference.profiling import ProfileSession
from stoke.cli import main

pytestmark = pytest.mark.triton
REPO = str(Path(__file__).resolve().parents[2] / "triton_repo")


def test_profile_run_measures_resumes_and_fits(tmp_path, capsys):
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
        "-o",
        str(out),
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    lines = [line for line in text.splitlines() if line.startswith("[")]
    session = ProfileSession.from_dict(json.loads(out.read_text()))
    # 2 shares x 2 batches + co-location, and each re-measurement of a non-monotone point (a busy machine)
    retries = sum(session.retries.values())
    assert len(lines) == 5 + retries and all(" windows, spread " in line for line in lines)
    assert all(", ETA " in line for line in lines) and lines[-1].endswith("ETA 0s")
    assert (f"re-measured {len(session.retries)} non-monotone point(s)" in text) == bool(retries)
    for key in session.rejected():
        assert f"rejected {key}: " in text
    assert session.done and all(v > 0 for v in session.results.values())
    assert set(session.spreads) == set(session.results)
    assert session.model_bytes["mlp_small"] == (64 * 4, 16 * 4)
    capsys.readouterr()
    assert main(argv) == 0  # resuming a finished profile measures nothing again
    assert "[" not in capsys.readouterr().out.split("resuming")[1].split("measurements written")[0]
    profile = fit_measured_profile(session)
    assert set(profile.models) == {"mlp_small"}
    # real measurements on a shared machine may or may not fit well: the report is printed either way
    assert main(["profile", "fit", str(out), "-o", str(tmp_path / "p.json"), "--force"]) == 0
    assert "MAPE_%" in capsys.readouterr().out and (tmp_path / "p.json").exists()


def test_profile_run_names_a_missing_model(tmp_path, capsys):
    assert main(["profile", "run", "--repo", REPO, "--models", "nope", "-o", str(tmp_path / "m.json")]) == 2
    assert "no model 'nope'" in capsys.readouterr().err
