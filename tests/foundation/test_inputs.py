"""Bounded reads of input files: size, encoding, JSON depth and big integers, YAML alias expansion."""

from __future__ import annotations

import io

import pytest

from foundation import inputs
from foundation.errors import InputError

LAUGHS = "\n".join(
    [
        'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]',
        *(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)),
        "top: *a8",
    ]
)


def test_a_file_past_the_size_limit_is_refused_before_it_is_read_whole(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b"x" * 2049)
    with pytest.raises(InputError, match=r"big.json: plan is larger than"):
        inputs.read_text(big, "plan", limit=2048)
    assert inputs.read_text(big, "plan", limit=4096) == "x" * 2049
    # /dev/zero never ends: the read stops at the limit
    with pytest.raises(InputError, match="larger than 32 MiB"):
        inputs.read_text("/dev/zero", "profile")


def test_unreadable_paths_name_the_file_and_escape_it(tmp_path):
    with pytest.raises(InputError, match="cannot read plan .Is a directory.; check the path"):
        inputs.read_text(tmp_path, "plan")
    with pytest.raises(InputError, match="NUL character"):
        inputs.read_text("a\0b", "plan")
    with pytest.raises(InputError) as caught:
        inputs.read_text(tmp_path / "\x1b[31mred", "plan")
    assert "\x1b" not in str(caught.value) and "\\x1b[31mred" in str(caught.value)


def test_text_that_is_not_utf8_is_refused_with_the_offset(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"ok: 1\n\xe9")
    with pytest.raises(InputError, match=r"not UTF-8 text \(byte 0xe9 at offset 6\)"):
        inputs.read_text(bad, "workload file")
    with pytest.raises(InputError, match="not UTF-8"):
        inputs.read_stream(io.TextIOWrapper(io.BytesIO(b"\xff")), "<stdin>", "plan")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000, "nested too deeply"),
        ('{"a": 1', "not valid JSON .line 1"),
        ("1" + "0" * 6000, None),  # Python refuses ints past 4,300 digits; read as a float instead
    ],
)
def test_json_errors_are_one_line(text, message):
    if message is None:
        assert inputs.parse_json(text, "p.json", "plan") == float("inf")
        return
    with pytest.raises(InputError, match=message):
        inputs.parse_json(text, "p.json", "plan")


def test_small_integers_stay_integers():
    assert inputs.parse_json('{"batch": 8, "big": 123456789012345678901234567890}', "p", "plan") == {
        "batch": 8,
        "big": 123456789012345678901234567890,
    }


def test_a_yaml_alias_bomb_is_refused_quickly_and_plain_aliases_still_work():
    with pytest.raises(InputError, match="holds more than 2,000,000 values, counting each use of a YAML alias"):
        inputs.parse_yaml(LAUGHS, "w.yaml", "workload file")
    data = inputs.parse_yaml("base: &b {slo_ms: 50}\nw: *b\n", "w.yaml", "workload file")
    assert data["w"] == {"slo_ms": 50}


@pytest.mark.parametrize(
    ("text", "value"), [("1e3", 1000.0), ("-2.5E-1", -0.25), ("1.0e+2", 100.0), ("12", 12), ("'1e3'", "1e3")]
)
def test_yaml_reads_exponent_numbers_as_yaml_1_2_does(text, value):
    assert inputs.parse_yaml(f"v: {text}\n", "f.yaml", "file") == {"v": value}


def test_malformed_yaml_names_the_line():
    with pytest.raises(InputError, match=r"f.yaml: malformed YAML at line 2"):
        inputs.parse_yaml("a: [1\nb: {", "f.yaml", "file")


@pytest.mark.parametrize("digits", [310, 5000])
def test_yaml_integers_too_long_for_a_float_are_read_as_out_of_range_floats(digits):
    # 310 digits overflowed float(); 4,301 raised Python's own int limit, uncaught
    assert inputs.parse_yaml(f"v: {'1' * digits}\n", "f.yaml", "file") == {"v": float("inf")}
    assert inputs.parse_yaml("v: 1_000\n", "f.yaml", "file") == {"v": 1000}


def test_a_yaml_document_past_its_size_limit_is_refused_before_it_is_built():
    with pytest.raises(InputError, match="larger than 8 MiB of YAML"):
        inputs.parse_yaml("[" + "0," * (4 * 1024 * 1024) + "0]", "w.yaml", "workload file")
    with pytest.raises(InputError, match="holds a value YAML cannot read"):
        inputs.parse_yaml("d: 2024-13-45\n", "w.yaml", "workload file")
