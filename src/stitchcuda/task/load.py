"""Loading tasks: a file, a folder, a KernelBench checkout, the KernelBench parquet dataset,
or our bundled suite. Loading reads and statically checks sources; it runs nothing.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from stitchcuda.task.inspect import TaskError, check_reference_source
from stitchcuda.task.preset import apply_preset
from stitchcuda.task.record import Candidate, Task

_KB_FILE = re.compile(r"^(?P<id>\d+)_(?P<name>.+)\.py$")


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise TaskError(f"{what} {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskError(f"cannot read {what} {path}: {exc}") from exc


def load_task_file(path: str | Path, origin: str = "file", name: str | None = None,
                   preset: str | None = None, checked: bool = True) -> Task:
    """One task file; with ``preset``, at the sizes of that entry of the file's ``PRESETS``.
    ``checked=False`` keeps a file that does not parse or lacks a name, for a check that reports
    every file of a folder (``stitchcuda tasks DIR --check``)."""
    path = Path(path)
    source = _read(path, "task file")
    if checked:
        check_reference_source(source, label=str(path.resolve()))
    task = Task(name=name or path.stem, source=source, path=str(path.resolve()), origin=origin)  # type: ignore[arg-type]
    return with_preset(task, preset)


def with_preset(task: Task, preset: str | None) -> Task:
    """The task at the sizes of its preset ``preset`` (unchanged for None); see task/preset.py."""
    if preset is None:
        return task
    return task.model_copy(update={"source": apply_preset(task.source, preset, label=f"task {task.name}")})


def load_folder(path: str | Path, checked: bool = True) -> list[Task]:
    files = sorted(p for p in Path(path).glob("*.py") if not p.name.startswith("_"))
    if not files:
        raise TaskError(f"folder {path} holds no .py task files")
    return [load_task_file(p, origin="folder", checked=checked) for p in files]


def kernelbench_level_dir(root: str | Path, level: int) -> Path:
    root = Path(root)
    for candidate in (root / "KernelBench" / f"level{level}", root / f"level{level}"):
        if candidate.is_dir():
            return candidate
    raise TaskError(
        f"{root} is not a KernelBench checkout with level {level}: expected {root}/KernelBench/level{level}/ "
        f"(or {root}/level{level}/)"
    )


def load_kernelbench(root: str | Path, level: int, problem: int | None = None, checked: bool = True) -> list[Task]:
    """Problems of one level of a KernelBench checkout (files named ``{id}_{Name}.py``)."""
    tasks = []
    for path in sorted(kernelbench_level_dir(root, level).glob("*.py"), key=_problem_order):
        match = _KB_FILE.match(path.name)
        if not match or (problem is not None and int(match["id"]) != problem):
            continue
        task = load_task_file(path, origin="kernelbench", name=f"L{level}/{path.stem}", checked=checked)
        tasks.append(task.model_copy(update={"level": level, "problem_id": int(match["id"])}))
    if not tasks:
        which = f"problem {problem} in " if problem is not None else ""
        raise TaskError(f"no {which}KernelBench level {level} found under {root}")
    return tasks


def _problem_order(path: Path) -> tuple[int, str]:
    match = _KB_FILE.match(path.name)
    return (int(match["id"]) if match else 1 << 30, path.name)


def load_parquet(path: str | Path, level: int | None = None, problem: int | None = None) -> list[Task]:
    """Rows of the KernelBench parquet dataset (columns ``code``, ``level``, ``name``, ``problem_id``)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TaskError("reading parquet needs pyarrow: pip install 'stitchcuda[kernelbench]'") from None
    try:
        table = pq.read_table(str(path))
    except (OSError, ValueError) as exc:
        raise TaskError(f"cannot read parquet file {path}: {exc}") from exc
    missing = {"code", "level", "name", "problem_id"} - set(table.column_names)
    if missing:
        raise TaskError(f"{path} lacks column(s) {sorted(missing)}; is it the KernelBench dataset?")
    tasks = []
    for row in table.select(["code", "level", "name", "problem_id"]).to_pylist():
        if (level is not None and row["level"] != level) or (problem is not None and row["problem_id"] != problem):
            continue
        label = f"{path} row level={row['level']} problem={row['problem_id']}"
        check_reference_source(row["code"], label=label)
        name = f"L{row['level']}/{row['problem_id']}_{Path(str(row['name'])).stem.split('_', 1)[-1]}"
        tasks.append(Task(name=name, source=row["code"], origin="parquet", level=row["level"],
                          problem_id=row["problem_id"]))
    if not tasks:
        raise TaskError(f"no rows matched in {path} (level={level}, problem={problem})")
    return sorted(tasks, key=lambda t: (t.level or 0, t.problem_id or 0))


def _suite_dir() -> Path:
    return Path(str(resources.files("stitchcuda.task") / "suite"))


def bundled_task_names() -> list[str]:
    return sorted(p.stem for p in _suite_dir().glob("*.py") if not p.name.startswith("_"))


def bundled_tasks() -> list[Task]:
    return [load_task_file(_suite_dir() / f"{name}.py", origin="bundled") for name in bundled_task_names()]


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long for the file system, such as a long comma-separated list
        return False


def resolve_tasks(spec: str, level: int | None = None, problem: int | None = None,
                  preset: str | None = None, checked: bool = True) -> list[Task]:
    """Tasks named by ``spec``: a .py file, a .parquet file, a folder, a KernelBench checkout
    (with ``level``), a bundled task name, ``suite`` for the whole bundled suite, or several of
    these separated by commas (``mlp,small_cnn``). With ``preset``, each at that named size preset
    (an error for a task that lacks it). ``checked=False``: files are kept unparsed (see
    :func:`load_task_file`)."""
    return [with_preset(task, preset) for task in _resolve(spec, level, problem, checked)]


def _resolve(spec: str, level: int | None, problem: int | None, checked: bool = True) -> list[Task]:
    path = Path(spec).expanduser()
    if "," in spec and not _exists(path):
        tasks = [t for part in spec.split(",") if part.strip()
                 for t in _resolve(part.strip(), level, problem, checked)]
        names = [t.name for t in tasks]
        if len(set(names)) != len(names):
            raise TaskError(f"{spec!r} names a task twice: {sorted({n for n in names if names.count(n) > 1})}")
        return tasks
    if path.is_file():
        if path.suffix == ".parquet":
            return load_parquet(path, level, problem)
        return [load_task_file(path, checked=checked)]
    if path.is_dir():
        is_checkout = (path / "KernelBench").is_dir() or any(path.glob("level[0-9]"))
        if is_checkout:
            if level is None:
                raise TaskError(f"{path} is a KernelBench checkout: name a level with --level N")
            return load_kernelbench(path, level, problem, checked)
        return load_folder(path, checked)
    if spec == "suite":
        return bundled_tasks()
    if spec in bundled_task_names():
        return [load_task_file(_suite_dir() / f"{spec}.py", origin="bundled")]
    if spec.endswith((".py", ".parquet")) or "/" in spec or "\\" in spec:
        raise TaskError(f"{spec}: no such file or folder")
    raise TaskError(
        f"{spec!r} is neither a file, a folder, nor a bundled task (bundled: {', '.join(bundled_task_names())})"
    )


def load_candidate(path: str | Path) -> Candidate:
    path = Path(path)
    return Candidate(name=path.stem, source=_read(path, "candidate file"), path=str(path.resolve()))
