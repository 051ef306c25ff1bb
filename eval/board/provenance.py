"""What makes a verified grade checkable besides its rows: the grader's version (the repository's
commit, and whether the grader's code had local changes) and the form each kind of entry was
graded in (`FORMS`; an outside policy's sandbox is proven by its self-test, which the run
folder records)."""

from __future__ import annotations

import subprocess
from importlib.metadata import PackageNotFoundError, version

from agents.spec import ROOT

# What decides a grade: a local change to any of these makes the grader "dirty".
GRADER_CODE = ("finality_gym", "agents", "eval", "pyproject.toml", "constraints.txt")
FORMS = {"scripted": "the grader's own code",
         "outside": "its own process in the operating-system sandbox",
         "sb3": "loaded as data in the grader's process (no pickle of it runs)",
         "onnx": "a graph run by onnxruntime in the grader's process (no code of it runs)",
         "model": "a remote endpoint, which sees only the tool results"}


def _git(*args: str) -> str | None:
    try:
        run = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return run.stdout if run.returncode == 0 else None


def grader_version() -> dict:
    """`commit` (None outside a git checkout), `dirty` (local changes to `GRADER_CODE`, None
    where unknown), `package` (the installed version) and `label`, the one string entries are
    grouped by: entries of different labels are never ranked together."""
    commit = (_git("rev-parse", "HEAD") or "").strip() or None
    status = _git("status", "--porcelain", "--", *GRADER_CODE) if commit else None
    dirty = None if status is None else bool(status.strip())
    try:
        package = version("finality-gym")
    except PackageNotFoundError:
        package = None
    label = (f"{commit[:12]}{'+dirty' if dirty else ''}" if commit
             else f"package {package} (no commit)")
    return {"commit": commit, "dirty": dirty, "package": package, "label": label}
