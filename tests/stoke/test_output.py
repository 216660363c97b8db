"""How every command prints: the table renderer, -o formats, live views, progress, stdin, completion, options."""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from stoke.cli import build_parser, main
from stoke.live import LiveView, Tab
from stoke.progress import Progress
from stoke.table import print_table, render_table

ROOT = Path(__file__).resolve().parents[2]


class Terminal(io.StringIO):
    """A stream that says it is a terminal (rich then draws and redraws)."""

    def isatty(self) -> bool:
        return True


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plain_tables_have_one_format_for_every_command():
    text = render_table(
        ["workload", "slo_ms", "share", "pred_ms", "note"],
        [["a[b]", 30.0, "12.5%", None, "ok"], ["photo-tagging", 1200.5, "100%", 1234567.0, ":smile:"]],
    )
    # numbers (and strings that read as numbers) right aligned, text left, None as '-', no markup or emoji
    assert text.splitlines() == [
        "workload         slo_ms  share    pred_ms  note",
        "-------------  --------  -----  ---------  -------",
        "a[b]              30.00  12.5%          -  ok",
        "photo-tagging  1,200.50   100%  1,234,567  :smile:",
    ]
    assert render_table(["a", "b"], []) == "a  b\n-  -"


_CELL = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**9), 10**9),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.sampled_from(["-", "+3.1", "45%", "1,200", "ok", "MISS", "a b", "[x]", ""]),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=12),
)


@settings(max_examples=200, deadline=None)
@given(
    headers=st.lists(st.text(alphabet="abc_ %", min_size=1, max_size=8), min_size=1, max_size=5),
    rows=st.lists(st.lists(_CELL, max_size=6), max_size=5),
)
def test_plain_ascii_tables_are_laid_out_as_rich_lays_them_out(headers, rows):
    from stoke.table import _plain_ascii

    rich_text = _rich_render(headers, rows)
    assert _plain_ascii(headers, rows) == rich_text
    assert render_table(headers, rows) == rich_text


def _rich_render(headers, rows) -> str:
    from rich.console import Console

    from stoke.table import _table

    buffer = io.StringIO()
    console = Console(
        file=buffer, width=100_000, color_system=None, force_terminal=False, markup=False, emoji=False, highlight=False
    )
    console.print(_table(headers, rows, plain=True), crop=False)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())


def test_a_table_of_wide_characters_is_still_laid_out_by_rich():
    rows = [["名前", 1.0], ["é\u0301", 2.5]]
    assert render_table(["name", "v"], rows) == _rich_render(["name", "v"], rows)


def test_on_a_terminal_the_same_table_is_drawn_by_rich():
    screen = Terminal()
    print_table(["workload", "slo"], [["photo-tagging", "MISS"]], file=screen)
    drawn = screen.getvalue()
    assert "─" in drawn and "photo-tagging" in drawn and "MISS" in drawn
    piped = io.StringIO()
    print_table(["workload", "slo"], [["photo-tagging", "MISS"]], file=piped)
    assert piped.getvalue() == render_table(["workload", "slo"], [["photo-tagging", "MISS"]]) + "\n"


def test_a_table_wider_than_the_terminal_is_printed_whole():
    # the probe: `stoke device show` on a 120-column terminal cut numbers to "24,10…"
    headers = ["device", "sm_clock_mhz", "throttle_reasons", "processes"] * 3
    rows = [["AMD EPYC 7B13 64-Core Processor", 24101.5, "sw_power_cap,hw_slowdown", 12345678.0] * 3]
    screen = Terminal()  # rich's default width: 80 columns
    print_table(headers, rows, file=screen)
    assert screen.getvalue() == render_table(headers, rows) + "\n"
    assert "…" not in screen.getvalue() and "24,101.50" in screen.getvalue()


def test_live_views_redraw_in_place_on_a_terminal_and_print_blocks_when_piped():
    screen = Terminal()
    with LiveView(screen) as view:
        view.show(["frame one", Tab(["a"], [[1]])])
        view.show(["frame two", Tab(["a"], [[2]])])
    drawn = screen.getvalue()
    assert "frame two" in drawn and re.search(r"\x1b\[\d*A", drawn)  # the cursor moves up: redrawn in place
    assert "\x1b[2J" not in drawn  # never clears the screen
    piped = io.StringIO()
    with LiveView(piped, separator="") as view:
        view.show(["frame one", Tab(["a"], [[1]])])
        view.show(["frame two", Tab(["a"], [[2]])])
    assert piped.getvalue() == "frame one\na\n-\n1\n\nframe two\na\n-\n2\n"


def test_progress_prints_an_eta_per_step_when_piped():
    now = [0.0]
    out = io.StringIO()
    with Progress("simulating", 4, file=out, min_interval_s=0.0, clock=lambda: now[0]) as bar:
        for _ in range(4):
            now[0] += 2.5
            bar.advance(note="mix 100")
    lines = out.getvalue().splitlines()
    assert lines[0] == "simulating: 1/4 (25%), 2 s elapsed, ETA 8 s; mix 100"
    assert lines[-1] == "simulating: 4/4 (100%), 10 s elapsed, ETA 0 s; mix 100"
    screen = Terminal()
    with Progress("simulating", 4, file=screen) as bar:
        bar.advance()
    assert "simulating" in screen.getvalue() and "1/4" in screen.getvalue()


def test_output_formats_give_the_same_data(capsys):
    code, as_json, _ = run(capsys, "plan", "--json")
    assert code == 0
    assert json.loads(run(capsys, "plan", "-o", "json")[1]) == json.loads(as_json)
    assert yaml.safe_load(run(capsys, "plan", "-o", "yaml")[1]) == json.loads(as_json)
    table, wide = run(capsys, "plan")[1], run(capsys, "plan", "-o", "wide")[1]
    assert wide.startswith("strategy stoke:")
    # wide adds columns to the same rows: throughput, utilisation, arrivals
    header, plain_header = next(line for line in wide.splitlines() if line.startswith("gpu ")), table.splitlines()[2]
    assert header.split()[: len(plain_header.split())] == plain_header.split()
    assert header.split()[-3:] == ["thru_rps", "util", "arrivals"]
    with pytest.raises(SystemExit) as err:
        main(["plan", "-o", "xml"])
    assert err.value.code == 2 and "invalid choice: 'xml'" in capsys.readouterr().err


def test_wide_is_accepted_only_where_it_adds_columns(capsys):
    """Every command's -o either takes wide and says what it adds, or refuses it (no wide that prints the table)."""
    from stoke.cli import build_parser

    def commands(parser, path=()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from commands(sub, (*path, name))
        yield path, parser

    takes_wide = set()
    for path, parser in commands(build_parser()):
        for action in parser._actions:
            if action.dest == "output_format" and action.choices:
                if "wide" in action.choices:
                    takes_wide.add(" ".join(path))
                    assert "wide (" in (action.help or ""), path  # it says what wide adds
    assert takes_wide == {"plan", "status", "nodes", "up", "profile show"}
    with pytest.raises(SystemExit) as err:
        main(["workload", "ls", "-o", "wide"])
    assert err.value.code == 2 and "invalid choice: 'wide'" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--json", "-o", "yaml"], ["-o", "wide", "--json"], ["-o", "yaml", "-o", "json"]])
def test_two_output_formats_are_refused_not_the_last_taken(capsys, argv):
    with pytest.raises(SystemExit) as err:
        main(["plan", *argv])
    assert err.value.code == 2 and "ask for two output formats; give one" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--json", "-o", "yaml"], ["-o", "yaml", "--json"], ["--format", "yaml", "--json"]])
def test_two_output_formats_are_refused_where_o_may_name_a_file(capsys, argv):
    """`train plan -o FILE` reads a bare format name as the format: there too the last one won silently."""
    with pytest.raises(SystemExit) as err:
        main(["train", "plan", *argv])
    assert err.value.code == 2 and "ask for two output formats; give one" in capsys.readouterr().err


def test_the_same_output_format_twice_is_one(capsys):
    assert main(["plan", "--json", "-o", "json"]) == 0 and capsys.readouterr().out.startswith("{")


@pytest.mark.slow
def test_a_dash_reads_stdin(capsys, monkeypatch):
    plan = run(capsys, "plan", "--json")[1]
    monkeypatch.setattr("sys.stdin", io.StringIO(plan))
    code, out, err = run(capsys, "simulate", "-", "--seconds", "2", "-o", "json")
    assert code == 0, err
    names = {w["name"] for g in json.loads(plan)["gpus"] for w in g["workloads"]}
    assert {w["name"] for w in json.loads(out)["workloads"]} == names
    monkeypatch.setattr("sys.stdin", io.StringIO('[{"model": "alexnet", "batch": 4, "share_pct": 50}]\n'))
    code, out, _ = run(capsys, "predict", "--cases", "-", "--json")
    assert code == 0 and json.loads(out)[0]["predicted_latency_ms"] > 0
    monkeypatch.setattr("sys.stdin", io.StringIO("workloads:\n  - {name: a, model: vgg19, slo_ms: 60, rate_rps: -1}\n"))
    code, _, err = run(capsys, "plan", "-")
    assert code == 2 and err.startswith("stoke: error: <stdin>: workloads[0].rate_rps must be a positive number")


def test_repo_is_the_one_spelling_and_repository_still_works(capsys):
    parser = build_parser()
    for argv in (["up", "--repository", "x"], ["agent", "--repository", "x"], ["up", "--repo", "x"]):
        assert parser.parse_args(argv).repo == "x"
    for command in ("up", "agent"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        assert "--repo REPO" in text and "--repository" not in text


@pytest.mark.parametrize(
    "argv",
    [
        ["triton", "render", "plan.json"],
        ["triton", "up"],
        ["profile", "run", "-o", "m.json"],
        ["up"],
        ["agent"],
    ],
)
def test_every_repo_option_takes_the_hidden_repository_alias(argv):
    parser = build_parser()
    assert parser.parse_args([*argv, "--repository", "x"]).repo == "x"
    assert parser.parse_args([*argv, "--repo", "x"]).repo == "x"


def test_a_required_repo_is_still_required(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["triton", "up"])
    assert "--repo is required" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["profile", "fit"], "--format"),
        (["train", "plan"], "--format"),
        (["train", "fit-loss"], "--format"),
        (["plan"], "-o"),
    ],
)
def test_json_help_names_the_commands_own_format_flag(capsys, argv, flag):
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"--json same as {flag} json" in text


@pytest.mark.slow
def test_bash_completion_completes_commands_options_and_formats(tmp_path):
    script = tmp_path / "stoke.bash"
    result = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "stoke"), "completion", "bash"], capture_output=True, text=True, check=True
    )
    script.write_text(result.stdout)

    def complete(*words: str) -> list[str]:
        line = " ".join(words)
        program = (
            f"source {script}; COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}; "
            f'COMP_LINE="{line}"; COMP_POINT={len(line)}; _shtab_stoke; echo "${{COMPREPLY[@]}}"'
        )
        return subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True).stdout.split()

    assert complete("stoke", "pl") == ["plan"]
    assert "--watch" in complete("stoke", "status", "--w")
    assert complete("stoke", "status", "-o", "") == ["table", "wide", "json", "yaml"]


def _readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_the_readme_documents_every_controller_config_key_and_workload_key():
    from controller.config import ControllerConfig
    from foundation.validate import key_docs
    from planner.workload_file import WorkloadFileSpec

    section = _readme_section("Controller configuration")
    for key, _, doc in key_docs(ControllerConfig):
        assert f"| `{key}` |" in section, f"README: controller key {key} is not documented"
        assert doc in section, f"README: the meaning of {key} differs from controller/config.py"
    workloads = _readme_section("Workload files")
    for key, _, _ in key_docs(WorkloadFileSpec):
        assert f"`{key}`" in workloads, f"README: workload key {key} is not documented"


@pytest.mark.slow
def test_a_benchmark_shows_its_progress_with_an_eta_on_stderr():
    result = subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "python"),
            str(ROOT / "benchmarks" / "bench_core.py"),
            "--sizes",
            "12",
            "--seconds",
            "1",
            "--arrivals",
            "poisson",
            "--strategies",
            "igniter,stoke",
            "--min-requests",
            "2000",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert re.search(
        r"^bench_core: solve \+ simulate: 2/2 \(100%\), .* elapsed, ETA 0 s; poisson mix 12 x stoke$",
        result.stderr,
        re.M,
    )
    assert "ETA" not in result.stdout and "   12 stoke" in result.stdout  # the figures stay on stdout


def test_an_agent_pool_outside_its_bounds_is_refused_before_anything_starts(capsys):
    code, _, err = run(capsys, "agent", "--repo", "x", "--sli-pooled-windows", "40")
    assert code == 2 and "--sli-pooled-windows must be from 1 to 32, got 40" in err


def test_a_numeric_column_with_unstable_cells_stays_right_aligned():
    lines = render_table(["p99_ms"], [[82.08], ["unstable"], [119.08], ["?"]]).splitlines()
    assert lines[2] == "   82.08" and lines[4] == "  119.08"
