"""The process an outside policy runs in (`command_line`: TARGET CLASS SOURCE DIGEST PATH).

TARGET is a file (`path/to/my_policy.py`) or a module (`mypkg.policies`), CLASS a `Policy`
subclass in it, SOURCE the file the grader hashed for the run's manifest (`PolicySpec.source()`),
DIGEST its SHA-256 and PATH (JSON) where the policy's modules are found. The host runs only that
file with that content: a module that Python finds elsewhere on its path (a package of the same
name, a module already imported), or a file edited since it was hashed, is refused, so the rows
are always those of the code the manifest names.

No file of the policy's is on the host's own import path: Python imports some modules by name
on its own (`sitecustomize` at start, `org` when `copy` is imported, ...), and a package of the
policy's by such a name would run in the host, which sees every case. The host runs in Python's
isolated mode (`-I`: no PYTHONPATH, no user site, not the working directory), with only the
repository put first; the fork server adds PATH to its path after it has forked from the host,
just before it imports the policy. The grader starts this process
(`agents.sandbox.external.ExternalPolicy`) and speaks JSON lines with it over its standard input
and output; this process, and only it, holds that channel:

    host -> grader   {"ready": NAME} | {"unloadable": TEXT}       NAME: the class's `name`
    grader -> host   {"episode": BRIEF, "case": TOKEN}             a case starts
    host -> grader   {"case": TOKEN, "call": {"name": TOOL, "arguments": {...}}}
                   | {"case": TOKEN, "error": TEXT}
    grader -> host   {"result": RESULT}          the tool's result, as the engine returned it
    grader -> host   {"end": true}               the case has ended: the host kills it
    host -> grader   {"case": TOKEN, "ended": true} | {"case": TOKEN, "overran": TEXT}

TOKEN is the grader's, new for every case; the host adds it to every message of that case, and
the case never sees it. TEXT is one line: the exception and the file and line it was raised at.
The calls are the twelve tools of `finality_gym.tools.TOOL_TABLE`, the results what the engine
returns: the same table and messages a language model gets.

Three kinds of process. This one, the host, never imports the policy's code. The fork server
(the zygote), forked from the host before anything else, closes the grader's channel, imports
the policy's code once, is refused if the import left anything that would outlive it in a fork
(a thread, a file descriptor, a shared mapping, read-only or not, a signal handler, a tracing hook:
`left_by_import`; a process: the host looks), and then forks a case whenever the host asks,
and nothing else: it reads no case's data, sees no exit status, and is told nothing but "fork".
Each case connects to the host's listening socket, the one channel made for it; the host checks
the process that connected before it sends the brief, relays its messages to the grader with the
case's token, and kills it when the grader says the case ended. Every case is thus a copy of the
same post-import state: a module-level counter or anything else a case changes dies with it. A
case that sends anything past its turn or its end is an error. The grader shuffles the jobs of a
run across its chunks in an unrecorded order and gives every chunk a fresh host, so counting
cases tells a policy nothing of its place. The engine, and the episode's truth, are never in these
processes. Anything the policy prints goes to standard error, through the host, which relays a
capped amount; its tracebacks too. Numerical libraries run on one thread (`OPENBLAS_NUM_THREADS=1`
and the like, set by the grader): a thread pool started at import could not be forked.

The fork server and the cases are `agents/sandbox/fork_server.py`; this module is the host. Under
the operating-system sandbox (`agents/sandbox/`: these processes run under bwrap, and
`FINALITY_SANDBOX=1` says so) the fork server isolates and filters itself once after the
import (`isolate_worker`), every case gets fresh namespaces and scratch space (`enter_case`)
and its limits and filter (`restrict_case`), and the host checks each case from /proc
(`case_problems`, `agents/sandbox/case_checks.py`) and refuses a policy that leaves any other
process running (`others`).

When the grader's side is gone (it closed the pipes, or a worker of its was stopped while a case
ran), there is no one left to tell: the host and its case end at once, quietly, a case stuck in
a loop too.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import signal
import socket
import sys
import time
from pathlib import Path

from agents.sandbox.bwrap import HOSTDIR
from agents.sandbox.supervisor import Supervisor
from agents.sandbox.case_checks import (case_problems, expected_mounts, left_by_import, orphaned,
                                        others, peer, server_state)
from agents.sandbox import fork_server
from agents.sandbox.limits import MAX_LINE, STDERR_CASE, STDERR_TOTAL
from agents.spec import ROOT


class _GraderGone(Exception):
    """The grader closed its side: nobody is left to tell anything."""


class _Host:
    """The host's side of everything: the grader's pipe, the fork server's control socket, the
    listening socket, the current case's channel, and the capped relay of standard error."""

    def __init__(self, protocol, listener: socket.socket, address: str, relay: tuple[int, int],
                 sandboxed: bool, policy: tuple):
        self.protocol, self.listener, self.address = protocol, listener, address
        self.stderr, self.stderr_write = relay
        self.sandboxed, self.policy = sandboxed, policy
        self.stderr_name = f"pipe:[{os.fstat(self.stderr).st_ino}]"
        self.unprepared: str | None = None  # why the next case could not be prepared
        self.killed: tuple[int, ...] = ()  # the last case, killed: it needs no waiting for
        self.grader_buffer = b""
        self.relayed_total = self.relayed_case = 0
        self.cut = False  # whether this case's standard error was cut (said once a case)
        self.case = None  # (channel, pid, token, buffer)
        self.control: socket.socket | None = None
        self.supervisor: Supervisor | None = None  # sandboxed: answers the fork server
        self.zygote = self.forked = 0
        if sandboxed:  # what every case's mounts must be
            self.mounts = expected_mounts()

    # ---------------------------------------------------------------- the fork server
    def start_server(self) -> str:
        """Fork a fresh fork server, which imports the policy; its class's name, or raises
        `_Unloadable` with why not. A server's import may leave nothing running."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        zygote = os.fork()
        if zygote == 0:  # nothing of the grader's channel or the host's: its output relayed
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(self.stderr_write, 1)
            os.dup2(self.stderr_write, 2)
            os.dup2(theirs.fileno(), 3)
            os.closerange(4, 1 << 20)
            sys.stdout = sys.stderr = os.fdopen(2, "w", buffering=1)
            fork_server.serve(*self.policy, socket.socket(fileno=3), self.address)
            os._exit(0)
        theirs.close()
        self.control, self.zygote, self.killed, self.forked = ours, zygote, (), 0
        if self.supervisor is not None:
            self.supervisor.close()
            self.supervisor = None
        try:  # its state read before and after the import; told to go on between
            self.wait(ours.fileno())
            said, listener, _, _ = socket.recv_fds(ours, 1, 1)
            if listener:  # sandboxed: its filter's clones, which the host answers
                self.supervisor = Supervisor(listener[0], zygote)
            before = server_state(zygote) if said == b"i" else None
            loaded = self.said() if before is not None and ours.send(b"g") else b""
            if loaded[:1] == b"u":
                raise _Unloadable(loaded[1:].decode(errors="replace"))
            left = left_by_import(before, server_state(zygote)) if loaded[:1] == b"l" else []
            if left:
                raise _Unloadable(f"importing it left {'; '.join(left)}: each case is forked "
                                  "from the imported code, so nothing may outlive the import")
            ready = loaded[:1] == b"l" and ours.send(b"g") and self.said() == b"r"
            if ready and self.supervisor is not None:  # from now on, a fork when asked
                self.supervisor.requests = 0
        except OSError:  # it ended while we looked
            ready = False
        if not ready:
            raise _Unloadable("loading it ended its process")
        if self.sandboxed:
            left = others({os.getpid(), zygote})
            if left:
                raise _Unloadable(f"importing it left {len(left)} process(es) running "
                                  f"({'; '.join(left.values())}): a case may start none, and "
                                  "the import none that lives")
        return loaded[1:].decode(errors="replace")

    def said(self) -> bytes:
        """The fork server's next word on the control socket (empty: it ended)."""
        self.wait(self.control.fileno())
        try:
            return self.control.recv(fork_server.SAID_BYTES + 1)
        except OSError:
            return b""

    def load(self) -> bool:
        """Start a fork server and its first case, and tell the grader: ready, with the class's
        name, or why the code cannot be loaded. Whether it loaded."""
        try:
            self.send({"ready": self.start_server()})
        except _Unloadable as exc:
            self.send({"unloadable": str(exc)})
            return False
        self.unprepared = self.prepare()
        return True

    def restart(self) -> None:
        """A fresh fork server for a new chunk of work: the last one, and any case it forked,
        killed and gone first (it had no writable place, so it leaves nothing behind)."""
        if self.case is not None:
            self.end_case()
        self.control.close()
        os.kill(self.zygote, signal.SIGKILL)
        os.waitpid(self.zygote, 0)
        if self.sandboxed:
            deadline = time.monotonic() + LINGER_S
            while others({os.getpid()}) and time.monotonic() < deadline:
                time.sleep(0.001)

    # ---------------------------------------------------------------- waiting, with the relay
    def wait(self, fd: int, deadline: float | None = None) -> bool:
        """Until `fd` is readable (True) or `deadline` passes (False), relaying standard error
        meanwhile; the grader gone ends everything."""
        watch = select.poll()
        watch.register(0, 0)  # POLLHUP once the grader closed its end (read only when asked)
        clones = self.supervisor.fd if self.supervisor is not None else None
        for watched in {fd, self.stderr} | ({clones} if clones is not None else set()):
            watch.register(watched, select.POLLIN)
        watch.register(self.protocol.fileno(), 0)  # POLLERR once no one reads the pipe
        while True:
            left = None if deadline is None else max(0, deadline - time.monotonic())
            events = dict(watch.poll(None if left is None else int(left * 1000) + 1))
            if self.protocol.fileno() in events:
                raise _GraderGone
            if self.stderr in events:
                self.pump()
            if clones is not None and clones in events:
                if events[clones] & select.POLLIN:
                    self.supervisor.answer()
                else:  # the fork server is gone: nothing more will ask
                    watch.unregister(clones)
                    clones = None
            if fd in events:
                return True
            if 0 in events and fd != 0 and events[0] & (select.POLLHUP | select.POLLERR):
                raise _GraderGone
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def pump(self) -> None:
        """Relay what the policy wrote to standard error, up to the caps; drop the rest, and
        say so once a case."""
        chunk = os.read(self.stderr, 65536)
        room = max(0, min(STDERR_CASE - self.relayed_case, STDERR_TOTAL - self.relayed_total))
        passed = chunk[:room]
        if passed:
            os.write(2, passed)
            self.relayed_case += len(passed)
            self.relayed_total += len(passed)
        if len(chunk) > len(passed) and not self.cut:
            self.cut = True
            os.write(2, b"\n[the policy's standard error was cut here: at most %d bytes a "
                     b"case, %d a process are relayed]\n" % (STDERR_CASE, STDERR_TOTAL))

    def send(self, message: dict) -> None:
        text = json.dumps(message, separators=(",", ":")) + "\n"
        try:
            self.protocol.write(text)
            self.protocol.flush()
        except BrokenPipeError:
            raise _GraderGone from None

    def from_grader(self) -> dict:
        while b"\n" not in self.grader_buffer:
            self.wait(0)
            chunk = os.read(0, 1 << 20)
            if not chunk:
                raise _GraderGone
            self.grader_buffer += chunk
        line, _, self.grader_buffer = self.grader_buffer.partition(b"\n")
        return json.loads(line)

    # ---------------------------------------------------------------- one case
    def from_case(self) -> dict | str:
        """The case's next message, or why there is none (a text)."""
        channel, pid, token, buffer = self.case
        while b"\n" not in buffer:
            if len(buffer) > MAX_LINE:
                return f"it sent a line over {MAX_LINE} bytes"
            self.wait(channel.fileno())
            try:
                chunk = channel.recv(1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                return ("the case's process ended without finishing (it exited, crashed or "
                        "passed a limit: memory, CPU time, open files)")
            buffer += chunk
        line, _, rest = buffer.partition(b"\n")
        self.case = (channel, pid, token, rest)
        if rest:
            return "it sent a message before its turn"
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            return f"it broke the protocol: {line[:120]!r}"
        return message

    def prepare(self) -> str | None:
        """Fork the next case, accept its connection and check it, before the grader asks for
        it (this overlaps with the grader's own work on the last row); why not, if not. No
        process but the host, the fork server and the last case (killed, perhaps still being
        torn down) may be running: one that outlives its case is refused."""
        if self.sandboxed:
            known = {os.getpid(), self.zygote, *self.killed}
            deadline = time.monotonic() + LINGER_S  # (a process may be exiting as we look)
            while (left := others(known)) and time.monotonic() < deadline:
                time.sleep(0.001)
            if left:
                return (f"a process outlived its case ({'; '.join(left.values())}): a case may "
                        "start none, and the import none that lives")
        if self.forked == fork_server.CASES_PER_SERVER:  # its channels used up: a fresh one
            self.restart()
            try:
                self.start_server()
            except _Unloadable as exc:
                return f"its code could not be loaded again: {exc}"
        self.forked += 1
        if self.supervisor is not None:
            self.supervisor.requests += 1
        self.control.send(b"c")
        if not self.wait(self.listener.fileno(), time.monotonic() + CASE_START_S):
            return f"no case connected within {CASE_START_S:g} s of being forked"
        channel, _ = self.listener.accept()
        pid = peer(channel)
        self.case = (channel, pid, None, b"")
        hello = self.from_case()
        if hello != {"ready": True}:
            return hello if isinstance(hello, str) else f"it said {hello!r:.120}"
        if self.sandboxed:
            orphaned(pid, LINGER_S)  # its starter exits as soon as it forked it
            problems = case_problems(pid, self.zygote, self.stderr_name, self.mounts)
            if problems:
                return f"the case did not start isolated: {'; '.join(problems)}"
        return None

    def start_case(self, brief: dict, token: str) -> str | None:
        """Hand the prepared case its brief; why not, if it could not be prepared."""
        if self.unprepared is not None:
            return self.unprepared
        channel, pid, _, buffer = self.case
        self.case = (channel, pid, token, buffer)
        self.relayed_case, self.cut = 0, False
        channel.sendall(json.dumps({"episode": brief}, separators=(",", ":")).encode() + b"\n")
        return None

    def end_case(self) -> str | None:
        """Kill the current case (its whole pid namespace); what it did wrong at its end, if
        anything: data sent past its last message."""
        channel, pid, token, buffer = self.case
        self.case = None
        overran = None
        if buffer or select.select([channel], [], [], 0)[0] and channel.recv(1, socket.MSG_PEEK):
            overran = "it sent a message after its last (past its turn or its end)"
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.killed = (pid,)
        channel.close()
        return overran

    def serve(self) -> int:
        """Cases, one at a time, until the grader has no further one."""
        while True:
            message = self.from_grader()
            if "chunk" in message:  # a new chunk of work: a fresh fork server
                self.restart()
                if not self.load():
                    return 1
                continue
            if "episode" not in message:
                return 0
            token = message["case"]
            why_not = self.start_case(message["episode"], token)
            if why_not is None:
                why_not = self.relay(token)
            overran = self.end_case() if self.case is not None else None
            if why_not is not None:  # the case's end, an error: the grader sends no "end"
                self.send({"case": token, "error": why_not})
            else:
                self.send({"case": token,
                           **({"overran": overran} if overran else {"ended": True})})
            self.unprepared = self.prepare()

    def relay(self, token: str) -> str | None:
        """The case's calls to the grader and the results back, until the grader says the case
        ended (None) or the case fails (why, said to the grader as its error)."""
        while True:
            said = self.from_case()
            if isinstance(said, str):
                return said
            if "error" in said:
                return str(said["error"])[:2000]
            if not isinstance(said.get("call"), dict):
                return f"it sent a malformed message: {said!r:.120}"
            self.send({"case": token, "call": said["call"]})
            reply = self.from_grader()
            if "end" in reply:
                return None
            self.case[0].sendall(json.dumps({"result": reply["result"]},
                                            separators=(",", ":")).encode() + b"\n")


LINGER_S = 2.0     # how long a killed case's processes may take to be gone
CASE_START_S = 30.0


class _Unloadable(Exception):
    """Why the policy's code could not be loaded (said to the grader as is)."""


# The host's start: the repository first on the path of an isolated interpreter, nothing else.
BOOT = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from agents.sandbox.host import main; "
        "sys.exit(main())")


def command_line(target: str, cls: str, source: str, digest: str, path: list[str]) -> list[str]:
    """How the grader starts a host: `python -I` (isolated: PYTHONPATH, the user site and the
    working directory are not on its import path), the repository put first by `BOOT`, and the
    policy's import path `path` as an argument, which only the fork server takes up."""
    return [sys.executable, "-I", "-c", BOOT, str(ROOT), target, cls, source, digest,
            json.dumps(path)]


def main() -> int:
    policy = (sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5]))
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    sandboxed = os.environ.get("FINALITY_SANDBOX") == "1"
    # Sandboxed, a socket in the host's own folder, which the policy's code may reach but not
    # write; else an abstract socket. Its name is random, and a connection that is not the case
    # the host asked for fails the host's check of it.
    name = f"cases-{secrets.token_hex(8)}"
    address = f"{HOSTDIR}/{name}" if sandboxed else f"\0finality-{name}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(4)
    host = _Host(protocol, listener, address, os.pipe(), sandboxed, policy)
    try:
        return host.serve() if host.load() else 1
    except _GraderGone:  # end the fork server and a case stuck in a loop too, quietly
        os.killpg(0, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
