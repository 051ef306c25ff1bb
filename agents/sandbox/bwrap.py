"""The bubblewrap (`bwrap`) command line an outside policy's process runs under, the first layer
of the sandbox (`agents/sandbox/`): new user, pid, network, ipc, uts and cgroup namespaces, no
capability, a read-only filesystem of only the system, the interpreter, the repository's
`agents/` and `finality_gym/` and the policy's own code, and a bare environment. Also where
things are inside it (the policy's code, the scratch folder, the host's folder), which the
later layers and the host's checks go by, and whether bwrap can start a sandbox here at all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from .limits import FILE_MB
from ..spec import ROOT

SUBMISSION = "/submission"  # where a policy file is shown inside the sandbox
# A case's writable scratch space ($TMPDIR, $HOME), private to it. /tmp itself is read-only (it
# may hold the repository or the interpreter: a clone under /tmp must keep working).
SCRATCH = "/scratch"
# Where the host listens for its cases: a tmpfs of the host's, read-only to the policy's code.
HOSTDIR = "/run/finality"
CASE_ID = 1000  # the user and group the policy's process and its cases run as, inside

INSTALL = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install "
           "bubblewrap)")
USERNS = ("unprivileged user namespaces are disabled: allow them (Debian: sysctl -w "
          "kernel.unprivileged_userns_clone=1; Ubuntu 24.04 and later: sysctl -w "
          "kernel.apparmor_restrict_unprivileged_userns=0; elsewhere: sysctl -w "
          "user.max_user_namespaces=15000)")
HOW = ("or grade with --sandbox off, which runs outside policies without it (refused for "
       "--split private)")


@lru_cache(maxsize=1)
def unavailable() -> str | None:
    """None where the sandbox can run here; else what is missing and how to get it."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return f"the sandbox needs bubblewrap, and no bwrap is on PATH: {INSTALL}, {HOW}"
    probe = subprocess.run([bwrap, "--unshare-all", "--cap-drop", "ALL", *_system_binds(),
                            "--proc", "/proc", "--dev", "/dev", "--", "/bin/sh", "-c",
                            "exec true"], capture_output=True, text=True)
    if probe.returncode != 0:
        said = probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else "no message"
        return f"bwrap cannot start a sandbox here ({said}): {USERNS}, {HOW}"
    return None


def _system_binds() -> list[str]:
    """The system's programs and libraries, read-only; the merged-/usr links as links."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    for name in ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives"):
        args += ["--ro-bind-try", name, name]
    return args


def command(argv: list[str], shown: dict[str, str], env: dict[str, str]) -> list[str]:
    """`argv` under bwrap, seeing only the system, the interpreter, the repository's code and
    `shown` (a path outside -> its path inside), with only `env`."""
    args = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--die-with-parent",
            "--new-session", "--cap-drop", "ALL", "--uid", str(CASE_ID), "--gid", str(CASE_ID),
            *_system_binds()]
    for prefix in dict.fromkeys((sys.base_prefix, sys.prefix)):  # the interpreter, the venv
        args += ["--ro-bind", prefix, prefix]
    for code in ("agents", "finality_gym"):
        args += ["--ro-bind", str(ROOT / code), str(ROOT / code)]
    for outside, inside in shown.items():
        args += ["--ro-bind", outside, inside]
    size = ["--size", str(FILE_MB << 20)] if sizes_tmpfs() else []
    args += ["--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", SCRATCH, *size, "--tmpfs",
             "/dev/shm", "--tmpfs", HOSTDIR, "--remount-ro", SCRATCH, "--remount-ro",
             "/dev/shm", "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/",
             "--clearenv"]
    for key, value in {**env, "TMPDIR": SCRATCH, "HOME": SCRATCH,
                       "FINALITY_SANDBOX": "1"}.items():
        args += ["--setenv", key, value]
    return [*args, "--", *argv]


def tmpfs_options() -> bytes:
    """A case's writable place's tmpfs: open to the case's user, size-capped where bwrap caps
    one."""
    return (f"size={FILE_MB}m,mode=1777" if sizes_tmpfs() else "mode=1777").encode()


@lru_cache(maxsize=1)
def sizes_tmpfs() -> bool:
    """Whether this bwrap caps a tmpfs's size (`--size`, bubblewrap 0.8 and later)."""
    shown = subprocess.run([shutil.which("bwrap") or "bwrap", "--help"], capture_output=True,
                           text=True)
    return "--size" in shown.stdout + shown.stderr


def shown_for(target: str, source: Path) -> tuple[dict[str, str], str, str, list[str],
                                                  tuple[str, str] | None]:
    """What the sandbox shows of a policy: (the binds, its target and source file as seen
    inside, the import path to add, and the (inside, outside) prefix that names its files in
    messages). A file is shown alone, as `/submission/NAME.py`; a module with its whole
    top-level package (or module file) under `/submission`, which goes on the import path; the
    repository's own `agents` and `finality_gym` are shown anyway, where they are."""
    if target.endswith(".py"):
        inside = f"{SUBMISSION}/{source.name}"
        return {str(source): inside}, inside, inside, [], (inside, str(source))
    parts = target.split(".")
    depth = len(parts) if source.name != "__init__.py" else len(parts) + 1
    entry = source.parents[depth - 1]
    if entry == ROOT and parts[0] in ("agents", "finality_gym"):
        return {}, target, str(source), [], None
    if parts[0] in ("agents", "finality_gym", *sys.stdlib_module_names) or parts[0] in sys.modules:
        # Shown first on the import path, such a package would stand in for the module the
        # host imports under that name: the host that relays and isolates the cases would run
        # the policy's code.
        raise ValueError(f"{target}: a policy's package may not be named {parts[0]!r}, the "
                         "name of the sandbox's own code, of the standard library or of a "
                         "module the grader imports")
    top = entry / parts[0]
    top = top if top.is_dir() else top.with_suffix(".py")
    inside = f"{SUBMISSION}/{source.relative_to(entry)}"
    return ({str(top): f"{SUBMISSION}/{top.name}"}, target, inside, [SUBMISSION],
            (SUBMISSION, str(entry)))
