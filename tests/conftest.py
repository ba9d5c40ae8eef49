"""Shared fixtures; GPU tests skip on machines without CUDA, build tests without nvcc/a compiler."""

from __future__ import annotations

import fcntl
import os
import random
from pathlib import Path

import pytest

from stitchcuda import machine
from stitchcuda.torchvision_compat import make_torchvision_importable

make_torchvision_importable()  # the zoo's tasks and transformers import torchvision (a CUDA build on CPU CI)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist's workers get COLUMNS=80, which the CLI's console honours as a user's setting: the
    # tests read the CLI's output as a pipe or a log sees it, as they do without xdist
    os.environ.pop("COLUMNS", None)

FIXTURES = Path(__file__).parent / "fixtures"
CPU = FIXTURES / "cpu"
GPU_CANDIDATES = FIXTURES / "candidates"


def sampled(items: list, k: int, seed: int = 44) -> list:
    """``items`` as pytest params: a seeded sample of ``k`` for the default run, the rest marked
    ``full`` (deselected unless asked for: ``pytest -m full``, or ``-m "full or not full"``)."""
    chosen = set(random.Random(seed).sample(range(len(items)), min(k, len(items))))
    return [pytest.param(x, marks=() if i in chosen else pytest.mark.full, id=str(x)) for i, x in enumerate(items)]


def split_sample(items: list, k: int, seed: int = 44) -> list:
    """``items`` as two pytest params, a seeded sample of ``k`` (id ``sample``) and the rest (id
    ``rest``, marked ``full``), for a test that handles a list at once (one nvcc run over several)."""
    chosen = set(random.Random(seed).sample(range(len(items)), min(k, len(items))))
    rest = [x for i, x in enumerate(items) if i not in chosen]
    return [pytest.param([x for i, x in enumerate(items) if i in chosen], id="sample"),
            *([pytest.param(rest, id="rest", marks=pytest.mark.full)] if rest else [])]


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    has_cuda = _cuda_available()
    has_nvcc = machine.nvcc_path() is not None
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "nvcc" in item.keywords and not has_nvcc:
            item.add_marker(pytest.mark.skip(reason="needs nvcc"))


@pytest.fixture(autouse=True)
def _one_gpu_test_at_a_time(request, tmp_path_factory):
    """Under `pytest -n`, the GPU tests of every worker take turns (two at once would time each
    other's kernels); the workers' temporary folders share a parent, which holds the lock."""
    if "gpu" not in request.keywords or not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    with open(tmp_path_factory.getbasetemp().parent / "gpu-tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A private cache root per test: builds and baselines never leak between tests."""
    root = tmp_path / "cache"
    monkeypatch.setenv("STITCHCUDA_CACHE", str(root))
    return root


@pytest.fixture(scope="session")
def session_builds(tmp_path_factory) -> Path:
    """One builds folder for the whole session, every xdist worker's included (their temporary
    folders share a parent)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "session-builds"
    root.mkdir(exist_ok=True)
    return root


def share_builds(cache_root: Path, builds: Path) -> Path:
    """``cache_root`` with its builds folder linked to ``builds``: builds are keyed by their sources
    and flags, so a test that does not test the build cache itself gets the same verdicts from another
    test's build of the same fixture candidate (each took about 30 s of g++ on CI's two cores)."""
    cache_root.mkdir(parents=True, exist_ok=True)
    (cache_root / "builds").symlink_to(builds, target_is_directory=True)
    return cache_root


@pytest.fixture(scope="module")
def kb(tmp_path_factory):
    """The knowledge base built once per test module, in a cache of its own."""
    from stitchcuda.agents.knowledge import KnowledgeBase

    old = os.environ.get("STITCHCUDA_CACHE")
    os.environ["STITCHCUDA_CACHE"] = str(tmp_path_factory.mktemp("kbcache"))
    try:
        yield KnowledgeBase.build()
    finally:
        if old is None:
            os.environ.pop("STITCHCUDA_CACHE", None)
        else:
            os.environ["STITCHCUDA_CACHE"] = old
