"""Red team, finding 2a: walk up the call stack to the grader's runner and read the episode's
task. In the grader's process this scored like the oracle; through the process boundary there
is no such frame."""

import sys

from agents.scripted import FinalityGate
from finality_gym.oracle import oracle_plan


def _fate_from_frames():
    frame = sys._getframe()
    while frame is not None:
        for value in frame.f_locals.values():
            task = getattr(value, "task", value)
            fate = getattr(task, "fate", None)
            if isinstance(fate, str) and hasattr(task, "t_det"):
                return fate
        frame = frame.f_back
    return None


class Frames(FinalityGate):
    name = "redteam_frames"

    def plan(self):
        fate = _fate_from_frames()
        if fate is not None:
            for call in oracle_plan(fate):
                yield call
            return
        yield from super().plan()
