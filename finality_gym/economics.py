"""The economics of docs/world.md section 7: a position read off the canonical log alone.

The four deductions are disjoint, so a loss breakdown always sums to the total:
position = cash - cogs - liability - dispute - escalation.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Iterable

from .records import check_keys


@dataclass(frozen=True, slots=True)
class Costs:
    """The cost constants the sensitivity sweep varies. `cogs_fraction` is applied in basis
    points with half-up rounding, so the cost of goods is an exact integer number of cents."""

    cogs_fraction: float = 0.6
    dispute_fee: int = 2500
    escalation_fee: int = 1800

    def __post_init__(self) -> None:
        if isinstance(self.cogs_fraction, bool) or not isinstance(self.cogs_fraction, (int, float)):
            raise ValueError(f"cogs_fraction must be a number in [0, 1], got {self.cogs_fraction!r}")
        if not 0.0 <= self.cogs_fraction <= 1.0:
            raise ValueError(f"cogs_fraction must lie in [0, 1], got {self.cogs_fraction!r}")
        for name in ("dispute_fee", "escalation_fee"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"{name} must be a non-negative int of cents, got {value!r}")
        object.__setattr__(self, "cogs_fraction", float(self.cogs_fraction))

    def cogs(self, order_value: int) -> int:
        bps = round(self.cogs_fraction * 10000)
        return (order_value * bps + 5000) // 10000

    def to_dict(self) -> dict:
        return {"cogs_fraction": self.cogs_fraction, "dispute_fee": self.dispute_fee,
                "escalation_fee": self.escalation_fee}

    @classmethod
    def from_dict(cls, data: dict) -> Costs:
        """The costs whose `to_dict` is `data` (a run.json's `costs`); anything else is refused,
        saying why, rather than read as other costs (the types are checked on construction)."""
        if not isinstance(data, dict):
            raise ValueError(f"costs are a dict (Costs.to_dict), got {data!r}")
        check_keys(data, (f.name for f in fields(cls)), "costs")
        return cls(**data)


DEFAULT_COSTS = Costs()


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the position is computed from; enough to re-price an episode under other costs."""

    order_value: int
    cash: int
    goods_left: bool
    escalated: bool


@dataclass(frozen=True, slots=True)
class Position:
    cash: int
    cogs: int
    liability: int
    dispute: int
    escalation: int

    @property
    def total(self) -> int:
        return self.cash - self.cogs - self.liability - self.dispute - self.escalation


def outcome_of(log: Iterable, order_value: int) -> Outcome:
    cash = 0
    goods_left = escalated = False
    for event in log:
        kind = event.kind
        if kind == "capture_settled":
            cash += event.amount
        elif kind == "refunded" or kind == "chargeback":
            cash -= event.amount
        elif kind == "shipped":
            goods_left = True
        elif kind == "escalated":
            escalated = True
    return Outcome(order_value, cash, goods_left, escalated)


@lru_cache(maxsize=1 << 12)
def price(outcome: Outcome, costs: Costs = DEFAULT_COSTS) -> Position:
    """The position of an outcome under `costs`. Cached (a Position is immutable): an episode's
    end prices one, and the outcomes of a corpus are a few hundred."""
    cogs = costs.cogs(outcome.order_value) if outcome.goods_left else 0
    liability = max(0, outcome.cash - (outcome.order_value if outcome.goods_left else 0))
    dispute = costs.dispute_fee if liability > 0 else 0
    escalation = costs.escalation_fee if outcome.escalated else 0
    return Position(outcome.cash, cogs, liability, dispute, escalation)
