"""The one runner every policy goes through, scripted or learned; the grader calls it.

It is the only place that hands a `Privilege` out, and only to a policy whose class declares
itself privileged (the reference oracle).
"""

from __future__ import annotations

from finality_gym import Episode, EpisodeRecord, FaultProfile, Task
from finality_gym.economics import Costs
from finality_gym.faults import mix64
from finality_gym.tasks import CALL_BUDGET, HANDOVER_AT, HORIZON, SHIP_BY

from .base import Brief, GiveUp, Policy, Privilege


def brief_for(task: Task, seed: int, probe: str) -> Brief:
    """The case brief: no archetype, no fate, no t_det; identical for the halves of a twin pair."""
    return Brief(order_value=task.order_value, handover_at=HANDOVER_AT, ship_by=SHIP_BY,
                 horizon=HORIZON, budget=CALL_BUDGET, probe=probe,
                 seed=mix64(task.fault_key ^ seed) & 0x7FFFFFFF)


def run_episode(policy: Policy, task: Task, seed: int, faults: FaultProfile | None = None,
                probe: str = "full", costs: Costs | None = None) -> EpisodeRecord:
    episode = Episode(task, seed=seed, faults=faults, probe=probe, costs=costs)
    policy.reset(brief_for(task, seed, probe))
    if type(policy).privileged:
        policy.grant(Privilege(task.fate, task.t_det))
    result = None
    call = episode.call
    while not episode.done:
        try:
            tool, args = policy.act(result)
        except GiveUp:
            episode.lapse()
            break
        result = call(tool, **args)
    return episode.record()
