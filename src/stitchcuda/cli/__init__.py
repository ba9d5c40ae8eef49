"""The ``stitchcuda`` command: a thin Typer app over the stages (see each module's commands)."""

from __future__ import annotations

import sys
import time
import traceback

from stitchcuda.cli import run_commands, verify_commands, workspace_commands  # noqa: F401 - they register
from stitchcuda.cli.app import EXIT_INTERNAL, app
from stitchcuda.paths import cache_root


def main() -> None:
    """The console script. Every expected failure is a message of its command; anything else is a
    bug of ours, said in one line with the traceback kept in a file, never dumped on the user."""
    try:
        app()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the last line of defence
        log = cache_root() / "errors" / f"{time.strftime('%Y%m%d-%H%M%S')}.log"
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(f"stitchcuda {' '.join(sys.argv[1:])}\n\n{traceback.format_exc()}")
            where = f"the traceback is in {log}"
        except OSError:
            where = "the traceback could not be written"
        print(f"internal error: {type(exc).__name__}: {exc}\nThis is a bug in StitchCUDA, not in your input; "
              f"{where}: please report it with that file.", file=sys.stderr)
        sys.exit(EXIT_INTERNAL)


__all__ = ["app", "main"]
