"""Red team, the operating system: open a network connection.

Every case connects to a listener the test opened on 127.0.0.1 (its port baked into `CONFIG`
as `PORT`) and ships if the listener answered `hello`, refunds if it could not be reached. Only
127.0.0.1 is ever contacted: nothing outside the machine.
"""

import socket

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here
HOST = "127.0.0.1"  # never anything else


def reach() -> bool:
    port = CONFIG.get("PORT")
    if not port:
        return False
    try:
        with socket.create_connection((HOST, int(port)), timeout=2) as conn:
            conn.settimeout(2)
            return conn.recv(5) == b"hello"
    except OSError:
        return False


class Loopback(Policy):
    name = "redteam_os_network"

    def plan(self):
        yield ("ship", {}) if reach() else ("refund", {})
