"""A stand-in for the two extensions a generated program builds (its kernel library and the program
host), for tests that run the program's Python on a machine that builds nothing."""

from __future__ import annotations

import types


class ProgramExtensions:
    """What ``load_inline`` returns for either build: ``table()`` (the kernel library), ``Program``
    and ``forward`` (the host). ``forward`` hands each call to ``on_call`` (none: an error) and
    ``calls`` keeps them; ``builds`` keeps every ``load_inline`` call's arguments."""

    def __init__(self, on_call=None):
        self.on_call = on_call
        self.calls: list[tuple] = []
        self.programs: list[tuple] = []
        self.builds: list[dict] = []
        self.bound: list[tuple[int, int]] = []

    def load_inline(self, **kwargs) -> ProgramExtensions:
        self.builds.append(kwargs)
        return self

    def table(self) -> int:
        return 0

    def bind_cutlass(self, slot: int, address: int) -> None:
        self.bound.append((slot, address))

    def Program(self, table: int, *spec) -> tuple:  # noqa: N802 (the host's class)
        self.programs.append(spec)
        return spec

    def forward(self, program, args):
        if self.on_call is None:
            raise AssertionError("the build is stubbed")
        self.calls.append(args)
        return self.on_call(args)

    def build(self, prefix: str) -> dict:
        """The arguments of the one build whose name starts with ``prefix``."""
        (found,) = [b for b in self.builds if b["name"].startswith(prefix)]
        return found


def exec_program(source: str, monkeypatch, extensions: ProgramExtensions | None = None) -> types.ModuleType:
    """The program's module, run with ``extensions`` (a fresh stub by default) in place of its builds."""
    import torch.utils.cpp_extension as cpp

    extensions = extensions or ProgramExtensions()
    monkeypatch.setattr(cpp, "load_inline", extensions.load_inline)
    module = types.ModuleType("program_under_test")
    exec(compile(source, "program.py", "exec"), module.__dict__)
    module.extensions = extensions
    return module
