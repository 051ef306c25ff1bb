"""Red team, the operating system: leave a process behind.

A case detaches a process (fork, `setsid`, fork again; the middle process exits, so the last one
belongs to no one's session or process group: killing the policy's host's group misses it; its
standard streams go to /dev/null and it closes every other descriptor, so no pipe of the
grader's waits on it). It ships if the detached process started, refunds if it did not:

- `EditsResultsLater`: the process waits until the run is over (its `report.md` and last figure
  written, then `DELAY` seconds), then appends a line to the results folder's `episodes.jsonl`;
  it gives up `LIFE` seconds after it started. Only cases whose brief's order value is
  `ORDER_VALUE` detach one (the others refund; without it every case does), to keep the
  processes few.
- `AbstractSocket`: a case first connects to the abstract unix socket `@finality-redteam-TOKEN`
  and ships if the process there answers `here`; if none answers, it binds the socket, hands it
  to a detached process that answers every connection for `LIFE` seconds, and refunds. So with
  processes that outlive their case and one network namespace for all cases, every case of a
  worker but the first (and one every `LIFE` seconds) ships.

The test (tests/sandbox/test_sandbox.py) copies this file beside its run and bakes into `CONFIG`:
`RESULTS` (the results folder: the only folder a process of this file writes in; without it
none is detached), `TOKEN`, `PIDS` (a file under the test's folder each detached process
appends its pid to, so that the test can end a leftover by its id), `ORDER_VALUE`, `DELAY`,
`LIFE`.
Every detached process exits by itself.
"""

import os
import socket
import time

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here


def _quiet(keep: tuple[int, ...] = ()) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def _note_pid() -> None:
    if CONFIG.get("PIDS"):
        try:
            with open(CONFIG["PIDS"], "a") as f:
                f.write(f"{os.getpid()}\n")
        except OSError:
            pass


def detach(work, keep: tuple[int, ...] = ()) -> bool:
    """Run `work` in a detached process; whether it started. A fork that fails raises."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setsid()
            if os.fork() == 0:
                try:
                    _quiet(keep)
                    _note_pid()
                    work()
                finally:
                    os._exit(0)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _edit_results_later() -> None:
    results = CONFIG["RESULTS"]
    started = time.monotonic()
    life = float(CONFIG.get("LIFE", 60))
    report = os.path.join(results, "report.md")
    while not os.path.exists(report):
        if time.monotonic() - started > life:
            return
        time.sleep(0.1)
    figure = os.path.join(results, "paired_halves.png")  # written last
    written = time.monotonic()
    while not os.path.exists(figure) and time.monotonic() - written < 10:
        time.sleep(0.1)
    time.sleep(float(CONFIG.get("DELAY", 3)))
    with open(os.path.join(results, "episodes.jsonl"), "a") as f:
        f.write('{"policy": "planted after the run"}\n')


class EditsResultsLater(Policy):
    name = "redteam_os_edits_later"

    def plan(self):
        worked = False
        if CONFIG.get("RESULTS") and CONFIG.get("ORDER_VALUE") in (None, self.brief.order_value):
            try:
                worked = detach(_edit_results_later)
            except Exception:  # noqa: BLE001 - no fork: it did not work
                worked = False
        yield ("ship", {}) if worked else ("refund", {})


def _address() -> str:
    return "\0finality-redteam-" + CONFIG.get("TOKEN", "default")


def _serve(listener: socket.socket) -> None:
    listener.settimeout(0.2)
    deadline = time.monotonic() + float(CONFIG.get("LIFE", 10))
    while time.monotonic() < deadline:
        try:
            conn, _ = listener.accept()
        except OSError:  # the timeout
            continue
        with conn:
            try:
                conn.sendall(b"here")
            except OSError:
                pass


def _reached() -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(2)
            conn.connect(_address())
            return conn.recv(4) == b"here"
    except OSError:
        return False


def _leave_listener() -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(_address())
        listener.listen(64)
        detach(lambda: _serve(listener), keep=(listener.fileno(),))
    finally:
        listener.close()


class AbstractSocket(Policy):
    name = "redteam_os_abstract_socket"

    def plan(self):
        reached = _reached()
        if not reached and CONFIG.get("TOKEN"):
            try:
                _leave_listener()
            except Exception:  # noqa: BLE001 - no socket, no fork: nothing left behind
                pass
        yield ("ship", {}) if reached else ("refund", {})
