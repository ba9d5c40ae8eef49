"""One full optimize run on the GPU with a scripted LLM answering real CUDA programs (prints a table).

    python benchmarks/agent_loop_gpu.py [--workspace DIR]

The LLM is our scripted OpenAI-compatible server (tests/llm_server.py) on 127.0.0.1, reached
through the real SDK; every program is built with nvcc, verified, timed and profiled for real
on the ``norm_softmax_gate`` task. The script makes the run take each route once at least:
a build error (fix), a correct but slow program (optimize), a faster one, no further gain
(replan after stagnation), then the new plan's target met (done).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from stitchcuda.agents.knowledge import KnowledgeBase
from stitchcuda.agents.loop import OptimizeConfig, Optimizer, summarize
from stitchcuda.agents.routing import RoutingConfig
from stitchcuda.llm.openai_backend import OpenAIChatClient
from stitchcuda.store import RunStore
from stitchcuda.task import resolve_tasks
from stitchcuda.verify import PRESETS, Verifier
from tests.llm_server import ScriptedOpenAIServer

ROOT = Path(__file__).parents[1]
HONEST = (ROOT / "tests" / "fixtures" / "candidates" / "norm_softmax_gate_honest.py").read_text()
# A build error: a misspelt CUDA intrinsic.
BROKEN = HONEST.replace("__syncthreads();", "__syncthread();", 1)
# Correct but wasteful: the whole kernel runs twice per forward.
SLOW = HONEST.replace("        return _ext.norm_softmax_gate_forward(", "        _ext.norm_softmax_gate_forward(\n"
                      "            x, self.norm.weight, self.norm.bias, self.gate_scale,\n"
                      "            float(self.temperature), float(self.norm.eps),\n        )\n"
                      "        return _ext.norm_softmax_gate_forward(")
assert BROKEN != HONEST and SLOW != HONEST


def fenced(source: str) -> str:
    return f"```python\n{source}```\n"


def plan(target: float, title: str) -> str:
    return "```json\n" + json.dumps({"rationale": "Memory-bound chain of LayerNorm, softmax and RMS passes: one "
                                                  "fused kernel, one read and one write per element.",
                                     "subtasks": [{"title": title, "operators": [
                                         "aten::native_layer_norm", "aten::_softmax", "aten::mul", "aten::add",
                                         "aten::mean", "aten::sqrt", "aten::div"], "time_share": 1.0,
                                         "fusion": "all of it, one block per row", "target_speedup": target}]}) + "\n```"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", type=Path, default=None)
    args = parser.parse_args()
    workspace = args.workspace or Path(tempfile.mkdtemp(prefix="stitchcuda-agent-"))
    (task,) = resolve_tasks("norm_softmax_gate")
    verifier = Verifier(PRESETS["quick"].model_copy(update={"timing_budget_s": 1.5}))
    events: list[str] = []
    with ScriptedOpenAIServer() as server:
        server.script([
            plan(8.0, "fuse the whole block into one row kernel"),
            fenced(BROKEN),  # -> fix
            fenced(SLOW),  # -> optimize (correct, under target)
            fenced(HONEST),  # -> optimize (faster, still under an ambitious target)
            fenced(HONEST),  # no gain
            fenced(HONEST),  # no gain again -> replan
            plan(2.0, "one fused row kernel, kept; target revised to what memory bandwidth allows"),
            fenced(HONEST),  # -> done
        ])
        llm = OpenAIChatClient(server.config(timeout_s=30))
        config = OptimizeConfig(planner=llm.config, coder=llm.config, verify=verifier.config,
                                routing=RoutingConfig(replan_after_stagnation=2, max_replans=1))
        store = RunStore(workspace)

        def report(state, message):
            events.append(message)
            print(message, flush=True)

        optimizer = Optimizer(task, config, llm, llm, verifier, store, reporter=report,
                              knowledge=KnowledgeBase.default())
        state = optimizer.start()
        prompts = server.requests

    table = Table(title=f"optimize norm_softmax_gate with a scripted LLM ({state.status}: {state.stop_reason})")
    for col in ("step", "skill", "result", "ms", "vs eager", "hacking", "decision"):
        table.add_column(col, overflow="fold")
    for step in store.steps(state.run_id):
        o = next(s for s in step.samples if s.sample == step.chosen)
        result = "passed" if o.passed else ("build failed" if not o.compiled else "failed")
        table.add_row(str(step.index + 1), step.skill, result, f"{o.milliseconds:.3f}" if o.milliseconds else "-",
                      f"{o.speedup_eager:.2f}x" if o.speedup_eager else "-", o.hacking or "-",
                      f"{step.decision.action}: {step.decision.reason}")
    Console().print(table)
    fix_prompt = prompts[2]["messages"][1]["content"]
    print("fix prompt names the compiler error:", "__syncthread" in fix_prompt)
    print("fix prompt carries API notes:", "API" in fix_prompt or "signature" in fix_prompt.lower())
    print(json.dumps(summarize(state), indent=1))


if __name__ == "__main__":
    main()
