"""`stoke load`'s bounds at the command line: refused before any connection, one line each (no server needed)."""

from __future__ import annotations

import argparse

import pytest

from agents.loadgen import ERROR_TEXT_MAX, _one_line
from foundation.errors import UserError
from stoke.commands import load


@pytest.fixture
def parser():
    p = argparse.ArgumentParser(prog="stoke")
    load.register(p.add_subparsers(dest="command", required=True))
    return p


def run(parser, *argv: str):
    args = parser.parse_args(["load", "--url", "127.0.0.1:1", *argv])
    return args.run(args)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--model", "../m", "--rate", "1", "--seconds", "1"), "--model must be a name"),
        (("--model", "m\x1b[2J", "--rate", "1", "--seconds", "1"), r"--model must be a name .*\\x1b"),
        (("--model", "m", "--workload", "a/b", "--rate", "1", "--seconds", "1"), "--workload must be a name"),
        (("--model", "m", "--rate", "1", "--seconds", "1e9"), "--seconds must be a positive number .* up to 600"),
        (("--model", "m", "--rate", "1e9", "--seconds", "1"), "--rate must be a positive number .* up to 100000"),
        (("--model", "m", "--rate", "50000", "--seconds", "600"), "30,000,000 requests in one step, over 10,000,000"),
        (("--model", "m", "--rate", "1", "--seconds", "1", "--seed", "-1"), "--seed must be a whole number >= 0"),
        (("--model", "m", "--rate", "1", "--seconds", "1", "--batch", "0"), "--batch must be 1..4096"),
        (("--model", "m", "--rate", "1", "--seconds", "1", "--batch", "100000"), "--batch must be 1..4096"),
        (("--model", "m", "--rate", "1", "--seconds", "1", "--slo-ms", "nan"), "--slo-ms must be a positive number"),
        (("--model", "m", "--rate", "1", "--seconds", "1", "--stop-p99-ms", "-1"), "--stop-p99-ms must be a positive"),
        # a span too wide to count was an OverflowError traceback
        (("--model", "m", "--sweep-rate", "1:inf:1", "--seconds", "1"), "give 1 to 64 positive levels"),
        (("--model", "m", "--sweep-rate", "1:1e308:1e-300", "--seconds", "1"), "give 1 to 64 positive levels"),
        (("--model", "m", "--sweep-concurrency", "1:2000:1", "--seconds", "1"), "give 1 to 64 positive levels"),
        (("--model", "m", "--sweep-concurrency", "1,2000", "--seconds", "1"), "--concurrency must be 1..1024"),
    ],
)
def test_out_of_bounds_inputs_are_one_line_errors_before_any_connection(parser, argv, message):
    with pytest.raises(UserError, match=message):
        run(parser, *argv)


def test_a_servers_error_text_is_kept_printable_and_bounded():
    assert _one_line(RuntimeError("\x1b[2Jboom\u202e\nsecond line")) == "?[2Jboom?"
    assert len(_one_line(RuntimeError("x" * 10_000))) == ERROR_TEXT_MAX + len("...")
    assert _one_line(RuntimeError("")) == "RuntimeError"


@pytest.mark.parametrize(("protocol", "fix"), [("grpc", "Triton's gRPC port"), ("http", "Triton's HTTP port")])
def test_nothing_listening_says_where_and_what_to_check(parser, protocol, fix):
    from triton_helpers import free_port

    with pytest.raises(
        UserError, match=rf"--url 127\.0\.0\.1:\d+ --model m \({protocol}\): .*check that --url is {fix}"
    ):
        args = parser.parse_args(
            ["load", "--url", f"127.0.0.1:{free_port()}", "--model", "m", "--protocol", protocol, "--rate", "1"]
            + ["--seconds", "1"]
        )
        args.run(args)
