"""Red team, finding 1: recompute every task's brief from the shipped corpus and look the case
up. Under the old brief (a seed derived from the task's fault key) this named the task and
scored like the oracle; now the brief says only what it shows, and this plays the gate."""

from agents import brief_for
from agents.scripted import FinalityGate
from finality_gym import PROBE_ARMS, SPLITS, load_corpus
from finality_gym.oracle import oracle_plan

FATES: dict = {}  # every brief the grader can hand out -> the card fates behind it
for split in SPLITS:
    for task in load_corpus(split).tasks:
        for seed in range(5):
            for probe in PROBE_ARMS:
                FATES.setdefault(brief_for(task, seed, probe), set()).add(task.fate)


class Lookup(FinalityGate):
    name = "redteam_lookup"

    def plan(self):
        fates = FATES.get(self.brief, set())
        if len(fates) == 1:  # the brief pins the card's fate: act like the oracle
            for call in oracle_plan(next(iter(fates))):
                yield call
            return
        yield from super().plan()
