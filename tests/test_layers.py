"""The package's layers point one way (docs/design.md, "Layers").

Every import of a ``stitchcuda`` module, at module level or inside a function, relative or
absolute, is read from the source (nothing is imported) and mapped to its package: the folder
under ``src/stitchcuda/`` it lives in, or the top-level module's own name. A package may import
its own modules, any package of a lower layer, and the peers named in :data:`PEERS`; anything
else is an upward (or unannounced sideways) import. Apart from the layers, no two packages may
import each other, directly or round a longer cycle, and no two modules either: an import moved
inside a function to dodge a cycle still counts.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "stitchcuda"

# Bottom to top. A package imports from lower layers, and from a peer of its own layer only where
# PEERS says so.
LAYERS: list[tuple[str, set[str]]] = [
    # the version string, where the cache lives, what the machine has (nvidia-smi, the CUDA
    # toolkit and its library headers), the one Jinja setup every template renders under, the hints
    # messages carry, files written whole or not at all
    ("foundation", {"stitchcuda", "paths", "machine", "gpu_specs", "cuda_headers", "templating", "hints", "torchvision_compat",
                    "files"}),
    # the task and candidate records and their loading, and the records of an optimize run
    # (plan, steps, state): what every stage passes around
    ("task, records", {"task", "records"}),
    # the run store (runs.sqlite): keeps the records it is handed as JSON; checks and repairs it
    ("store", {"store", "store_repair"}),
    # the Verifier: worker process, checks, timing, the Verdict, the GPU gate and pool
    ("verify", {"verify"}),
    # LLM clients, rewards, the offline compiler: each may read verdicts, none knows about agents
    ("llm, reward, compiler", {"llm", "reward", "compiler"}),
    # Planner, Coder, routing, the optimize loop and session, the offline agents over the compiler
    ("agents", {"agents"}),
    # suites and reports; skill datasets and GRPO training
    ("bench, rl", {"bench", "rl"}),
    # the command line: its commands, their terminal views, `doctor`'s diagnosis
    ("cli", {"cli"}),
]

# Imports between two packages of one layer, each with its reason. Anything not listed here
# (bench <-> rl, say) must go through a lower layer.
PEERS: dict[tuple[str, str], str] = {
    ("store_repair", "store"): "a repaired store is made by the store's own connect, with its schema",
    ("reward", "llm"): "the rubric reward asks an LLM judge",
}

@dataclass(frozen=True)
class Import:
    file: Path
    line: int
    module: str  # the stitchcuda module (or package) imported
    in_function: bool

    def where(self) -> str:
        return f"{self.file.relative_to(SRC)}:{self.line}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p) for p in PACKAGE.rglob("*.py")}


def imports_of(path: Path, source: str | None = None) -> list[Import]:
    """Every stitchcuda import in ``path`` (or in ``source``, as if it were that file), with its
    line and whether it sits inside a function."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend(Import(path, child.lineno, a.name, in_function) for a in child.names
                             if a.name.split(".")[0] == "stitchcuda")
            elif isinstance(child, ast.ImportFrom):
                if child.level:  # from . import x / from .y import z
                    base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                if target.split(".")[0] == "stitchcuda":
                    for alias in child.names:  # `from stitchcuda import machine` imports a module
                        sub = f"{target}.{alias.name}"
                        found.append(Import(path, child.lineno, sub if sub in MODULES else target, in_function))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text() if source is None else source, str(path)), False)
    return list(dict.fromkeys(found))


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def all_imports() -> list[Import]:
    return [i for p in sorted(PACKAGE.rglob("*.py")) for i in imports_of(p)]


RANK = {pkg: rank for rank, (_, pkgs) in enumerate(LAYERS) for pkg in pkgs}
LAYER_NAME = {pkg: name for name, pkgs in LAYERS for pkg in pkgs}


def test_every_package_has_a_layer():
    packages = {package_of(m) for m in MODULES}
    assert packages - set(RANK) == set(), "place the new package or top-level module in LAYERS"
    assert set(RANK) - packages == set(), "LAYERS names a package that no longer exists"


def test_no_upward_import():
    wrong = []
    for imp in all_imports():
        a, b = package_of(module_name(imp.file)), package_of(imp.module)
        if a == b or (a, b) in PEERS or RANK[b] < RANK[a]:
            continue
        how = "a peer not in PEERS" if RANK[a] == RANK[b] else "upward"
        wrong.append(f"{imp.where()}: {a} ({LAYER_NAME[a]}) imports {imp.module} ({LAYER_NAME[b]}): {how}")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def package_cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected sets of more than one package (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                cycles.append(sorted(members))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return cycles


def test_no_cycle_between_packages():
    seen: dict[tuple[str, str], str] = {}
    for imp in all_imports():
        a, b = package_of(module_name(imp.file)), package_of(imp.module)
        if a != b:
            seen.setdefault((a, b), imp.where())
    cycles = package_cycles(set(seen))
    detail = [f"{' <-> '.join(c)}: " + "; ".join(f"{a} -> {b} at {w}" for (a, b), w in sorted(seen.items())
                                                 if a in c and b in c) for c in cycles]
    assert not cycles, "packages that import each other:\n" + "\n".join(detail)


def test_no_cycle_between_modules():
    """Imports inside functions count too: one placed there to dodge a cycle still closes it."""
    edges: dict[tuple[str, str], str] = {}
    for imp in all_imports():
        me, target = module_name(imp.file), imp.module
        while target not in MODULES:  # `from stitchcuda.x import name` of a package's name
            target = target.rpartition(".")[0]
        if target != me:
            edges.setdefault((me, target), imp.where())
    cycles = package_cycles(set(edges))
    detail = [" <-> ".join(c) + ": " + "; ".join(f"{a} -> {b} at {w}" for (a, b), w in sorted(edges.items())
                                                 if a in c and b in c) for c in cycles]
    assert not cycles, "modules that import each other:\n" + "\n".join(detail)


def test_the_walk_sees_every_kind_of_import():
    """The walk itself: relative, absolute, `from package import module` and in-function imports."""
    probe = PACKAGE / "verify" / "probe.py"  # never written: the source is given
    source = ("from . import judge\nfrom .verdict import Verdict\nimport stitchcuda.task\n"
              "from stitchcuda import machine\n\ndef f():\n    from stitchcuda.agents import loop\n")
    found = [(i.line, i.module, i.in_function) for i in imports_of(probe, source)]
    assert found == [(1, "stitchcuda.verify.judge", False), (2, "stitchcuda.verify.verdict", False),
                     (3, "stitchcuda.task", False), (4, "stitchcuda.machine", False),
                     (7, "stitchcuda.agents.loop", True)]
    assert package_cycles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [["a", "b", "c"]]


# The compiler's stages, bottom to top, in the order a model goes through them: a stage imports its
# own modules and earlier stages only (check.py, nvcc's compile check, is a leaf any stage may run).
COMPILER_STAGES = ["check", "capture", "ir", "schedule", "lowering", "emit", "driver"]


def compiler_stage(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["stitchcuda", "compiler"]:
        return None
    if len(parts) == 2 or parts[2] in ("driver", "coverage"):
        return "driver"
    return parts[2]


def test_the_compiler_stages_point_one_way():
    """capture < ir < schedule < lowering < emit < driver: scheduling reads the IR's operator table,
    never a lowering."""
    upward = []
    for imp in all_imports():
        mine, theirs = compiler_stage(module_name(imp.file)), compiler_stage(imp.module)
        if mine is None or theirs is None:
            continue
        assert mine in COMPILER_STAGES and theirs in COMPILER_STAGES, (mine, theirs)
        if COMPILER_STAGES.index(theirs) > COMPILER_STAGES.index(mine):
            upward.append(f"{imp.where()}: {mine} imports {imp.module} ({theirs})")
    assert not upward, "\n".join(upward)


def test_the_compiler_knows_nothing_of_the_verifier():
    """The compiler writes programs; the Verifier judges them. What both read (the cost model's
    estimate) is a record below both."""
    wrong = [f"{i.where()}: {i.module}" for i in all_imports()
             if module_name(i.file).startswith("stitchcuda.compiler") and package_of(i.module) == "verify"]
    assert not wrong, "the compiler imports the Verifier:\n" + "\n".join(wrong)


def test_cuda_source_lives_in_template_files():
    """No Python module of the lowering holds a kernel: kernels are template files under templates/
    (a family's statements may still be composed in Python and passed to its template)."""
    lowering = PACKAGE / "compiler" / "lowering"
    kernel = re.compile(r"(?<!`)__global__(?!`)")  # ``__global__`` in a docstring names one, is none
    found = {str(p.relative_to(lowering)) for p in lowering.rglob("*.py") if kernel.search(p.read_text())}
    assert not found, f"CUDA source in Python (put it under compiler/templates/): {sorted(found)}"
