"""Red team, memorization: recognize a published task by re-running the engine.

Everything this needs is in the sandbox, by design: the corpus, the engine, `brief_for`. The brief
names no task, but its sampler seed is a function of the order value and the episode seed alone,
so the episode seed is found by trying each; then the case reads three systems, re-plays every
published task (public and regenerated) with the brief's order value through the same three
reads under that seed, and keeps those whose results match. When they agree on the card's fate
it plays the reference's plan; otherwise it plays the finality gate. On a published split this
beats the gate (a public split is memorizable by design: its grades are development figures);
on a private split no published task matches, and it gains nothing.
"""

import json

from agents.scripted import FinalityGate
from finality_gym import SPLITS, load_corpus
from finality_gym.episode import Episode
from finality_gym.faults import mix64
from finality_gym.oracle import oracle_plan
from finality_gym.policy import _SAMPLER_SALT

READS = ("read_processor", "read_ledger", "read_erp")
PUBLISHED: dict[int, list] = {}  # order value -> the published tasks with it
for split in SPLITS:
    for task in load_corpus(split).tasks:
        PUBLISHED.setdefault(task.order_value, []).append(task)


def episode_seed(order_value: int, sampler_seed: int) -> int | None:
    for seed in range(100):
        if mix64(_SAMPLER_SALT ^ (order_value << 20) ^ seed) & 0x7FFFFFFF == sampler_seed:
            return seed
    return None


def _same(results: list) -> str:
    return json.dumps(results, sort_keys=True)


class Memorize(FinalityGate):
    name = "redteam_memorize"

    def plan(self):
        seen = []
        for tool in READS:
            seen.append((yield (tool, {})))
        seed = episode_seed(self.brief.order_value, self.brief.seed)
        fates = set()
        for task in PUBLISHED.get(self.brief.order_value, []) if seed is not None else []:
            episode = Episode(task, seed=seed, probe=self.brief.probe)
            if _same([episode.call(tool) for tool in READS]) == _same(seen):
                fates.add(task.fate)
        if len(fates) == 1:
            for call in oracle_plan(fates.pop()):
                yield call
            return
        yield from super().plan()
