"""Red team, the operating system: a fork bomb, bounded.

Every case forks `CHILDREN` children (the test bakes a small number into `CONFIG`; never more
than `MOST`), all alive at once: each waits on a pipe until the last one has been forked, then
exits at once; the case reaps them all. No child forks again or runs anything else. It ships if
at least one fork worked, refunds if none did (a sandbox must make `fork` fail with an error, not
end the case).
"""

import os

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here
MOST = 200


def bomb() -> int:
    """How many children were forked."""
    wanted = min(int(CONFIG.get("CHILDREN", 8)), MOST)
    read, write = os.pipe()
    children = []
    try:
        for _ in range(wanted):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                try:
                    os.close(write)
                    os.read(read, 1)  # until every sibling exists: EOF once the case lets go
                finally:
                    os._exit(0)
            children.append(pid)
    finally:
        os.close(write)
        os.close(read)
        for pid in children:
            os.waitpid(pid, 0)
    return len(children)


class ForkBomb(Policy):
    name = "redteam_os_fork"

    def plan(self):
        try:
            forked = bomb()
        except Exception:  # noqa: BLE001 - no pipe, no fork: it did not work
            forked = 0
        yield ("ship", {}) if forked else ("refund", {})
