"""The policy interface and the one runner every policy goes through, scripted or learned.

A policy gets a case brief at the start, then makes one tool call per step from the last result.
Only a policy whose class says `privileged = True` is ever handed a `Privilege`, and only by
`play` here; nothing else a policy receives carries the truth. It lives in the installed package
so that a policy written anywhere (a script, a notebook, a submission) imports it with
`from finality_gym.policy import Policy, run_episode`; `agents/` holds the project's policies.
`GymPolicy` plays any `predict(observation, action_mask)` (a network trained on the env) through
the same runner, decoding each tool result with the env's own encoder.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable, Generator

import numpy as np

from .economics import Costs
from .encoder import DEFAULT_WAITS, ObservationEncoder
from .episode import Episode, EpisodeRecord
from .faults import FaultProfile, mix64
from .tasks import CALL_BUDGET, HANDOVER_AT, HORIZON, SHIP_BY, Task

Call = tuple[str, dict]


@dataclass(frozen=True)
class Brief:
    """What the agent is told when the case is handed over. `seed` seeds a randomized policy;
    it derives from the order value and the episode seed only (`brief_for`), so both
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


class GymPolicy(Policy):
    """`predict(observation, action_mask) -> action index` behind the policy interface;
    `start(seed)`, if given, runs at the start of every episode (to seed a sampler, to reset a
    recurrent state)."""

    def __init__(self, name: str, predict: Callable[[np.ndarray, np.ndarray], int], wait_ticks: tuple[int, ...] = DEFAULT_WAITS,
                 start: Callable[[int], object] | None = None):
        self.name = name
        self.predict = predict
        self.start = start
        self.encoder = ObservationEncoder(tuple(wait_ticks))

    def plan(self):
        if self.start is not None:
            self.start(self.brief.seed)
        probes_answered = 0
        obs = self.encoder.reset(self.brief.order_value)
        while True:
            mask = self.encoder.masks(self.now, self.brief.probe, probes_answered)
            action = self.predict(obs, mask)
            try:
                action = operator.index(action)  # an int, a numpy integer or a 0-d integer array
            except TypeError:
                raise PolicyError(f"predict returned {action!r}, not an action index (an "
                                  f"integer 0..{len(self.encoder.actions) - 1})") from None
            if not 0 <= action < len(self.encoder.actions):
                raise PolicyError(f"predict returned {action}, not an action index (an integer "
                                  f"0..{len(self.encoder.actions) - 1})")
            result = yield self.encoder.actions[action]
            if result["tool"] == "probe_processor" and "captures" in result:
                probes_answered += 1
            obs = self.encoder.update(action, result, self.now,
                                      self.brief.budget - self.calls_left)


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
         probe: str = "full", costs: Costs | None = None, guard: bool = False) -> Episode:
    """One episode of `policy` to its end (behind the guard, `guard.py`, if `guard`); returns
    the ended `Episode` (to draw it, say)."""
    episode = Episode(task, seed=seed, faults=faults, probe=probe, costs=costs, guard=guard)
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
                probe: str = "full", costs: Costs | None = None,
                guard: bool = False) -> EpisodeRecord:
    return play(policy, task, seed, faults, probe, costs, guard).record()
