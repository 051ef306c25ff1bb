"""Tasks as data: the clock constants of docs/world.md section 1 and the frozen `Task` record.

A task is everything the world needs to replay one case: the card fate, when `cap1` is determined,
the retry latency, the order value, the fault key, and the few archetype parameters (docs/world.md section 6).
It is generated once (see `corpus.py`) and round-trips through JSON.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields

from .records import check_keys

# docs/world.md section 1 (ticks; 1 tick = 1 second).
ORDER_PLACED_AT = 0
AUTHORIZED_AT = 2
CAPTURE_SUBMITTED_AT = 10
HANDOVER_AT = 120
SHIP_BY = 600
HORIZON = 1800
CALL_BUDGET = 40
ESCALATION_DELAY = 240
ORDER_VALUES = (2499, 4999, 9900, 18900, 34900, 74900, 129900, 349900)

FATES = ("settle", "fail_soft", "fail_hard")
ARCHETYPES = (
    "lost_settlement",
    "stale_processor",
    "pending_settle",
    "unresolvable",
    "pending_fail",
    "duplicate_settlement",
    "partial_ledger",
    "late_chargeback",
    "hard_decline",
)
TWIN_HALVES = ("settle", "fail")


@dataclass(frozen=True, slots=True)
class Task:
    """One case. `processor_lag` is set only for `stale_processor` (L of docs/world.md section 6) and
    `chargeback_at` only for `late_chargeback`; every other archetype fault follows from the
    archetype name alone."""

    task_id: str
    archetype: str
    fate: str
    t_det: int
    retry_latency: int
    order_value: int
    fault_key: int
    twin_id: str | None = None
    twin_half: str | None = None
    processor_lag: int | None = None
    chargeback_at: int | None = None

    def __post_init__(self) -> None:
        if self.archetype not in ARCHETYPES:
            raise ValueError(f"unknown archetype {self.archetype!r}; valid: {', '.join(ARCHETYPES)}")
        if self.fate not in FATES:
            raise ValueError(f"unknown fate {self.fate!r}; valid: {', '.join(FATES)}")
        if self.twin_half not in (None, *TWIN_HALVES):
            raise ValueError(f"twin_half must be one of {TWIN_HALVES} or None, got {self.twin_half!r}")
        if (self.twin_id is None) != (self.twin_half is None):
            raise ValueError("twin_id and twin_half must be both set or both None")
        for name in ("t_det", "retry_latency", "order_value", "fault_key"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        if not CAPTURE_SUBMITTED_AT < self.t_det < HORIZON:
            raise ValueError(f"t_det must lie in ({CAPTURE_SUBMITTED_AT}, {HORIZON}), got {self.t_det}")
        if (self.processor_lag is None) != (self.archetype != "stale_processor"):
            raise ValueError("processor_lag is set exactly for stale_processor tasks")
        if (self.chargeback_at is None) != (self.archetype != "late_chargeback"):
            raise ValueError("chargeback_at is set exactly for late_chargeback tasks")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Task:
        """The task whose `to_dict` is `data` (a corpus file's row); a key it does not have, or
        lacks without a default, is refused, naming it."""
        if not isinstance(data, dict):
            raise ValueError(f"a task is a dict (Task.to_dict), got {data!r}")
        check_keys(data, (f.name for f in fields(cls)), "a task",
                   optional=(f.name for f in fields(cls) if f.default is not MISSING))
        return cls(**data)
