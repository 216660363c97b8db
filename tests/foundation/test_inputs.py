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
    ("text", "value"),
    [
        ("1e3", 1000.0),
        ("-2.5E-1", -0.25),
        ("1.0e+2", 100.0),
        ("12", 12),
        ("'1e3'", "1e3"),
        ("2.5", 2.5),
        ("1:30", "1:30"),  # YAML 1.1's base 60 read `rate_rps: 1:30` as 90; 1.2 has none: text, which checks refuse
        ("1:30.5", "1:30.5"),
    ],
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


@pytest.fixture(params=["libyaml", "pure-python"])
def yaml_loader(request, monkeypatch):
    """Both of PyYAML's safe loaders: libyaml's where PyYAML was built with it, and the pure-Python one."""
    import yaml

    if request.param == "pure-python":
        monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    elif not hasattr(yaml, "CSafeLoader"):
        pytest.skip("PyYAML built without libyaml")
    monkeypatch.setattr(inputs, "_YAML_LOADERS", {})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (  # the last value won silently: an SLO of 1500 ms planned, no word said
            "workloads:\n  - name: a\n    model: alexnet\n    slo_ms: 15\n    slo_ms: 1500\n",
            "w.yaml: line 5: key 'slo_ms' repeated (in workloads[0], first at line 4); keep one",
        ),
        (  # a second `workloads:` block dropped the first list
            "workloads:\n  - {name: a}\ngpu_types: []\nworkloads:\n  - {name: b}\n",
            "w.yaml: line 4: key 'workloads' repeated (at the top level, first at line 1); keep one",
        ),
        ("a:\n  'x y': {b: 1, c: 2, b: 3}\n", "w.yaml: line 2: key 'b' repeated (in a['x y'], first at line 2)"),
        ("1: a\n0x1: b\n", "w.yaml: line 2: key 1 repeated (at the top level, first at line 1)"),  # one key to YAML
    ],
)
def test_a_key_repeated_in_a_yaml_mapping_is_refused_with_its_line_and_place(yaml_loader, text, message):
    with pytest.raises(InputError) as err:
        inputs.parse_yaml(text, "w.yaml", "workload file")
    assert str(err.value).startswith(message) and str(err.value).endswith("; keep one")


def test_yaml_merges_and_aliases_are_not_repeats(yaml_loader):
    text = "base: &b {slo_ms: 50, rate_rps: 1}\nw:\n  <<: *b\n  slo_ms: 60\nv: *b\nu: {slo_ms: 50}\n"
    assert inputs.parse_yaml(text, "w.yaml", "workload file") == {
        "base": {"slo_ms": 50, "rate_rps": 1},
        "w": {"slo_ms": 60, "rate_rps": 1},  # a key over a merged one is YAML's merge, not a repeat
        "v": {"slo_ms": 50, "rate_rps": 1},
        "u": {"slo_ms": 50},
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": 1, "a": 2}', "key 'a' repeated (at the top level); keep one"),
        (
            '{"gpus": [{"workloads": [{}, {"model": "alexnet", "model": "vgg19"}]}]}',
            "key 'model' repeated (in gpus[0].workloads[1]); keep one",
        ),
        ('[{"x y": {"b": 1, "b": 1}}]', "key 'b' repeated (in [0]['x y']); keep one"),  # even with one value
    ],
)
def test_a_key_repeated_in_a_json_object_is_refused_with_its_place(text, message):
    with pytest.raises(InputError) as err:
        inputs.parse_json(text, "p.json", "plan", fix="write one with `stoke plan --json`")
    assert str(err.value) == f"p.json: {message}"
    with pytest.raises(inputs.RepeatedKeyError, match="repeated"):  # a ValueError, for bytes as for text
        inputs.load_json(text.encode())
    assert inputs.load_json('{"a": {"b": 1}, "b": {"a": 1}}') == {"a": {"b": 1}, "b": {"a": 1}}
