"""The entry point of `inspect eval eval/inspect_task.py`: inspect_ai loads a task by its file's
path, so the task is declared here and built by `eval.models.inspect_task` (its docstring says
what the task is and how it differs from the model arm)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # inspect imports this file by path, not as part of the package
    sys.path.insert(0, str(ROOT))

from inspect_ai import Task, task  # noqa: E402

from eval.models.inspect_task import build_task  # noqa: E402


@task
def finality(split: str = "public", subset: str = "stratified", seeds: int = 1,
             probe: str = "full", max_requests: int = 80, max_invalid_turns: int = 8,
             max_total_tokens: int | None = None) -> Task:
    """The model arm's cases as samples: one per (task, seed); the model sees the brief."""
    return build_task(split, subset, seeds, probe, max_requests, max_invalid_turns,
                      max_total_tokens)
