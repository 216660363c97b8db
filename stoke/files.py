"""Writing files safely: the one helper every layer uses to write a file.

Below every layer (like `stoke.errors`), so the profile files of
`interference`, the model configs of `controller.render`, the checkpoints of
`agents.profiler` and the CLI's outputs are all written the same way.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> bool:
    """Write `text` to `path` through a temp file + rename; skip if unchanged.

    Returns True when the file was written.
    """
    target = Path(path)
    try:
        if target.read_text() == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True
