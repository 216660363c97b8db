"""Reading the files stoke is given: bounded text, JSON and YAML. Below every layer.

Plans, profiles, workload files, configs and catalogs come from users and from
other processes, so every read is bounded: a file of `MAX_INPUT_BYTES` or more
(``/dev/zero``, a log given by mistake) is refused before it fills memory, text
that is not UTF-8 is refused with the offset of the first bad byte, JSON nested
past Python's recursion limit or holding a 5,000-digit integer gets the same
one-line error as any other malformed file, and a YAML alias chain ("billion
laughs": 700 bytes that expand to 10^9 nodes) is refused by counting the nodes
the document expands to. A key given twice in one JSON object or YAML mapping is
refused (both parsers would keep the last value silently), naming the key, where
it is and, for YAML, its line. Each error names the file (control characters
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


class RepeatedKeyError(ValueError):
    """A key given twice in one JSON object or YAML mapping, where the parser would keep the last value
    silently. Its text says which key, where, and the fix; the caller puts the source in front."""

    def __init__(self, key: Any, where: str, line: int | None = None, first_line: int | None = None) -> None:
        super().__init__(key, where, line, first_line)
        self.key, self.where, self.line, self.first_line = key, where, line, first_line
        self.node: Any = None  # YAML: the mapping node that repeats the key

    def __str__(self) -> str:
        at = f"line {self.line}: " if self.line else ""
        first = f", first at line {self.first_line}" if self.first_line else ""
        return f"{at}key {repr(self.key)[:80]} repeated ({self.where}{first}); keep one"


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")


def _where(path: list[str | int]) -> str:
    """`path` (mapping keys and list indexes from the top) as an error says it: "in workloads[0].model"."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _NAME.match(part):
            text += f".{part}" if text else part
        else:
            text += f"[{repr(part)[:40]}]"
    return f"in {text}" if text else "at the top level"


def _first_repeat(pairs: list[tuple[str, Any]]) -> str:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return key
        seen.add(key)
    raise AssertionError("no repeated key")  # pragma: no cover - called only when there is one


def _json_path(data: Any, target: object) -> list[str | int]:
    """The keys and indexes from `data` down to the object `target` (by identity); [] when it is `data`."""
    stack: list[tuple[Any, list[str | int]]] = [(data, [])]
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        if isinstance(node, dict):
            stack.extend((v, [*path, k]) for k, v in node.items() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend((v, [*path, i]) for i, v in enumerate(node) if isinstance(v, (dict, list)))
    return []  # pragma: no cover - the target is always in the data


def load_json(text: str | bytes) -> Any:
    """`json.loads` with integers past `_MAX_INT_DIGITS` digits read as floats and a key repeated within an
    object refused (`RepeatedKeyError`, a ``ValueError`` naming the key and the object's path). Raises what
    `json.loads` raises otherwise; `parse_json` turns each into one line."""
    repeated: list[tuple[str, dict[str, Any]]] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) != len(items):
            repeated.append((_first_repeat(items), obj))
        return obj

    data = json.loads(text, parse_int=_parse_int, object_pairs_hook=pairs)
    if repeated:  # found after the whole text is read, so the error can say where the object is
        key, obj = repeated[0]
        raise RepeatedKeyError(key, _where(_json_path(data, obj)))
    return data


def parse_json(text: str, source: str, what: str, *, error: type[InputError] = InputError, fix: str = "") -> Any:
    """The JSON value of `text` (a `what` from `source`), or one line of `error` with the line and the fix;
    a key repeated within an object is refused."""
    tail = f"; {fix}" if fix else ""
    try:
        return load_json(text)
    except RepeatedKeyError as err:
        raise error(f"{source}: {err}") from None
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
        loader: Any = type(
            "StokeSafeLoader",
            (base,),
            {"flatten_mapping": _yaml_flatten_mapping, "construct_document": _yaml_construct_document},
        )
        loader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_FLOAT, list("-+0123456789"))
        loader.add_constructor("tag:yaml.org,2002:int", _yaml_int)
        loader.add_constructor("tag:yaml.org,2002:float", _yaml_float)
        _YAML_LOADERS["safe"] = loader
    return _YAML_LOADERS["safe"]


def _yaml_int(loader: Any, node: Any) -> int | float | str:
    """YAML's int, but one longer than `_MAX_INT_DIGITS` digits read as a float (as `parse_json` does), so
    range checks refuse it instead of Python raising past 4,300 digits or overflowing a float conversion."""
    import yaml

    digits = str(loader.construct_scalar(node)).replace("_", "")
    if ":" in digits:  # YAML 1.1's base 60 (`rate_rps: 1:30` is 90); 1.2 has none: text, which checks refuse
        return digits
    if len(digits.lstrip("+-")) > _MAX_INT_DIGITS and digits.lstrip("+-").isdigit():
        return float(digits)
    return int(yaml.SafeLoader.construct_yaml_int(loader, node))


def _yaml_float(loader: Any, node: Any) -> float | str:
    """YAML's float, but base 60 (`1:30.5`) is text, as in YAML 1.2 (see `_yaml_int`)."""
    import yaml

    text = str(loader.construct_scalar(node))
    return text if ":" in text else float(yaml.SafeLoader.construct_yaml_float(loader, node))


_YAML_MERGE = "tag:yaml.org,2002:merge"
_YAML_VALUE = "tag:yaml.org,2002:value"
_YAML_STR = "tag:yaml.org,2002:str"


def _yaml_flatten_mapping(loader: Any, node: Any) -> None:
    """SafeConstructor's `flatten_mapping` (which every mapping passes through before it is built, and which
    folds `<<` merges in), after `_refuse_repeated_keys`: once a mapping, before its merge (a key that
    overrides a merged one is YAML's merge, not a repeat)."""
    import yaml

    checked: set[int] = loader.__dict__.setdefault("_stoke_checked", set())
    if id(node) not in checked:
        checked.add(id(node))
        _refuse_repeated_keys(loader, node)
    yaml.SafeLoader.flatten_mapping(loader, node)


def _refuse_repeated_keys(loader: Any, node: Any) -> None:
    """`RepeatedKeyError` (with both lines) if the mapping `node` gives a key twice: equal once built, so
    `1` and `0x1` are one key, as they would be in the dict."""
    keys = [k for k, _ in node.value if k.tag not in (_YAML_MERGE, _YAML_VALUE)]
    if len({k.value for k in keys if k.tag == _YAML_STR and isinstance(k.value, str)}) == len(keys):
        return  # all keys text (the usual case), none twice: none need be built to compare
    seen: dict[Any, Any] = {}
    for key_node in keys:
        key = loader.construct_object(key_node)
        try:
            first = seen.setdefault(key, key_node)
        except TypeError:  # an unhashable key: SafeConstructor refuses it itself
            continue
        if first is not key_node:
            err = RepeatedKeyError(key, "", key_node.start_mark.line + 1, first.start_mark.line + 1)
            err.node = node  # `_yaml_construct_document` finds its path
            raise err


def _yaml_construct_document(loader: Any, node: Any) -> Any:
    """SafeConstructor's `construct_document`; a repeated key's error gets the path of its mapping."""
    import yaml

    try:
        return yaml.SafeLoader.construct_document(loader, node)
    except RepeatedKeyError as err:
        err.where = _where(_yaml_path(node, err.node))
        raise


def _yaml_path(root: Any, target: Any) -> list[str | int]:
    """The keys and indexes from the node `root` down to the node `target` (each node visited once: aliases
    make the tree a graph); [] when it is `root`."""
    import yaml

    stack: list[tuple[Any, list[str | int]]] = [(root, [])]
    visited: set[int] = set()
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        if id(node) in visited:
            continue
        visited.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for k, v in reversed(node.value):
                stack.append((v, [*path, str(k.value) if isinstance(k, yaml.ScalarNode) else "?"]))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((v, [*path, i]) for i, v in reversed(list(enumerate(node.value))))
    return []  # pragma: no cover - the target is always under the root


def parse_yaml(text: str, source: str, what: str, *, error: type[InputError] = InputError) -> Any:
    """The data of a YAML document (safe tags only), or one line of `error`: malformed, a key repeated in a
    mapping (with its line), or expanding (through aliases) to more than `MAX_YAML_NODES` nodes."""
    import yaml

    if len(text) > MAX_YAML_CHARS:
        raise error(
            f"{source}: {what} is larger than {MAX_YAML_CHARS // (1024 * 1024)} MiB of YAML; is this the right file?"
        )
    try:
        data = yaml.load(text, Loader=_yaml_loader())  # a SafeLoader subclass: plain data only
    except RepeatedKeyError as err:
        raise error(f"{source}: {err}") from None
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
