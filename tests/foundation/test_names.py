"""The one name rule (foundation.names) and how refused values are echoed."""

from __future__ import annotations

import pytest

from foundation.errors import InputError
from foundation.names import NAME_MAX, SHOWN_MAX, check_name, clean_text, is_name, name_problem, shown

GOOD = ["web", "photo-tagging", "mlp_small", "NVIDIA-H200", "ip-10-0-0-1.ec2.internal", "a", "x" * NAME_MAX, "7b"]
# what the issue-10 probe sent, and the rest of the rule: dot names, separators, controls, bidi, invisible, size
BAD = [
    "",
    ".",
    "..",
    "../evilrel",
    "a/b",
    "a\\b",
    "a:b",
    "a#b",
    "a b",
    ".hidden",
    "-rf",
    "a\x00b",
    "a\x1b[31mred",
    "bell\x07",
    "abc\u202eexe.txt",
    "zero\u200bwidth",
    "café",
    "x" * (NAME_MAX + 1),
    "n" * 20_000,
    None,
    7,
]


@pytest.mark.parametrize("value", GOOD)
def test_good_names_pass(value):
    assert is_name(value) and check_name(value, "name") == value


@pytest.mark.parametrize("value", BAD, ids=lambda v: repr(v)[:20])
def test_bad_names_are_refused_naming_the_field_and_echoed_safely(value):
    with pytest.raises(InputError) as err:
        check_name(value, "workloads[2].model", where="w.yaml")
    message = str(err.value)
    assert message.startswith("w.yaml: workloads[2].model must be") and err.value.field == "workloads[2].model"
    # echoed as a cut repr: no control or bidi character reaches a terminal, and the size stays small
    assert message.isprintable() and len(message) < 400


def test_surrounding_whitespace_is_stripped():
    assert check_name("  web ", "name") == "web"


def test_shown_cuts_long_values_and_says_how_long():
    text = shown("n" * 20_000)
    assert len(text) < SHOWN_MAX + 40 and "20000 characters" in text
    assert shown("a\x1bb") == "'a\\x1bb'" and shown(1e308) == "1e+308"


def test_clean_text_replaces_controls_and_cuts():
    assert clean_text("ok\x1b[2Jnow\u202e", 100) == "ok?[2Jnow?"
    assert clean_text("x" * 50, 10) == "x" * 10 + "..."


def test_a_number_where_a_name_goes_says_to_quote_it():
    # `name: 123` in YAML is the number 123, not the name '123'
    assert "quote it ('123')" in name_problem(123) and name_problem("123") == ""
