"""Red team, the host: a module of the policy's that Python imports by name on its own.

Python imports some modules by name without being asked: `sitecustomize` when the interpreter
starts, `org` when the standard library's `copy` is imported (a Jython fallback), and more. A
policy whose module or package has such a name, and whose files stand first on the host's
import path, runs in the host, which hands every case its brief. This module, imported there,
wraps `json.dumps` so that each brief the host sends says, in its `seed`, how many cases came
before it (a case that is told could be told anything the host saw). A case that is told
(a negative seed) ships; one that is not refunds. Imported where it should be, in the fork
server only, it changes nothing of a brief: every case refunds.

The test (tests/sandbox/test_private_leaks.py) installs this file as `sitecustomize.py` and as
`org/__init__.py` in a bundle; there is nothing to bake in.
"""

import json

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here
SEEN: list = []


def _telling(dumps):
    def told(obj, *args, **kwargs):
        if isinstance(obj, dict) and isinstance(obj.get("episode"), dict):
            brief = obj["episode"]
            if SEEN:
                obj = {**obj, "episode": {**brief, "seed": -len(SEEN)}}
            SEEN.append(brief["order_value"])
        return dumps(obj, *args, **kwargs)
    told.telling = True
    return told


if not getattr(json.dumps, "telling", False):
    json.dumps = _telling(json.dumps)


class Told(Policy):
    name = "redteam_host_import"

    def plan(self):
        yield ("ship", {}) if self.brief.seed < 0 else ("refund", {})
