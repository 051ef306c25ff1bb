"""Policies from outside the project, graded through a process boundary.

A spec `path/to/my_policy.py:MyPolicy` or `mypkg.policies:MyPolicy` names a `Policy` subclass
that the grader never imports: `ExternalPolicy` starts the host (`agents/sandbox/host.py`: one
process a worker, a fresh fork server for every chunk of work, every case a fork of it) and relays
tool calls and results as JSON lines. Every case gets a token of its own that the host adds to each
message of that case (the case never sees it): a message with another token is an error, and so is
a case that sends anything past its end (`finish`). A line over `limits.MAX_LINE` bytes breaks the
protocol; it is never buffered whole. The engine, and with it the episode's truth, stays in the
grader's process; a case that takes longer than `timeout_s` (wall time, the policy's whole
case; `limits.policy_timeout()`: 10 s, or the environment variable FINALITY_POLICY_TIMEOUT)
kills the host and is an error naming the policy.

The grader pins the SHA-256 of the file that holds the class (`PolicySpec.source()`, found
without importing it: importing would run the submitter's code in the grader) in the run's
manifest, so a resume with changed code is refused. Only that file is hashed, not what it
imports. The host is handed that path and hash and runs nothing else (`agents/sandbox/host.py`).

By default the policy's process runs in the operating-system sandbox (`agents/sandbox/`:
bubblewrap around the process, `agents/sandbox/bwrap.py`; fresh namespaces and limits around every
case); `sandbox=False` runs it as a plain process of the grader's user, for a policy that
needs the network or a machine without user namespaces.

Code that does not load (a syntax error, a missing class, a privileged one, another file than
the hashed one) is a `PolicyLoadError`: `preflight()` raises it before the first case, so it is
never blamed on a task.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import time

from finality_gym.policy import Brief, Call, Policy, PolicyError

from . import bwrap
from .limits import MAX_LINE, PASSED, TIMEOUT_VARIABLE, policy_timeout
from .host import command_line
from ..spec import PolicySpec, import_path

STARTUP_S = 60.0
_PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV", "OPENBLAS_CORETYPE",
               "OPENBLAS_L2_SIZE")
# Every case is forked from the process that imported the policy: a thread pool started at import
# (OpenBLAS starts one when numpy is imported) would be copied without its threads.
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
_TEXT = 500  # the most characters of the policy's process's words that reach a message


class PolicyLoadError(PolicyError):
    """The policy's code could not be loaded: no case was played, so no task is to blame. The
    message starts with "{spec} could not be loaded:"."""


class ExternalPolicy(Policy):
    def __init__(self, spec: PolicySpec, timeout_s: float | None = None, sandbox: bool = True):
        self.name = str(spec)
        self.sandbox = sandbox
        self.target, self.cls = spec.target, spec.arguments
        self.source = spec.source()  # a missing file or module fails now, in the grader's words
        self.digest = hashlib.sha256(self.source.read_bytes()).hexdigest()
        self.timeout_s = timeout_s if timeout_s is not None else policy_timeout()
        self.policy_name: str | None = None  # the class's own `name`, once its process is up
        self.proc: subprocess.Popen | None = None
        self._shown: tuple[str, str] | None = None  # (inside, outside) names of its files
        self._buffer = b""
        self._active = False
        self._new_chunk = False

    # ----------------------------------------------------------------- the process
    def preflight(self) -> None:
        """Start the policy's process and close it again: code that does not load is a
        `PolicyLoadError` before any case, not a failure on whichever task came first."""
        self._start()
        self.close()

    def _start(self) -> None:
        # A bare environment: nothing of the grader's (API keys, operators' variables) reaches
        # the policy's process.
        env = {**{k: os.environ[k] for k in _PASSED_ENV if k in os.environ}, **ONE_THREAD}
        if self.sandbox:
            shown, target, source, path, self._shown = bwrap.shown_for(self.target, self.source)
            env = {**{k: v for k, v in env.items() if k not in ("HOME", "TMPDIR", "VIRTUAL_ENV")},
                   "HOME": "/tmp", **{k: os.environ[k] for k in PASSED if k in os.environ}}
            argv = bwrap.command(command_line(target, self.cls, source, self.digest, path),
                                 shown, env)
        else:
            argv = command_line(self.target, self.cls, str(self.source), self.digest,
                                import_path())
        self.proc = subprocess.Popen(argv, cwd=os.getcwd(), env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, start_new_session=True)
        self._buffer = b""
        message = self._read(time.monotonic() + STARTUP_S, None)
        if not isinstance(message.get("ready"), str):
            self.close()
            raise self._unloadable(message.get("unloadable", f"it said {message!r}"))
        self.policy_name = message["ready"][:_TEXT]

    def _unloadable(self, why) -> PolicyLoadError:
        return PolicyLoadError(f"{self.name} could not be loaded: {self._outside(why)}")

    def _outside(self, text) -> str:
        """The policy's process's words, cut short, with the sandbox's name of the policy's
        file (`/submission/NAME.py`) put back to the file's own."""
        text = str(text)[:_TEXT]
        return text.replace(*self._shown) if self._shown else text

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
        self._new_chunk = False

    def _send(self, message: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            raise PolicyError(f"{self.name}'s process died") from None

    def _read(self, deadline: float, doing: str | None) -> dict:
        """The next message of the policy's process. Silence past `deadline`, an exit or a
        line that is not a JSON object closes the process and raises; while `doing` is None
        (it is starting, no case has begun) as a `PolicyLoadError`."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_LINE:
                raise self._broken(doing, "its process sent a line over the protocol's limit",
                                   f"{self.name} sent a line over {MAX_LINE} bytes")
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise self._broken(doing, f"its process did not start within {STARTUP_S:g} s",
                                   f"{self.name} exceeded its time limit of {self.timeout_s:g} s "
                                   f"a case (set {TIMEOUT_VARIABLE} to change it)")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise self._broken(doing, "its process exited while starting",
                                   f"{self.name}'s process exited while {doing}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            message = None
        if not isinstance(message, dict):
            raise self._broken(doing, f"its process broke the protocol: {line[:120]!r}",
                               f"{self.name} broke the protocol: {line[:120]!r}")
        return message

    def _broken(self, doing: str | None, starting: str, playing: str) -> PolicyError:
        """Close the process; the error to raise, a `PolicyLoadError` while it was starting."""
        self.close()
        return self._unloadable(starting) if doing is None else PolicyError(playing)

    # ----------------------------------------------------------------- the policy interface
    def new_chunk(self) -> None:
        """The next case starts a new chunk of work: its process imports the policy afresh (a
        new fork server), so nothing a fork server could count or keep reaches another chunk."""
        self._new_chunk = self.proc is not None

    def reset(self, brief: Brief) -> None:
        if self.proc is None:
            self._start()
        self.finish()  # a case the runner did not finish (`play` outside the grader)
        if self._new_chunk:
            self._new_chunk = False
            self._send({"chunk": True})
            message = self._read(time.monotonic() + STARTUP_S, None)
            if not isinstance(message.get("ready"), str):
                self.close()
                raise self._unloadable(message.get("unloadable", f"it said {message!r}"))
        self.brief = brief
        self._deadline = time.monotonic() + self.timeout_s
        self._token = secrets.token_hex(8)
        self._send({"episode": brief.__dict__, "case": self._token})
        self._active = True
        self._started = False

    def _case_message(self) -> dict:
        message = self._read(self._deadline, "playing a case")
        if message.get("case") != self._token:
            self.close()
            raise PolicyError(f"{self.name}'s process sent a message that is not of its case: "
                              f"{message!r:.120}")
        return message

    def act(self, result: dict | None) -> Call:
        if self._started:
            self._send({"result": result})
        self._started = True
        message = self._case_message()
        if "error" in message:
            self._active = False
            raise PolicyError(self._outside(message["error"]) or "failed")
        call = message.get("call") or {}
        if not isinstance(call.get("name"), str) or not isinstance(call.get("arguments"), dict):
            raise PolicyError(f"{self.name} sent a malformed call: {message!r:.120}")
        return call["name"], call["arguments"]

    def finish(self) -> None:
        """The case has ended (its disposition is recorded): the host kills its process. A case
        that sent anything past its last call, or left a process, is an error (the grader adds
        the task and the seed)."""
        if not self._active:
            return
        self._active = False
        self._send({"end": True})
        message = self._case_message()
        if "overran" in message:
            self.close()
            raise PolicyError(f"{self.name} misbehaved at the end of its case: "
                              f"{self._outside(message['overran'])}")
        if message.get("ended") is not True:
            self.close()
            raise PolicyError(f"{self.name} broke the protocol at the end of its case: "
                              f"{message!r:.120}")

    def stats(self) -> dict:
        """The class's own `name` on every row: the row's `policy` stays the spec, the identity
        that resumes and manifests go by."""
        return {"policy_name": self.policy_name}

    def plan(self):  # the host plays the plan; this proxy only relays
        raise NotImplementedError
