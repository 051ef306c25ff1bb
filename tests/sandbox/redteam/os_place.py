"""Red team, the job order: a case that counts the cases before it in its sandbox.

Each worker keeps one sandbox for a run, and its process ids count: the host is pid 2 of the
sandbox's pid namespace, a chunk's fork server takes one id, and every case two (the fork
server's child that starts it, and the case itself, pid 1 of a namespace of its own but with an
id in the sandbox's too). A hook the import leaves runs in that child and keeps its id, which
the case inherits: `(id - 3) // (2 * CHUNK + 1)` is the chunk the case belongs to. Were chunks
consecutive slices of the job order (public: policy, task, seed in corpus order), that would
name the jobs a case can be: this policy escalates in the cases that count themselves in chunk
`CONFIG["CHUNK_INDEX"]` and refunds in the others, so the rows show which jobs it found.

The test (tests/sandbox/test_private_leaks.py) copies this file beside its run with CHUNK (the
grader's chunk size) and CHUNK_INDEX baked in.
"""

import os

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here
FORKED: list = []  # the id, in the sandbox's pid namespace, of the child that started the case
os.register_at_fork(after_in_child=lambda: FORKED.append(os.getpid()))


class Place(Policy):
    name = "redteam_place"

    def plan(self):
        chunk = (FORKED[0] - 3) // (2 * CONFIG["CHUNK"] + 1)
        yield ("escalate", {}) if chunk == CONFIG["CHUNK_INDEX"] else ("refund", {})
