"""The operator table (compiler/ir/op_table.py) is the one place an operator is described: each
row has one role and one lowering or a stated refusal, every stage's operator set is a query of
it, and the lowerings' own formula tables name only operators it routes to them."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import get_args

import torch

from stitchcuda.compiler.capture.graph import keep_table
from stitchcuda.compiler.coverage import core_forward_ops
from stitchcuda.compiler.ir import formulas, typed
from stitchcuda.compiler.ir.op_table import (
    DECOMPOSED,
    FAMILY,
    GROUPS,
    GROUPS_THEN_FAMILY,
    OPERATORS,
    TAGS,
    Role,
    lowered_by,
    refusal,
    tagged,
)
from stitchcuda.compiler.ir.ops import CELLS, GROUP_LOWERED
from stitchcuda.compiler.lowering.lower_sequence import SEQUENCES
from stitchcuda.compiler.lowering.registry import OPERATORS as FAMILY_LOWERINGS

COMPILER = Path(__file__).resolve().parents[1] / "src" / "stitchcuda" / "compiler"


def test_every_row_has_one_role_and_one_lowering_or_a_stated_refusal():
    for op, info in OPERATORS.items():
        assert re.fullmatch(r"(aten|stitchcuda)\.\w+", op), op
        assert info.role in get_args(Role), op
        assert info.tags <= TAGS, op
        assert info.lowering in (GROUPS, FAMILY, GROUPS_THEN_FAMILY, DECOMPOSED) or refusal(op), op


def test_core_aten_operators_in_the_table_are_lowered_decomposed_or_refused():
    """A core-ATen operator reaches the lowering unless capture decomposes it: so it has a
    lowering, or capture's decomposition table really takes it, or the table says why not."""
    core = set(core_forward_ops())
    decomposed = {f"aten.{op._overloadpacket.__name__}" for op in keep_table() if isinstance(op, torch._ops.OpOverload)}
    for op in core & set(OPERATORS):
        lowering = OPERATORS[op].lowering
        if lowering == DECOMPOSED:
            assert op in decomposed, f"{op}: the table says capture decomposes it, and it does not"
        else:
            assert lowering in (GROUPS, FAMILY, GROUPS_THEN_FAMILY) or refusal(op), op


def test_the_family_lowerings_are_exactly_the_tables_family_rows():
    assert set(FAMILY_LOWERINGS) == lowered_by(FAMILY, GROUPS_THEN_FAMILY)


def test_the_lowerings_formula_tables_name_only_operators_the_table_routes_to_them():
    pointwise = (set(formulas.POINTWISE_UNARY) | set(formulas.COMPARISONS) | set(formulas.ACTIVATIONS)
                 | set(formulas.MASK_OPS))
    assert pointwise <= GROUP_LOWERED | lowered_by(FAMILY), sorted(pointwise - GROUP_LOWERED)
    assert {op for op in OPERATORS if formulas.is_pointwise(op)} <= GROUP_LOWERED
    assert set(CELLS) <= tagged("cell") and set(SEQUENCES) == tagged("sequence")
    assert set(OPERATORS) >= typed.TYPED, sorted(typed.TYPED - set(OPERATORS))


# modules that still spell out operator sets of their own (the list only shrinks): capture's (it
# comes before ir/ and may not read the table: the random draws, the decompositions kept, what
# the Planner's description leaves out); per-operator formulas, C spellings and costs of the
# lowerings; the operators each family module registers; the activations a library epilogue
# applies; and the integer operators constant folding evaluates
OWN_OPERATOR_SETS = {"capture/describe.py", "capture/graph.py", "driver.py", "ir/formulas.py", "ir/typed.py",
                     "lowering/cost.py", "lowering/families/layout.py", "lowering/families/layout_typed.py",
                     "lowering/families/pool.py", "lowering/lower_gemm.py", "lowering/lower_sequence.py",
                     "schedule/fusion.py", "schedule/simplify.py"}


def test_no_stage_declares_operator_sets_of_its_own():
    """A set or dict literal of three or more ``aten.`` names outside the table is a second table."""
    found = set()
    for path in COMPILER.rglob("*.py"):
        name = path.relative_to(COMPILER).as_posix()
        if name == "ir/op_table.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            keys = node.elts if isinstance(node, ast.Set) else node.keys if isinstance(node, ast.Dict) else []
            names = [k.value for k in keys if isinstance(k, ast.Constant) and str(k.value).startswith("aten.")]
            if len(names) >= 3:
                found.add(name)
    assert found <= OWN_OPERATOR_SETS, sorted(found - OWN_OPERATOR_SETS)
    assert found == OWN_OPERATOR_SETS, f"no longer declares its own: {sorted(OWN_OPERATOR_SETS - found)}"


def test_the_docs_show_the_table_as_it_is():
    """docs/compiler.md's copy of the operator table is the one `python -m stitchcuda.compiler.coverage` prints."""
    from stitchcuda.compiler.coverage import markdown

    doc = (Path(__file__).resolve().parents[1] / "docs" / "compiler.md").read_text()
    shown = doc.split("<!-- operator table: begin -->\n", 1)[1].split("<!-- operator table: end -->", 1)[0]
    assert shown == markdown(), "regenerate it: python -m stitchcuda.compiler.coverage"
