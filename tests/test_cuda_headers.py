"""Where the CPU compile checks find real CUDA library headers (tests/cuda_headers.py)."""

from __future__ import annotations

import pytest

from tests.cuda_headers import NEEDED, HeadersMissing, include_dirs


def _toolkit(root, headers):
    (root / "include").mkdir(parents=True)
    for name in headers:
        (root / "include" / name).write_text("#pragma once\n")
    return root


def test_a_full_toolkit_needs_no_other_folder(tmp_path):
    assert include_dirs(_toolkit(tmp_path, ["cuda_runtime_api.h", *NEEDED]), allow_fetch=False) == []


def test_what_is_missing_is_named_when_fetching_is_off(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.path", [])  # no installed nvidia wheels
    monkeypatch.setattr("tests.cuda_headers.CACHE", tmp_path / "cache")
    home = _toolkit(tmp_path / "cuda", ["cuda_runtime_api.h", "cublas_v2.h"])
    (home / "include/cuda_runtime_api.h").write_text("#define CUDART_VERSION 13000\n")
    with pytest.raises(HeadersMissing, match=r"cublasLt.h, cusparse.h, cusolverDn.h, cudnn.h: in neither"):
        include_dirs(home, allow_fetch=False)
