"""Red team, the operating system: start a process that outlives every case, and count cases
with it.

`IMPORT`: the import double-forks a small server (the check of what an import left looked at
threads, descriptors, mappings and handlers, not processes); `AT_FORK`: the import registers a
hook that starts it when the first case is forked, after every check of the import. The server
listens on an abstract socket and answers each connection with a count: every case of the worker
shares one network namespace and reaches it. A case that gets an answer ships, one that does not
refunds; a case played while the server runs is one of many that a process can number (with the
job order, that narrows down the task; a twin pair's halves can be paired).

The test (tests/sandbox/test_sandbox.py) copies this file beside its run and bakes `TOKEN` (the
socket's name part), `MODE` (`IMPORT` or `AT_FORK`), `PIDS` (a file the server writes its pid to)
and `LIFE` (seconds the server lives) into `CONFIG`.
"""

import os
import socket
import time

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here
ADDRESS = "\0finality-redteam-" + CONFIG.get("TOKEN", "default")


def serve() -> None:
    """Double-fork a server that lives `LIFE` seconds; return in the caller at once."""
    if os.fork():
        return
    if os.fork():
        os._exit(0)
    try:
        with open(CONFIG["PIDS"], "a") as pids:
            pids.write(f"{os.getpid()}\n")
    except OSError:
        pass
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(ADDRESS)
    server.listen(8)
    server.settimeout(1.0)
    count, until = 0, time.monotonic() + CONFIG.get("LIFE", 30)
    while time.monotonic() < until:
        try:
            conn, _ = server.accept()
        except OSError:
            continue
        count += 1
        conn.sendall(str(count).encode())
        conn.close()
    os._exit(0)


if CONFIG.get("MODE") == "IMPORT":
    serve()
    time.sleep(0.2)  # the server is up before the first case
elif CONFIG.get("MODE") == "AT_FORK":
    _started = []
    os.register_at_fork(after_in_parent=lambda: _started or (_started.append(1), serve()))


def count() -> int | None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(2)
            conn.connect(ADDRESS)
            return int(conn.recv(16))
    except (OSError, ValueError):
        return None


class Daemon(Policy):
    name = "redteam_daemon"

    def plan(self):
        yield ("ship", {}) if count() else ("refund", {})
