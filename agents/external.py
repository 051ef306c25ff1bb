"""Policies from outside the project, graded through a process boundary.

A spec `path/to/my_policy.py:MyPolicy` or `mypkg.policies:MyPolicy` names a `Policy` subclass
that the grader never imports: `ExternalPolicy` starts `python -m agents.host` (one process per
grading run and worker, every case in a fresh fork of it, see `agents/host.py`) and relays tool
calls and results as JSON lines. The engine, and with it the episode's truth, stays in the
grader's process; a case that takes longer than `timeout_s` (wall time, the policy's whole
case; 10 s, or the environment variable FINALITY_POLICY_TIMEOUT) kills the host and is an error
naming the policy.

`code_identity(spec)` is the SHA-256 of the file that holds the class, found without importing
it (importing would run the submitter's code in the grader): a run's manifest pins it, so a
resume with changed code is refused. Only that file is hashed, not what it imports.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from .base import Brief, Call, Policy, PolicyError

ROOT = Path(__file__).resolve().parents[1]
STARTUP_S = 60.0
_PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV", "OPENBLAS_CORETYPE",
               "OPENBLAS_L2_SIZE")
EPISODE_TIMEOUT_S = 10.0


def is_external(spec: str) -> bool:
    """`FILE.py:CLASS` or `MODULE:CLASS` (a dotted or a top-level module); the project's own
    names (`sop:...`, `plan:...`, `ppo:...`) are never outside policies."""
    from .registry import BUILTIN
    target, colon, cls = spec.partition(":")
    if not colon or not cls.isidentifier() or target in BUILTIN:
        return False
    return target.endswith(".py") or "/" in target or all(
        p.isidentifier() for p in target.split("."))


def source_file(target: str) -> Path:
    """The file behind a target: the path itself, or the module's file on `sys.path` (the
    repository root first), looked up without importing anything."""
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise ValueError(f"no policy file {target}")
        return path
    parts = target.split(".")
    for entry in [str(ROOT), os.getcwd(), *sys.path]:
        base = Path(entry or ".").joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    raise ValueError(f"no module {target!r} on the path (give a file path ending in .py, or a "
                     "module importable from the repository root)")


def code_identity(spec: str) -> str:
    return hashlib.sha256(source_file(spec.partition(":")[0]).read_bytes()).hexdigest()


class ExternalPolicy(Policy):
    def __init__(self, spec: str, timeout_s: float | None = None):
        self.name = spec
        self.target, _, self.cls = spec.partition(":")
        source_file(self.target)  # a missing file or module fails now, in the grader's words
        self.timeout_s = timeout_s if timeout_s is not None else float(
            os.environ.get("FINALITY_POLICY_TIMEOUT", EPISODE_TIMEOUT_S))
        self.proc: subprocess.Popen | None = None
        self._buffer = b""
        self._active = False

    # ----------------------------------------------------------------- the process
    def _start(self) -> None:
        # A bare environment: nothing of the grader's (API keys, operators' variables) reaches
        # the policy's process.
        env = {k: os.environ[k] for k in _PASSED_ENV if k in os.environ}
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agents.host", self.target, self.cls], cwd=os.getcwd(),
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        self._buffer = b""
        message = self._read(time.monotonic() + STARTUP_S, "starting")
        if "ready" not in message:
            self.close()
            raise PolicyError(f"{self.name} could not be loaded: {message.get('error')}")

    def close(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout):
                try:
                    stream.close()
                except OSError:  # a pipe the policy's process broke
                    pass
            self.proc = None
        self._active = False

    def _send(self, message: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            raise PolicyError(f"{self.name}'s process died") from None

    def _read(self, deadline: float, doing: str) -> dict:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.close()
                raise PolicyError(f"{self.name} exceeded its time limit while {doing} "
                                  f"({self.timeout_s:g} s a case, {STARTUP_S:g} s to start)")
            chunk = os.read(fd, 65536)
            if not chunk:
                self.close()
                raise PolicyError(f"{self.name}'s process exited while {doing}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            self.close()
            raise PolicyError(f"{self.name} broke the protocol: {line[:120]!r}") from None

    # ----------------------------------------------------------------- the policy interface
    def reset(self, brief: Brief) -> None:
        if self.proc is None:
            self._start()
        if self._active:  # the last case ended: let its fork go
            self._send({"end": True})
            self._read(time.monotonic() + self.timeout_s, "ending a case")
        self.brief = brief
        self._deadline = time.monotonic() + self.timeout_s
        self._send({"episode": brief.__dict__})
        self._active = True
        self._started = False

    def act(self, result: dict | None) -> Call:
        if self._started:
            self._send({"result": result})
        self._started = True
        message = self._read(self._deadline, "playing a case")
        if "error" in message:
            self._active = False
            last = (message["error"].strip() or "failed").splitlines()[-1]
            raise PolicyError(last.removeprefix("agents.base.PolicyError: "))
        call = message.get("call") or {}
        if not isinstance(call.get("name"), str) or not isinstance(call.get("arguments"), dict):
            raise PolicyError(f"{self.name} sent a malformed call: {message!r:.120}")
        return call["name"], call["arguments"]

    def plan(self):  # the host plays the plan; this proxy only relays
        raise NotImplementedError
