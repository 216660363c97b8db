"""The validation kit: checks of plain values, and typed settings over frozen dataclasses.

Below every layer (like `foundation.errors`), so the pure core, the file readers,
the controller's config and the service's request checks word a bad value
the same way::

    <where>: <field> must be <requirement>, got <value>[; <fix>]

Checks
    `number`, `positive`, `non_negative`, `whole`, `text`, `one_of` check one
    value and return it converted (``float``, ``int``, stripped ``str``). They
    raise `error` (an `InputError` subclass; `InputError` by default) with its
    ``field`` set. `where` names the file or object ("" when `field` says it all).

Settings
    A settings class is a frozen dataclass whose fields are declared with
    `setting(default, rule, doc)`. `load(cls, data, where=...)` builds one from a
    parsed YAML/JSON mapping: unknown keys are refused (the known ones are
    listed), missing keys take their default, each value goes through its
    rule, nested settings classes and tuples of them are read recursively
    (``flatten=True`` reads a nested class from the same mapping), relative
    paths are resolved against `base_dir`. `json_schema(cls)` derives the JSON
    Schema from the same declarations, so keys, defaults and checks are
    written once.

Why dataclasses and not pydantic: the pure core keeps plain frozen
dataclasses (the solver's types are dataclasses too), one set of checks
serves the core, the files and the config, and the error wording is stoke's
by construction rather than translated from a library's.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from foundation import names
from foundation.errors import InputError
from foundation.names import shown

T = TypeVar("T")
E = type[InputError]


# ---------------------------------------------------------------- checks of one value


def fail(
    field: str, requirement: str, value: Any, *, where: str = "", error: E = InputError, fix: str = ""
) -> InputError:
    """The error for `value` of `field` not meeting `requirement` (raise it)."""
    head = f"{where}: " if where else ""
    tail = f"; {fix}" if fix else ""
    return error(f"{head}{field} must be {requirement}, got {shown(value)}{tail}", field)


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def number(value: Any, field: str, *, where: str = "", error: E = InputError, fix: str = "") -> float:
    if not _real(value):
        raise fail(field, "a number", value, where=where, error=error, fix=fix)
    return float(value)


def positive(
    value: Any,
    field: str,
    *,
    where: str = "",
    error: E = InputError,
    unit: str = "",
    fix: str = "",
    maximum: float | None = None,
) -> float:
    """A finite number > 0, and <= `maximum` when given (`unit`, e.g. "seconds", completes "a positive number
    of ...")."""
    if not _real(value) or value <= 0 or (maximum is not None and value > maximum):
        requirement = f"a positive number{' of ' + unit if unit else ''}"
        if maximum is not None:
            requirement += f" up to {maximum:g}"
        raise fail(field, requirement, value, where=where, error=error, fix=fix)
    return float(value)


def non_negative(
    value: Any, field: str, *, where: str = "", error: E = InputError, fix: str = "", maximum: float | None = None
) -> float:
    """A finite number >= 0, and <= `maximum` when given."""
    if not _real(value) or value < 0 or (maximum is not None and value > maximum):
        requirement = "a number >= 0" + (f" up to {maximum:g}" if maximum is not None else "")
        raise fail(field, requirement, value, where=where, error=error, fix=fix)
    return float(value)


def whole(
    value: Any,
    field: str,
    *,
    minimum: int = 0,
    where: str = "",
    error: E = InputError,
    fix: str = "",
    maximum: int | None = None,
) -> int:
    """An int (not a bool) >= `minimum`, and <= `maximum` when given."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        requirement = f"a whole number >= {minimum}" + (f" up to {maximum:,}" if maximum is not None else "")
        raise fail(field, requirement, value, where=where, error=error, fix=fix)
    return value


def text(value: Any, field: str, *, where: str = "", error: E = InputError, fix: str = "") -> str:
    if not isinstance(value, str) or not value.strip():
        raise fail(field, "a non-empty string", value, where=where, error=error, fix=fix)
    return value.strip()


def one_of(value: Any, field: str, choices: Sequence[Any], *, where: str = "", error: E = InputError) -> Any:
    if value not in choices:
        raise fail(field, "one of " + ", ".join(map(str, choices)), value, where=where, error=error)
    return value


def require(data: Mapping[str, Any], key: str, *, where: str, error: E = InputError, fix: str = "add it") -> Any:
    """`data[key]`, or an error that `where` lacks it."""
    if key not in data:
        raise error(f"{where} lacks field {key!r}; {fix}", key)
    return data[key]


# ---------------------------------------------------------------- rules of settings fields


@dataclass(frozen=True)
class Rule:
    """How a settings field checks and converts its value, and its JSON Schema."""

    check: Callable[[Any, str, str, E], Any]  # (value, field, where, error) -> converted value
    schema: Mapping[str, Any]
    is_path: bool = False  # resolved against `load`'s base_dir


POSITIVE = Rule(lambda v, f, w, e: positive(v, f, where=w, error=e), {"type": "number", "exclusiveMinimum": 0})
POSITIVE_SECONDS = Rule(
    lambda v, f, w, e: positive(v, f, where=w, error=e, unit="seconds"), {"type": "number", "exclusiveMinimum": 0}
)
NON_NEGATIVE = Rule(lambda v, f, w, e: non_negative(v, f, where=w, error=e), {"type": "number", "minimum": 0})
WHOLE = Rule(lambda v, f, w, e: whole(v, f, where=w, error=e), {"type": "integer", "minimum": 0})
FRACTION = Rule(lambda v, f, w, e: _fraction(v, f, w, e), {"type": "number", "exclusiveMinimum": 0, "maximum": 1})


def _fraction(value: Any, field: str, where: str, error: E) -> float:
    if not _real(value) or not 0 < value <= 1:
        raise fail(field, "a number above 0, up to 1", value, where=where, error=error)
    return float(value)


def whole_at_least(minimum: int) -> Rule:
    """A whole number >= `minimum`."""
    return Rule(
        lambda v, f, w, e: whole(v, f, minimum=minimum, where=w, error=e), {"type": "integer", "minimum": minimum}
    )


POSITIVE_WHOLE = whole_at_least(1)


def non_negative_up_to(maximum: float) -> Rule:
    """A finite number >= 0 and <= `maximum`."""
    return Rule(
        lambda v, f, w, e: non_negative(v, f, where=w, error=e, maximum=maximum),
        {"type": "number", "minimum": 0, "maximum": maximum},
    )


def whole_between(minimum: int, maximum: int) -> Rule:
    """A whole number from `minimum` to `maximum`."""
    return Rule(
        lambda v, f, w, e: whole(v, f, minimum=minimum, maximum=maximum, where=w, error=e),
        {"type": "integer", "minimum": minimum, "maximum": maximum},
    )


def positive_up_to(maximum: float, unit: str = "") -> Rule:
    """A finite number > 0 and <= `maximum`."""
    return Rule(
        lambda v, f, w, e: positive(v, f, where=w, error=e, unit=unit, maximum=maximum),
        {"type": "number", "exclusiveMinimum": 0, "maximum": maximum},
    )


#: A name under the one rule of `foundation.names` (workloads, models, GPU types, nodes).
NAME = Rule(
    lambda v, f, w, e: names.check_name(v, f, where=w, error=e),
    {"type": "string", "pattern": f"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{names.NAME_MAX - 1}}}$"},
)


TEXT = Rule(lambda v, f, w, e: text(v, f, where=w, error=e), {"type": "string", "minLength": 1})
PATH = Rule(lambda v, f, w, e: text(v, f, where=w, error=e), {"type": "string", "minLength": 1}, is_path=True)


def _strings(value: Any, field: str, where: str, error: E) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(m, str) and m for m in items):
        raise fail(field, "a list of non-empty strings", value, where=where, error=error)
    return tuple(items)


#: A list of non-empty strings; a single string stands for a list of one.
STRINGS = Rule(
    _strings,
    {"anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "items": {"type": "string", "minLength": 1}}]},
)


#: Largest TCP port.
PORT_MAX = 65535
#: A port from 0 to 65535 in decimal, without leading zeros (as the loader reads it).
_PORT_PATTERN = r"(0|[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"


def address(
    value: Any,
    field: str,
    *,
    where: str = "",
    error: E = InputError,
    any_port: bool = False,
    allow_empty: bool = False,
    fix: str = "",
) -> str:
    """HOST:PORT with a port from 1 to `PORT_MAX` (from 0 with `any_port`: a listen address, 0 = any free
    port); "" with `allow_empty` (off). A missing, non-numeric or out-of-range port is said as such."""
    if allow_empty and value in ("", None):
        return ""
    low = 0 if any_port else 1
    requirement = f"HOST:PORT with a port from {low} to {PORT_MAX}" + (" (0 = any free port)" if any_port else "")
    requirement += ' or "" (off)' if allow_empty else ""
    problem = ""
    if not isinstance(value, str):
        problem = "not text"
    else:
        host, sep, port = value.rpartition(":")
        if not sep or not port:
            problem = "the port is missing"
        elif not host and not any_port:
            problem = "the host is missing"
        elif not (port.isascii() and port.isdigit()) or (port != "0" and port.startswith("0")):
            problem = f"{shown(port)} is not a port number"
        elif not low <= int(port) <= PORT_MAX:
            problem = f"port {int(port)} is out of range"
    if problem:
        raise fail(field, requirement, value, where=where, error=error, fix=problem + (f"; {fix}" if fix else ""))
    return str(value)


ADDRESS = Rule(
    lambda v, f, w, e: address(v, f, where=w, error=e, any_port=True),
    {"type": "string", "pattern": f"^.+:{_PORT_PATTERN}$"},
)
ADDRESS_OR_OFF = Rule(
    lambda v, f, w, e: address(v, f, where=w, error=e, any_port=True, allow_empty=True),
    {"type": "string", "pattern": f"^(.+:{_PORT_PATTERN})?$"},
)


def choice(options: Sequence[str]) -> Rule:
    return Rule(lambda v, f, w, e: one_of(v, f, options, where=w, error=e), {"enum": list(options)})


def setting(
    default: Any = dataclasses.MISSING, rule: Rule | None = None, doc: str = "", *, flatten: bool = False
) -> Any:
    """A settings field: its default, its rule and one line saying what it means."""
    metadata = {"rule": rule, "doc": doc, "flatten": flatten}
    if isinstance(default, (list, dict, set)):
        raise TypeError("settings defaults must be immutable (use a tuple)")
    return dataclasses.field(default=default, metadata=metadata)


# ---------------------------------------------------------------- loading settings


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The resolved field types of a settings class, once per class (resolving them per item made reading a
    10,000-workload file take seconds)."""
    return typing.get_type_hints(cls)


def _optional(tp: Any) -> Any:
    """X for ``X | None``, else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return None


def _tuple_item(tp: Any) -> Any:
    """X for ``tuple[X, ...]``, else None."""
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
    return None


def _is_settings(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _fields(cls: Any) -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(cls)


def keys(cls: type) -> list[str]:
    """The keys a mapping of `cls` may hold (flattened nested settings included), in declaration order."""
    return list(_keys(cls))


@functools.cache
def _keys(cls: type) -> tuple[str, ...]:
    out: list[str] = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        out += _keys(hints[f.name]) if f.metadata.get("flatten") else [f.name]
    return tuple(out)


def key_docs(cls: type, prefix: str = "") -> list[tuple[str, Any, str]]:
    """Every key of `cls` with its default and meaning, nested keys as ``a.b`` and ``a[].b`` (for documentation)."""
    out: list[tuple[str, Any, str]] = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if f.metadata.get("flatten"):
            out += key_docs(tp, prefix)
            continue
        default = None if f.default is dataclasses.MISSING else _jsonable(f.default)
        out.append((prefix + f.name, default, str(f.metadata.get("doc", ""))))
        inner = _optional(tp) or tp
        item = _tuple_item(inner)
        if _is_settings(inner):
            out += key_docs(inner, f"{prefix}{f.name}.")
        elif item is not None and _is_settings(item):
            out += key_docs(item, f"{prefix}{f.name}[].")
    return out


@dataclass(frozen=True)
class _Context:
    where: str
    error: E
    base_dir: Path | None


def load(
    cls: type[T], data: Any, *, where: str, error: E = InputError, base_dir: Path | None = None, prefix: str = ""
) -> T:
    """A `cls` from a parsed mapping (None: every default); see the module docstring."""
    ctx = _Context(where, error, base_dir)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        what = prefix.rstrip(".") or "the settings"  # a nested prefix ends in "." for the keys it holds
        raise error(f"{where}: {what} must be a mapping of keys ({', '.join(keys(cls))}), got {shown(data)}", prefix)
    settings: type = cls  # the cached helpers take a plain class
    known = _keys(settings)
    odd = [k for k in data if not isinstance(k, str)]
    if odd:  # YAML reads `on:`, `yes:`, `null:` and `5:` as a bool, None or a number, not as text
        raise error(
            f"{where}: key {shown(odd[0])}{' under ' + prefix.rstrip('.') if prefix else ''} is not text; "
            f"known keys: {', '.join(sorted(known))} (quote a key such as 'on' or 'yes' that YAML reads as a value)",
            prefix,
        )
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise error(
            f"{where}: unknown key {prefix + unknown[0]!r}; known keys: {', '.join(sorted(known))}", prefix + unknown[0]
        )
    return _build(cls, data, prefix, ctx)


def _build(cls: type[T], data: Mapping[str, Any], prefix: str, ctx: _Context) -> T:
    settings: type = cls  # the cached helper takes a plain class
    hints = _hints(settings)
    values: dict[str, Any] = {}
    for f in _fields(cls):
        if f.metadata.get("flatten"):
            values[f.name] = _build(hints[f.name], data, prefix, ctx)
            continue
        value = data.get(f.name)
        # not given, given empty, or "" for an optional field: the default
        if value is None or value == [] or (value == "" and f.default is None):
            if f.default is dataclasses.MISSING:
                raise ctx.error(
                    f"{ctx.where}: {prefix.rstrip('.') or 'the settings'} lacks field {f.name!r}; add it",
                    prefix + f.name,
                )
            rule: Rule | None = f.metadata.get("rule")
            if rule is not None and rule.is_path and isinstance(f.default, str):
                values[f.name] = _resolve(f.default, ctx)  # a default path is relative to the file too
            continue
        values[f.name] = _value(value, hints[f.name], f, prefix + f.name, ctx)
    try:
        return cls(**values)
    except InputError as err:  # a check across fields (__post_init__), without the place
        inside = f"{prefix.rstrip('.')}: " if prefix else ""  # "workloads[3]: min_rps ... must not exceed ..."
        raise ctx.error(f"{ctx.where}: {inside}{err}", prefix + (err.field or "")) from None


def _value(value: Any, tp: Any, f: dataclasses.Field[Any], path: str, ctx: _Context) -> Any:
    rule: Rule | None = f.metadata.get("rule")
    if rule is not None:
        out = rule.check(value, path, ctx.where, ctx.error)
        return _resolve(out, ctx) if rule.is_path else out
    inner = _optional(tp) or tp
    if _is_settings(inner):
        return load(
            inner, _shorthand(inner, value), where=ctx.where, error=ctx.error, base_dir=ctx.base_dir, prefix=path + "."
        )
    item = _tuple_item(inner)
    if item is not None and _is_settings(item):
        if not isinstance(value, list):
            raise fail(path, "a list", value, where=ctx.where, error=ctx.error)
        return tuple(
            load(
                item,
                _shorthand(item, v),
                where=ctx.where,
                error=ctx.error,
                base_dir=ctx.base_dir,
                prefix=f"{path}[{i}].",
            )
            for i, v in enumerate(value)
        )
    return _plain(value, inner, path, ctx)


def _resolve(path: str, ctx: _Context) -> str:
    if ctx.base_dir is None or Path(path).is_absolute():
        return path
    return str(ctx.base_dir / path)


def _shorthand(cls: type, value: Any) -> Any:
    """A class with ``SHORTHAND = "field"`` accepts a bare value for that field."""
    name = getattr(cls, "SHORTHAND", None)
    return {name: value} if name and not isinstance(value, Mapping) else value


def _plain(value: Any, tp: Any, path: str, ctx: _Context) -> Any:
    if tp is float:
        return number(value, path, where=ctx.where, error=ctx.error)
    if tp is int:
        return whole(value, path, where=ctx.where, error=ctx.error)
    if tp is bool:
        if not isinstance(value, bool):
            raise fail(path, "true or false", value, where=ctx.where, error=ctx.error)
        return value
    if tp is str:
        if not isinstance(value, str):
            raise fail(path, "a string", value, where=ctx.where, error=ctx.error)
        return value
    raise TypeError(f"settings field {path}: type {tp!r} needs a rule")


# ---------------------------------------------------------------- JSON Schema


def json_schema(cls: type, title: str = "") -> dict[str, Any]:
    """The JSON Schema of a mapping `load(cls, ...)` accepts (draft 2020-12)."""
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema"}
    if title:
        schema["title"] = title
    return {**schema, **_object_schema(cls)}


def _object_schema(cls: type) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    required: list[str] = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("flatten"):
            nested = _object_schema(hints[f.name])
            properties.update(nested["properties"])
            required += nested.get("required", [])
            continue
        prop = _field_schema(f, hints[f.name])
        if f.metadata.get("doc"):
            prop["description"] = f.metadata["doc"]
        if f.default is dataclasses.MISSING:
            required.append(f.name)
        elif f.default is not None:
            prop["default"] = _jsonable(f.default)
        properties[f.name] = prop
    out: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("):  # not the dataclass's generated doc
        out["description"] = " ".join(cls.__doc__.split())
    if required:
        out["required"] = required
    return out


def _field_schema(f: dataclasses.Field[Any], tp: Any) -> dict[str, Any]:
    rule: Rule | None = f.metadata.get("rule")
    if rule is not None:
        return dict(rule.schema)
    inner = _optional(tp) or tp
    if _is_settings(inner):
        return _with_shorthand(inner, _object_schema(inner))
    item = _tuple_item(inner)
    if item is not None and _is_settings(item):
        return {"type": "array", "items": _with_shorthand(item, _object_schema(item))}
    return {float: {"type": "number"}, int: {"type": "integer"}, bool: {"type": "boolean"}, str: {"type": "string"}}[
        inner
    ]


def _with_shorthand(cls: type, schema: dict[str, Any]) -> dict[str, Any]:
    name = getattr(cls, "SHORTHAND", None)
    if not name:
        return schema
    return {"anyOf": [schema["properties"][name], schema]}


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value
