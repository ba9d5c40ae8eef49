"""Where the compiler's CUDA lives: the templates folder every stage that writes CUDA renders from,
and the kernels without parameters of their own, taken as they are from its ``kernels/``."""

from __future__ import annotations

import functools
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"
KERNELS = TEMPLATES / "kernels"


@functools.cache
def cuda_file(name: str) -> str:
    return (KERNELS / name).read_text()


def render_kernel(template: str, /, **values: object) -> str:
    """``kernels/<template>`` (a ``.cu.j2`` template) rendered with ``values``: a kernel whose types,
    sizes or names differ from program to program."""
    from stitchcuda.templating import environment

    return environment(TEMPLATES).get_template(f"kernels/{template}").render(**values)
