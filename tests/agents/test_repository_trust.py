"""What an agent trusts of its model repository, and how fast it stops (issue 21, item 6).

- No file path in a model config may leave its model's folder (`default_model_filename: "../../../evil.py"`
  made Triton run a file outside the repository); a config over the size cap is refused unread.
- Shutdown finishes within the documented bound (`agents.agent.SHUTDOWN_S`, 30 s) even while a model takes
  90 s to load (real Triton on CPU).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from control_helpers import wait_for
from triton_helpers import DEMO_REPO

from agents.agent import SHUTDOWN_S, Agent
from agents.triton import TritonFleet
from controller.messages import HeartbeatAnswer, ModelAssignment, NodeDevice
from controller.render import MAX_CONFIG_BYTES, RenderError, parse_config, read_config

ECHO_CONFIG = (DEMO_REPO / "tiny_echo" / "config.pbtxt").read_text()


@pytest.mark.parametrize(
    "line",
    [
        'default_model_filename: "../../../evil.py"',
        'default_model_filename: "/tmp/evil.py"',
        'default_model_filename: "1/../../x.py"',
        'runtime: "/tmp/libevil.so"',
        'cc_model_filenames { key: "7.0" value: "../x.plan" }',
        'model_operations { op_library_filename: "/tmp/libop.so" }',
        'parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "/opt/envs/evil.tar.gz" } }',
        'parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/../../e.tgz" } }',
    ],
)
def test_a_config_path_that_leaves_the_model_folder_is_refused(line):
    with pytest.raises(RenderError, match="refused"):
        parse_config(ECHO_CONFIG.replace('backend: "python"', f'backend: "python"\n{line}'))


def test_paths_inside_the_model_folder_pass_and_a_huge_config_is_not_read(tmp_path):
    ok = ECHO_CONFIG + (
        'default_model_filename: "model.py"\n'
        'parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }\n'
    )
    assert parse_config(ok).default_model_filename == "model.py"
    huge = tmp_path / "config.pbtxt"
    huge.write_text(ECHO_CONFIG + "#" * (MAX_CONFIG_BYTES + 10))
    with pytest.raises(RenderError, match="over the"):
        read_config(huge)


class Controller:
    def __init__(self, assignments):
        self.assignments = assignments
        self.reports = []

    def register(self, node_id, devices, address=""):
        return 0.3

    def heartbeat(self, report):
        self.reports.append(report)
        return HeartbeatAnswer(True, 1, self.assignments, 0.3)


def repo_with(tmp_path: Path, model: str, config: str, model_py: str) -> Path:
    repo = tmp_path / "repo"
    (repo / model / "1").mkdir(parents=True)
    (repo / model / "config.pbtxt").write_text(config.replace('name: "tiny_echo"', f'name: "{model}"'))
    (repo / model / "1" / "model.py").write_text(model_py)
    return repo


@pytest.mark.triton
def test_a_repository_config_pointing_outside_its_folder_never_runs(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    config = ECHO_CONFIG + 'default_model_filename: "../../../evil.py"\n'
    repo = repo_with(tmp_path, "escape", config, (DEMO_REPO / "tiny_echo" / "1" / "model.py").read_text())
    with TritonFleet(str(repo), workdir=str(tmp_path / "work"), ready_timeout_s=60) as fleet:
        report = fleet.apply([ModelAssignment("esc", "escape", 0, 50.0, 4, 1.0, 100.0, 10.0)])
        assert report.errors and "file name in the model's folder" in report.errors[0].message
        assert fleet.running() == []
    assert not marker.exists()


@pytest.mark.triton
def test_shutdown_finishes_within_the_bound_while_a_model_loads_for_90_seconds(tmp_path):
    slow = (DEMO_REPO / "tiny_echo" / "1" / "model.py").read_text()
    slow = "import time as _slow_time\n" + slow.replace(
        "def initialize(self, args):", "def initialize(self, args):\n        _slow_time.sleep(90)", 1
    )
    assert "_slow_time.sleep(90)" in slow, "the demo model's initialize changed: adapt the test"
    repo = repo_with(tmp_path, "slow_echo", ECHO_CONFIG, slow)
    shutil.copytree(DEMO_REPO / "tiny_echo", repo / "tiny_echo")
    controller = Controller((ModelAssignment("slow", "slow_echo", 0, 50.0, 4, 1.0, 100.0, 10.0),))
    fleet = TritonFleet(str(repo), workdir=str(tmp_path / "work"), ready_timeout_s=60)
    agent = Agent(controller, fleet, "n1", (NodeDevice(0, "cpu", "cpu", cores=2),))
    agent.start()
    try:
        wait_for("a Triton loading the slow model", lambda: any(p.alive() for p in fleet._spawned), timeout=60)
        time.sleep(3)  # well into the load
    finally:
        t0 = time.monotonic()
        agent.stop()
        took = time.monotonic() - t0
    print(f"shutdown took {took:.1f} s during a 90 s model load")
    assert took <= SHUTDOWN_S
    assert not any(p.alive() for p in fleet._spawned)
