"""torchvision beside a CPU build of torch, where the package index's torchvision is a CUDA build.

There its C operators cannot load, and ``import torchvision`` (which transformers does whenever
torchvision is installed) fails while registering fake kernels for ``torchvision::nms`` and
``qnms``. Defining those two operator schemas first lets it import; nothing here calls them.
Where torchvision's C operators load (a matching build, a GPU machine), this does nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_SCHEMAS: list[Any] = []  # the library that defines them lives as long as the process


def make_torchvision_importable() -> None:
    """Call before importing torchvision or transformers; safe to call any number of times."""
    import torch

    if _SCHEMAS or hasattr(torch.ops.torchvision, "nms"):
        return
    package = Path(torch.__file__).parent.parent / "torchvision"  # pip installs both in one site-packages
    extensions = sorted(package.glob("_C*.so")) if package.is_dir() else []
    if not extensions:
        return  # not installed here (or not next to torch): nothing to make importable
    try:
        torch.ops.load_library(str(extensions[0]))
        return
    except OSError:  # a CUDA build of its operators on a machine whose torch has no CUDA
        pass
    library = torch.library.Library("torchvision", "DEF")
    library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _SCHEMAS.append(library)
