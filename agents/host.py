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
                     | {"unloadable": TEXT}
    grader -> host   {"result": RESULT}                 the tool's result, as the engine returned it
    grader -> host   {"end": true}                      the case has ended
    host -> grader   {"bye": true}

TEXT is one line: the exception and the file and line it was raised at. The calls are the
twelve tools of `finality_gym.tools.TOOL_TABLE`, the results what the engine returns: the same
table and messages a language model gets. Each case is played in a child forked from this
process, which imports the policy's code afresh: this process never imports it (a first child
checks that it loads), so no state in memory (a class attribute, a module global, a shared
mapping made at import) carries from one case to the next. The grader runs the cases of a chunk
in an unrecorded order, so counting them tells a policy nothing. The episode's truth is never
in this process: the grader keeps the engine. Anything the policy prints goes to standard error,
its tracebacks too.

Under the operating-system sandbox (`agents/sandbox.py`: this process runs under bwrap, and
`FINALITY_SANDBOX=1` says so) every case's fork first isolates itself (`isolate_case`: its own
namespaces, a private /tmp, no /proc, no new process, limits), so nothing a case writes or
starts reaches the next.

When the grader's side is gone (it closed the pipes, or a worker of its was stopped while a case
ran), there is no one left to tell: the host and its case end at once, quietly, a case stuck in
a loop too.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import select
import signal
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


_FINISHED = 3  # a case's process exits with this once it has said its last word


def _in_child(work, grader: int) -> int:
    """Run `work` in a fork and wait for it; its exit status. The policy's code is imported
    there, never in this process, so nothing it sets up (an anonymous shared mapping, a
    global) outlives the case.

    If the grader goes first (its end of `grader`, the protocol's pipe, closes: a worker of its
    was stopped mid-case), nothing the case does can reach anyone, and a policy stuck in a loop
    would run on for ever: the host ends its process group, the case and itself, at once."""
    pid = os.fork()
    if pid == 0:
        try:
            if os.environ.get("FINALITY_SANDBOX") == "1":
                from agents.sandbox import isolate_case
                isolate_case()
            work()
            code = _FINISHED
        except BaseException:  # noqa: BLE001 - the policy may raise anything, SystemExit too
            code = 1
        os._exit(code)
    try:
        ended = os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux 5.3 or later: wait for the case as it is
        ended = None
    if ended is not None:
        watch = select.poll()
        watch.register(ended, select.POLLIN)
        watch.register(grader, 0)  # a pipe's writer is told POLLERR once no one reads it
        gone = grader in dict(watch.poll())
        os.close(ended)
        if gone:
            os.killpg(0, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def main() -> int:
    target, name, source, digest = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the policy's prints go to standard error, never into the protocol
    sys.stdout = sys.stderr
    import agents.scripted  # noqa: F401 - the project's code, imported once, before any fork

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

    def load():
        try:
            return load_class(target, name, source, digest)
        except BaseException as exc:  # noqa: BLE001 - a module may raise anything on import
            send({"unloadable": why(exc)})
            return None

    def check() -> None:
        if (cls := load()) is not None:
            send({"ready": str(cls.name)})

    def case(brief: dict) -> None:
        if (cls := load()) is not None:
            _play(cls, brief, read, send)

    if (code := _in_child(check, protocol.fileno())) != _FINISHED:
        send({"unloadable": f"loading it ended its process (exit status {code})"})
        return 1
    while True:
        message = read()
        if message is None or "episode" not in message:
            return 0
        code = _in_child(lambda: case(message["episode"]), protocol.fileno())
        if code != _FINISHED:  # it died mid-case (os._exit, a signal): say so, do not hang
            send({"error": f"the case's process ended without finishing (exit status {code})"})


if __name__ == "__main__":
    sys.exit(main())
