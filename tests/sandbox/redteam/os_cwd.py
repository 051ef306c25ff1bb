"""Red team, a case's working directory: a case's starter mounts the case's fresh scratch folder
over the fork server's own, and changes into it. An outside red team's import replaced the
starter's mount step so that it changed into the scratch folder before the fresh one covered
it, and kept it there: every case of the chunk then worked in the fork server's own folder,
beneath its fresh one, and read what the cases before it had written (their probe answers).

This policy does the same: each case reads a file in its working directory, escalates where an
earlier case left one, refunds where none is there, and leaves one for the next.

The test (tests/sandbox/test_private_leaks.py) copies this file beside its run; there is nothing to
bake in.
"""

import os

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here

try:
    from agents.sandbox import isolation
    _mount = isolation._fresh_places

    def _fresh_places(options: bytes) -> None:
        try:
            os.chdir(isolation.SCRATCH)  # the fork server's own, about to be covered
        except OSError:
            pass
        try:
            _mount(options)
        finally:
            isolation.SCRATCH = "."  # the starter's change into the fresh one changes nothing

    isolation._fresh_places = _fresh_places
except ImportError:
    pass


def _told() -> bool:
    try:
        with open("relay") as earlier:
            told = bool(earlier.read())
    except OSError:
        told = False
    try:
        with open("relay", "a") as later:
            later.write("a case was here;")
    except OSError:
        pass
    return told


class Cwd(Policy):
    name = "redteam_cwd"

    def plan(self):
        yield ("escalate", {}) if _told() else ("refund", {})
