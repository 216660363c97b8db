"""Reading the files stoke is given: bounded text, JSON and YAML. Below every layer.

Plans, profiles, workload files, configs and catalogs come from users and from
other processes, so every read is bounded: a file of `MAX_INPUT_BYTES` or more
(``/dev/zero``, a log given by mistake) is refused before it fills memory, text
that is not UTF-8 is refused with the offset of the first bad byte, JSON nested
past Python's recursion limit or holding a 5,000-digit integer gets the same
one-line error as any other malformed file, and a YAML alias chain ("billion
laughs": 700 bytes that expand to 10^9 nodes) is refused by counting the nodes
the document expands to. Each error names the file (control characters
escaped), what was wrong and the fix; the caller picks the error class.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import IO, Any

from foundation.errors import InputError

#: The largest input file stoke reads (a 10,000-workload plan is about 5 MB).
MAX_INPUT_BYTES = 32 * 1024 * 1024
#: The largest YAML document (characters): YAML builds a Python object per value, about 200 bytes of memory
#: per byte of a flat list, so 8 MiB is about 1.5 GB at worst; a 10,000-workload file is about 1 MB.
MAX_YAML_CHARS = 8 * 1024 * 1024
#: The most nodes a YAML document may expand to, counting every alias's expansion (a 10,000-workload
#: file has about 70,000).
MAX_YAML_NODES = 2_000_000
#: Integers longer than this are read as floats (and so refused by range checks, as an out-of-range
#: number) instead of raising Python's own error past 4,300 digits or overflowing a float conversion.
_MAX_INT_DIGITS = 30


def shown_path(path: str | os.PathLike[str]) -> str:
    """A file name as an error prints it: as given when printable, else its repr (no escape sequence reaches
    a terminal)."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "backslashreplace")
    return text if text.isprintable() else repr(text)[:400]


def read_text(
    path: str | os.PathLike[str],
    what: str,
    *,
    error: type[InputError] = InputError,
    fix: str = "check the path",
    limit: int = MAX_INPUT_BYTES,
) -> str:
    """The UTF-8 text of the file at `path` (a `what`), or `error`: unreadable, too large or not UTF-8."""
    name = shown_path(path)
    try:
        if "\0" in os.fspath(path):
            raise error(f"{name}: cannot read {what} (the path holds a NUL character); {fix}", "path")
        with Path(path).open("rb") as handle:
            data = handle.read(limit + 1)
    except OSError as err:
        raise error(f"{name}: cannot read {what} ({err.strerror or err}); {fix}", "path") from None
    return _decode(data, name, what, error, limit)


def read_stream(stream: IO[Any], source: str, what: str, *, error: type[InputError] = InputError) -> str:
    """`read_text` of an open stream (standard input); a text stream is read as it is."""
    binary = getattr(stream, "buffer", None)
    if binary is None:  # already text (a test's StringIO)
        text = str(stream.read(MAX_INPUT_BYTES + 1))
        if len(text) > MAX_INPUT_BYTES:
            raise error(_too_large(source, what, MAX_INPUT_BYTES), "path")
        return text
    return _decode(binary.read(MAX_INPUT_BYTES + 1), source, what, error, MAX_INPUT_BYTES)


def _decode(data: bytes, source: str, what: str, error: type[InputError], limit: int) -> str:
    if len(data) > limit:
        raise error(_too_large(source, what, limit), "path")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(
            f"{source}: not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start}); save it as UTF-8"
        ) from None


def _too_large(source: str, what: str, limit: int) -> str:
    return f"{source}: {what} is larger than {limit // (1024 * 1024)} MiB; is this the right file?"


def _parse_int(digits: str) -> int | float:
    return int(digits) if len(digits.lstrip("-")) <= _MAX_INT_DIGITS else float(digits)


def parse_json(text: str, source: str, what: str, *, error: type[InputError] = InputError, fix: str = "") -> Any:
    """The JSON value of `text` (a `what` from `source`), or one line of `error` with the line and the fix."""
    tail = f"; {fix}" if fix else ""
    try:
        return json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as err:
        raise error(f"{source}: not valid JSON (line {err.lineno}: {err.msg}){tail}") from None
    except RecursionError:
        raise error(f"{source}: {what} is nested too deeply to be a {what}{tail}") from None
    except ValueError as err:  # a float literal too long for Python's converter
        raise error(f"{source}: not valid JSON ({str(err).splitlines()[0][:120]}){tail}") from None


_YAML_LOADERS: dict[str, Any] = {}
#: YAML 1.2 reads 1e3 as a number; PyYAML (YAML 1.1) reads it as the string '1e3' unless the exponent
#: carries a sign or the mantissa a dot, so `rate_rps: 1e3` would be refused as "not a number".
_YAML12_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")


def _yaml_loader() -> Any:
    """libyaml's safe loader where PyYAML was built with it (about 10x faster), else the pure-Python one,
    both with YAML 1.2's exponent floats."""
    if not _YAML_LOADERS:
        import yaml  # here, not at the top: most commands read no YAML

        base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        loader: Any = type("StokeSafeLoader", (base,), {})
        loader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_FLOAT, list("-+0123456789"))
        loader.add_constructor("tag:yaml.org,2002:int", _yaml_int)
        _YAML_LOADERS["safe"] = loader
    return _YAML_LOADERS["safe"]


def _yaml_int(loader: Any, node: Any) -> int | float:
    """YAML's int, but one longer than `_MAX_INT_DIGITS` digits read as a float (as `parse_json` does), so
    range checks refuse it instead of Python raising past 4,300 digits or overflowing a float conversion."""
    import yaml

    digits = str(loader.construct_scalar(node)).replace("_", "")
    if len(digits.lstrip("+-")) > _MAX_INT_DIGITS and digits.lstrip("+-").isdigit():
        return float(digits)
    return int(yaml.SafeLoader.construct_yaml_int(loader, node))


def parse_yaml(text: str, source: str, what: str, *, error: type[InputError] = InputError) -> Any:
    """The data of a YAML document (safe tags only), or one line of `error`: malformed, or expanding (through
    aliases) to more than `MAX_YAML_NODES` nodes."""
    import yaml

    if len(text) > MAX_YAML_CHARS:
        raise error(
            f"{source}: {what} is larger than {MAX_YAML_CHARS // (1024 * 1024)} MiB of YAML; is this the right file?"
        )
    try:
        data = yaml.load(text, Loader=_yaml_loader())  # a SafeLoader subclass: plain data only
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise error(f"{source}: malformed YAML{at}; fix the syntax") from None
    except RecursionError:
        raise error(f"{source}: {what} is nested too deeply; fix the file") from None
    except (ValueError, OverflowError) as err:  # a value its tag cannot hold (a date such as 2024-13-45)
        raise error(f"{source}: {what} holds a value YAML cannot read ({str(err)[:120]}); quote it") from None
    if _expands_past(data, MAX_YAML_NODES):
        raise error(
            f"{source}: {what} holds more than {MAX_YAML_NODES:,} values, counting each use of a YAML alias "
            "(*name) as a copy; split it, or use fewer aliases"
        )
    return data


def _expands_past(data: Any, limit: int) -> bool:
    """Whether `data`, every alias expanded, holds more than `limit` nodes (stops counting at the limit)."""
    count = 0
    stack = [data]
    while stack:
        node = stack.pop()
        count += 1
        if count > limit:
            return True
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
    return False
