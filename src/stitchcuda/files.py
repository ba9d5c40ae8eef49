"""Files written whole or not at all: a temporary file beside the target, then a rename.

A process killed mid-write (Ctrl-C, SIGKILL, a full disk) leaves the old file as it was, never a
truncated one: a user's program from an earlier run, a report, a verdict the store points to. No
fsync: the guard is against a process that dies, not a machine that loses power.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

_NEW_FILE_MODE = 0o644  # what a plain write makes under the usual umask (mkstemp's own is 0o600)


def write_atomic(path: str | Path, data: str | bytes, encoding: str = "utf-8") -> None:
    """Write ``data`` to ``path`` (text as ``encoding``), replacing it in one rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), path.stat().st_mode & 0o777 if path.exists() else _NEW_FILE_MODE)
            f.write(data.encode(encoding) if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def copy_atomic(source: str | Path, target: str | Path) -> None:
    """Copy ``source`` to ``target``, replacing it in one rename (programs and reports: small files)."""
    write_atomic(target, Path(source).read_bytes())
