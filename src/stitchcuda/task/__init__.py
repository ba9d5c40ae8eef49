"""Tasks (PyTorch references in KernelBench format) and candidates: loading and checking."""

from stitchcuda.task.inspect import (
    TaskError,
    check_candidate_source,
    check_reference_source,
    inspect_task_module,
)
from stitchcuda.task.load import (
    bundled_task_names,
    bundled_tasks,
    load_candidate,
    load_folder,
    load_kernelbench,
    load_parquet,
    load_task_file,
    resolve_tasks,
)
from stitchcuda.task.record import Candidate, Task

__all__ = [
    "Candidate", "Task", "TaskError", "bundled_task_names", "bundled_tasks", "check_candidate_source",
    "check_reference_source", "inspect_task_module", "load_candidate", "load_folder", "load_kernelbench",
    "load_parquet", "load_task_file", "resolve_tasks",
]
