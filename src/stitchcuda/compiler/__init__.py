"""The LLM-free Coder as a compiler: PyTorch reference -> one CUDA program.

    capture (graph.py: torch.export, core ATen, the model's own mode)
      -> fusion groups (fusion.py)
      -> a lowering per group: fused GEMM/conv epilogues, row kernels and pointwise chains
         (codegen.py, expr.py), or an operator family's general lowering (families/)
      -> emitted CUDA and host program (templates/, pymodule.py for ModelNew's parameters)

:func:`compile_task` is the front door; it knows nothing of agents or of the Verifier's verdicts.
"""

from stitchcuda.compiler.driver import Compiled, compile_task

__all__ = ["Compiled", "compile_task"]
