"""Shape of the controller's service layer: small functions a newcomer can read at once."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The service layer: the facade, its parts and its edges (generated stubs aside).
SERVICE_LAYER = [
    "controller/service.py",
    "controller/registry.py",
    "controller/status.py",
    "controller/config.py",
    "controller/messages.py",
    "controller/server.py",
    "controller/store.py",
    "controller/metrics.py",
    "controller/observations.py",
    "controller/feedback.py",
    "controller/demand.py",
    "controller/guard.py",
    "controller/recalibrate.py",
    "controller/reconcile/*.py",
    "controller/api/[!s]*.py",
]
MAX_LINES = 50


def test_no_function_in_the_service_layer_is_over_50_lines():
    files = sorted({p for pattern in SERVICE_LAYER for p in ROOT.glob(pattern)})
    assert len(files) >= 12
    long = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split these into named parts: " + "; ".join(long)
