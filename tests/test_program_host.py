"""The program host (compiler/templates/program_host.cpp): one build for every generated program,
which the offline Coder starts ahead of a task's first program."""

from __future__ import annotations

import time

from stitchcuda.agents.offline import build_host_ahead
from stitchcuda.compiler import compile_task
from stitchcuda.compiler.check import host_source
from stitchcuda.compiler.emit.program import host_module, host_name, program_spec
from stitchcuda.task import resolve_tasks
from tests.program_stub import exec_program


def test_the_host_built_ahead_is_the_one_every_program_loads(monkeypatch):
    programs = [compile_task(resolve_tasks(name)[0]).program() for name in ("mlp", "small_cnn")]
    hosts = [exec_program(p, monkeypatch).extensions.build("stitchcuda_host_") for p in programs]
    ahead = exec_program(host_module(), monkeypatch).extensions.builds
    assert ahead == [hosts[0]] == [hosts[1]]  # the same load_inline call: one cache entry
    assert hosts[0]["name"] == host_name(host_source(programs[0]).removeprefix("\n")) and hosts[0]["with_cuda"] is True


def test_the_spec_counts_the_pointers_the_kernel_library_takes():
    program = compile_task(resolve_tasks("transformer_block")[0]).program()
    spec = program_spec(program)
    pointers = len(spec.names) + len(spec.buffer_shapes) + len(spec.output_shapes)
    assert f"constexpr int kPointers = {pointers};" in program and f"p[{pointers - 1}]" in program
    assert len(spec.arg_shapes) == len(spec.arg_types) == len(spec.names)


class _Verifier:
    def __init__(self, cache, gpu="H100"):
        self.cache, self.gpu, self.built = cache, gpu, []

    def build(self, candidate):
        self.built.append(candidate)


def test_the_host_is_built_ahead_once_per_cache_and_only_where_a_gpu_is(tmp_path):
    first, same_cache, no_gpu = _Verifier(tmp_path / "a"), _Verifier(tmp_path / "a"), _Verifier(tmp_path / "b", None)
    for verifier in (first, same_cache, no_gpu):
        build_host_ahead(verifier)
    deadline = time.time() + 30
    while not first.built and time.time() < deadline:
        time.sleep(0.05)
    assert [c.source for c in first.built] == [host_module()] and not same_cache.built and not no_gpu.built
