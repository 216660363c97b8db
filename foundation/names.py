"""The one name rule of stoke, and how a value is echoed in an error. Below every layer.

Workload, model, GPU type, profile model and node names end up as file and
directory names (Triton's model repository, process logs), in assignment keys
(``name#replica``), in Prometheus labels and on terminals. The controller
checks every name it receives with `check_name`, and so does the agent for
every name the controller sends it (a controller is not trusted to name a
path):

- 1 to `NAME_MAX` characters;
- ASCII letters, digits, ``.``, ``_`` and ``-`` only, so no path separator,
  no ``:``, ``#`` or space, no control character (NUL, ESC, BEL) and no
  invisible or bidi character (U+200B, U+202E);
- starting with a letter or a digit, so never ``.``, ``..``, a hidden file or
  something a command line would read as an option.

`shown(value)` is how an error echoes a value it refuses: its ``repr`` (control
and bidi characters escaped), cut to `SHOWN_MAX` characters, so a 20 kB name
cannot push the real error out of gRPC's 16 KiB metadata or write an escape
sequence to the reader's terminal.
"""

from __future__ import annotations

import re
from typing import Any

from foundation.errors import InputError

#: Longest workload, model, GPU type or node name.
NAME_MAX = 128
#: Longest echo of a refused value in an error message (characters of its repr).
SHOWN_MAX = 80
NAME_RULE = (
    f"1-{NAME_MAX} characters from A-Z a-z 0-9 . _ -, starting with a letter or digit "
    "(no '.', '..', path separators, ':', '#', spaces, control or invisible characters)"
)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def shown(value: Any, limit: int = SHOWN_MAX) -> str:
    """`repr(value)`, cut to `limit` characters with the full length said (for error messages)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value)} characters" if isinstance(value, (str, bytes)) else f"{len(text)} characters as text"
    return f"{text[:limit]}... ({size})"


def is_name(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= NAME_MAX and _NAME.fullmatch(value) is not None


def name_problem(value: Any) -> str:
    """Why `value` is not a valid name, worded to follow the field ("must be ..., got ..."); "" when it is."""
    if is_name(value):
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):  # YAML reads `name: 123` as a number
        return f"must be a name, got the number {shown(value)}; quote it ('{value}') to use it as a name"
    if isinstance(value, bool):  # YAML 1.1 reads `name: yes` (on, off, no, true, ...) as a boolean
        return f"must be a name, got the boolean {value}; quote it (e.g. 'yes') to use the word as a name"
    if not isinstance(value, str) or not value:
        return f"must be a non-empty name ({NAME_RULE}), got {shown(value)}"
    return f"must be a name of {NAME_RULE}, got {shown(value)}"


def check_name(value: Any, field: str, *, error: type[InputError] = InputError, where: str = "") -> str:
    """`value` when it is a valid name (see the module docstring), else `error` naming `field`.

    Surrounding whitespace is stripped first (a name typed with a trailing space is the same name).
    """
    name = value.strip() if isinstance(value, str) else value
    problem = name_problem(name)
    if problem:
        raise error(f"{where + ': ' if where else ''}{field} {problem}", field)
    return str(name)


def clean_text(value: str, limit: int) -> str:
    """Free text (an event, an error message) made safe to store and print: control and invisible
    characters replaced by '?', cut to `limit` characters."""
    out = "".join(c if c.isprintable() else "?" for c in value[:limit])
    return out if len(value) <= limit else out + "..."
