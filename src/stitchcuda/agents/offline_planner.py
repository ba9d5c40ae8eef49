"""The offline Planner: the fusion groups of the captured graph as a typed Plan, no LLM.

Like the LLM Planner it answers with ordered subtasks: what each replaces, where its fusion
boundary lies, the layout contracts with its neighbours, the host orchestration, its share of
the reference's GPU time and the speedup at which it is done. Subtasks gather groups of one
kind (attention, GEMMs, convolutions, row reductions, recurrent steps, the glue), ordered by
time share: from the reference profile's per-operator (or per-module) GPU time when there is
one, else from a roofline estimate of every operator on an H100 in fp32.
"""

from __future__ import annotations

import re
from collections import Counter

from stitchcuda.agents.records import Plan, Subtask
from stitchcuda.compiler.capture.graph import Node, OpGraph, TensorMeta, capture
from stitchcuda.compiler.ir.group import FusionGroup
from stitchcuda.compiler.ir.ops import (
    CONV_OPS,
    GEMM_OPS,
    RECURRENT_OPS,
    RECURRENT_SEQUENCE_OPS,
    SDPA_OPS,
    short,
)
from stitchcuda.compiler.schedule.fusion import fuse, op_role
from stitchcuda.task.record import Task
from stitchcuda.verify.verdict import ProgramProfile

PEAK_FLOPS = 50e12  # H100 fp32 without TF32, what cuBLAS/cuDNN reach in practice
PEAK_BYTES = 3.0e12  # H100 HBM3, bytes per second
EAGER_KERNEL_S = 2.0e-6  # the least GPU time of one eager kernel
FUSED_KERNEL_S = 1.5e-6  # the same inside a replayed CUDA graph
DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
               "int8": 1, "uint8": 1, "bool": 1, "complex64": 8}
GATHERS = {"aten.embedding", "aten.index", "aten.index_select", "aten.gather"}

HOST = ("intermediate buffers preallocated once per input shape; the whole forward captured into one CUDA "
        "graph and replayed; Python's forward only calls the compiled entry point")

# Profiler names (innermost aten op of each kernel) that an ATen node of the captured graph runs as.
_PROFILE_NAMES = {
    "aten.linear": ["aten::addmm", "aten::mm"],
    "aten.matmul": ["aten::bmm", "aten::mm"],
    "aten.conv1d": ["aten::cudnn_convolution", "aten::_convolution", "aten::convolution"],
    "aten.conv2d": ["aten::cudnn_convolution", "aten::_convolution", "aten::convolution"],
    "aten.conv3d": ["aten::cudnn_convolution", "aten::_convolution", "aten::convolution"],
    "aten.conv_transpose2d": ["aten::cudnn_convolution_transpose", "aten::_convolution", "aten::convolution"],
    "aten.layer_norm": ["aten::native_layer_norm"],
    "aten.group_norm": ["aten::native_group_norm"],
    "aten.batch_norm": ["aten::cudnn_batch_norm", "aten::native_batch_norm",
                        "aten::_native_batch_norm_legit_no_training", "aten::_batch_norm_impl_index"],
    "aten.relu": ["aten::clamp_min"],
    "aten.relu6": ["aten::hardtanh"],
    "aten.lstm_cell": ["aten::_thnn_fused_lstm_cell", "aten::mm", "aten::addmm"],
    "aten.gru_cell": ["aten::_thnn_fused_gru_cell", "aten::mm", "aten::addmm"],
    "aten.lstm": ["aten::_cudnn_rnn"],
    "aten.gru": ["aten::_cudnn_rnn"],
    "aten.rnn_tanh": ["aten::_cudnn_rnn"],
    "aten.rnn_relu": ["aten::_cudnn_rnn"],
    "aten.scaled_dot_product_attention": ["aten::_flash_attention_forward", "aten::_efficient_attention_forward",
                                          "aten::_scaled_dot_product_flash_attention",
                                          "aten::_scaled_dot_product_efficient_attention",
                                          "aten::_scaled_dot_product_cudnn_attention"],
    "aten.embedding": ["aten::index_select", "aten::embedding_dense"],
    "aten.stack": ["aten::cat"],
    "aten.max_pool2d": ["aten::max_pool2d_with_indices"],
    "aten.new_zeros": ["aten::zero_", "aten::fill_"],
    "aten.reshape": ["aten::copy_", "aten::clone"],
    "aten.flatten": ["aten::copy_", "aten::clone"],
}


def profile_names(op: str) -> list[str]:
    """The torch.profiler operator names an ATen node's kernels are attributed to."""
    s = short(op)
    return [*_PROFILE_NAMES.get(op, []), f"aten::{s}", f"aten::{s}_", f"aten::_{s}"]


# -- cost model ------------------------------------------------------------------------------------

class Costs:
    """FLOPs, bytes and time estimates of nodes and groups, from the graph's shapes."""

    def __init__(self, graph: OpGraph):
        self.graph = graph
        self.node = {n.name: n for n in graph.nodes}
        self.meta: dict[str, TensorMeta | None] = {p.name: p.meta for p in graph.placeholders}
        for n in graph.nodes:
            self.meta[n.name] = n.out[0] if n.out else None
        for value, (src, i) in graph.getitems.items():
            out = self.node[src].out
            self.meta[value] = out[i] if i < len(out) else None
        self.producer = {v: src for v, (src, _) in graph.getitems.items()} | {n.name: n.name for n in graph.nodes}
        self.role = {n.name: op_role(n) for n in graph.nodes}

    def nbytes(self, value: str) -> float:
        meta = self.meta.get(value)
        return float(meta.numel * DTYPE_BYTES.get(meta.dtype, 4)) if meta is not None else 0.0

    def shape(self, value: str) -> list[int]:
        meta = self.meta.get(value)
        return list(meta.shape) if meta is not None else []

    def out_bytes(self, n: Node) -> float:
        return sum(float(m.numel * DTYPE_BYTES.get(m.dtype, 4)) for m in n.out)

    def node_cost(self, n: Node) -> tuple[float, float, int]:
        """(FLOPs, bytes moved, eager kernels) of one node run on its own."""
        reads = list(dict.fromkeys(n.inputs()))
        out = self.out_bytes(n)
        numel = float(n.out[0].numel) if n.out else 0.0
        role = self.role[n.name]
        if role == "view":
            return 0.0, 0.0, 0
        if role == "const":
            return 0.0, out, 1
        moved = sum(self.nbytes(v) for v in reads) + out
        if n.op in GATHERS:
            index = sum(self.nbytes(v) for v in reads if (self.meta.get(v) and self.meta[v].dtype.startswith("int")))
            return 0.0, 2 * out + index, 1
        if n.op in GEMM_OPS:
            a = self.shape(reads[1] if n.op in ("aten.addmm", "aten.baddbmm", "aten.addbmm") else reads[0]) \
                if reads else []
            k = a[-1] if a else 0
            return 2.0 * numel * k, moved, 1
        if n.op in CONV_OPS and len(reads) > 1:
            w = self.shape(reads[1])
            per = 1
            for d in w[1:]:
                per *= d
            if "transpose" in n.op:
                x = self.meta.get(reads[0])
                return 2.0 * (x.numel if x else 0) * per, moved, 1
            return 2.0 * numel * per, moved, 1
        if n.op in RECURRENT_OPS:
            batch = (self.shape(reads[0]) or [1])[0]
            weights = sum(float(self.meta[a[1:]].numel) for a in n.args[2:4]
                          if isinstance(a, str) and self.meta.get(a[1:]))
            return 2.0 * batch * weights + 10 * numel, moved, 3
        if n.op in SDPA_OPS and len(reads) >= 3:
            q, k = self.shape(reads[0]), self.shape(reads[1])
            if q and k:
                return 4.0 * numel * k[-2], moved, 1  # Q·Kᵀ and P·V: 2·2·B·H·Sq·Sk·D
        if n.op in RECURRENT_SEQUENCE_OPS:
            x = self.shape(reads[0]) if reads else []
            tokens = x[0] * x[1] if len(x) >= 3 else (x[0] if x else 1)
            weights = [self.meta[v] for v in reads[1:] if self.meta.get(v) and len(self.meta[v].shape) == 2]
            steps = max(x[:2]) if len(x) >= 3 else 1
            return 2.0 * tokens * sum(float(w.numel) for w in weights), moved, 3 * steps * max(1, len(weights) // 2)
        if role == "reduce":
            return 5.0 * sum(float(self.meta[v].numel) for v in reads[:1] if self.meta.get(v)), moved, 1
        return 4.0 * numel, moved, 1

    def node_time(self, n: Node) -> float:
        """Seconds the reference spends on the node: roofline, at least one short kernel per launch."""
        flops, moved, kernels = self.node_cost(n)
        return max(flops / PEAK_FLOPS, moved / PEAK_BYTES, kernels * EAGER_KERNEL_S)

    def fused_time(self, g: FusionGroup) -> float:
        """Seconds the group should take as one kernel (or library call) in a replayed CUDA graph."""
        flops = sum(self.node_cost(self.node[m])[0] for m in g.nodes)
        moved = 0.0
        inside = set(g.nodes)
        for v in g.inputs:
            readers = [self.node[m] for m in g.nodes if v in self.node[m].inputs()]
            if readers and all(r.op in GATHERS and r.inputs()[:1] == [v] for r in readers):
                moved += sum(self.out_bytes(r) for r in readers)  # only the gathered rows are read
            else:
                moved += self.nbytes(v)
        moved += sum(self.nbytes(v) for v in g.outputs if self.producer.get(v) in inside)
        if g.kind == "data_movement" and all(m in g.views for m in g.nodes):
            return 0.0
        kernels = 1
        if g.kind == "recurrent":
            kernels = 2 if g.anchor is None or self.node[g.anchor].op not in RECURRENT_SEQUENCE_OPS else \
                self.node_cost(self.node[g.anchor])[2] // 3
        return max(flops / PEAK_FLOPS, moved / PEAK_BYTES, kernels * FUSED_KERNEL_S)

    def ref_time(self, g: FusionGroup) -> float:
        return sum(self.node_time(self.node[m]) for m in g.nodes)


def node_times(graph: OpGraph, costs: Costs, profile: ProgramProfile | None) -> tuple[dict[str, float], str]:
    """Seconds of reference GPU time per node, and where the numbers come from."""
    estimate = {n.name: costs.node_time(n) for n in graph.nodes}
    if profile is None or not (profile.ops or profile.modules):
        return estimate, "roofline estimate (H100 fp32: 50 TFLOP/s, 3 TB/s, 2 µs per eager kernel)"
    measured: dict[str, float] = {}
    pools: list[tuple[float, list[str]]] = []
    for stat in profile.ops:
        names = [n.name for n in graph.nodes if stat.name in profile_names(n.op)]
        if names:
            pools.append((stat.gpu_us * 1e-6, names))
    source = "the reference profile's per-operator GPU time"
    if not pools:
        for stat in profile.modules:
            names = [n.name for n in graph.nodes if n.module == stat.name]
            if names:
                pools.append((stat.gpu_us * 1e-6, names))
        source = "the reference profile's per-module GPU time"
    for seconds, names in pools:
        weights = [estimate[n] for n in names]
        total = sum(weights)
        for n, w in zip(names, weights, strict=True):
            measured[n] = measured.get(n, 0.0) + seconds * (w / total if total else 1 / len(names))
    if not measured:
        return estimate, "roofline estimate (the profile names no operator of the graph)"
    matched = sum(estimate[n] for n in measured)
    scale = sum(measured.values()) / matched if matched else 1.0
    times = {n: measured.get(n, estimate[n] * scale) for n in estimate}
    return times, source + " (operators it does not name: roofline estimate scaled to it)"


# -- text --------------------------------------------------------------------------------------------

def chain(g: FusionGroup, graph: OpGraph | None = None, limit: int = 8) -> str:
    """The group's work as ``op→op→...`` (views left out)."""
    ops = [_op_of(graph, m) for m in g.nodes if m not in g.views] or [_op_of(graph, m) for m in g.nodes]
    text = "→".join(ops[:limit])
    return text + (f"→…(+{len(ops) - limit})" if len(ops) > limit else "")


def _op_of(graph: OpGraph | None, name: str) -> str:
    if graph is not None:
        try:
            return short(graph.node(name).op)
        except KeyError:
            pass
    return re.sub(r"_\d+$", "", name)


def _signature(g: FusionGroup, ops: dict[str, str], modules: dict[str, str]) -> tuple:
    work = tuple(ops[m] for m in g.nodes if m not in g.views)
    return g.kind, work, modules.get(g.anchor or "", "")


def describe(groups: list[FusionGroup], graph: OpGraph, limit: int = 60) -> str:
    """A compact text of the fusion groups, for logs and for the LLM Planner's prompt; repeated
    patterns (the steps of a recurrent loop) are folded into one line."""
    ops = {n.name: short(n.op) for n in graph.nodes}
    modules = {n.name: n.module for n in graph.nodes}
    params = {p.name for p in graph.placeholders if p.kind in ("parameter", "buffer", "constant")}
    costs = Costs(graph)
    counts = Counter(g.kind for g in groups)
    lines = [f"{len(groups)} fusion groups over {len(graph.nodes)} operators: "
             + ", ".join(f"{k} {c}" for k, c in counts.most_common())]

    def line(g: FusionGroup) -> str:
        acts = [v for v in g.inputs if v not in params]
        n_params = len(g.inputs) - len(acts)
        where = f" [{modules.get(g.anchor or '', '')}]" if modules.get(g.anchor or "") else ""
        ins = ", ".join(f"{v}{costs.shape(v)}" for v in acts[:4]) + (" …" if len(acts) > 4 else "")
        if n_params:
            ins += f" +{n_params} param{'s' if n_params > 1 else ''}"
        outs = ", ".join(f"{v}{costs.shape(v)}" for v in g.outputs[:3]) + (" …" if len(g.outputs) > 3 else "")
        note = g.note if len(g.note) <= 200 else g.note[:197] + "..."
        return f"#{g.id} {g.kind} {chain(g, graph)}{where} | in: {ins or '-'} | out: {outs or '-'} | {note}"

    sigs = [_signature(g, ops, modules) for g in groups]
    i = 0
    while i < len(groups):
        for period in (1, 2, 3, 4):
            block = sigs[i:i + period]
            reps = 1
            while sigs[i + reps * period:i + (reps + 1) * period] == block:
                reps += 1
            if reps >= 3 and len(block) == period:
                lines.extend(line(g) for g in groups[i:i + period])
                end = i + reps * period - 1
                lines.append(f"… #{i + period}–#{end}: the {'group' if period == 1 else f'{period} groups'} "
                             f"above repeated {reps - 1} more times")
                i += reps * period
                break
        else:
            lines.append(line(groups[i]))
            i += 1
    if len(lines) > limit + 1:
        lines = lines[:limit] + [f"… {len(lines) - limit} more lines"]
    return "\n".join(lines)


# -- the planner -------------------------------------------------------------------------------------

_CATEGORY = {"attention": "attention", "gemm": "gemm", "conv": "conv", "row_reduce": "row_reduce",
             "recurrent": "recurrent", "elementwise": "glue", "data_movement": "glue", "other": "glue"}


class OfflinePlanner:
    """Plans without an LLM: :func:`fuse` decides the groups, the cost model (or the reference
    profile) orders them."""

    def __init__(self, max_subtasks: int = 6):
        self.max_subtasks = max(1, max_subtasks)

    def plan(self, task: Task, graph: OpGraph | None = None, profile: ProgramProfile | None = None,
             groups: list[FusionGroup] | None = None) -> tuple[Plan, list[FusionGroup]]:
        """(the Plan, the fusion groups it is made of); raises CaptureError when the graph cannot
        be captured."""
        if graph is None:
            graph = capture(task)
        groups = groups if groups is not None else fuse(graph)
        costs = Costs(graph)
        times, source = node_times(graph, costs, profile)
        total = sum(times.values()) or 1.0

        buckets: dict[str, list[FusionGroup]] = {}
        for g in groups:
            buckets.setdefault(_CATEGORY[g.kind], []).append(g)
        parts = []
        for category, members in buckets.items():
            seconds = sum(times[m] for g in members for m in g.nodes)
            parts.append((seconds, category, members))
        parts.sort(key=lambda p: -p[0])
        if len(parts) > self.max_subtasks:
            keep, rest = parts[: self.max_subtasks - 1], parts[self.max_subtasks - 1:]
            merged = [g for _, _, ms in rest for g in ms]
            keep.append((sum(p[0] for p in rest), "mixed", sorted(merged, key=lambda g: g.id)))
            parts = keep

        subtasks = []
        for i, (seconds, category, members) in enumerate(parts):
            ref = sum(costs.ref_time(g) for g in members)
            fused = sum(costs.fused_time(g) for g in members)
            target = min(4.0, max(1.0, ref / fused)) if fused > 0 else 1.0
            subtasks.append(Subtask(
                id=i + 1, title=self._title(category, members, graph), operators=self._operators(members, graph),
                fusion=self._fusion(members, graph), layout=self._layout(category, members, groups, graph),
                host=HOST if i == len(parts) - 1 else "launched in group order from the one C++ entry point",
                time_share=round(seconds / total, 4), target_speedup=round(target, 2)))
        ref_all = sum(costs.ref_time(g) for g in groups)
        fused_all = sum(costs.fused_time(g) for g in groups) or 1.0
        counts = Counter(g.kind for g in groups)
        rationale = (f"Offline plan for {graph.task} from its captured ATen graph: {len(graph.nodes)} operators "
                     f"in {len(groups)} fusion groups ({', '.join(f'{k} {c}' for k, c in counts.most_common())}). "
                     f"Subtasks gather groups of one kind, ordered by their share of the reference's GPU time "
                     f"from {source}. Estimated gain of fusion plus one replayed CUDA graph over eager: "
                     f"{ref_all / fused_all:.2f}x (roofline, fp32).")
        batch = sorted({m.group(0) for g in groups for m in re.finditer(r"one of \d+ GEMMs with weight \w+", g.note)})
        if batch:
            rationale += " Batchable: " + "; ".join(batch) + "."
        return Plan(source="offline", rationale=rationale, subtasks=subtasks), groups

    @staticmethod
    def _operators(members: list[FusionGroup], graph: OpGraph) -> list[str]:
        ops = {n.name: n.op for n in graph.nodes}
        views = {v for g in members for v in g.views}
        names = [m for g in members for m in g.nodes]
        work = [ops[m] for m in names if m not in views]
        moved = [ops[m] for m in names if m in views]
        return [o.replace(".", "::", 1) for o in dict.fromkeys(work + moved)]

    @staticmethod
    def _title(category: str, members: list[FusionGroup], graph: OpGraph) -> str:
        n = len(members)
        ops = {x.name: short(x.op) for x in graph.nodes}
        anchors = list(dict.fromkeys(ops[g.anchor] for g in members if g.anchor))
        epi = list(dict.fromkeys(ops[m] for g in members for m in g.epilogue))
        epi_text = f" with fused {'/'.join(epi[:5])} epilogues" if epi else ""
        plural = "s" if n > 1 else ""
        if category == "attention":
            return f"{n} fused attention kernel{plural}: Q·Kᵀ, scale/mask, softmax and ·V in one pass"
        if category == "gemm":
            return f"{n} GEMM{plural} ({'/'.join(anchors)}){epi_text}"
        if category == "conv":
            return f"{n} convolution{plural} ({'/'.join(anchors)}){epi_text}"
        if category == "row_reduce":
            reds = list(dict.fromkeys(ops[m] for g in members for m in g.nodes
                                      if op_role(graph.node(m)) == "reduce"))
            fused = any(g.prologue or g.epilogue for g in members)
            return f"{n} row-reduction kernel{plural} ({'/'.join(reds[:5])})" + \
                (" with their elementwise neighbours fused" if fused else "")
        if category == "recurrent":
            what = "whole-sequence recurrent layer" if any(
                graph.node(g.anchor).op in RECURRENT_SEQUENCE_OPS for g in members if g.anchor) else "recurrent step"
            return f"{n} {what}{plural} ({'/'.join(anchors)}): batched input GEMMs and fused step kernels"
        kinds = Counter(g.kind for g in members)
        return ("glue: " if category == "glue" else "the rest: ") + ", ".join(f"{c} {k.replace('_', ' ')}" for k, c in kinds.most_common()) + \
            f" group{'s' if n > 1 else ''} ({'/'.join(list(dict.fromkeys(chain(g, graph) for g in members))[:4])})"

    @staticmethod
    def _fusion(members: list[FusionGroup], graph: OpGraph) -> str:
        ops = {n.name: short(n.op) for n in graph.nodes}
        modules = {n.name: n.module for n in graph.nodes}
        seen: dict[tuple, list[FusionGroup]] = {}
        for g in members:
            seen.setdefault(_signature(g, ops, modules), []).append(g)
        parts = []
        for gs in list(seen.values())[:6]:
            first = gs[0]
            ids = f"#{first.id}" if len(gs) == 1 else f"{len(gs)}× (#{first.id}…#{gs[-1].id})"
            note = re.sub(r"\(\d+/(\d+)\)", r"(of \1)", first.note)
            note = note if len(note) <= 260 else note[:257] + "..."
            parts.append(f"{ids} {chain(first, graph)}: {note}; boundary: writes {', '.join(first.outputs[:3])}"
                         + (" …" if len(first.outputs) > 3 else ""))
        if len(seen) > 6:
            parts.append(f"… {len(seen) - 6} more patterns")
        return " | ".join(parts)

    @staticmethod
    def _layout(category: str, members: list[FusionGroup], groups: list[FusionGroup], graph: OpGraph) -> str:
        text = "fp32 throughout (no TF32), row-major contiguous tensors between groups; parameters in the " \
               "reference's state_dict layout"
        anchors = {graph.node(g.anchor).op for g in members if g.anchor}
        if category == "conv" or anchors & CONV_OPS:
            text += "; NCHW activations, conv weights [Cout, Cin/groups, kh, kw] (transposed conv: [Cin, " \
                    "Cout/groups, kh, kw])"
        if category == "gemm" or "aten.linear" in anchors:
            text += "; linear weights [N, K] row-major, Y = X·Wᵀ + b over the flattened leading dims"
        if category == "attention":
            text += "; Q, K, V read through strides from the projection output; the output written " \
                    "[B, S, H·D] for the next GEMM"
        if category == "row_reduce":
            text += "; statistics accumulated in fp32, one row per warp/block"
        if category == "recurrent":
            text += "; states [B, H]; gate order as PyTorch (LSTM i, f, g, o; GRU r, z, n)"
        ids = {g.id for g in members}
        mine = list(dict.fromkeys(v for g in members for v in g.outputs))
        elsewhere_out = {v for o in groups if o.id not in ids for v in o.outputs}
        elsewhere_in = {v for o in groups if o.id not in ids for v in o.inputs}
        taken = list(dict.fromkeys(v for g in members for v in g.inputs if v in elsewhere_out))
        given = [v for v in mine if v in graph.outputs or v in elsewhere_in]
        if taken:
            text += f"; takes {', '.join(taken[:5])}{' …' if len(taken) > 5 else ''} from other subtasks"
        if given:
            text += f"; hands on {', '.join(given[:5])}{' …' if len(given) > 5 else ''}"
        return text


def plan_text(plan: Plan) -> str:
    """The plan as a few lines of text (for logs)."""
    lines = [plan.rationale]
    for s in plan.subtasks:
        lines.append(f"{s.id}. [{s.time_share:.0%}, target {s.target_speedup:.2f}x] {s.title}")
    return "\n".join(lines)
