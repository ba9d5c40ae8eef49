"""The warm-worker pool (verify/workers.py): who waits for which worker, with a stand-in process
that becomes ready after a delay."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time

from stitchcuda.verify import workers
from stitchcuda.verify.workers import WorkerPool

START_S = 1.5  # the stand-in's start: a torch import and a CUDA context, in a real worker

STANDIN = f'''
import sys, time
time.sleep({START_S})
ready = sys.argv[sys.argv.index("--ready") + 1]
served = 0
open(ready, "w").write("0")
for line in sys.stdin:  # a request: "served" at once
    served += 1
    open(ready, "w").write(str(served))
'''


def _pool(tmp_path) -> WorkerPool:
    (tmp_path / "standin_worker.py").write_text(STANDIN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    return WorkerPool(env, module="standin_worker")


def test_callers_asking_at_once_wait_for_one_start_each_side_by_side(tmp_path):
    """A spare is starting (as after every request) when four callers ask at once: the three it
    cannot serve have workers started for them now, not once the spare is taken."""
    pool = _pool(tmp_path)
    got: list[tuple[object, bool]] = []
    pool.warm_up(1)
    spare = pool._idle[0]
    started = time.time()
    threads = [threading.Thread(target=lambda: got.append(pool.take())) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        while not all(w.ready() for w, _ in got) and time.time() - started < 60:  # each can take its request
            time.sleep(0.02)
        elapsed = time.time() - started
        assert len(got) == 4 and len({id(w) for w, _ in got}) == 4 and pool.started == 4
        # the spare was started ahead of every request; a worker started for one caller may be
        # older than a later caller's request (threads start apart on a loaded machine), so only
        # the spare's flag is certain
        assert (spare, True) in [(w, warm) for w, warm in got]
        assert elapsed < 1.8 * START_S, elapsed  # one start, not the spare's and then their own
    finally:
        for w, _ in got:
            w.stop()
        pool.close()


def test_a_ready_worker_is_served_however_long_it_waited(tmp_path, monkeypatch):
    monkeypatch.setattr(workers, "READY_LIMIT_S", START_S + 1.0)  # for a worker still starting, not a ready one
    pool = _pool(tmp_path)
    try:
        pool.warm_up(1)
        first, warm = pool.take()
        assert warm  # started ahead of the request
        first.hand_over(tmp_path / "request")
        pool.give_back(first, reusable=True)
        time.sleep(START_S + 2.0)
        again, warm = pool.take()
        assert again is first and warm and pool.started == 1
        pool.give_back(again, reusable=True)
    finally:
        pool.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie nobody reaped is gone too
    except OSError:
        return False


def test_a_worker_dies_with_its_parent_and_takes_its_build_and_folder_along():
    """A worker (a session of its own, as the pool starts them) busy with a long child process, an
    nvcc stand-in: its parent is killed, and within seconds the worker, the child and the worker's
    folder are gone (they used to live on as orphans)."""
    import subprocess
    import textwrap

    worker_code = ("import subprocess, time; from stitchcuda.verify.workers import die_with_parent; die_with_parent(); "
                   "p = subprocess.Popen(['sleep', '300']); print(p.pid, flush=True); time.sleep(300)")
    parent_code = textwrap.dedent(f"""
        import subprocess, sys, tempfile, time
        from stitchcuda.verify.workers import temp_prefix
        folder = tempfile.mkdtemp(prefix=temp_prefix("worker"))
        worker = subprocess.Popen([sys.executable, "-c", {worker_code!r}], cwd=folder, stdout=subprocess.PIPE,
                                  text=True, start_new_session=True)
        print(worker.pid, worker.stdout.readline().strip(), folder, flush=True)
        time.sleep(300)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    worker, child, folder = parent.stdout.readline().split()
    assert _alive(int(worker)) and _alive(int(child))
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (_alive(int(worker)) or _alive(int(child)) or os.path.exists(folder)):
        time.sleep(0.1)
    assert not _alive(int(worker)) and not _alive(int(child)) and not os.path.exists(folder)


def test_the_next_start_clears_the_folders_of_dead_owners(tmp_path):
    import subprocess
    import tempfile

    from stitchcuda.verify.workers import clear_stale_folders, temp_prefix

    dead = subprocess.Popen(["true"])  # a PID that has exited
    dead.wait()
    stale = tempfile.mkdtemp(prefix=f"stitchcuda-verify-{dead.pid}-")
    mine = tempfile.mkdtemp(prefix=temp_prefix("verify"))
    try:
        assert clear_stale_folders() >= 1
        assert not os.path.exists(stale) and os.path.exists(mine)
    finally:
        shutil.rmtree(mine, ignore_errors=True)


def test_stop_kills_busy_workers_too_and_starts_none_again(tmp_path):
    """An interrupted bench: the worker serving a request dies under it, the idle one goes, and a
    later take() or warm_up() starts nothing."""
    import pytest

    pool = _pool(tmp_path)
    busy, _ = pool.take()
    pool.warm_up(1)
    idle = pool._idle[0]
    pool.stop()
    deadline = time.time() + 10
    while busy.alive() and time.time() < deadline:
        time.sleep(0.02)
    assert not busy.alive() and not idle.alive()
    pool.give_back(busy, reusable=True)  # its caller hands it back once it sees it die: not kept
    assert pool._idle == []
    with pytest.raises(workers.WorkersStopped):
        pool.take()
    pool.warm_up(1)
    assert pool._idle == [] and pool.started == 2
