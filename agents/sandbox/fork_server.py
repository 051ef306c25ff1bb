"""The fork server (the host's zygote) and the cases it forks: what of an outside policy's process
runs the policy's code (`agents/sandbox/host.py` is the process that never does).

The fork server, forked from the host before anything else, imports the policy's code once
(`load_class`: that file, with that content, and nothing else), is refused if the import left
anything that would outlive it in a fork (a thread, a file descriptor, a shared mapping,
read-only or not, a signal handler, a tracing hook, its namespaces or mounts: the host reads
them from /proc, `agents/sandbox/case_checks.py`'s `server_state`; a process: the host looks), and
then forks a case whenever the host asks, and nothing else (`serve`). Each case connects, on a
socket made before the import, to the host's listening socket, says it is ready, reads its brief
and plays it (`_case`, `_play`); a failure of the policy's is said in one line (`why`) and its
traceback goes to standard error, from the policy's own call on.

Under the operating-system sandbox (`FINALITY_SANDBOX=1`) the fork server takes its own
namespaces, filter and read-only host folder before the import (`enter_worker`) and isolates
itself again after it (`isolate_worker`); every case gets fresh namespaces and scratch space
(`enter_case`) and its limits and filter (`restrict_case`): `agents/sandbox/isolation.py`.
"""

from __future__ import annotations

import gc
import hashlib
import importlib
import importlib.util
import json
import os
import signal
import socket
import sys
import traceback
from pathlib import Path

SAID_BYTES = 4000  # the most bytes of a load message the fork server sends in one packet
CASES_PER_SERVER = 256  # the channels a fork server makes before the import: the cases it forks


class Refused(Exception):
    """The host's own reason not to run a class, said as is (no exception type)."""


def load_class(target: str, name: str, source: Path, digest: str):
    """The class `name` of the file or module `target`, imported here (never in the grader),
    from `source` with content `digest` and nothing else."""
    if target.endswith(".py"):
        spec = importlib.util.spec_from_file_location(f"_policy_{source.stem}", source)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
        imported = Path(module.__file__).resolve() if getattr(module, "__file__", None) else None
        if imported != source:
            raise Refused(f"imported {imported}, not the hashed {source} (Python finds another "
                          f"{target!r} first: rename the module, or give the file's path)")
    if hashlib.sha256(source.read_bytes()).hexdigest() != digest:
        raise Refused(f"{source} has changed since the grader hashed it (sha256 {digest[:12]}); "
                      "grade it again")
    cls = getattr(module, name, None)
    from finality_gym.policy import Policy
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise Refused(f"{target} has no Policy subclass named {name!r}")
    if cls.privileged:
        raise Refused(f"{name} declares itself privileged; only the project's reference oracle "
                      "is")
    return cls


def why(exc: BaseException) -> str:
    """An exception in one line, with the file and line it was raised at (for a syntax error,
    the line that does not parse): what its author needs, and nothing of the host's."""
    from finality_gym.policy import PolicyError
    if isinstance(exc, (Refused, PolicyError)):  # the host's or the runner's own words
        return " ".join(str(exc).split("\n"))
    if isinstance(exc, SyntaxError):
        text, where = exc.msg, f" ({exc.filename}, line {exc.lineno})"
    else:
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if not f.filename.startswith("<")]  # not importlib's frozen frames
        text = str(exc)
        where = f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
    return " ".join(f"{type(exc).__name__}: {text}".split("\n")) + where


def _print_policy_traceback(exc: BaseException) -> None:
    """The traceback of a policy's failure on standard error, from the policy's own call on."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb, file=sys.stderr)


def _play(cls, brief: dict, read, send) -> None:
    """Play one case to its disposition (or its error); the host kills the process after."""
    from finality_gym.policy import Brief
    try:
        policy = cls()
        policy.reset(Brief(**brief))
    except Exception as exc:
        _print_policy_traceback(exc)
        send({"error": why(exc)})
        return
    result = None
    while True:
        try:
            tool, args = policy.act(result)
        except Exception as exc:
            _print_policy_traceback(exc)
            send({"error": why(exc)})
            return
        try:
            send({"call": {"name": tool, "arguments": args}})
        except (TypeError, ValueError) as exc:  # arguments that are not JSON
            send({"error": f"the call {tool!r} has arguments that are not JSON: {exc}"})
            return
        message = read()
        if message is None:
            return
        result = message["result"]


def _own_state() -> dict:
    """What of this process only Python can see, that would outlive the import in every fork:
    its signal handlers and its tracing and collection hooks. (What the kernel holds, the host
    reads from /proc: `agents/sandbox/case_checks.py`, `server_state`.)"""
    return {"signal handlers": tuple(signal.getsignal(s) for s in signal.valid_signals()
                                     if s not in (signal.SIGKILL, signal.SIGSTOP)),
            "hooks": (sys.gettrace(), sys.getprofile(), tuple(gc.callbacks))}


def serve(target: str, name: str, source: Path, digest: str, path: list[str],
          control: socket.socket, address: str) -> None:
    """Import the policy's code once, let the host check that the import left nothing behind,
    then fork one case per request on `control`; nothing else. It reads no case's data, so
    every case starts from the same state: the one the import made. Its words to the host go
    over `control`: b"i" before the import (the host reads this process's state, and answers);
    b"l" and the class's name after it, or b"u" and why it cannot be loaded; b"r" once the
    host, having compared the state, said go on. Each case's channel to the host is a socket
    made before the import (`CASES_PER_SERVER`), since the fork server's filter refuses every
    new socket. The policy's import path `path` is put first here, never in the host
    (`agents/sandbox/host.py` says why)."""
    sandboxed = os.environ.get("FINALITY_SANDBOX") == "1"
    channels = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                for _ in range(CASES_PER_SERVER)]
    if sandboxed:  # bound before the import (which can still change what they run: the host
        # checks every case from /proc)
        from agents.sandbox.isolation import enter_case, enter_worker, isolate_worker, restrict_case
        cases, clones = enter_worker()
        socket.send_fds(control, [b"i"], [clones])  # the host answers every clone from now on
        os.close(clones)
    else:
        control.send(b"i")
    before = _own_state()
    control.recv(1)
    sys.path[:0] = path
    try:
        cls = load_class(target, name, source, digest)
    except BaseException as exc:  # noqa: BLE001 - a module may raise anything on import
        control.send(b"u" + why(exc).encode()[:SAID_BYTES])
        return
    after = _own_state()
    left = [f"{kind} set" for kind in before if after[kind] != before[kind]]
    if left:
        control.send(b"u" + (f"importing it left {'; '.join(left)}: each case is forked from "
                             "the imported code, so nothing may outlive the import").encode())
        return
    control.send(b"l" + str(cls.name).encode()[:SAID_BYTES])
    if control.recv(1) != b"g":  # the host found what the import left, and ends this process
        return
    if sandboxed:
        isolate_worker(cases)
    else:
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reaped unread
    # Every object the import made is left out of the collector's passes from now on: a case's
    # collection would otherwise write to every page that holds one, and copy them all.
    gc.freeze()
    control.send(b"r")
    recv, fork = control.recv, os.fork
    while recv(1) and channels:
        channel = channels.pop()
        if fork() == 0:
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # as the import left it
                control.close()
                for other in channels:
                    other.close()
                if sandboxed:
                    enter_case()
                channel.connect(address)
                if sandboxed:
                    restrict_case(channel.detach())
                else:  # descriptor 3, as in the sandbox (where `restrict_case` moves it)
                    os.dup2(channel.fileno(), 3)
                    channel.close()
                channel = socket.socket(fileno=3)
                _case(cls, channel)
            finally:  # the policy may raise anything, SystemExit too
                os._exit(0)
        channel.close()


def _case(cls, channel: socket.socket) -> None:
    """One case, in its own process: say it is ready, read the brief, play."""
    stream = channel.makefile("rb")  # buffered: a line in one receive, not a byte at a time

    def send(message: dict) -> None:
        channel.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def read() -> dict | None:
        line = stream.readline()
        return json.loads(line) if line else None

    send({"ready": True})
    message = read()
    if message is not None:
        _play(cls, message["episode"], read, send)
    stream.readline()  # nothing more comes: the host ends this process
