"""The root of stoke's errors, below every layer so each layer can raise one.

Every error stoke raises on purpose derives from `StokeError`, and its
message is one line that names what is wrong, where (file, field, flag or
node) and the fix. The CLI catches `StokeError` once (`stoke.cli.main`) and
prints ``stoke: error: <message>`` with exit code 2; anything else is a bug
and keeps its traceback.

Two kinds below the root:
- `InputError` (also a ``ValueError``): the input is bad (a file, a field, a
  flag, a request); `foundation.validate` raises it, or the subclass a module
  names, with ``field`` set to the field to blame.
- the errors of outside systems (Triton, NVML, MPS, S3, EC2, SQLite, the
  controller's API) derive from `StokeError` and ``RuntimeError``, each in
  the one module that wraps that system.
"""

from __future__ import annotations


class StokeError(Exception):
    """A failure stoke explains: one line with what, where and the fix."""


class InputError(StokeError, ValueError):
    """Bad input; `field` names the field to blame ("" when it is the input as a whole)."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class UserError(InputError):
    """Bad command-line input that the CLI itself checks (a flag, an argument)."""
