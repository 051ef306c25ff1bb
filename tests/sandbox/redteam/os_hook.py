"""Red team, the fork server: run code in it after every check of the import, and relay cases.

The fork server runs the policy's code: a hook its import registers runs there before every
fork, after the import was checked. This one (written by an outside red team against the first
version of the host) rewrites the case's seccomp filter in the memory of `agents.sandbox.isolation`
to allow sockets, and binds an abstract socket in the fork server; before each fork it drains what
earlier cases sent there, so each case is forked holding every earlier case's brief and first
tool result. A case that inherits anything ships, one that does not refunds. What stops it is
kernel state the policy's code cannot change: the fork server's own filter, taken before the
import (no bind, no listen), and the host's checks of each case from /proc.

The test (tests/sandbox/test_sandbox_protocol.py) copies this file beside its run; there is nothing
to bake in.
"""

import json
import os
import platform
import secrets
import socket
import sys

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here
LOG: list = []
STATE: dict = {}
ADDRESS = "\0finality-redteam-" + secrets.token_hex(6)


def _before() -> None:
    box = sys.modules.get("agents.sandbox.isolation")
    filters = sys.modules.get("agents.sandbox.seccomp")
    if box is not None and box._PREPARED and not STATE.get("patched"):
        allowed = tuple(name for name in filters.DENIED if name != "socket")
        box._PREPARED["case"] = box._filter(filters.seccomp_program(platform.machine(), allowed))
        STATE["patched"] = True
    if "listener" not in STATE:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(ADDRESS)
        listener.listen(64)
        listener.setblocking(False)
        STATE["listener"] = listener
    while True:
        try:
            conn, _ = STATE["listener"].accept()
        except BlockingIOError:
            return
        conn.settimeout(0.5)
        with conn:
            try:
                LOG.append(conn.recv(65536))
            except OSError:
                pass


os.register_at_fork(before=_before)


class Relay(Policy):
    name = "redteam_relay"

    def plan(self):
        learned = [entry for entry in LOG if entry]
        result = yield ("wait", {"ticks": 1})
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.connect(ADDRESS)
                conn.sendall(json.dumps({"brief": vars(self.brief), "result": result}).encode())
        except OSError:
            pass
        yield ("ship", {}) if learned else ("refund", {})
