"""The LLM-free Coder as a compiler: PyTorch reference -> one CUDA program.

    capture (graph.py: torch.export, core ATen, the model's own mode)
      -> fusion groups (fusion.py, over ops.py's operator classes and grouping.py's bookkeeping)
      -> a lowering per group (lower.py): fused GEMM/conv epilogues, row kernels, pointwise chains,
         attention and recurrent cells (lower_*.py over expr.py's IR and formulas.py's operator
         formulas, recorded as lowered.py's records), or an operator family's general lowering
         (families/)
      -> emitted CUDA and host program (emit.py, program.py, templates/, pymodule.py for ModelNew's
         parameters); codegen.py is the front that names the whole

:func:`compile_task` is the front door; it knows nothing of agents or of the Verifier's verdicts.
evaluate.py runs the IR on the CPU, for tests.
"""

from stitchcuda.compiler.driver import Compiled, compile_task

__all__ = ["Compiled", "compile_task"]
