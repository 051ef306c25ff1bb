"""Red team, the import's memory: a case has an address-space limit, and the import ran before
it had one. An outside red team's import touched 3 GiB, and `eval verify` accepted the entry;
each chunk's fork server imports again, so a small bundle could take the machine's memory.

This policy's import reserves more address space than a case may have (`CONFIG["MB"]`, without
touching it: MAP_NORESERVE, so the machine lends it whatever its memory). Every case escalates
where the reservation was granted and refunds where it was refused.

The test (tests/sandbox/test_private_leaks.py) copies this file beside its run with MB baked in.
"""

import ctypes

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
PROT_READ, MAP_PRIVATE, MAP_ANONYMOUS, MAP_NORESERVE = 1, 0x02, 0x20, 0x4000
RESERVED = _libc.mmap(None, CONFIG["MB"] << 20, PROT_READ,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
GRANTED = RESERVED not in (None, ctypes.c_void_p(-1).value)


class ImportMemory(Policy):
    name = "redteam_import_memory"

    def plan(self):
        yield ("escalate", {}) if GRANTED else ("refund", {})
