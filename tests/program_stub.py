"""A stand-in for the two extensions a generated program builds (its kernel library and the program
host), for tests that run the program's Python on a machine that builds nothing."""

from __future__ import annotations

import types


class ProgramExtensions:
    """What ``load_inline`` returns for each build, by its name: the host's ``Program`` and
    ``forward``, the kernel library's ``table()`` and ``bind_cutlass``, a CUTLASS kernel extension's
    launcher addresses; each has only its own. ``forward`` hands each call to ``on_call`` (none: an
    error) and ``calls`` keeps them; ``builds`` keeps every ``load_inline`` call's arguments,
    ``bound`` every CUTLASS address bound."""

    def __init__(self, on_call=None):
        self.on_call = on_call
        self.calls: list[tuple] = []
        self.programs: list[tuple] = []
        self.builds: list[dict] = []
        self.bound: list[tuple[int, int]] = []

    def load_inline(self, **kwargs) -> types.SimpleNamespace:
        self.builds.append(kwargs)
        name = kwargs["name"]
        if name.startswith("stitchcuda_host_"):
            return types.SimpleNamespace(Program=self.Program, forward=self.forward)
        if name.startswith("stitchcuda_offline_"):
            return types.SimpleNamespace(table=self.table, bind_cutlass=self.bind_cutlass)
        if name.startswith("stitchcuda_cutlass_"):
            address = 4096 * len(self.builds)
            return types.SimpleNamespace(launcher_address=lambda: address, **(
                {"workspace_address": lambda: address + 16} if "workspace_address" in kwargs["cpp_sources"] else {}))
        raise AssertionError(f"a build the program should not make: {name}")

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
