"""Where StitchCUDA keeps what outlives one process (build cache, baseline timings)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The cache root: ``$STITCHCUDA_CACHE``, else ``$XDG_CACHE_HOME/stitchcuda``, else ``~/.cache/stitchcuda``."""
    if env := os.environ.get("STITCHCUDA_CACHE"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "stitchcuda"
