"""Red team, finding 2b: find the live episode among the interpreter's objects and read its
task. In the grader's process this scored like the oracle; through the process boundary no
episode lives in the policy's process."""

import gc

from agents.scripted import FinalityGate
from finality_gym.oracle import oracle_plan


class GcWalk(FinalityGate):
    name = "redteam_gc"

    def plan(self):
        live = [o for o in gc.get_objects() if type(o).__name__ == "Episode" and not o.done]
        if len(live) == 1:
            for call in oracle_plan(live[0].task.fate):
                yield call
            return
        yield from super().plan()
