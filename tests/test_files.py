"""Files written whole or not at all."""

from __future__ import annotations

import os

import pytest

from stitchcuda import files
from stitchcuda.files import copy_atomic, write_atomic


def test_an_interrupted_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    target = tmp_path / "mlp_stitchcuda.py"
    target.write_text("the program from an earlier run\n")

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, "x" * 100_000)
    with pytest.raises(KeyboardInterrupt):
        copy_atomic(__file__, target)
    assert target.read_text() == "the program from an earlier run\n"
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no partial file left behind


def test_writes_replace_and_keep_the_mode(tmp_path):
    new = tmp_path / "new.py"
    write_atomic(new, "a")
    assert new.read_text() == "a" and (new.stat().st_mode & 0o777) == 0o644
    os.chmod(new, 0o600)
    write_atomic(new, b"b")
    copy_atomic(new, tmp_path / "copy.py")
    assert new.read_bytes() == b"b" and (new.stat().st_mode & 0o777) == 0o600
    assert (tmp_path / "copy.py").read_bytes() == b"b"
