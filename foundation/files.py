"""Writing files safely: the one helper every layer uses to write a file.

Below every layer (like `foundation.errors`), so the profile files of
`interference`, the model configs of `controller.render`, the checkpoints of
`agents.profiler` and the CLI's outputs are all written the same way.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


@contextmanager
def atomic_replace(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary handle whose bytes replace `path` only when the block ends without error.

    The data goes to a temp file beside `path`, is fsynced and renamed over
    it, so a reader never sees half a file; large files can be streamed in.
    The file gets the mode a plain ``open(path, "w")`` would give: an existing
    file keeps its mode, a new one gets 0666 less the umask (0644 usually).
    `tempfile.mkstemp` would leave it 0600, unreadable to a Triton, Prometheus
    or Grafana container running as another user.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        keep_mode: int | None = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        keep_mode = None
    fd, tmp = _create_temp_beside(target)
    try:
        with os.fdopen(fd, "wb") as handle:
            if keep_mode is not None:
                os.fchmod(handle.fileno(), keep_mode)
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` through `atomic_replace` (temp file + rename, open()'s mode)."""
    with atomic_replace(path) as handle:
        handle.write(data)


def _create_temp_beside(target: Path) -> tuple[int, Path]:
    """A new hidden file next to `target`, created with 0666 so the kernel applies the umask as open() does."""
    for _attempt in range(100):
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"{target.parent}: no free temporary file name for {target.name}")


def atomic_write_text(path: str | os.PathLike[str], text: str) -> bool:
    """Write `text` to `path` through a temp file + rename (see `atomic_write_bytes`); skip if unchanged.

    Returns True when the file was written.
    """
    target = Path(path)
    try:
        if target.read_text() == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    atomic_write_bytes(target, text.encode("utf-8"))
    return True


def write_private_text(path: str | os.PathLike[str], text: str) -> None:
    """Write a secret (a token) readable by its owner only (0600), never readable by others for a moment;
    an existing file is overwritten and made private too."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
