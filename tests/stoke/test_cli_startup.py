"""`stoke --help` stays light: every command module is imported to build the parser, so a heavy library
imported at a command module's top slows every invocation (scikit-learn alone took ~4 s under load here)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Libraries a command imports where it runs, never at `stoke --help`.
HEAVY = ("sklearn", "scipy", "grpc", "matplotlib", "tritonclient", "boto3", "kubernetes")

PROGRAM = """
import contextlib, io, json, sys
from stoke import cli
with contextlib.redirect_stdout(io.StringIO()):
    try:
        cli.main(["--help"])
    except SystemExit:
        pass
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


@pytest.mark.slow
def test_help_imports_no_heavy_library():
    result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True, timeout=120)
    loaded = set(json.loads(result.stdout))
    assert not loaded & set(HEAVY), f"`stoke --help` imported {sorted(loaded & set(HEAVY))}"
