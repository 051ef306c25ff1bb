"""The fork server (the host's zygote) and the cases it forks: what of an outside policy's process
runs the policy's code (`agents/host.py` is the process that never does).

The fork server, forked from the host before anything else, imports the policy's code once
(`load_class`: that file, with that content, and nothing else), is refused if the import left
anything that would outlive it in a fork (a thread, a file descriptor, a shared mapping,
read-only or not, a signal handler, a tracing hook, its namespaces or mounts: `left_by_import`; a
process: the host looks), and then forks a case whenever the host asks, and nothing else
(`serve`). Each case connects to the host's listening socket, says it is ready, reads its brief
and plays it (`_case`, `_play`); a failure of the policy's is said in one line (`why`) and its
traceback goes to standard error, from the policy's own call on.

Under the operating-system sandbox (`FINALITY_SANDBOX=1`) the fork server takes its own
namespaces, filter and read-only host folder before the import (`enter_worker`) and isolates
itself again after it (`isolate_worker`); every case gets fresh namespaces and scratch space
(`enter_case`) and its limits and filter (`restrict_case`): `agents/isolation.py`.
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


def _state(protocol: set[int]) -> dict:
    """What a process holds that could carry something from one fork of it to the next: its
    threads, its file descriptors (beyond `protocol`), its shared mappings that can be written
    (read-only ones too: a case can make them writable again, `writable_shared`), its signal
    handlers (native and Python's), Python's tracing and collection hooks, its namespaces, root,
    working directory and mounts (a filesystem mounted at import would be every case's)."""
    from agents.case_checks import mapped, writable_shared
    shared = writable_shared("self")
    fds = {int(f) for f in os.listdir("/proc/self/fd")} - protocol
    status = dict(line.split(":\t", 1) for line in Path("/proc/self/status").read_text()
                  .splitlines() if ":\t" in line)
    return {
        "threads": len(os.listdir("/proc/self/task")),
        "file descriptors": {f for f in fds if os.path.exists(f"/proc/self/fd/{f}")},
        "shared writable mappings": {mapped(line) for line in shared
                                     if line.split()[1][1:2] == b"w"},
        "shared read-only mappings": {mapped(line) for line in shared
                                      if line.split()[1][1:2] != b"w"},
        "signal handlers": (status.get("SigCgt", "").strip(), status.get("SigIgn", "").strip(),
                            tuple(signal.getsignal(s) for s in signal.valid_signals()
                                  if s not in (signal.SIGKILL, signal.SIGSTOP))),
        "hooks": (sys.gettrace(), sys.getprofile(), tuple(gc.callbacks)),
        "namespaces": (tuple(os.readlink(f"/proc/self/ns/{ns}")
                             for ns in sorted(os.listdir("/proc/self/ns"))),
                       os.readlink("/proc/self/root"), os.getcwd()),
        "mounts": Path("/proc/self/mountinfo").read_text(),
    }


def left_by_import(before: dict, after: dict) -> list[str]:
    """What importing the policy left that every case would share (nothing is allowed)."""
    found = []
    if after["threads"] > before["threads"]:
        found.append(f"{after['threads'] - before['threads']} thread(s) running")
    for kind in ("file descriptors", "shared writable mappings", "shared read-only mappings"):
        if extra := after[kind] - before[kind]:
            found.append(f"{kind} open ({', '.join(map(str, sorted(extra)))})")
    if after["signal handlers"] != before["signal handlers"]:
        found.append("signal handlers set")
    if after["hooks"] != before["hooks"]:
        found.append("a tracing, profiling or garbage-collection hook set")
    if after["namespaces"] != before["namespaces"]:
        found.append("its namespaces, root or working directory changed")
    if after["mounts"] != before["mounts"]:
        found.append("its mounts changed")
    return found


def serve(target: str, name: str, source: Path, digest: str, path: list[str],
          control: socket.socket, address: str) -> None:
    """Import the policy's code once, check that the import left nothing behind, then fork one
    case per request on `control`; nothing else. It reads no case's data, so every case starts
    from the same state: the one the import made. Its words to the host go over `control`: b"r"
    and the class's name, or b"u" and why it cannot be loaded. The policy's import path `path`
    is put first here, never in the host (`agents/host.py` says why)."""
    sandboxed = os.environ.get("FINALITY_SANDBOX") == "1"
    if sandboxed:  # bound before the import (which can still change what they run: the host
        # checks every case from /proc)
        from agents.isolation import enter_case, enter_worker, isolate_worker, restrict_case
        enter_worker()
    before = _state({control.fileno()})
    sys.path[:0] = path
    try:
        cls = load_class(target, name, source, digest)
    except BaseException as exc:  # noqa: BLE001 - a module may raise anything on import
        control.send(b"u" + why(exc).encode()[:SAID_BYTES])
        return
    left = left_by_import(before, _state({control.fileno()}))
    if left:
        control.send(b"u" + (f"importing it left {'; '.join(left)}: each case is forked from "
                             "the imported code, so nothing may outlive the import").encode())
        return
    if sandboxed:
        isolate_worker()
    else:
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reaped unread
    # Every object the import made is left out of the collector's passes from now on: a case's
    # collection would otherwise write to every page that holds one, and copy them all.
    gc.freeze()
    control.send(b"r" + str(cls.name).encode()[:SAID_BYTES])
    recv, fork = control.recv, os.fork
    while recv(1):
        if fork() == 0:
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # as the import left it
                control.close()
                if sandboxed:
                    enter_case()
                channel = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                channel.connect(address)
                if sandboxed:
                    restrict_case(channel.detach())
                    channel = socket.socket(fileno=3)
                _case(cls, channel)
            finally:  # the policy may raise anything, SystemExit too
                os._exit(0)


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
