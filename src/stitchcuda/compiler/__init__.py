"""The LLM-free Coder as a compiler: PyTorch reference -> one CUDA program, in five stages, one
subpackage each (layers point one way: capture < ir < schedule < lowering < emit < driver):

    capture/   torch.export in the model's own mode -> core-ATen OpGraph
    ir/        expressions, operator formulas and classes (which lower alone: FAMILY_OPS), the
               fusion-group record
    schedule/  fusion groups, formed only where the IR says a lowering accepts them
    lowering/  one registry of lowerings: fused group lowerings and per-operator families
    emit/      CUDA kernels, the library calls' host code, the host program and ModelNew
               (templates/ is shared, kernels/ holds the fixed kernels)

driver.py runs them, splitting a group whose lowering refuses it; coverage.py reports the core-ATen
operators without a lowering; check.py compile-checks a program with nvcc.
:func:`compile_task` is the front door; it knows nothing of agents or of the Verifier's verdicts.
"""

from stitchcuda.compiler.driver import Compiled, compile_task

__all__ = ["Compiled", "compile_task"]
