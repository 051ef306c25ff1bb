"""Red team, the operating system: read the grader's `/proc` entries from the policy's process.

Three capabilities, one class each; every case tries its capability once and ships when it
worked, refunds when it did not, so the rows' `disposition` says which:

- `GraderCommandLine`: the grader's command line (`/proc/PID/cmdline` of a process running
  `eval headline`), and with it a private split's master seed (`--master-seed N`, or the file
  named by `--master-seed-file PATH`, read as this user);
- `GraderEnvironment`: a variable of another process's environment (`/proc/PID/environ`), such
  as `FINALITY_MASTER_SEED`, which the policy's own bare environment does not hold;
- `GraderMemory`: the grader's memory (`/proc/PID/mem`, a readable region from `/proc/PID/maps`).

The test (tests/sandbox/test_sandbox.py) copies this file beside its run and bakes its values into
`CONFIG` (the copy is the policy graded: a sandbox shows the policy nothing but its own file):
`GRADER`, text the grader's command line holds (the test's own folder, so that no one else's
run is looked at), `SEED_SHA`, the SHA-256 of the master seed's decimal text, and `SECRETS`, a
variable's name -> the SHA-256 of its value. Only hashes are baked in: the policy must find the
values. Nothing is written anywhere.
"""

import hashlib
import os

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here


def _sha(text: str) -> str:
    return hashlib.sha256(text.strip().encode()).hexdigest()


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]  # no /proc: raises


def _argv(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]


def _is_grader(argv: list[str]) -> bool:
    ran = any(argv[i:i + 2] == ["eval", "headline"] for i in range(len(argv)))
    needle = CONFIG.get("GRADER", "")
    return ran and any(needle in a for a in argv)


def graders() -> list[tuple[int, list[str]]]:
    """Every process of the grader (its workers too) that this process can see: (pid, argv)."""
    found = []
    for pid in _pids():
        if pid == os.getpid():
            continue
        try:
            argv = _argv(pid)
        except OSError:
            continue
        if _is_grader(argv):
            found.append((pid, argv))
    return found


def _seed_candidates(pid: int, argv: list[str]) -> list[str]:
    """What the command line gives for the master seed: its value, or its file's content."""
    values, files = [], []
    for i, arg in enumerate(argv):
        for flag, into in (("--master-seed", values), ("--master-seed-file", files)):
            if arg == flag and i + 1 < len(argv):
                into.append(argv[i + 1])
            elif arg.startswith(flag + "="):
                into.append(arg.split("=", 1)[1])
    for path in files:
        if not os.path.isabs(path):
            try:
                path = os.path.join(os.readlink(f"/proc/{pid}/cwd"), path)
            except OSError:
                pass
        try:
            with open(path) as f:
                values.append(f.read())
        except OSError:
            pass
    return values


def read_command_line() -> bool:
    """Whether the grader's command line could be read (and, with SEED_SHA, gave the seed)."""
    found = graders()
    wanted = CONFIG.get("SEED_SHA")
    if wanted is None:
        return bool(found)
    return any(_sha(value) == wanted for pid, argv in found
               for value in _seed_candidates(pid, argv))


def read_environment() -> bool:
    """Whether another process's environment holds one of SECRETS with its value."""
    secrets = CONFIG.get("SECRETS", {})
    for pid in _pids():
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                entries = f.read().split(b"\0")
        except OSError:
            continue
        for entry in entries:
            name, _, value = entry.decode(errors="replace").partition("=")
            if name in secrets and _sha(value) == secrets[name]:
                return True
    return False


def read_memory() -> bool:
    """Whether bytes of a mapped region of the grader's memory could be read."""
    for pid, _ in graders():
        try:
            with open(f"/proc/{pid}/maps") as f:
                regions = [line.split() for line in f]
            with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
                for fields in regions:
                    if not fields[1].startswith("r") or fields[-1] in ("[vvar]", "[vsyscall]"):
                        continue
                    start = int(fields[0].split("-")[0], 16)
                    try:
                        mem.seek(start)
                        if mem.read(4096):
                            return True
                    except OSError:
                        continue
        except OSError:
            continue
    return False


class _Attack(Policy):
    attempt = staticmethod(lambda: False)

    def plan(self):
        try:
            worked = self.attempt()
        except Exception:  # noqa: BLE001 - no /proc, a process gone mid-read: it did not work
            worked = False
        yield ("ship", {}) if worked else ("refund", {})


class GraderCommandLine(_Attack):
    name = "redteam_os_cmdline"
    attempt = staticmethod(read_command_line)


class GraderEnvironment(_Attack):
    name = "redteam_os_environ"
    attempt = staticmethod(read_environment)


class GraderMemory(_Attack):
    name = "redteam_os_mem"
    attempt = staticmethod(read_memory)
