"""The Rich console every command writes through."""

from __future__ import annotations

import os

from rich.console import Console

LOG_WIDTH = 160


def console(stderr: bool = False) -> Console:
    """Rich's console, wide when it writes to a pipe or a file: Rich's 80 columns there break a
    bench's table into word fragments in every log (COLUMNS still wins when set).

    Markup is off: what we print quotes user code and compiler output (``x[i]``, ``[N, C]``), which
    Rich would read as tags and drop; styles come from Text objects."""
    made = Console(stderr=stderr, markup=False)
    if made.is_terminal or "COLUMNS" in os.environ:
        return made
    return Console(stderr=stderr, width=LOG_WIDTH, markup=False)
