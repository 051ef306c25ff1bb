"""The reference (docs/world.md section 8): the only code in the project that reads the truth.

It is told the fate of `cap1` and `t_det` (not the chargeback), acts at its first call, and is not
clairvoyant, so a refusing policy can beat it on `late_chargeback`. Its position does not depend on
the episode seed (faults touch only the replicas), so it is computed once per task and costs.
"""

from __future__ import annotations

from functools import lru_cache

from .economics import DEFAULT_COSTS, Costs, Outcome, outcome_of, price
from .tasks import HANDOVER_AT, Task
from .world import World


def oracle_plan(fate: str) -> tuple[tuple[str, dict], ...]:
    """The oracle's whole plan, from the card fate alone."""
    if fate == "settle":
        return (("ship", {}),)
    if fate == "fail_soft":
        return (("retry_capture", {"key": "fresh"}), ("ship", {}))
    if fate == "fail_hard":
        return (("close", {}),)
    raise ValueError(f"unknown fate {fate!r}")


@lru_cache(maxsize=4096)
def reference_outcome(task: Task) -> Outcome:
    world = World(task)
    now = HANDOVER_AT
    for tool, args in oracle_plan(task.fate):
        if tool == "retry_capture":
            world.retry(args["key"], now)
        else:
            world.dispose(tool, now)
        now += 1
    return outcome_of(world.log, task.order_value)


@lru_cache(maxsize=1 << 16)
def reference_position(task: Task, costs: Costs = DEFAULT_COSTS) -> int:
    return price(reference_outcome(task), costs).total
