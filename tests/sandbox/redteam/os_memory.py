"""Red team, the operating system: a memory hog.

A case allocates `GIB` GiB (baked into `CONFIG` by the test: 1 unsandboxed, 8 sandboxed) in
`bytearray`s of 64 MiB, writes a byte in every page so that it is really held, and ships once it
holds all of it. A `MemoryError` is not caught: the case ends with an error, which the grader
reports naming the policy, the task and the seed. Only the cases whose brief's order value is
`ORDER_VALUE` hog (the others refund at once; without it every case hogs), so that the
unsandboxed run stays short.
"""

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here
CHUNK = 64 << 20
PAGE = 4096


def hog(gib: float) -> int:
    """Allocate and touch `gib` GiB; the bytes held."""
    held = []
    total = 0
    while total < gib * (1 << 30):
        chunk = bytearray(CHUNK)  # past an address-space limit: MemoryError
        chunk[::PAGE] = b"\x01" * len(range(0, CHUNK, PAGE))
        held.append(chunk)
        total += CHUNK
    return total


class MemoryHog(Policy):
    name = "redteam_os_memory"

    def plan(self):
        if CONFIG.get("ORDER_VALUE") in (None, self.brief.order_value):
            hog(float(CONFIG.get("GIB", 1)))
            yield ("ship", {})
        else:
            yield ("refund", {})
