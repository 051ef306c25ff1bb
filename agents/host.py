"""`python -m agents.host TARGET CLASS`: the process an outside policy runs in.

TARGET is a file (`path/to/my_policy.py`) or a module (`mypkg.policies`), CLASS a `Policy`
subclass in it. The grader starts this process (`agents.external.ExternalPolicy`) and speaks
JSON lines with it over its standard input and output, nothing else:

    host -> grader   {"ready": NAME} | {"error": TEXT}
    grader -> host   {"episode": BRIEF}               a case starts (the brief's fields)
    host -> grader   {"call": {"name": TOOL, "arguments": {...}}} | {"error": TEXT}
    grader -> host   {"result": RESULT}                 the tool's result, as the engine returned it
    grader -> host   {"end": true}                      the case has ended
    host -> grader   {"bye": true}

The calls are the twelve tools of `finality_gym.tools.TOOL_TABLE`, the results what the engine
returns: the same table and messages a language model gets. Each case is played in a child
forked from this process, which imports the policy's code afresh: this process never imports
it (a first child checks that it loads), so no state in memory (a class attribute, a module
global, a shared mapping made at import) carries from one case to the next. The grader runs the
cases of a chunk in an unrecorded order, so counting them tells a policy nothing. The episode's truth is never in this process: the grader
keeps the engine. Anything the policy prints goes to standard error.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import traceback
from pathlib import Path


def load_class(target: str, name: str):
    """The class `name` of a file or module, imported here (never in the grader)."""
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise ValueError(f"no policy file {target}")
        spec = importlib.util.spec_from_file_location(f"_policy_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    cls = getattr(module, name, None)
    from agents.base import Policy
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise ValueError(f"{target} has no Policy subclass named {name!r}")
    if cls.privileged:
        raise ValueError(f"{target}:{name} declares itself privileged; only the project's "
                         "reference oracle is")
    return cls


def _play(cls, brief: dict, read, send) -> None:
    from agents.base import Brief
    try:
        policy = cls()
        policy.reset(Brief(**brief))
    except Exception:
        traceback.print_exc()
        send({"error": traceback.format_exc(limit=8)})
        return
    result = None
    while True:
        try:
            tool, args = policy.act(result)
        except Exception:
            traceback.print_exc()
            send({"error": traceback.format_exc(limit=8)})
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


def _in_child(work) -> int:
    """Run `work` in a fork and wait for it; its exit status. The policy's code is imported
    there, never in this process, so nothing it sets up (an anonymous shared mapping, a
    global) outlives the case."""
    pid = os.fork()
    if pid == 0:
        try:
            work()
            code = _FINISHED
        except BaseException:  # noqa: BLE001 - the policy may raise anything, SystemExit too
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def main() -> int:
    target, name = sys.argv[1], sys.argv[2]
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the policy's prints go to standard error, never into the protocol
    sys.stdout = sys.stderr
    import agents.scripted  # noqa: F401 - the project's code, imported once, before any fork

    def send(message: dict) -> None:
        protocol.write(json.dumps(message, separators=(",", ":")) + "\n")
        protocol.flush()

    def read() -> dict | None:
        line = sys.stdin.readline()
        return json.loads(line) if line else None

    def check() -> None:
        try:
            cls = load_class(target, name)
        except Exception as exc:
            send({"error": f"{type(exc).__name__}: {exc}"})
            return
        send({"ready": getattr(cls, "name", name)})

    if _in_child(check) != _FINISHED:
        send({"error": "loading the policy ended its process"})
        return 1
    while True:
        message = read()
        if message is None or "episode" not in message:
            return 0
        code = _in_child(lambda: _play(load_class(target, name), message["episode"], read, send))
        if code != _FINISHED:  # it died mid-case (os._exit, a signal): say so, do not hang
            send({"error": f"the case's process ended without finishing (exit status {code})"})


if __name__ == "__main__":
    sys.exit(main())
