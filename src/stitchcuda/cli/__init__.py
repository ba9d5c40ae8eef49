"""The ``stitchcuda`` command: a thin Typer app over the stages (see each module's commands)."""

from stitchcuda.cli import run_commands, verify_commands, workspace_commands  # noqa: F401 - they register
from stitchcuda.cli.app import app


def main() -> None:
    app()


__all__ = ["app", "main"]
