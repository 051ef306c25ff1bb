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
forked from this process after the policy's code was imported and before it saw any case, so
no state (a class attribute, a module global) carries from one case to the next, and the order
of the cases tells a policy nothing. The episode's truth is never in this process: the grader
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
    policy = cls()
    policy.reset(Brief(**brief))
    result = None
    while True:
        try:
            tool, args = policy.act(result)
        except Exception:
            traceback.print_exc()
            send({"error": traceback.format_exc(limit=8)})
            return
        send({"call": {"name": tool, "arguments": args}})
        message = read()
        if message is None:
            return
        if "end" in message:
            send({"bye": True})
            return
        result = message["result"]


def main() -> int:
    target, name = sys.argv[1], sys.argv[2]
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the policy's prints go to standard error, never into the protocol
    sys.stdout = sys.stderr

    def send(message: dict) -> None:
        protocol.write(json.dumps(message, separators=(",", ":")) + "\n")
        protocol.flush()

    def read() -> dict | None:
        line = sys.stdin.readline()
        return json.loads(line) if line else None

    try:
        cls = load_class(target, name)
    except Exception as exc:
        send({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    send({"ready": getattr(cls, "name", name)})
    while True:
        message = read()
        if message is None or "episode" not in message:
            return 0
        pid = os.fork()
        if pid == 0:  # the case runs in a copy of the process as it was before any case
            try:
                _play(cls, message["episode"], read, send)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)


if __name__ == "__main__":
    sys.exit(main())
