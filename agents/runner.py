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


_SAMPLER_SALT = 0x6A09E667F3BCC909


def brief_for(task: Task, seed: int, probe: str) -> Brief:
    """The case brief: no task id, archetype, fate or t_det. Its sampler seed is a function of
    what the brief already says (the order value) and the episode seed alone, so it is the same
    for both halves of a twin pair and no policy can map it back to a task: the corpus ships with
    the package, so a seed derived from anything task-specific (the fault key, say) would name
    the task to a policy that recomputes it for every task."""
    return Brief(order_value=task.order_value, handover_at=HANDOVER_AT, ship_by=SHIP_BY,
                 horizon=HORIZON, budget=CALL_BUDGET, probe=probe,
                 seed=mix64(_SAMPLER_SALT ^ (task.order_value << 20) ^ seed) & 0x7FFFFFFF)


def play(policy: Policy, task: Task, seed: int, faults: FaultProfile | None = None,
         probe: str = "full", costs: Costs | None = None) -> Episode:
    """One episode of `policy` to its end; returns the ended `Episode` (to draw it, say)."""
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
    return episode


def run_episode(policy: Policy, task: Task, seed: int, faults: FaultProfile | None = None,
                probe: str = "full", costs: Costs | None = None) -> EpisodeRecord:
    return play(policy, task, seed, faults, probe, costs).record()
