"""Red team, the operating system: a shared mapping that the checks called harmless.

The checks after the import and of every case refused shared mappings that were writable: one
mapped shared and read-only passed them, and a case can make it writable (mprotect). Made at
import (`MODE` "IMPORT"), or by a hook the import leaves in the fork server, which maps it
before the first fork, after the import was checked (`MODE` "AT_FORK"), it is every case's:
each case makes it writable, reads the count of the cases before it and adds one (an outside
red team counted 148 of 150 cases this way). A case that finds a count ships, one that does not
refunds.

The test (tests/sandbox/test_shared_channels.py) copies this file beside its run and bakes `MODE`
into `CONFIG`.
"""

import ctypes
import mmap
import os

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long)
SHARED: list = []  # the page's address, once mapped


def _map() -> None:
    """One page, anonymous, shared and read-only: every process forked from here holds it."""
    if not SHARED:
        address = _libc.mmap(None, mmap.PAGESIZE, mmap.PROT_READ,
                             mmap.MAP_SHARED | mmap.MAP_ANONYMOUS, -1, 0)
        if address is not None and address != ctypes.c_void_p(-1).value:
            SHARED.append(address)


if CONFIG["MODE"] == "IMPORT":
    _map()
else:
    os.register_at_fork(before=_map)


class Counter(Policy):
    name = "redteam_shared_counter"

    def plan(self):
        seen = 0
        if SHARED and _libc.mprotect(ctypes.c_void_p(SHARED[0]), ctypes.c_size_t(mmap.PAGESIZE),
                                     mmap.PROT_READ | mmap.PROT_WRITE) == 0:
            count = ctypes.c_long.from_address(SHARED[0])
            seen = count.value
            count.value += 1
        yield ("ship", {}) if seen else ("refund", {})
