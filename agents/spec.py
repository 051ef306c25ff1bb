"""A policy spec, parsed once: what `--policies` takes and what every row and manifest names.

    sop, finality_gate, ...               a policy of the project (`scripted`)
    sop:poll_interval=30,max_polls=6      one with knobs
    plan:60,original,120,ship             an open-loop plan (`plan`)
    env:finality_gate, env:sop:...        a rule or plan whose waits are the env's four
                                          (`env`: `agents/scripted/env_actions.py`)
    ppo:PATH, ppo-greedy:PATH             a saved PPO or MaskablePPO model (`ppo`, `ppo-greedy`)
    sb3:PATH, sb3-greedy:PATH             a saved model of any stable-baselines3 or sb3-contrib
                                          algorithm with a Discrete action space (`sb3`,
                                          `sb3-greedy`)
    onnx:PATH, onnx-greedy:PATH           a policy network as an ONNX graph, run by onnxruntime
                                          (`onnx`, `onnx-greedy`: `agents/learned/onnx_policy.py`)
    model:NAME                            a language model (`python -m eval model` grades it)
    FILE.py:CLASS, MODULE:CLASS           a policy from outside the project (`outside`)

`PolicySpec.parse` is the only place a spec string is taken apart. `source()` is the file the
spec loads (a model archive, an outside policy's code), found without importing anything, in
the order the outside policy's own process imports it (`agents/sandbox/external.py`): the working
directory, the repository root, then `PYTHONPATH`.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .registry import CLASSES, SCRIPTED

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("plan", "env", "ppo", "ppo-greedy", "sb3", "sb3-greedy", "onnx", "onnx-greedy", "model")
# A saved stable-baselines3 model, run by torch: its spec reads a `vecnormalize.pkl` beside it,
# and the grader starts its workers fresh (torch's threads are not forked).
LEARNED = ("ppo", "ppo-greedy", "sb3", "sb3-greedy")
# A policy network as an ONNX graph, its own whole input, run by onnxruntime on one thread.
ONNX = ("onnx", "onnx-greedy")
FORMS = ("NAME, sop:poll_interval=INT,max_polls=INT, plan:W1,RETRY,W2,TERMINAL, env:RULE, ppo:PATH, "
         "ppo-greedy:PATH, sb3:PATH, sb3-greedy:PATH, onnx:PATH, onnx-greedy:PATH, model:NAME, "
         "FILE.py:CLASS, MODULE:CLASS")


@dataclass(frozen=True)
class PolicySpec:
    """`kind` is `scripted`, `plan`, `env`, `ppo`, `ppo-greedy`, `sb3`, `sb3-greedy`, `onnx`,
    `onnx-greedy`, `model` or `outside`; `target` the policy's name, the model file, the model's
    name, the rule an `env:` spec wraps (itself a spec), or the outside policy's file or module; `arguments` the knobs, the plan, or the outside
    policy's class."""

    kind: str
    target: str
    arguments: str = ""

    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        head, colon, rest = text.partition(":")
        if head in SCRIPTED:
            return cls("scripted", head, rest)
        if head in KINDS:
            if not rest:
                raise ValueError(f"{head}:... needs its argument; specs take the forms {FORMS}")
            return cls(head, rest)
        if colon and _is_outside(head, rest):
            return cls("outside", head, rest)
        raise ValueError(f"unknown policy {text!r}; specs take the forms {FORMS} (names: "
                         f"{', '.join(SCRIPTED)})")

    def __str__(self) -> str:
        return ":".join(self.parts)

    @property
    def parts(self) -> tuple[str, ...]:
        """The spec's pieces in the order it is written (`str` joins them with `:`)."""
        if self.kind == "scripted":
            return (self.target, self.arguments) if self.arguments else (self.target,)
        if self.kind == "outside":
            return self.target, self.arguments
        return self.kind, self.target

    @property
    def unprivileged_scripted(self) -> bool:
        """A rule written by hand that sees only tool results: not the oracle, not a model."""
        return self.kind == "scripted" and not CLASSES[self.target].privileged

    @property
    def learned(self) -> bool:
        return self.kind in LEARNED

    def source(self) -> Path | None:
        """The file this spec loads from disk, or None for the project's own policies."""
        if self.learned or self.kind in ONNX:
            path = Path(self.target)
            if not path.is_file():
                raise ValueError(f"no model file at {path}")
            return path
        if self.kind == "outside":
            return module_file(self.target)
        return None


def is_unprivileged_scripted(spec: str) -> bool:
    """`PolicySpec.unprivileged_scripted` of a row's spec; False for one that does not parse."""
    try:
        return PolicySpec.parse(spec).unprivileged_scripted
    except ValueError:
        return False


def _is_outside(target: str, cls: str) -> bool:
    return cls.isidentifier() and (target.endswith(".py") or "/" in target or all(
        p.isidentifier() for p in target.split(".")))


def import_path() -> list[str]:
    """Where an outside policy's process looks for a module, in order."""
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [os.getcwd(), str(ROOT), *extra]


def module_file(target: str) -> Path:
    """The file behind `FILE.py` or `MODULE` (dotted or top-level), looked up without importing
    it (importing runs the submitter's code)."""
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise ValueError(f"no policy file {target}")
        return path.resolve()
    parts = target.split(".")
    for entry in [*import_path(), *sys.path[1:]]:
        base = Path(entry or ".").joinpath(*parts)
        for candidate in (base / "__init__.py", base.with_suffix(".py")):  # Python's order
            if candidate.is_file():
                return candidate.resolve()
    raise ValueError(f"no module {target!r} on the path (give a file path ending in .py, or a "
                     "module importable from the working directory or the repository root)")


def split_specs(text: str) -> tuple[str, ...]:
    """A comma-separated list of specs, where a spec's own arguments may hold commas
    (`sop:poll_interval=30,max_polls=6`, `plan:60,original,120,ship`): a piece that does not
    start a spec (a built-in name or kind, or a file or module with `:CLASS`) continues the last
    one."""
    if not text.strip(" ,"):
        raise argparse.ArgumentTypeError("name at least one policy")
    specs: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        head, colon, rest = piece.partition(":")
        starts = head in SCRIPTED or head in KINDS or (colon and _is_outside(head, rest))
        if specs and not starts:
            specs[-1] += "," + piece
        else:
            specs.append(piece)
    return tuple(specs)
