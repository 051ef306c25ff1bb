"""Red team, the operating system: signal another process of the same user.

- `KillParent`: `SIGKILL` to the process the case was forked from (`os.getppid()`: unsandboxed,
  the policy's host or the process of the host's that forks its cases), and first to the host
  above it, if the parent is not the host itself (the topmost process up from the parent running
  `agents.sandbox.host`, found through `/proc`: the host, which speaks to the grader, would
  otherwise tell it at once that its case's parent died, before this case could say that its kill
  worked). It worked if the parent is gone afterwards (this process was handed to another
  parent); a signal the kernel accepts but drops (to the init of a pid namespace) did not work.
  A parent id of 0 (a parent outside this process's pid namespace) is not signalled: that would
  be `kill(0)`, this process's own group.
- `KillGrader`: `SIGKILL` to the grader, found through `/proc`: the first process up the chain of
  `eval headline` processes (a worker's parent is the grader) whose command line holds `GRADER`,
  the text the test bakes into `CONFIG` (its own folder: without it nothing is signalled, so no
  one else's run can be hit). It worked if that process is gone (or a zombie) afterwards.

Each ships when its kill worked and refunds when it did not. Unsandboxed, the first case's kill
ends the run: the host's death makes the next case fail; the grader's death ends the command.
"""

import os
import signal
import time

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here


def host_above(pid: int) -> int | None:
    """The topmost process from `pid` up that runs the policy's host (`agents.sandbox.host`), or
    None: none of them can be seen."""
    found = None
    while pid > 1:
        try:
            argv = _argv(pid)
            up = _parent(pid)
        except OSError:  # no /proc, a process gone
            break
        if "agents.sandbox.host" not in argv:
            break
        found, pid = pid, up
    return found


def kill_parent() -> bool:
    parent = os.getppid()
    if parent <= 0:
        return False
    host = host_above(parent)
    if host is not None and host != parent:
        os.kill(host, signal.SIGKILL)
    os.kill(parent, signal.SIGKILL)
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        if os.getppid() != parent:
            return True
        time.sleep(0.01)
    return False


def _argv(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[1])


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def grader() -> int | None:
    """The grader's pid, or None: the topmost `eval headline` process holding GRADER."""
    needle = CONFIG.get("GRADER")
    if not needle:
        return None

    def is_grader(pid: int) -> bool:
        try:
            argv = _argv(pid)
        except OSError:
            return False
        ran = any(argv[i:i + 2] == ["eval", "headline"] for i in range(len(argv)))
        return ran and any(needle in a for a in argv)

    for name in os.listdir("/proc"):  # no /proc: raises
        if name.isdigit() and int(name) != os.getpid() and is_grader(int(name)):
            pid = int(name)
            while True:  # up to the topmost: a pool worker's parent is the grader
                try:
                    up = _parent(pid)
                except OSError:
                    break
                if up <= 1 or not is_grader(up):
                    break
                pid = up
            return pid
    return None


def kill_grader() -> bool:
    pid = grader()
    if pid is None:
        return False
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.01)
    return False


class _Attack(Policy):
    attempt = staticmethod(lambda: False)

    def plan(self):
        try:
            worked = self.attempt()
        except Exception:  # noqa: BLE001 - no /proc, EPERM, ESRCH: it did not work
            worked = False
        yield ("ship", {}) if worked else ("refund", {})


class KillParent(_Attack):
    name = "redteam_os_kill_parent"
    attempt = staticmethod(kill_parent)


class KillGrader(_Attack):
    name = "redteam_os_kill_grader"
    attempt = staticmethod(kill_grader)
