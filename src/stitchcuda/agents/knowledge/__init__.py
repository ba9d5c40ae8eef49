"""Knowledge for the agents: our CUDA technique notes and this machine's CUDA API declarations.

>>> kb = KnowledgeBase.default()
>>> hits = kb.search("fuse bias and gelu into the gemm", k=3)
>>> print(format_hits(hits, max_chars=3000))
"""

from stitchcuda.agents.knowledge.index import (
    Hit,
    KnowledgeBase,
    Note,
    format_hits,
    identifiers_in_compiler_error,
    load_notes,
    tokenize,
)

__all__ = [
    "Hit",
    "KnowledgeBase",
    "Note",
    "format_hits",
    "identifiers_in_compiler_error",
    "load_notes",
    "tokenize",
]
