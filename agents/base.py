"""The policy interface: a case brief at the start, then one tool call per step from the last
result. Only a policy whose class says `privileged = True` is ever handed a `Privilege`, and only
by the runner; nothing else a policy receives carries the truth."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generator

Call = tuple[str, dict]


@dataclass(frozen=True)
class Brief:
    """What the agent is told when the case is handed over. `seed` seeds a randomized policy;
    it derives from the order value and the episode seed only (`runner.brief_for`), so both
    halves of a twin pair get the same one and it identifies no task."""

    order_value: int
    handover_at: int
    ship_by: int
    horizon: int
    budget: int
    probe: str
    seed: int


class GiveUp(Exception):
    """Raised from `plan()` by a policy that stops acting (a model past one of its caps): the
    runner then ends the case as a lapse at the current time."""


class PolicyError(ValueError):
    """A policy failed: it raised, its plan ended before the case did, it timed out or broke
    the protocol. The grader's message adds the policy, the task and the seed."""


@dataclass(frozen=True)
class Privilege:
    """The reference's one piece of truth (docs/world.md section 8): the fate of `cap1` and `t_det`."""

    fate: str
    t_det: int


class Policy:
    """Subclasses write `plan()` as a generator: it yields calls and receives their results.

    The base class keeps the clock and the budget from the results (every result carries the
    time `t` its call started at; a call's cost is its ticks), so `self.now` and
    `self.calls_left` are what they are before the next call.
    """

    name = "policy"
    privileged = False
    _PROBE_TICKS = 5

    def reset(self, brief: Brief) -> None:
        self.brief = brief
        self.now = brief.handover_at
        self.calls_left = brief.budget
        self._plan = self.plan()
        self._started = False

    def grant(self, privilege: Privilege) -> None:
        raise PermissionError(f"{self.name} is not a privileged policy")

    def act(self, result: dict | None) -> Call:
        try:
            if not self._started:
                self._started = True
                return next(self._plan)
            self._observe(result)
            return self._plan.send(result)
        except StopIteration:
            raise PolicyError("plan() returned before the case ended (no disposition)") from None

    def plan(self) -> Generator[Call, dict, None]:
        raise NotImplementedError

    def stats(self) -> dict:
        """Extra per-episode fields for the graded row (a model's requests and tokens)."""
        return {}

    def _observe(self, result: dict) -> None:
        tool = result["tool"]
        ticks = result["ticks"] if tool == "wait" else (
            self._PROBE_TICKS if tool == "probe_processor" else 1)
        self.now = result["t"] + ticks
        self.calls_left -= 1

    def fits(self, calls: int, ticks: int) -> bool:
        """Whether a round of `calls` calls (its final disposition included) whose disposition
        starts `ticks` from now still fits in the budget and before the ship-by deadline."""
        return calls <= self.calls_left and self.now + ticks <= self.brief.ship_by
