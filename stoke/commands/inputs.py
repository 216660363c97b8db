"""Files the commands read that `stoke plan --json` wrote: one reader, one wording."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from stoke.errors import UserError

if TYPE_CHECKING:
    from controller.solver.problem import Plan


def read_plan(path: str) -> Plan:
    """The plan in a JSON file; a missing, malformed or incomplete file raises a one-line error."""
    from controller.solver.problem import plan_from_dict  # the solver loads only for commands that need it

    try:
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise UserError(
            f"{path}: cannot read plan ({err.strerror}); write one with `stoke plan --json > {path}`", "plan"
        ) from None
    except json.JSONDecodeError as err:
        raise UserError(
            f"{path}: not valid JSON (line {err.lineno}: {err.msg}); write the plan with `stoke plan --json`", "plan"
        ) from None
    return plan_from_dict(data, source=path)
