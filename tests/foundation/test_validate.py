"""The validation kit: one wording for bad values, settings loaded and described from one declaration."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from foundation import validate as check
from foundation.errors import InputError, StokeError


class FileError(InputError):
    pass


@pytest.mark.parametrize("value", [0, -1, math.inf, math.nan, True, "3", None])
def test_positive_refuses_what_is_not_a_positive_number(value):
    with pytest.raises(FileError) as err:
        check.positive(value, "rate_rps", where="w.yaml", error=FileError, unit="requests per second")
    assert str(err.value) == f"w.yaml: rate_rps must be a positive number of requests per second, got {value!r}"
    assert err.value.field == "rate_rps" and isinstance(err.value, StokeError)


def test_checks_return_the_converted_value():
    assert check.positive(3, "x") == 3.0 and isinstance(check.positive(3, "x"), float)
    assert check.non_negative(0, "x") == 0.0
    assert check.whole(4, "n", minimum=1) == 4
    assert check.text("  a ", "name") == "a"
    assert check.one_of("b", "k", ("a", "b")) == "b"
    with pytest.raises(InputError, match=r"^n must be a whole number >= 1, got 0$"):
        check.whole(0, "n", minimum=1)
    with pytest.raises(InputError, match=r"^f: k must be one of a, b, got 'c'; pick one$"):
        raise check.fail("k", "one of a, b", "c", where="f", fix="pick one")


@dataclass(frozen=True)
class Inner:
    path: str = check.setting(None, check.PATH, "a file")
    SHORTHAND = "path"


@dataclass(frozen=True)
class Shared:
    interval_s: float = check.setting(2.0, check.POSITIVE_SECONDS, "how often")
    timeout_s: float = check.setting(10.0, check.POSITIVE_SECONDS, "how long")

    def __post_init__(self) -> None:
        if self.timeout_s <= self.interval_s:
            raise InputError(
                f"timeout_s ({self.timeout_s}) must be larger than interval_s ({self.interval_s})", "timeout_s"
            )


@dataclass(frozen=True)
class Outer:
    listen: str = check.setting("127.0.0.1:1", check.ADDRESS, "where")
    mode: str = check.setting("a", check.choice(("a", "b")), "which")
    items: tuple[Inner, ...] = check.setting((), doc="files")
    shared: Shared = check.setting(Shared(), flatten=True)


def test_load_takes_defaults_converts_and_resolves_paths(tmp_path):
    got = check.load(Outer, {"interval_s": 1, "items": ["a.txt", {"path": "/abs"}]}, where="c.yaml", base_dir=tmp_path)
    assert got == Outer(items=(Inner(str(tmp_path / "a.txt")), Inner("/abs")), shared=Shared(interval_s=1.0))
    assert check.load(Outer, None, where="defaults") == Outer()
    assert check.keys(Outer) == ["listen", "mode", "items", "interval_s", "timeout_s"]


@pytest.mark.parametrize(
    "data, message",
    [
        ({"lissen": "x"}, "c.yaml: unknown key 'lissen'; known keys: interval_s, items, listen, mode, timeout_s"),
        (
            {"listen": "nope"},
            "c.yaml: listen must be HOST:PORT with a port from 0 to 65535 (0 = any free port), got 'nope'; "
            "the port is missing",
        ),
        (
            {"listen": "127.0.0.1:99999"},
            "c.yaml: listen must be HOST:PORT with a port from 0 to 65535 (0 = any free port), got "
            "'127.0.0.1:99999'; port 99999 is out of range",
        ),
        ({"mode": "c"}, "c.yaml: mode must be one of a, b, got 'c'"),
        ({"interval_s": 0}, "c.yaml: interval_s must be a positive number of seconds, got 0"),
        ({"items": [{"path": 3}]}, "c.yaml: items[0].path must be a non-empty string, got 3"),
        ({"items": [{"pth": "a"}]}, "c.yaml: unknown key 'items[0].pth'; known keys: path"),
        ({"interval_s": 20}, "c.yaml: timeout_s (10.0) must be larger than interval_s (20.0)"),
        ([1], "c.yaml: the settings must be a mapping of keys (listen, mode, items, interval_s, timeout_s), got [1]"),
    ],
)
def test_load_names_file_field_value(data, message):
    with pytest.raises(FileError) as err:
        check.load(Outer, data, where="c.yaml", error=FileError)
    assert str(err.value) == message


@pytest.mark.parametrize(
    "value, problem",
    [
        ("localhost", "the port is missing"),
        ("localhost:", "the port is missing"),
        (":50051", "the host is missing"),
        ("h:http", "'http' is not a port number"),
        ("h:080", "'080' is not a port number"),
        ("h:\u00b2", "is not a port number"),  # str.isdigit() says yes to a superscript two
        ("127.0.0.1:99999", "port 99999 is out of range"),
        ("127.0.0.1:0", "port 0 is out of range"),  # a client cannot connect to "any" port
        (50051, "not text"),
    ],
)
def test_an_address_names_what_is_wrong_with_it(value, problem):
    with pytest.raises(InputError) as err:
        check.address(value, "--controller")
    assert str(err.value).startswith("--controller must be HOST:PORT with a port from 1 to 65535, got ")
    assert problem in str(err.value) and err.value.field == "--controller"


def test_a_listen_address_takes_port_0_and_the_schema_refuses_what_the_loader_does():
    import jsonschema

    assert check.address("127.0.0.1:0", "listen", any_port=True) == "127.0.0.1:0"
    assert check.address("[::1]:65535", "x") == "[::1]:65535" and check.address("", "x", allow_empty=True) == ""
    schema = check.json_schema(Outer)
    for value in ("127.0.0.1:0", "h:1", "h:9470", "h:65535", "h:65536", "h:99999", "h:080", "h:", "h", "h:-1"):
        try:
            check.load(Outer, {"listen": value}, where="c.yaml")
            loader_ok = True
        except InputError:
            loader_ok = False
        assert jsonschema.Draft202012Validator(schema).is_valid({"listen": value}) == loader_ok, value


def test_json_schema_follows_the_declarations():
    schema = check.json_schema(Outer, "outer")
    props = schema["properties"]
    assert schema["title"] == "outer" and schema["additionalProperties"] is False
    assert list(props) == ["listen", "mode", "items", "interval_s", "timeout_s"]
    assert props["interval_s"] == {"type": "number", "exclusiveMinimum": 0, "description": "how often", "default": 2.0}
    assert props["mode"]["enum"] == ["a", "b"]
    assert props["items"]["items"]["anyOf"][0] == {"type": "string", "minLength": 1, "description": "a file"}
