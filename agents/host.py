"""`python -m agents.host TARGET CLASS SOURCE DIGEST`: the process an outside policy runs in.

TARGET is a file (`path/to/my_policy.py`) or a module (`mypkg.policies`), CLASS a `Policy`
subclass in it, SOURCE the file the grader hashed for the run's manifest (`PolicySpec.source()`)
and DIGEST its SHA-256. The host runs only that file with that content: a module that Python
finds elsewhere on its path (a package of the same name, a module already imported), or a file
edited since it was hashed, is refused, so the rows are always those of the code the manifest
names. The grader starts this process (`agents.external.ExternalPolicy`) and speaks JSON lines
with it over its standard input and output, nothing else:

    host -> grader   {"ready": NAME} | {"unloadable": TEXT}   NAME: the class's `name`
    grader -> host   {"episode": BRIEF}               a case starts (the brief's fields)
    host -> grader   {"call": {"name": TOOL, "arguments": {...}}} | {"error": TEXT}
    grader -> host   {"result": RESULT}                 the tool's result, as the engine returned it
    grader -> host   {"end": true}                      the case has ended
    host -> grader   {"bye": true}

TEXT is one line: the exception and the file and line it was raised at. The calls are the
twelve tools of `finality_gym.tools.TOOL_TABLE`, the results what the engine returns: the same
table and messages a language model gets.

The policy's code is imported once, and every case starts from that import (a model loaded at
import is loaded once per run and worker, not per case), yet nothing carries from one case to
the next. Three processes: this one, which never imports the policy's code and never reads a
case's data, only asks for cases and watches how they end; the zygote, forked from it, which
imports the code once, is refused if the import left anything that would outlive it in a fork
(a thread, a file descriptor, a writable shared mapping, a signal handler: `left_by_import`),
and then does nothing but fork a case when asked and report its exit status; and one case
process per case, forked from the zygote, which reads its own brief and plays it. Every case is
thus a copy of the same post-import state: a module-level counter, a class attribute or
anything a case changes dies with it. The grader runs the cases of a chunk in an unrecorded
order, so counting them tells a policy nothing. The episode's truth is never in these
processes: the grader keeps the engine. Anything the policy prints goes to standard error, its
tracebacks too. Numerical libraries run on one thread (`OPENBLAS_NUM_THREADS=1` and the like,
set by the grader): a thread pool started at import could not be forked.

Under the operating-system sandbox (`agents/sandbox.py`: these processes run under bwrap, and
`FINALITY_SANDBOX=1` says so) the zygote enters its own user and mount namespaces once after
the import (`isolate_worker`: /proc hidden), every case process isolates itself before it reads
its brief (`isolate_case`: its own pid namespace, no capability, no new process, limits), and
this process empties the scratch folder and /dev/shm after every case (`wipe`), so nothing a
case writes or starts reaches the next.

When the grader's side is gone (it closed the pipes, or a worker of its was stopped while a case
ran), there is no one left to tell: the host and its case end at once, quietly, a case stuck in
a loop too.
"""

from __future__ import annotations

import gc
import hashlib
import importlib
import importlib.util
import json
import os
import select
import signal
import socket
import sys
import traceback
from pathlib import Path


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
        if "end" in message:
            send({"bye": True})
            return
        result = message["result"]


_FINISHED = 3   # a case's process exits with this once it has said its last word
_NO_CASE = 4    # ... and with this when the grader had no further case for it


def _state(protocol: set[int]) -> dict:
    """What a process holds that could carry something from one fork of it to the next: its
    threads, its file descriptors (beyond `protocol`), its writable shared mappings, and its
    signal handlers (native and Python's)."""
    fds = {int(f) for f in os.listdir("/proc/self/fd")} - protocol
    status = dict(line.split(":\t", 1) for line in Path("/proc/self/status").read_text()
                  .splitlines() if ":\t" in line)
    return {
        "threads": len(os.listdir("/proc/self/task")),
        "file descriptors": {f for f in fds if os.path.exists(f"/proc/self/fd/{f}")},
        "shared writable mappings": {_mapped(line.split())
                                     for line in Path("/proc/self/maps").read_text().splitlines()
                                     if line.split()[1][1] == "w" and line.split()[1][3] == "s"},
        "signal handlers": (status.get("SigCgt", "").strip(), status.get("SigIgn", "").strip(),
                            tuple(signal.getsignal(s) for s in signal.valid_signals()
                                  if s not in (signal.SIGKILL, signal.SIGSTOP))),
    }


def _mapped(fields: list[str]) -> str:
    """What a line of /proc/self/maps maps: a file, or anonymous memory (shown as /dev/zero)."""
    name = " ".join(fields[5:])
    return "anonymous" if not name or name.startswith("/dev/zero") else name


def left_by_import(before: dict, after: dict) -> list[str]:
    """What importing the policy left that every case would share (nothing is allowed)."""
    found = []
    if after["threads"] > before["threads"]:
        found.append(f"{after['threads'] - before['threads']} thread(s) running")
    for kind in ("file descriptors", "shared writable mappings"):
        if extra := after[kind] - before[kind]:
            found.append(f"{kind} open ({', '.join(map(str, sorted(extra)))})")
    if after["signal handlers"] != before["signal handlers"]:
        found.append("signal handlers set")
    return found


def _zygote(target: str, name: str, source: Path, digest: str, control: socket.socket,
            protocol: int, send, read) -> None:
    """Import the policy's code once, check that the import left nothing behind, then fork one
    case per request on `control` and report its exit status; nothing else. This process never
    reads a case's data (each case reads its own brief), so every case starts from the same
    state: the one the import made."""
    before = _state({protocol, control.fileno()})
    try:
        cls = load_class(target, name, source, digest)
    except BaseException as exc:  # noqa: BLE001 - a module may raise anything on import
        send({"unloadable": why(exc)})
        control.send(b"u")
        return
    left = left_by_import(before, _state({protocol, control.fileno()}))
    if left:
        send({"unloadable": f"importing it left {'; '.join(left)}: each case is forked from "
                            "the imported code, so nothing may outlive the import"})
        control.send(b"u")
        return
    sandboxed = os.environ.get("FINALITY_SANDBOX") == "1"
    if sandboxed:
        from agents.sandbox import isolate_case, isolate_worker
        isolate_worker()
    # Every object the import made is left out of the collector's passes from now on: a case's
    # collection would otherwise write to every page that holds one, and copy them all.
    gc.freeze()
    send({"ready": str(cls.name)})
    control.send(b"r")
    while control.recv(1):
        pid = os.fork()
        if pid == 0:
            control.close()
            code = _FINISHED
            try:
                if sandboxed:
                    isolate_case()
                message = read()
                if message is None or "episode" not in message:
                    code = _NO_CASE
                else:
                    _play(cls, message["episode"], read, send)
            except BaseException:  # noqa: BLE001 - the policy may raise anything, SystemExit too
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        control.send(str(os.waitstatus_to_exitcode(status)).encode())


def main() -> int:
    target, name, source, digest = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the policy's prints go to standard error, never into the protocol
    sys.stdout = sys.stderr

    def send(message: dict) -> None:
        text = json.dumps(message, separators=(",", ":")) + "\n"  # not JSON: raises, unsent
        try:
            protocol.write(text)
            protocol.flush()
        except BrokenPipeError:  # the grader is gone: nobody reads this, or anything after it
            os._exit(0)

    def read() -> dict | None:
        line = sys.stdin.readline()
        return json.loads(line) if line else None

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    zygote = os.fork()
    if zygote == 0:
        ours.close()
        _zygote(target, name, source, digest, theirs, protocol.fileno(), send, read)
        os._exit(0)
    theirs.close()
    watch = select.poll()
    watch.register(ours, select.POLLIN)
    watch.register(protocol.fileno(), 0)  # a pipe's writer is told POLLERR once no one reads it

    def reply() -> bytes:
        """The zygote's next word; if the grader goes first, end the cases and ourselves."""
        events = dict(watch.poll())
        if ours.fileno() not in events:
            os.killpg(0, signal.SIGKILL)
        return ours.recv(16)

    def ended() -> int:
        return os.waitstatus_to_exitcode(os.waitpid(zygote, 0)[1])

    loaded = reply()  # the zygote said ready or why not to the grader itself
    if loaded != b"r":
        if not loaded:  # it died importing, before it could say
            send({"unloadable": f"loading it ended its process (exit status {ended()})"})
        return 1
    sandboxed = os.environ.get("FINALITY_SANDBOX") == "1"
    if sandboxed:
        from agents.sandbox import wipe
    while True:
        if sandboxed:
            wipe()  # what the last case wrote, before the next case starts
        ours.send(b"c")  # fork a case: the grader's next message starts it, or says none is left
        answer = reply()
        if not answer:
            send({"error": f"the policy's process ended (exit status {ended()})"})
            return 1
        code = int(answer)
        if code == _NO_CASE:
            return 0
        if code != _FINISHED:  # it died mid-case (os._exit, a signal): say so, do not hang
            send({"error": f"the case's process ended without finishing (exit status {code})"})


if __name__ == "__main__":
    sys.exit(main())
