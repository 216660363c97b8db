"""The CLI starts at once: building its parser loads no heavy library (issue 16).

Run in a fresh interpreter, since this test process has long imported everything.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Libraries a command imports where it runs, never while the parser is built (scikit-learn alone took ~4 s
#: under load here).
HEAVY = ("sklearn", "scipy", "grpc", "matplotlib", "tritonclient", "boto3", "kubernetes")

PROBE = """
import json, sys
from stoke.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def _loaded_after(*argv: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120, check=False
    )
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
@pytest.mark.parametrize("argv", [("--help",), ("plan", "--help"), ("train", "comm-sim", "--help")])
def test_help_loads_no_heavy_library(argv: tuple[str, ...]) -> None:
    loaded = _loaded_after(*argv)
    assert not loaded & set(HEAVY), f"stoke {' '.join(argv)} imported {sorted(loaded & set(HEAVY))}"


@pytest.mark.slow
@pytest.mark.parametrize("argv", [("--help",), ("status", "--help"), ("alerts", "render", "--help")])
def test_help_loads_not_even_numpy_or_yaml(argv: tuple[str, ...]) -> None:
    # numpy alone took 0.1 s of a 0.35 s `stoke --help` (issue 16); `plan --help` may load it: it prints the
    # solver's defaults
    loaded = _loaded_after(*argv)
    assert not loaded & {"numpy", "yaml", "pynvml"}, (
        f"stoke {' '.join(argv)} imported {loaded & {'numpy', 'yaml', 'pynvml'}}"
    )


@pytest.mark.slow
def test_plan_of_the_example_loads_no_fit_or_rpc_library() -> None:
    loaded = _loaded_after("plan")
    assert "numpy" in loaded  # it did plan
    assert not loaded & {"sklearn", "scipy", "grpc", "matplotlib"}


def test_help_shows_the_strategy_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    from planner.solver.stoke import DEFAULT_OPTIONS
    from stoke.cli import main

    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"(default {DEFAULT_OPTIONS.safety_margin:g})" in text
    assert f"(default {DEFAULT_OPTIONS.max_paced_utilisation:g})" in text


def test_constants_copied_for_the_parser_match_their_source() -> None:
    from agents.device import DEVICE_KINDS
    from interference.profiling import Stability
    from planner.solver import STRATEGIES
    from stoke.commands import core, device, train
    from training.comm_sim import SCHEDULERS

    assert train.SCHEDULERS == SCHEDULERS
    assert core.STRATEGIES == STRATEGIES
    assert device.DEVICE_KINDS == DEVICE_KINDS
    assert (core.STABILITY_TOLERANCE_PCT, core.STABILITY_MAX_WINDOWS) == (
        Stability().tolerance_pct,
        Stability().max_windows,
    )
