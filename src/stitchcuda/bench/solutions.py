"""Match a folder of existing solutions (``bench --evaluate DIR``) to the suite's tasks.

Accepted names, so that other systems' outputs can be verified as they are:

- ``<task>.py`` or ``<task>_stitchcuda.py`` (what ``stitchcuda optimize`` writes);
- KernelBench's ``level_<L>_problem_<P>_sample_<S>[_kernel].py``, matched to the task with that
  level and problem id.

Every solution file is one row (several samples of a task are named ``task#S``); a task with no
solution is a row that fails with "no solution", so systems are compared over the same tasks.
"""

from __future__ import annotations

import re
from pathlib import Path

from stitchcuda.task.record import Task

KERNELBENCH_NAME = re.compile(r"level_(\d+)_problem_(\d+)_sample_(\d+)(?:_kernel)?\.py$")


def match_solutions(tasks: list[Task], folder: Path) -> tuple[list[tuple[Task, str | None]], list[str]]:
    """([(task, solution path or None)], files that match no task)."""
    files = sorted(p for p in folder.glob("*.py") if p.is_file())
    by_name = {t.name: t for t in tasks} | {t.file_stem: t for t in tasks}
    by_problem = {(t.level, t.problem_id): t for t in tasks if t.level is not None and t.problem_id is not None}
    found: dict[str, list[tuple[int, Path]]] = {}
    unmatched = []
    for path in files:
        m = KERNELBENCH_NAME.search(path.name)
        task = by_problem.get((int(m[1]), int(m[2]))) if m else None
        if task is None:
            stem = path.stem.removesuffix("_stitchcuda")
            task = by_name.get(stem)
        if task is None:
            unmatched.append(path.name)
            continue
        found.setdefault(task.name, []).append((int(m[3]) if m else 0, path))
    rows: list[tuple[Task, str | None]] = []
    for t in tasks:
        samples = sorted(found.get(t.name, []))
        if not samples:
            rows.append((t, None))
        for sample, path in samples:
            named = t if len(samples) == 1 else t.model_copy(update={"name": f"{t.name}#{sample}"})
            rows.append((named, str(path.resolve())))
    return rows, unmatched
