"""Stage 5, emit: the lowered records as CUDA and a Python module (emit.py's kernels, program.py's
translation unit and host code over ../templates/, pymodule.py's ModelNew that holds the
reference's parameters); codegen.py names the whole for the agents."""
