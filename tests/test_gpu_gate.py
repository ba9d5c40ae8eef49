"""The GPU gate (verify/gate.py): trials share the GPU, timing has it alone, and a waiting timer is
never starved by trials that keep coming. Threads stand in for processes: each section opens the
lock file anew, and flocks on separate opens exclude each other as they do across processes."""

from __future__ import annotations

import os
import threading
import time

from stitchcuda.verify.gate import GateClient, GpuGate, busy_seconds


def _run(path: str, plan: list[tuple[float, str, float]]) -> list[tuple[str, float, float]]:
    """Each (delay, mode, hold) starts a thread after ``delay`` that holds a ``mode`` section for
    ``hold`` seconds; returns (mode, start, end) of each section, in plan order."""
    spans: list[tuple[str, float, float] | None] = [None] * len(plan)

    def one(i: int, delay: float, mode: str, hold: float) -> None:
        time.sleep(delay)
        client = GateClient(path)
        with client.section(mode):  # type: ignore[arg-type]
            start = time.time()
            time.sleep(hold)
            spans[i] = (mode, start, time.time())

    threads = [threading.Thread(target=one, args=(i, *p)) for i, p in enumerate(plan)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return spans  # type: ignore[return-value]


def _overlap(a: tuple[str, float, float], b: tuple[str, float, float]) -> bool:
    return a[1] < b[2] - 1e-3 and b[1] < a[2] - 1e-3


def test_shared_sections_overlap_and_exclusive_ones_run_alone(tmp_path):
    path = str(GpuGate("cpu", tmp_path).path)
    shared = _run(path, [(0.0, "shared", 0.3), (0.0, "shared", 0.3), (0.0, "shared", 0.3)])
    assert _overlap(shared[0], shared[1]) and _overlap(shared[1], shared[2])  # trials side by side

    mixed = _run(path, [(0.0, "shared", 0.3), (0.05, "exclusive", 0.2), (0.0, "exclusive", 0.0),
                        (0.0, "exclusive", 0.1)])
    exclusive = [s for s in mixed if s[0] == "exclusive"]
    for e in exclusive:  # timing never beside anything else
        assert not any(_overlap(e, other) for other in mixed if other is not e)


def test_a_waiting_exclusive_section_goes_before_shared_sections_asked_after_it(tmp_path):
    """A trial holds the GPU; a timer asks for it alone; trials that come after the timer wait
    behind it (the turnstile), so the timer runs as soon as the first trial is done."""
    path = str(GpuGate("cpu", tmp_path).path)
    first, timer, late = _run(path, [(0.0, "shared", 0.4), (0.1, "exclusive", 0.2), (0.2, "shared", 0.2)])
    assert timer[1] >= first[2] - 1e-3  # after the trial it found
    assert late[1] >= timer[2] - 1e-3  # the late trial waited for the timer, not the other way round


def test_a_client_records_its_waits_and_intervals_and_steps_down_for_a_nested_exclusive(tmp_path):
    gate = GpuGate("cpu", tmp_path)
    client = GateClient(str(gate.path))
    with client.section("shared"):
        time.sleep(0.05)
        with client.section("exclusive"):  # gives up the shared lock, takes the exclusive one
            time.sleep(0.05)
        time.sleep(0.05)
    use = client.use
    assert len(use.intervals) == 3 and use.exclusive_s > 0.04 and use.shared_s > 0.08
    assert busy_seconds(use.intervals) == __import__("pytest").approx(use.shared_s + use.exclusive_s, abs=0.01)

    client.switch("shared")
    client.switch("exclusive")
    client.switch(None)
    assert len(client.use.intervals) == 5

    other = GateClient(str(gate.path))
    with gate.exclusive():  # the orchestrator's own hold: another client waits for it, and says so
        waiter = threading.Thread(target=lambda: other.switch("shared"))
        waiter.start()
        time.sleep(0.2)
    waiter.join()
    other.switch(None)
    assert other.use.waited_s >= 0.1

    alone = GateClient(str(gate.path), alone=True)  # shared asked, exclusive taken
    spans = []

    def shared_beside() -> None:
        with GateClient(str(gate.path)).section("shared"):
            spans.append(time.time())

    with alone.section("shared"):
        start = time.time()
        t = threading.Thread(target=shared_beside)
        t.start()
        time.sleep(0.15)
        end = time.time()
    t.join()
    assert spans[0] >= end - 1e-3 and end - start >= 0.15


def test_busy_seconds_is_the_length_of_the_union():
    assert busy_seconds([]) == 0.0
    assert busy_seconds([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == 4.0
    assert busy_seconds([(4, 5), (0, 1)]) == 2.0


def _someone_waits_on(path) -> bool:
    """Whether a process is blocked on the flock of ``path`` (Linux lists waiters in /proc/locks as
    ``-> FLOCK ...`` lines, by device and inode)."""
    st = os.stat(path)
    inode = f":{st.st_ino} "
    with open("/proc/locks") as locks:
        return any(line.split(":", 1)[1].lstrip().startswith("->") and inode in line for line in locks)


def test_a_worker_takes_the_gate_around_its_gpu_work(tmp_path, cache):
    """A verification waits while another holds the GPU alone, and records its sections: shared
    around the reference and the trials, exclusive around the timing."""
    from stitchcuda.task import load_candidate, load_task_file
    from stitchcuda.verify import PRESETS, Verifier
    from tests.conftest import CPU

    gate = GpuGate("cpu", tmp_path / "locks")
    verifier = Verifier(PRESETS["tiny-debug"].model_copy(update={"timeout_s": 120}), cache=cache)
    verifier.gate_path = str(gate.path)
    held = threading.Event()

    def hold() -> None:
        # held until the worker is seen waiting (its start-up takes seconds on a loaded machine),
        # then a second more, so the wait it records is real and at least that long
        with gate.exclusive():
            held.set()
            deadline = time.time() + 60
            while not _someone_waits_on(gate.path) and time.time() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5.0)
    verdict = verifier.verify(load_task_file(CPU / "tiny_mlp.py"), load_candidate(CPU / "pure_torch.py"))
    holder.join()
    wall = verdict.wall
    assert verdict.correct and wall.gpu_wait_s > 0.5  # it waited for the holder
    assert wall.gpu_shared_s > 0 and wall.gpu_exclusive_s > 0 and len(wall.gpu_intervals) >= 2
    assert wall.split()["gpu_wait"] == wall.gpu_wait_s


def test_a_gate_under_a_relative_workspace_names_its_lock_absolutely(tmp_path, monkeypatch):
    """A bench given ``--workspace .stitchcuda/ws`` hands the lock's path to workers and to
    KernelBench's process, which run from folders of their own."""
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    gate = GpuGate("cpu", Path("ws") / "gpu-locks")
    assert gate.path.is_absolute() and gate.path.parent == tmp_path / "ws" / "gpu-locks"
    monkeypatch.chdir("/")
    with GateClient(str(gate.path)).section("shared"):
        pass
