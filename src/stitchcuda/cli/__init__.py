"""The ``stitchcuda`` command: a thin Typer app over the stages (see each module's commands).

The console script enters :func:`main` before anything heavy is imported (the app pulls in torch,
which takes seconds): a Ctrl-C during start-up is then one line and exit 130 like any other.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from typing import Any

from stitchcuda.cli.exits import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_UNUSABLE


def _stop_now(signum: int, frame: Any) -> None:
    os.write(2, b"\nstopped\n")
    os._exit(EXIT_INTERRUPTED)


def _interrupt(signum: int, frame: Any) -> None:
    """The first Ctrl-C unwinds (runs record that they stopped, workers are stopped); a second one
    while that happens stops the process at once."""
    signal.signal(signal.SIGINT, _stop_now)
    raise KeyboardInterrupt


def main() -> None:
    """The console script. Every expected failure is a message of its command; anything else is a
    bug of ours, said in one line with the traceback kept in a file, never dumped on the user."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where SIGINT is ignored
        signal.signal(signal.SIGINT, _interrupt)
    try:
        from stitchcuda.cli import run_commands, verify_commands, workspace_commands  # noqa: F401 - they register
        from stitchcuda.cli.application import app

        code = app(standalone_mode=False)  # usage errors come here, to be said as every other error
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:  # noqa: BLE001 - the last line of defence
        import typer

        from stitchcuda.paths import cache_root
        from stitchcuda.store import StoreError

        # typer's usage errors (a bad option or value) and the store's faults are the user's to fix
        usage = exc.format_message if isinstance(exc, typer.TyperException) and hasattr(exc, "format_message") else None
        if isinstance(exc, StoreError) or usage is not None:
            message = str(exc) if usage is None else usage().replace("Value error, ", "")
            if not message.strip():  # `stitchcuda` alone: the help was the answer
                sys.exit(EXIT_UNUSABLE)
            if usage is not None and getattr(exc, "ctx", None) is not None:
                message += f"\n(see `{exc.ctx.command_path} --help`)"
            if "--json" in sys.argv:
                print(json.dumps({"error": message, "exit_code": EXIT_UNUSABLE, "reasons": [message], "hints": []}))
            print(f"error: {message}", file=sys.stderr)
            sys.exit(EXIT_UNUSABLE)

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
    if code == EXIT_INTERRUPTED:  # Ctrl-C inside a command: typer ends it with 130 and says nothing
        print("interrupted", file=sys.stderr)
    sys.exit(code if isinstance(code, int) else 0)


def __getattr__(name: str) -> Any:
    """``from stitchcuda.cli import app`` (tests, embedding) without importing it at start-up."""
    if name == "app":
        from stitchcuda.cli import run_commands, verify_commands, workspace_commands  # noqa: F401
        from stitchcuda.cli.application import app

        return app
    raise AttributeError(name)


__all__ = ["app", "main"]
