"""The chaos suite's fixture: a `Cluster` whose processes are all stopped by pid at the end (chaos_helpers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from chaos_helpers import Cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()
